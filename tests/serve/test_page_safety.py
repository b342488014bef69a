"""No stored text can break, script or disguise the timeline page, and the
page shows the session it names or says it cannot: in the real browser
(Debian's chromium, headless), live from ``turnledger serve`` and as the
static file of ``turnledger log --html``."""

from __future__ import annotations

import random
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
import trio

from serve._harness import ODD_IDS, Serve, loopback, running
from serve.test_timeline import _wait
from turnledger.adapters.stores import SQLiteStore
from turnledger.events import (
    DEFAULT_CODEC,
    CompletionIgnored,
    Event,
    SessionStarted,
    StreamStarted,
    ToolCall,
    ToolCallsRequested,
    ToolResultRecorded,
    ToolRoundSubmitted,
    TurnCommitted,
    TurnDiscarded,
    TurnRejected,
    TurnSubmitted,
)
from turnledger.serve import quote_id, session_page
from turnledger.text import visible

pytestmark = [pytest.mark.loopback]

#: Each calls ``__xss(n)`` (or ``alert(n)``) if it ever runs.
PAYLOADS = [
    "<script>__xss(0)</script>",
    "<img src=x onerror=__xss(1)>",
    "<svg onload=__xss(2)>",
    '"><img src=x onerror=alert(3)>',
    "'><script>alert(4)</script>",
    "</script><script>__xss(5)</script>",
    "<!--<script>__xss(6)//",
    '<iframe srcdoc="<script>parent.__xss(7)</script>"></iframe>',
    "javascript:__xss(8)",
    '<a href="javascript:__xss(9)">x</a>',
    "{{js}}${__xss(10)}{{data}}",
    "<math><mtext><table><mglyph><style><img src=x onerror=__xss(11)>",
    "<details open ontoggle=__xss(12)>",
    "\u2028\u2029<script>__xss(13)</script>",
    "<input autofocus onfocus=__xss(14)>",
    "<style>@import '//127.0.0.1:9/x.css'</style><link rel=stylesheet href=//127.0.0.1:9/y>",
    "]]><![CDATA[<script>__xss(16)</script>",
]


KINDS = ("committed", "discarded", "rejected")


def _turn(kind: str, rid: str, question: str, text: str) -> list[Event]:
    """A committed turn (with a tool round and a late answer), a discarded or
    a rejected one, with ``text`` in every field it has."""
    if kind == "rejected":
        return [TurnRejected(rid, "empty_question", text)]
    start: list[Event] = [TurnSubmitted(rid, question, 0, 0, 100), StreamStarted(rid)]
    if kind == "discarded":
        return [*start, TurnDiscarded(rid, "provider_error", text, 3)]
    return [
        *start,
        ToolCallsRequested(rid, 0, [ToolCall(text, text, text)], content=text),
        ToolResultRecorded(rid, text, text),
        ToolRoundSubmitted(rid, 1, 100),
        TurnCommitted(rid, text, "stop"),
        CompletionIgnored(rid, text),
    ]


async def _write(db: Path, sessions: dict[str, list[Event]]) -> None:
    store = await SQLiteStore.open(db)
    try:
        for sid, events in sessions.items():
            stored = [
                DEFAULT_CODEC.encode(e, session_id=sid, seq=n, recorded_at=1000.0 + n / 10)
                for n, e in enumerate(events, 1)
            ]
            await store.append(sid, stored, 0)
    finally:
        await store.aclose()


def _session(system: str, turns: list[tuple[str, str, str, str]]) -> list[Event]:
    events: list[Event] = [SessionStarted(system=system, model="m")]
    for kind, rid, question, text in turns:
        events += _turn(kind, rid, question, text)
    return events


def _clip(text: str, n: int) -> str:  # the page's clip()
    return text if len(text) <= n else text[: n - 1] + "…"


