"""The timeline shows the tree: each branch, where it starts (the turn it
branched from, edit or regenerate), which one is active and the turns each
added, in the rows (pure), in ``turnledger log``'s text, in the page
``log --html`` writes and in ``serve``'s live page (the real browser); and
the live page's controls edit, regenerate and switch through serve's routes."""

from __future__ import annotations

import json
import shutil
import time
from pathlib import Path
from typing import Any

import pytest
import trio
from selenium.common.exceptions import WebDriverException

from cli._run import tl
from core._given import given
from serve._harness import loopback, post_turn, running
from serve.test_serve_branches import _events, _in_flight
from serve.test_timeline import _wait
from turnledger.adapters.stores import JournalStore, SQLiteStore
from turnledger.events import DEFAULT_CODEC, BranchId, Event, RequestId, StoredEvent
from turnledger.serve import timeline_model
from turnledger.sessions import (
    Completed,
    Edit,
    Message,
    Regenerate,
    Submit,
    Switch,
    branches_of,
    replay,
)
from turnledger.timeline import branch_line, branch_tree, timeline

SESSION = "tree"


def _tree_log() -> list[Event]:
    """main asks one, two, three; b1 asks question 2 differently; b2 asks
    b1's question 2 again; back on main, b3 asks question 1 differently;
    then b1 is made active again."""

    def asked(rid: str, message: Message) -> tuple[Message, Message]:
        return message, Completed(RequestId(rid), f"answer {rid}", "stop")

    return given(
        *asked("r0", Submit(RequestId("r0"), "one")),
        *asked("r1", Submit(RequestId("r1"), "two")),
        *asked("r2", Submit(RequestId("r2"), "three")),
        *asked("e1", Edit(RequestId("e1"), 1, "deux")),
        *asked("g1", Regenerate(RequestId("g1"))),
        Switch(BranchId("main")),
        *asked("e2", Edit(RequestId("e2"), 0, "uno")),
        Switch(BranchId("b1")),
    ).log


def _stored() -> list[StoredEvent]:
    return [
        DEFAULT_CODEC.encode(e, session_id=SESSION, seq=i, recorded_at=1000.0 + i)
        for i, e in enumerate(_tree_log(), 1)
    ]


@pytest.fixture(scope="module")
def tree_db(tmp_path_factory: pytest.TempPathFactory) -> Path:
    db = tmp_path_factory.mktemp("tree") / "tree.db"

    async def write() -> None:
        store = await SQLiteStore.open(db)
        try:
            await store.append(SESSION, _stored(), 0)
        finally:
            await store.aclose()

    trio.run(write)
    return db


#: What ``turnledger log`` draws under the events (and branch_tree returns).
TREE = [
    "  main: 3 turns, head r2",
    "      b3 from main after 0 turns (edit): 1 turns, head e2",
    "        1. [e2] uno",
    "    1. [r0] one",
    "    * b1 from main after 1 turns (edit): 2 turns, head e1",
    "          b2 from b1 after 1 turns (regenerate): 2 turns, head g1",
    "            2. [g1] deux",
    "        2. [e1] deux",
    "    2. [r1] two",
    "    3. [r2] three",
]


def test_each_branch_carries_the_turns_it_added() -> None:
    tline = timeline(SESSION, _stored())
    assert tline.active_branch == "b1"
    got = [(b.branch_id, b.parent, b.at_turn, b.kind, b.turns, b.active) for b in tline.branches]
    assert got == [
        ("main", None, 0, None, ("r0", "r1", "r2"), False),
        ("b1", "main", 1, "edit", ("e1",), True),
        ("b2", "b1", 1, "regenerate", ("g1",), False),
        ("b3", "main", 0, "edit", ("e2",), False),
    ]
    # every committed turn is on exactly one branch
    own = [rid for b in tline.branches for rid in b.turns]
    committed = [r.request_id for r in tline.rows if r.end == "committed"]
    assert sorted(own) == sorted(committed)
    assert list(branch_tree(tline)) == TREE
    model = timeline_model(SESSION, _stored())
    assert [b["turns"] for b in model["branches"]] == [["r0", "r1", "r2"], ["e1"], ["g1"], ["e2"]]


def test_a_branch_reads_the_same_from_the_hub_and_from_the_log() -> None:
    # chat's /branches lists hub.branches(); log's tree lists the timeline's
    state = replay(_tree_log())
    lines = [branch_line(b) for b in branches_of(state)]
    assert lines == [branch_line(b) for b in timeline(SESSION, _stored()).branches]
    assert lines[1] == "* b1 from main after 1 turns (edit): 2 turns, head e1"


