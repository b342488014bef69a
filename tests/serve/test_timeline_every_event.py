"""One session holding every event type, through every view of a log.

The views draw the rows of :mod:`turnledger.timeline`: ``turnledger log``
(text and ``--json``), ``turnledger log --html`` (the static page, in the
real browser), the ``serve`` page (in the real browser) and its JSON. Each
must show every row: every request id, the retry, the tool names and call
ids, the late completion. The log is built from the codec's registry of wire
tags, so a new event type fails here until the log (and the views) hold it.
"""

from __future__ import annotations

import json
import re
import time
from pathlib import Path
from typing import Any

import httpx
import pytest
import trio

from cli._run import tl
from serve._harness import loopback, running
from serve.test_timeline import _wait
from turnledger.adapters.stores import SQLiteStore
from turnledger.events import (
    DEFAULT_CODEC,
    MAIN_BRANCH,
    WIRE_TAGS,
    BranchId,
    BranchStarted,
    BranchSwitched,
    CompletionIgnored,
    Event,
    Ledger,
    PinAdded,
    PinRemoved,
    RequestId,
    SessionForked,
    SessionId,
    SessionStarted,
    StreamStarted,
    SummaryRecorded,
    SummarySent,
    ToolCall,
    ToolCallsRequested,
    ToolResultRecorded,
    ToolRoundSubmitted,
    ToolSpec,
    TurnCommitted,
    TurnDiscarded,
    TurnRejected,
    TurnRetried,
    TurnSubmitted,
    Usage,
)
from turnledger.timeline import session_summary, timeline

SESSION = "every"
#: The request ids of the log, in order of first appearance.
ROWS = ["r-tools", "r-retry", "r-old", "r-empty", "r-new", "r-edit", "r-sum"]
#: The summary of main's two turns, which r-sum sends in their place.
SUMMARY = "Paris is sunny; it was summarised."
#: Seconds between two events of the log.
STEP = 0.25


def _r(rid: str) -> RequestId:
    return RequestId(rid)


def _events() -> list[Event]:
    """A session with a tool round (one call failing), a retried overflow, a
    supersede, a rejection, a cancel, a late answer, and an edit of its
    second turn on a branch, then a switch back to main; an item pinned, a
    summary of main's two turns that the next request sends in their place,
    and the item unpinned."""
    calls = (
        ToolCall("call-paris", "get_weather", '{"city": "Paris"}'),
        ToolCall("call-clock", "get_time", "{}"),
    )
    return [
        SessionStarted(
            "be brief",
            "m",
            Ledger(),
            "supersede",
            tools=(ToolSpec("get_weather"), ToolSpec("get_time")),
            context_window=4096,
            output_reserve=512,
            window_source="user",
        ),
        # a fork of a session at its start: no turn shared
        SessionForked(SessionId("origin"), 1, MAIN_BRANCH, 0),
        TurnSubmitted(_r("r-tools"), "Weather in Paris?", 0, 0, 120, 300),
        StreamStarted(_r("r-tools")),
        ToolCallsRequested(_r("r-tools"), 0, calls, "", Usage(20, 8, 28)),
        ToolResultRecorded(_r("r-tools"), "call-paris", "sunny, 21 C", False, 12),
        ToolResultRecorded(_r("r-tools"), "call-clock", "the clock broke", True, 3),
        ToolRoundSubmitted(_r("r-tools"), 1, 310),
        StreamStarted(_r("r-tools")),
        TurnCommitted(_r("r-tools"), "Sunny in Paris.", "stop", Usage(40, 5, 45)),
        TurnSubmitted(_r("r-retry"), "Summarise all of it", 1, 0, 9000, 3900),
        TurnRetried(
            _r("r-retry"), "context_overflow", "maximum context length exceeded", 0, 1, 200, 250
        ),
        StreamStarted(_r("r-retry")),
        TurnCommitted(_r("r-retry"), "A summary.", "stop", Usage(55, 4, 59)),
        TurnSubmitted(_r("r-old"), "a slow question", 2, 0, 400, 100),
        StreamStarted(_r("r-old")),
        TurnRejected(_r("r-empty"), "empty_question"),
        TurnDiscarded(_r("r-old"), "superseded", "", 8),
        TurnSubmitted(_r("r-new"), "the newer question", 2, 0, 410, 102),
        StreamStarted(_r("r-new")),
        TurnDiscarded(_r("r-new"), "cancelled", "", 3),
        CompletionIgnored(_r("r-old"), "completed", Usage(9, 4, 13)),
        BranchStarted(BranchId("b1"), MAIN_BRANCH, 1, "edit", _r("r-edit")),
        TurnSubmitted(_r("r-edit"), "Summarise it in a word", 1, 0, 300, 80),
        StreamStarted(_r("r-edit")),
        TurnCommitted(_r("r-edit"), "Brief.", "stop", Usage(30, 2, 32)),
        BranchSwitched(MAIN_BRANCH),
        PinAdded("p1", "Answer briefly.", "policy"),
        SummaryRecorded(
            "s1",
            MAIN_BRANCH,
            0,
            2,
            _r("r-tools"),
            _r("r-retry"),
            SUMMARY,
            "model",
            "concise",
            _r("sum-1"),
            Usage(60, 9, 69),
            len(SUMMARY),
            13,
        ),
        TurnSubmitted(_r("r-sum"), "And then?", 0, 2, 190, 50),
        SummarySent(_r("r-sum"), "s1"),
        StreamStarted(_r("r-sum")),
        TurnCommitted(_r("r-sum"), "Then rain.", "stop", Usage(50, 3, 53)),
        PinRemoved("p1"),
    ]