def _static_page(db: Path, sid: str, out: Path) -> str:
    """The page ``log --html`` writes (checked equal to :func:`session_page`)."""
    cmd = [sys.executable, "-m", "turnledger", "log", str(db), "--session", sid, "--html"]
    done = subprocess.run([*cmd, str(out)], capture_output=True, timeout=60)
    assert done.returncode == 0, done.stderr

    async def page() -> str | None:
        store = await SQLiteStore.open(db, read_only=True)
        try:
            return await session_page(store, sid)
        finally:
            await store.aclose()

    assert trio.run(page) == out.read_text(encoding="utf-8")
    return out.as_uri()


# What runs in every document before the page: it records any payload that
# runs (``__xss``, ``alert``) and every policy violation (a payload taken as
# markup would load or run something, which the policy refuses and reports).
_WATCH = """
window.__seen = { ran: [], violations: [] };
window.__xss = (n) => window.__seen.ran.push(n);
for (const f of ["alert", "confirm", "prompt"]) window[f] = (n) => window.__seen.ran.push(f + n);
document.addEventListener("securitypolicyviolation", (e) =>
  window.__seen.violations.push(`${e.effectiveDirective} ${e.blockedURI} ${e.sample}`));
"""


@contextmanager
def _watched(driver: Any) -> Iterator[None]:
    added = driver.execute_cdp_cmd("Page.addScriptToEvaluateOnNewDocument", {"source": _WATCH})
    try:
        yield
    finally:
        driver.execute_cdp_cmd(
            "Page.removeScriptToEvaluateOnNewDocument", {"identifier": added["identifier"]}
        )


_PROBE = """
const img = document.createElement("img");
img.src = "http://127.0.0.1:9/probe.png";
document.body.append(img);
const script = document.createElement("script");
try { script.textContent = "__xss('probe')"; } catch (e) { window.__seen.refused = e.name; }
document.body.append(script);
"""


def _nothing_ran(driver: Any) -> None:
    seen = driver.execute_script("return window.__seen")
    assert seen == {"ran": [], "violations": []}
    # the page's own style applied (its hash is in the policy)
    badge = driver.find_element("css selector", ".badge")
    assert badge.value_of_css_property("color") == "rgba(255, 255, 255, 1)"
    # and the policy is in force: an image or a script the page did not
    # bring is refused (a script's text is not even taken: Trusted Types)
    driver.execute_script(_PROBE)
    deadline = time.monotonic() + 5
    while not (seen := driver.execute_script("return window.__seen"))["violations"]:
        assert time.monotonic() < deadline, "no policy refused the probe"
        time.sleep(0.05)
    assert seen["ran"] == [] and seen["refused"] == "TypeError"
    assert any(v.startswith("img-src http://127.0.0.1:9/probe.png") for v in seen["violations"])


def _row(driver: Any, rid: str) -> Any:
    rows = _wait(driver, "#timeline .row")
    (row,) = [r for r in rows if r.get_attribute("data-request-id") == rid]
    return row


# --- markup in stored text ---------------------------------------------------


def test_markup_in_an_answer_leaves_every_row_on_the_static_page(
    browser: Any, tmp_path: Path
) -> None:
    # "<!--<script>" with no "-->" after it: the tokenizer's "script data
    # double escaped" state, which the element's own "</script>" cannot end.
    answer = "Old pages hid a script from old browsers with <!--<script> at its start."
    turns = [("committed", f"r{i}", f"q {i}", answer if i == 3 else "a") for i in range(0, 9, 3)]
    turns += [("committed", "r9", "<!--<script ", "fine")]  # the question too
    db = tmp_path / "html.db"
    trio.run(_write, db, {"html": _session("be brief", turns)})
    with _watched(browser):
        browser.get(_static_page(db, "html", tmp_path / "html.html"))
        rows = _wait(browser, "#timeline .row", 4)
        assert [r.get_attribute("data-request-id") for r in rows] == ["r0", "r3", "r6", "r9"]
        history = browser.find_element("css selector", "#history").text
        assert "History (4 committed turns)" in history and answer in history
        assert "<!--<script" in _row(browser, "r9").find_element("css selector", ".question").text
        _nothing_ran(browser)