def test_a_session_that_never_branched_has_one_branch_with_every_turn() -> None:
    events: list[Event] = _tree_log()[:7]  # start, then three committed turns on main
    stored = [
        DEFAULT_CODEC.encode(e, session_id="s", seq=i, recorded_at=float(i))
        for i, e in enumerate(events, 1)
    ]
    tline = timeline("s", stored)
    (main,) = tline.branches
    assert (main.branch_id, main.turns, main.active) == ("main", ("r0", "r1", "r2"), True)
    assert branch_tree(tline)[0] == "* main: 3 turns, head r2"


def test_long_request_ids_and_questions_are_cut() -> None:
    long_id, question = "0123456789abcdef" * 2, "why " * 40 + "\nand more"
    log = given(
        Submit(RequestId(long_id), "one"),
        Completed(RequestId(long_id), "a", "stop"),
        Edit(RequestId("e" + long_id), 0, question),
        Completed(RequestId("e" + long_id), "b", "stop"),
    ).log
    stored = [
        DEFAULT_CODEC.encode(e, session_id="s", seq=i, recorded_at=float(i))
        for i, e in enumerate(log, 1)
    ]
    tline = timeline("s", stored)
    assert branch_tree(tline, id_width=8) == (
        "  main: 1 turns, head 0123456…",
        "    * b1 from main after 0 turns (edit): 1 turns, head e012345…",
        "        1. [e012345…] " + ("why " * 15)[:59] + "…",
        "    1. [0123456…] one",
    )
    assert f"[{long_id}] one" in branch_tree(tline)[-1]