#: The late answer came this long after its turn (r-old) was discarded.
LATE_BY = 4 * STEP


@pytest.fixture(scope="module")
def every_db(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The session in a real SQLite file, one event every STEP seconds."""
    db = tmp_path_factory.mktemp("every") / "every.db"
    t0 = time.time() - 60
    stored = [
        DEFAULT_CODEC.encode(e, session_id=SESSION, seq=i, recorded_at=t0 + i * STEP)
        for i, e in enumerate(_events(), 1)
    ]

    async def write() -> None:
        store = await SQLiteStore.open(db)
        try:
            # the source the session was forked from (at its first event)
            origin = DEFAULT_CODEC.encode(
                SessionStarted("be brief", "m"), session_id="origin", seq=1, recorded_at=t0
            )
            await store.append("origin", [origin], 0)
            await store.append(SESSION, stored, 0)
        finally:
            await store.aclose()

    trio.run(write)
    # Every event type the codec knows is in the log: a new one fails here.
    assert {s.tag for s in stored} == set(WIRE_TAGS.values())
    return db


def test_the_rows_carry_every_fact(every_db: Path) -> None:
    async def read() -> Any:
        store = await SQLiteStore.open(every_db, read_only=True)
        try:
            return await store.read(SESSION)
        finally:
            await store.aclose()

    stored = trio.run(read)
    tline = timeline(SESSION, stored)
    rows = {r.request_id: r for r in tline.rows}
    assert list(rows) == ROWS
    assert sorted(s.seq for s in tline.steps()) == list(range(1, len(stored) + 1))
    (tools,) = rows["r-tools"].tool_rounds
    assert [(c.name, c.call_id, c.is_error) for c in tools.calls] == [
        ("get_weather", "call-paris", False),
        ("get_time", "call-clock", True),
    ]
    assert tools.calls[0].argument_bytes == len('{"city": "Paris"}')
    assert (tools.calls[0].result_bytes, tools.calls[0].duration_ms) == (11, 12)
    assert tools.request_bytes == 310
    (retry,) = rows["r-retry"].retries
    assert (retry.reason, retry.turns_dropped, retry.estimated_prompt_tokens) == (
        "context_overflow",
        1,
        250,
    )
    # the window less the reserve, then cut after the overflow
    assert rows["r-tools"].token_budget == 4096 - 512
    before = rows["r-retry"].token_budget
    assert before is not None and retry.token_budget is not None
    assert retry.token_budget < before
    assert rows["r-old"].superseded_by == "r-new" and rows["r-new"].supersedes == ("r-old",)
    (late,) = rows["r-old"].late
    assert late.delay_s == pytest.approx(LATE_BY)
    assert rows["r-empty"].end == "rejected" and rows["r-new"].reason == "cancelled"
    assert [h[0] for h in tline.history] == ["r-tools", "r-retry", "r-sum"]
    # the tree: b1 keeps r-tools and asks r-edit; main is active again
    edit = rows["r-edit"]
    assert edit.branch == "b1" and rows["r-new"].branch == "main"
    assert edit.starts_branch is not None
    assert (edit.starts_branch.branch, edit.starts_branch.parent) == ("b1", "main")
    assert (edit.starts_branch.at_turn, edit.starts_branch.kind) == (1, "edit")
    assert [s.event for s in edit.steps][:2] == ["branch_started", "turn_submitted"]
    assert tline.active_branch == "main"
    assert [(b.branch_id, b.length, b.head, b.active) for b in tline.branches] == [
        ("main", 3, "r-sum", True),
        ("b1", 2, "r-edit", False),
    ]
    assert [w.branch for w in tline.switches] == ["main"]
    assert [s.event for s in tline.session_steps] == [
        "session_started",
        "session_forked",
        "branch_switched",
        "pin_added",
        "summary_recorded",
        "pin_removed",
    ]
    # the summary: the turns it covers, and the request that sent it instead
    (summ,) = tline.summaries
    assert (summ.summary_id, summ.start, summ.end, summ.text) == ("s1", 0, 2, SUMMARY)
    assert rows["r-sum"].summary_sent == "s1" and rows["r-sum"].turns_dropped == 2
    assert rows["r-edit"].summary_sent is None and tline.pins == ()
    assert [h[0] for h in timeline(SESSION, stored).history] == ["r-tools", "r-retry", "r-sum"]

    summary = session_summary(SESSION, stored)
    assert summary == {
        "session_id": SESSION,
        "subject": None,
        "events": len(stored),
        "turns": 3,
        "requests": 7,
        "committed": 4,
        "discarded": 2,
        "rejected": 1,
        "ignored": 1,
        "retried": 1,
        "tool_calls": 2,
        "phase": "committed",
        "last_outcome": "committed",
        "last_recorded_at": stored[-1].recorded_at,
        "context_window": 4096,
        "window_source": "user",
        "prompt_tokens": 40 + 55 + 9 + 30 + 50,
        "completion_tokens": 5 + 4 + 4 + 2 + 3,
        "estimated_prompt_tokens": 300 + 3900 + 250 + 100 + 102 + 80 + 50,
        "turns_dropped": 2,
        "context_overflows": 1,
    }


def test_a_busy_rejection_names_the_request_in_flight() -> None:
    events: list[Event] = [
        SessionStarted("", "m"),
        TurnSubmitted(_r("first"), "q", 0, 0, 10),
        TurnRejected(_r("second"), "busy"),
    ]
    stored = [
        DEFAULT_CODEC.encode(e, session_id="s", seq=i, recorded_at=float(i))
        for i, e in enumerate(events, 1)
    ]
    second = timeline("s", stored).rows[1]
    assert second.busy_with == "first"
    assert second.explanation == (
        "Refused before any request was sent: "
        "another turn of this session (first) was still in flight."
    )


# --- the views -----------------------------------------------------------------


def _text_log(db: Path, tmp_path: Path) -> None:
    done = tl("log", str(db), "--session", SESSION, cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    for tag in WIRE_TAGS.values():
        assert any(f" {tag} " in line or line.endswith(f" {tag}") for line in lines), tag
    for rid in ROWS:
        assert any(f" {rid} " in line for line in lines), rid
    (retry,) = [line for line in lines if " turn_retried " in line]
    assert "r-retry" in retry and "context_overflow (maximum context length exceeded" in retry
    assert "sent again: 0 turns sent, 1 dropped, 200 bytes, ~250 tokens" in retry
    (calls,) = [line for line in lines if " tool_calls_requested " in line]
    assert "get_weather call-paris 17 B, get_time call-clock 2 B" in calls
    results = [line for line in lines if " tool_result_recorded " in line]
    assert "ok (call-paris 11 B, 12 ms)" in results[0]
    assert "error (call-clock 15 B, 3 ms)" in results[1]
    (late,) = [line for line in lines if " completion_ignored " in line]
    assert "r-old" in late and f"{LATE_BY:.3f}s after the turn ended" in late
    (branch,) = [line for line in lines if " branch_started " in line]
    assert "r-edit" in branch and "branch b1 from main: keeps 1 turns" in branch
    (switch,) = [line for line in lines if " branch_switched " in line]
    assert "active branch: main" in switch
    (summ,) = [line for line in lines if " summary_recorded " in line]
    assert "summary s1 of main turns 0-1 (r-tools to r-retry) by concise" in summ
    (sent,) = [line for line in lines if " summary_sent " in line]
    assert "r-sum" in sent and "summary s1 sent in place of the turns dropped" in sent
    (pinned,) = [line for line in lines if " pin_added " in line]
    assert "pinned p1 (policy)" in pinned
    # only the one request with --request
    one = tl("log", str(db), "--session", SESSION, "--request", "r-tools", cwd=tmp_path)
    assert one.returncode == 0, one.stderr
    assert "r-tools" in one.stdout and "r-retry" not in one.stdout
    assert "session_started" not in one.stdout


def _json_log(db: Path, tmp_path: Path) -> None:
    done = tl("log", str(db), "--session", SESSION, "--json", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    steps = [json.loads(line) for line in done.stdout.splitlines()]
    assert {s["tag"] for s in steps} == set(WIRE_TAGS.values())
    assert {s["request_id"] for s in steps} == {None, *ROWS}
    (retry,) = [s for s in steps if s["tag"] == "turn_retried"]
    assert (retry["request_id"], retry["reason"], retry["from"], retry["to"]) == (
        "r-retry",
        "context_overflow",
        "pending",
        "pending",
    )
    assert retry["estimated_prompt_tokens"] == 250
    (calls,) = [s for s in steps if s["tag"] == "tool_calls_requested"]
    assert "get_weather call-paris" in calls["detail"] and "call-clock" in calls["detail"]
    assert calls["to"] == "awaitingtools"
    (late,) = [s for s in steps if s["tag"] == "completion_ignored"]
    assert late["request_id"] == "r-old" and late["late_by"] == pytest.approx(LATE_BY)
    (branch,) = [s for s in steps if s["tag"] == "branch_started"]
    assert (branch["request_id"], branch["reason"]) == ("r-edit", "edit")
    (switch,) = [s for s in steps if s["tag"] == "branch_switched"]
    assert (switch["request_id"], switch["reason"]) == (None, "switch")
    (summ,) = [s for s in steps if s["tag"] == "summary_recorded"]
    assert (summ["request_id"], summ["reason"]) == (None, "model")


def _serve_json(url: str, db: Path, tmp_path: Path) -> dict[str, Any]:
    model: dict[str, Any] = httpx.get(f"{url}/v1/sessions/{SESSION}/timeline").json()
    rows = {r["request_id"]: r for r in model["turns"]}
    assert list(rows) == ROWS
    assert [r["reason"] for r in rows["r-retry"]["retries"]] == ["context_overflow"]
    (round_,) = rows["r-tools"]["tool_rounds"]
    assert [(c["name"], c["call_id"]) for c in round_["calls"]] == [
        ("get_weather", "call-paris"),
        ("get_time", "call-clock"),
    ]
    assert rows["r-old"]["late"][0]["delay_s"] == pytest.approx(LATE_BY)
    assert rows["r-old"]["superseded_by"] == "r-new"
    assert rows["r-edit"]["starts_branch"] == {
        "branch": "b1",
        "parent": "main",
        "at_turn": 1,
        "kind": "edit",
    }
    assert (model["active_branch"], [b["branch_id"] for b in model["branches"]]) == (
        "main",
        ["main", "b1"],
    )
    assert [w["branch"] for w in model["switches"]] == ["main"]
    assert rows["r-sum"]["summary_sent"] == "s1"
    assert [(x["summary_id"], x["start"], x["end"]) for x in model["summaries"]] == [("s1", 0, 2)]
    assert model["pins"] == []
    assert [p["event"] for p in rows["r-tools"]["phases"]][:3] == [
        "turn_submitted",
        "stream_started",
        "tool_calls_requested",
    ]
    # One summary: the service's list and `turnledger sessions --json` agree.
    listed = httpx.get(f"{url}/v1/sessions").json()["sessions"]
    (mine,) = [s for s in listed if s["session_id"] == SESSION]
    done = tl("sessions", str(db), "--json", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    (line,) = [x for x in map(json.loads, done.stdout.splitlines()) if x["session_id"] == SESSION]
    assert line == mine
    assert (mine["requests"], mine["retried"], mine["tool_calls"]) == (7, 1, 2)
    return model


def _page(browser: Any) -> None:
    """The page in the browser shows every row, the retry, the tool calls,
    the late answer and the supersede link."""
    found = _wait(browser, "#timeline .row", len(ROWS))
    assert [r.get_attribute("data-request-id") for r in found] == ROWS

    def row(rid: str) -> Any:
        return browser.find_element("css selector", f'#timeline .row[data-request-id="{rid}"]')

    retry = row("r-retry")
    assert retry.get_attribute("data-retries") == "1"
    assert retry.find_elements("css selector", ".mark.retry")
    text = retry.find_element("css selector", ".retried").text
    assert "retried after context_overflow (maximum context length exceeded)" in text
    assert "1 dropped, 200 bytes, ~250 tokens" in text
    tools = row("r-tools")
    assert tools.get_attribute("data-tool-rounds") == "1"
    assert tools.find_elements("css selector", ".mark.tool")
    paris = tools.find_element("css selector", '.tool-call[data-call-id="call-paris"]')
    assert paris.text.startswith("get_weather [call-paris] 17 B → 11 B back, 12 ms, ok")
    clock = tools.find_element("css selector", '.tool-call[data-call-id="call-clock"]')
    assert "get_time [call-clock]" in clock.text and clock.text.endswith("error")
    assert "sunny" not in tools.text  # sizes, never a tool's result
    old = row("r-old")
    assert old.find_element("css selector", ".badge.late").text == f"late answer +{LATE_BY:.3f}s"
    assert "↷ superseded by r-new" in old.text
    assert "↶ supersedes r-old" in row("r-new").text
    assert "discarded: cancelled" in row("r-new").text
    assert "rejected: empty_question" in row("r-empty").text
    edit = row("r-edit")
    assert edit.get_attribute("data-branch") == "b1"
    start = edit.find_element("css selector", '.branch-start[data-branch="b1"]')
    assert "⑂ starts branch b1 from main (edit): keeps 1 turns" in start.text
    assert row("r-new").get_attribute("data-branch") == "main"
    active = browser.find_element("css selector", "#active-branch")
    assert active.get_attribute("data-branch") == "main"
    tree = browser.find_elements("css selector", "#branches li.branch")
    assert [li.get_attribute("data-branch-id") for li in tree] == ["main", "b1"]
    assert "active" in tree[0].get_attribute("class")
    assert browser.find_elements("css selector", '#branches li.switch[data-switch-to="main"]')
    sent = row("r-sum").find_element("css selector", '.summary-sent[data-summary-id="s1"]')
    assert sent.text == "▤ sent summary s1 in place of 2 dropped turns"
    (summ,) = browser.find_elements("css selector", '#summaries li.summary[data-summary-id="s1"]')
    assert "s1: main turns 0–1 (r-tools … r-retry) · model concise · ~13 tokens" in summ.text
    assert SUMMARY in summ.text


def test_every_view_shows_every_row(browser: Any, every_db: Path, tmp_path: Path) -> None:
    _text_log(every_db, tmp_path)
    _json_log(every_db, tmp_path)

    html = tmp_path / "every.html"
    done = tl("log", str(every_db), "--session", SESSION, "--html", str(html), cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    browser.get(html.as_uri())
    _page(browser)

    with loopback() as provider, running(every_db, provider.openai_base_url) as serve:
        model = _serve_json(serve.url, every_db, tmp_path)
        # the static page carries the very model the service returns
        data = html.read_text(encoding="utf-8").split('id="tl-data" type="application/json">')[1]
        embedded = json.loads(data.split("</script>")[0])["model"]
        assert embedded == model
        browser.get(f"{serve.url}/#session={SESSION}")
        _page(browser)
        assert "following live" in browser.find_element("css selector", "#live").text


def test_the_documented_timeline_example_runs(
    every_db: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    page = Path(__file__).parents[2] / "docs" / "events.md"
    blocks = re.findall(r"```python\n(.*?)```", page.read_text(encoding="utf-8"), re.S)
    [code] = [b for b in blocks if "async def print_race(" in b]
    code = code.split("\nawait ")[0]  # (the page runs it on its own store)
    scope: dict[str, Any] = {}
    exec(compile(code, "docs/events.md", "exec"), scope)

    async def main() -> None:
        store = await SQLiteStore.open(every_db, read_only=True)
        try:
            await scope["print_race"](store, SESSION)
        finally:
            await store.aclose()

    trio.run(main)
    lines = capsys.readouterr().out.splitlines()
    assert [line.split()[0] for line in lines if not line.startswith(" ")][:-1] == ROWS
    assert "  sent again after context_overflow: 200 bytes" in lines
    assert "  tools: get_weather [call-paris], get_time [call-clock]" in lines
    assert f"  a late answer, {LATE_BY:.3f}s after the turn ended" in lines
    assert lines[-1] == "last outcome: committed"