def _hostile_db(tmp_path: Path) -> tuple[str, Path]:
    """A session whose every stored field (and id) holds a payload."""
    sid = "<img src=x onerror=__xss(99)>"
    turns = [(KINDS[i % 3], f"r{i} {p}", p, p) for i, p in enumerate(PAYLOADS)]
    db = tmp_path / "xss.db"
    trio.run(_write, db, {sid: _session(" ".join(PAYLOADS), turns)})
    return sid, db


_READ_ROWS = """
const text = (el, css) => el.querySelector(css)?.innerText ?? null;
return [
  [...document.querySelectorAll("#timeline .row")].map((row) => ({
    id: row.dataset.requestId, rid: text(row, ".rid"), question: text(row, ".question"),
    badge: text(row, ".badge"), late: row.querySelector(".mark.late")?.title ?? null,
  })),
  [...document.querySelectorAll("#history .a")].map((a) => a.innerText),
];"""


def _shown_as_text(driver: Any) -> None:
    _wait(driver, "#timeline .row", len(PAYLOADS))
    rows, answers = driver.execute_script(_READ_ROWS)
    assert [r["id"] for r in rows] == [f"r{i} {p}" for i, p in enumerate(PAYLOADS)]
    for i, (p, row) in enumerate(zip(PAYLOADS, rows, strict=True)):
        assert row["rid"] == visible(_clip(row["id"], 40))
        kind = KINDS[i % 3]
        if kind == "committed":  # the question, the answer, the late outcome
            assert row["question"] == visible(_clip(p, 90))
            assert visible(p) in answers
            assert row["late"] == f"late answer ({visible(p)})"
        else:  # the detail
            reason = "provider_error" if kind == "discarded" else "empty_question"
            assert row["badge"] == f"{kind}: {reason} ({visible(_clip(p, 40))})"


def test_payloads_in_every_stored_field_never_run_on_the_static_page(
    browser: Any, tmp_path: Path
) -> None:
    sid, db = _hostile_db(tmp_path)
    with _watched(browser):
        browser.get(_static_page(db, sid, tmp_path / "xss.html"))
        _shown_as_text(browser)
        assert browser.find_element("css selector", "h2").text == sid
        _nothing_ran(browser)


def test_payloads_in_every_stored_field_never_run_on_the_live_page(
    browser: Any, tmp_path: Path
) -> None:
    sid, db = _hostile_db(tmp_path)
    with loopback() as provider, running(db, provider.openai_base_url) as serve, _watched(browser):
        browser.get(serve.url + "/")
        _link(browser, sid).click()
        _shown_as_text(browser)
        assert browser.find_element("css selector", "#sessions .sid").text == sid
        _nothing_ran(browser)


# --- ids the path cannot carry as they are ---------------------------------


def _link(driver: Any, sid: str) -> Any:
    links = _wait(driver, "#sessions a")
    (link,) = [a for a in links if a.get_attribute("data-session-id") == sid]
    return link


@pytest.fixture(scope="module")
def odd_service(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Serve]:
    db = tmp_path_factory.mktemp("odd") / "odd.db"
    sessions = {
        sid: _session("", [("committed", f"r{n}", f"question of {n}", "answer")])
        for n, sid in enumerate(["plain", *ODD_IDS])
    }
    sessions["plain"] += _turn("committed", "more", "another plain question", "answer")
    trio.run(_write, db, sessions)
    with loopback() as provider, running(db, provider.openai_base_url) as serve:
        yield serve


def _shows(driver: Any, sid: str, rid: str, question: str) -> None:
    rows = _wait(driver, f'#timeline .row[data-request-id="{rid}"]')
    assert rows, driver.find_element("css selector", "#session").text
    assert driver.find_element("css selector", ".summary h2").text == visible(sid)
    shown = driver.find_elements("css selector", "#timeline .row .question")
    assert [q.text for q in shown] == [question]