def test_the_text_log_draws_the_tree(tree_db: Path, tmp_path: Path) -> None:
    done = tl("log", str(tree_db), "--session", SESSION, cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    out = done.stdout.splitlines()
    at = out.index("  branches (4, * marks the active one):")
    assert out[at + 1 :] == [f"    {line}" for line in TREE]
    # one request, or JSON lines: the events only
    one = tl("log", str(tree_db), "--session", SESSION, "--request", "e1", cwd=tmp_path)
    assert one.returncode == 0 and "branches (" not in one.stdout
    lines = tl("log", str(tree_db), "--session", SESSION, "--json", cwd=tmp_path)
    assert all("tag" in json.loads(line) for line in lines.stdout.splitlines())


def _check_tree(browser: Any) -> None:
    """The page's tree: b2 nested in b1 and b3 in main, each just before the
    turn it replaced, each branch's own turns, b1 marked active."""

    def branch(bid: str) -> Any:
        return browser.find_element("css selector", f'#branches li.branch[data-branch-id="{bid}"]')

    found = _wait(browser, "#branches li.branch", 4)
    assert [li.get_attribute("data-branch-id") for li in found] == ["main", "b3", "b1", "b2"]
    assert browser.find_elements("css selector", '#branches > li.branch[data-branch-id="main"]')
    assert branch("b1").find_elements("css selector", 'ul.forks > li[data-branch-id="b2"]')
    assert branch("main").find_elements("css selector", 'ul.forks > li[data-branch-id="b3"]')
    own = {
        bid: [
            (d.get_attribute("data-request-id"), d.get_attribute("data-turn"))
            for d in branch(bid).find_elements("css selector", ":scope > .bturn")
        ]
        for bid in ("main", "b1", "b2", "b3")
    }
    assert own == {
        "main": [("r0", "1"), ("r1", "2"), ("r2", "3")],
        "b1": [("e1", "2")],
        "b2": [("g1", "2")],
        "b3": [("e2", "1")],
    }
    # main's children in document order: b3 (before turn 1), turn 1, b1, turns 2 and 3
    kids = branch("main").find_elements("css selector", ":scope > *")
    order = [
        k.get_attribute("data-request-id")
        or ",".join(
            li.get_attribute("data-branch-id")
            for li in k.find_elements("css selector", ":scope > li")
        )
        for k in kids[1:]
    ]
    assert order == ["b3", "r0", "b1", "r1", "r2"]
    b2 = branch("b2").find_element("css selector", ".bhead").text
    assert b2.startswith("b2: from b1 after 1 turns (regenerate) · 2 turns · head g1")
    assert "active" in branch("b1").get_attribute("class")
    assert "active" not in branch("main").get_attribute("class")
    assert branch("b1").find_element("css selector", ".bhead").text.startswith("● b1")
    assert "deux" in branch("b2").find_element("css selector", ".bturn").text
    active = browser.find_element("css selector", "#active-branch")
    assert active.get_attribute("data-branch") == "b1"
    # each row of the timeline says the branch its question was asked on
    on = {
        r.get_attribute("data-request-id"): r.find_element("css selector", ".on-branch").text
        for r in browser.find_elements("css selector", "#timeline .row")
    }
    assert on == {"r0": "on main", "r1": "on main", "r2": "on main", "e1": "on b1",
                  "g1": "on b2", "e2": "on b3"}  # fmt: skip


def test_the_static_page_draws_the_tree(browser: Any, tree_db: Path, tmp_path: Path) -> None:
    out = tmp_path / "tree.html"
    done = tl("log", str(tree_db), "--session", SESSION, "--html", str(out), cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    browser.get(out.as_uri())
    _check_tree(browser)
    # a file has no service behind it: no controls
    assert not browser.find_elements("css selector", "#history button")
    browser.save_screenshot(str(tmp_path / "tree-static.png"))


def test_the_live_page_draws_the_tree(browser: Any, tree_db: Path, tmp_path: Path) -> None:
    with loopback() as provider, running(tree_db, provider.openai_base_url) as serve:
        browser.get(f"{serve.url}/#session={SESSION}")
        _check_tree(browser)
        switches = browser.find_elements("css selector", "#branches button.switch-to")
        assert sorted(b.get_attribute("data-branch") for b in switches) == ["b2", "b3", "main"]


# --- the controls --------------------------------------------------------------


def _status(browser: Any, needle: str, timeout: float = 20) -> str:
    deadline = time.monotonic() + timeout
    text = ""
    while time.monotonic() < deadline:
        text = browser.execute_script(
            "const el = document.getElementById('branch-status'); return el ? el.textContent : ''"
        )
        if needle in text:
            return str(text)
        time.sleep(0.1)
    raise AssertionError(f"the status never said {needle!r}: {text!r}")


def _history(browser: Any, questions: list[str], timeout: float = 20) -> None:
    deadline = time.monotonic() + timeout
    got: list[str] = []
    while time.monotonic() < deadline:
        # (read in one script: the follow stream may redraw the page at any time)
        got = browser.execute_script(
            "return [...document.querySelectorAll('#history ol li .q')].map((e) => e.textContent)"
        )
        if got == questions:
            return
        time.sleep(0.1)
    raise AssertionError(f"history {got} is not {questions}")


def _click(browser: Any, css: str, timeout: float = 20) -> None:
    # Found and clicked again if a redraw (the follow stream) replaced it.
    deadline = time.monotonic() + timeout
    while True:
        try:
            _wait(browser, css)[0].click()
            return
        except (IndexError, WebDriverException):  # (stale, or not interactable while replaced)
            if time.monotonic() > deadline:
                raise
            time.sleep(0.1)


def _type(browser: Any, css: str, text: str, timeout: float = 20) -> None:
    # Typed again if a redraw (the follow stream) replaced the box meanwhile.
    deadline = time.monotonic() + timeout
    while True:
        try:
            box = _wait(browser, css)[0]
            box.clear()
            box.send_keys(text)
            if box.get_attribute("value") == text:
                return
            if time.monotonic() > deadline:
                raise AssertionError(f"the box never held {text!r}")
        except (IndexError, WebDriverException):  # (stale, or not interactable while replaced)
            if time.monotonic() > deadline:
                raise
        time.sleep(0.1)


def _edit(browser: Any, index: int, text: str) -> None:
    _click(browser, f'#history button.edit-turn[data-turn-index="{index}"]')
    _type(browser, "#history textarea.edit-text", text)
    _click(browser, "#history button.edit-ask")


def test_the_page_edits_regenerates_and_switches(browser: Any, tmp_path: Path) -> None:
    db = tmp_path / "controls.db"
    with loopback() as provider, running(db, provider.openai_base_url) as serve:
        with serve.client() as c:
            for q in ("one", "two"):
                status, events = post_turn(c, "ui", q)
                assert status == 200 and events[-1]["data"]["kind"] == "committed"
        browser.get(f"{serve.url}/#session=ui")
        _history(browser, ["one", "two"])
        # edit question 2: a new branch b1 keeps question 1 and asks "deux"
        _edit(browser, 1, "deux")
        assert "committed" in _status(browser, "edit of question 2: committed")
        _history(browser, ["one", "deux"])
        assert _wait(browser, '#branches li.branch.active[data-branch-id="b1"]')
        # the last question again: b2 from b1
        _click(browser, "#regenerate")
        _status(browser, "regenerate: committed")
        assert _wait(browser, '#branches li.branch.active[data-branch-id="b2"]')
        _history(browser, ["one", "deux"])
        # back to main, from the tree
        _click(browser, '#branches button.switch-to[data-branch="main"]')
        _status(browser, "branch main is active")
        _history(browser, ["one", "two"])
        assert _wait(browser, '#active-branch[data-branch="main"]')
        browser.save_screenshot(str(tmp_path / "controls.png"))
        with serve.client() as c:
            listed = c.get("/v1/sessions/ui/branches").json()
            assert listed["active_branch"] == "main"
            starts = {b["branch_id"]: (b["parent"], b["at_turn"], b["kind"])
                      for b in listed["branches"]}  # fmt: skip
            assert starts == {"main": (None, 0, None), "b1": ("main", 1, "edit"),
                              "b2": ("b1", 1, "regenerate")}  # fmt: skip
            sent = [x.json()["messages"] for x in provider.exchanges]
            edited = [m["content"] for m in sent[2] if m["role"] == "user"]
            assert edited == ["one", "deux"]
        # a refused edit (an empty question) says why, and writes nothing
        before = _events(db)
        _edit(browser, 0, "   ")
        said = _status(browser, "refused")
        assert "(400 empty_question)" in said
        assert _events(db) == before
        _history(browser, ["one", "two"])
        # a question being edited survives a redraw (a turn asked elsewhere)
        _click(browser, '#history button.edit-turn[data-turn-index="0"]')
        _type(browser, "#history textarea.edit-text", "half typed")
        with serve.client() as c:
            status, _ = post_turn(c, "ui", "three")
            assert status == 200
        _history(browser, ["one", "two", "three"])
        # (the focus comes back in the redraw's next animation frame)
        deadline = time.monotonic() + 10
        while True:
            kept = browser.execute_script(
                "const box = document.querySelector('#history textarea.edit-text');"
                "return box && [box.value, document.activeElement === box]"
            )
            if kept == ["half typed", True] or time.monotonic() > deadline:
                break
            time.sleep(0.05)
        assert kept == ["half typed", True]
        _click(browser, "#history button.edit-cancel")
        assert not _wait(browser, "#history textarea.edit-text", timeout=0.5)
        # while a turn is in flight the session is busy: refused, nothing written
        with serve.client() as c, c.stream("POST", "/v1/sessions/ui/turns",
                                           json={"question": "hang"}) as r:  # fmt: skip
            assert r.status_code == 200
            rid = _in_flight(c, "ui")
            before = _events(db)
            _edit(browser, 1, "zwei")
            assert "refused" in _status(browser, "(409 busy)")
            assert _events(db) == before
            assert c.post(f"/v1/sessions/ui/turns/{rid}/cancel", json={}).status_code == 200
        _history(browser, ["one", "two", "three"])


@pytest.mark.parametrize("release", ["85433a9", "6b53ecb"])
def test_a_log_from_before_branches_shows_one_branch_and_no_tree(
    release: str, tmp_path: Path
) -> None:
    # (tests/stores/test_old_logs_branch.py replays these logs; here: their timeline)
    fixture = Path(__file__).parent.parent / "fixtures" / f"log_{release}.jsonl"
    expected = json.loads(fixture.with_suffix(".expected.json").read_text("utf-8"))
    log = tmp_path / fixture.name  # (a copy: the fixture is never opened)
    shutil.copyfile(fixture, log)

    async def read() -> dict[str, list[StoredEvent]]:
        store = await JournalStore.open(log, read_only=True)
        try:
            return {sid: await store.read(sid) for sid in await store.session_ids()}
        finally:
            await store.aclose()

    for sid, stored in trio.run(read).items():
        tline = timeline(sid, stored)
        (main,) = tline.branches
        turns = tuple(t[0] for t in expected[sid]["turns"])
        assert (main.branch_id, main.active, main.turns) == ("main", True, turns)
    done = tl("log", str(log), cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert "branches (" not in done.stdout