def test_the_page_shows_each_session_it_lists_whatever_its_id(
    browser: Any, odd_service: Serve
) -> None:
    browser.get(odd_service.url + "/")
    _link(browser, "plain").click()
    assert len(_wait(browser, "#timeline .row", 2)) == 2
    for n, sid in enumerate(ODD_IDS, 1):
        _link(browser, sid).click()
        _shows(browser, sid, f"r{n}", f"question of {n}")
    assert "following live" in browser.find_element("css selector", "#live").text


def test_a_session_the_page_cannot_load_is_an_error_not_another_sessions_rows(
    browser: Any, odd_service: Serve
) -> None:
    for hash_, why in (("nope", "no session 'nope'"), ("%E0%A4%A", "bad percent-encoding")):
        browser.get(odd_service.url + "/#session=plain")
        assert len(_wait(browser, "#timeline .row", 2)) == 2
        browser.get(f"{odd_service.url}/#session={hash_}")
        error = _wait(browser, "#load-error")
        assert error and why in error[0].text
        assert not browser.find_elements("css selector", "#timeline .row")


def test_the_page_writes_an_id_into_a_path_as_quote_id_does(
    browser: Any, odd_service: Serve
) -> None:
    browser.get(odd_service.url + "/")
    _wait(browser, "#sessions a")
    rng = random.Random(7)
    alphabet = "~.%/?#& \t\n\x00aé\u202e😀\U0010fffd'()*!"
    ids = [*ODD_IDS, "~", "~.", "...", "%", "%7E", "."] + [
        "".join(rng.choice(alphabet) for _ in range(rng.randint(1, 6))) for _ in range(300)
    ]
    js = """
    return arguments[0].map((id) => {
      const segment = window.turnledger.idSegment(id);
      return [segment, new URL(`v1/sessions/${segment}/timeline`, location.href).pathname];
    });"""
    for sid, (segment, path) in zip(ids, browser.execute_script(js, ids), strict=True):
        assert segment == quote_id(sid), sid
        assert path == f"/v1/sessions/{segment}/timeline", sid  # the URL parser left it


# --- bidirectional and control characters -----------------------------------


def test_bidi_and_control_characters_are_shown_as_the_command_line_shows_them(
    browser: Any, tmp_path: Path
) -> None:
    question = "invoice_\u202efdp.exe"
    answer = "line one\nright-to-left \u2067override\u2069 \x1b[31m"
    sid = "bidi\u202eid"
    db = tmp_path / "bidi.db"
    trio.run(_write, db, {sid: _session("", [("committed", "r\u2066", question, answer)])})
    browser.get(_static_page(db, sid, tmp_path / "bidi.html"))
    row = _row(browser, "r\u2066")
    assert row.find_element("css selector", ".question").text == "invoice_\\u202efdp.exe"
    assert row.find_element("css selector", ".rid").text == "r\\u2066"
    assert browser.find_element("css selector", "h2").text == "bidi\\u202eid"
    shown = browser.find_element("css selector", "#history .a").text
    assert shown == visible(answer, lines=True)
    assert shown == "line one\nright-to-left \\u2067override\\u2069 \\x1b[31m"
    text = browser.execute_script("return document.body.innerText")
    assert not set(text) & {"\u202e", "\u2066", "\u2067", "\u2069", "\x1b"}
    assert row.find_elements("css selector", ".esc")  # marked as escapes
    assert browser.title == "turnledger: bidi\\u202eid"
    # the page's escapes are the command line's, for every code point
    every = "".join(chr(c) for c in range(0x30000) if not 0xD800 <= c <= 0xDFFF) + "\U0010ffff"
    assert browser.execute_script("return window.turnledger.visible(arguments[0])", every) == (
        visible(every)
    )
