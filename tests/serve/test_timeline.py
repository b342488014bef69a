"""The timeline: its model (pure), and the page in a real browser (Debian's
chromium, headless, driven by Selenium: the ``browser`` fixture of
conftest.py), live from ``turnledger serve`` and as the static file."""

from __future__ import annotations

import re
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import httpx
import pytest
import trio

from serve._harness import Serve, loopback, post_turn, running
from turnledger.adapters.stores import SQLiteStore
from turnledger.events import Usage
from turnledger.serve import render_page, session_page, timeline_model
from turnledger.sessions import open_hub
from turnledger.testing import Chunk, Finish, Hang, MemoryStore, ScriptedProvider


def _script(request: Any) -> list[Any]:
    question = request.messages[-1].content
    if question.startswith("hang"):
        return [Chunk("partial "), Hang()]
    return [Chunk("fine "), Finish(usage=Usage(12, 3, 15))]


async def _supersede_session(store: Any) -> None:
    provider = ScriptedProvider(_script)
    async with open_hub(store, provider, model="m", on_busy="supersede") as hub:
        first = await hub.submit("sup", "hang please </script>{{js}}", request_id="old")
        async for _ in first.preview():
            break
        second = await hub.submit("sup", "the newer question", request_id="new")
        assert (await first.outcome()).reason == "superseded"  # type: ignore[union-attr]
        await second.outcome()


async def test_the_model_has_one_row_per_request_with_why_and_arrows() -> None:
    store = MemoryStore()
    await _supersede_session(store)
    model = timeline_model("sup", await store.read("sup"))
    old, new = model["turns"]
    assert old["request_id"] == "old" and old["end"] == "discarded"
    assert old["reason"] == "superseded" and old["superseded_by"] == "new"
    assert old["preview_chars"] == len("partial ")
    assert old["stream_started_at"] is not None
    assert old["explanation"].startswith("Not in history: a newer question (new) replaced it")
    assert new["end"] == "committed" and new["superseded_by"] is None
    assert new["usage"] == {"prompt_tokens": 12, "completion_tokens": 3, "total_tokens": 15}
    assert new["explanation"] == "In history: a complete answer was accepted."
    assert model["history"] == [
        {"request_id": "new", "question": "the newer question", "answer": "fine "}
    ]
    page = render_page(model)
    # the data cannot close the script element, nor be substituted into
    assert page.count("</script>") == 2
    assert page.count("{{js}}") == 1  # the question's text, escaped in the JSON


# --- the browser -------------------------------------------------------------


@pytest.fixture(scope="module")
def demo_db(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, str]:
    """A log holding a committed, a cancelled, two timed-out turns and a late
    completion: the demo plays them against its loopback server."""
    db = tmp_path_factory.mktemp("demo") / "demo.db"
    done = subprocess.run(
        [sys.executable, "-m", "turnledger", "demo", "--db", str(db)],
        capture_output=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    sessions = subprocess.run(
        [sys.executable, "-m", "turnledger", "sessions", str(db), "--json"],
        capture_output=True,
        check=True,
        timeout=60,
    )
    session = sessions.stdout.decode().split('"session_id": "')[1].split('"')[0]
    return db, session


def _wait(driver: Any, css: str, count: int = 1, timeout: float = 15) -> list[Any]:
    deadline = time.monotonic() + timeout
    while True:
        found = driver.find_elements("css selector", css)
        if len(found) >= count or time.monotonic() > deadline:
            return found
        time.sleep(0.1)


def _check_the_story(driver: Any, model: dict[str, Any]) -> None:
    rows = _wait(driver, "#timeline .row", len(model["turns"]))
    assert len(rows) == len(model["turns"])
    by_end: dict[str, list[Any]] = {}
    for row in rows:
        by_end.setdefault(row.get_attribute("data-reason"), []).append(row)
    committed = by_end["stop"][0]
    assert "committed" in committed.find_element("css selector", ".badge").text
    assert "In history" in committed.text
    cancelled = by_end["cancelled"][0]
    assert "discarded: cancelled" in cancelled.text
    assert "Not in history: the turn was cancelled by an explicit Stop" in cancelled.text
    timeouts = {r.find_element("css selector", ".badge").text for r in by_end["timeout"]}
    assert timeouts == {"discarded: timeout (idle)", "discarded: timeout (deadline)"}
    late_rows = [r for r in rows if r.find_elements("css selector", ".badge.late")]
    assert len(late_rows) == 1
    (late_turn,) = [t for t in model["turns"] if t["late"]]
    delay = late_turn["late"][0]["delay_s"]
    badge = late_rows[0].find_element("css selector", ".badge.late")
    assert badge.text == f"late answer +{delay:.3f}s"
    assert f"arrived {delay:.3f}s after the turn ended and was ignored" in late_rows[0].text
    assert late_rows[0].get_attribute("data-request-id") == late_turn["request_id"]
    assert late_rows[0].find_elements("css selector", ".mark.late")
    history = driver.find_element("css selector", "#history")
    assert f"History ({len(model['history'])} committed turns)" in history.text
    for turn in model["history"]:
        assert turn["question"] in history.text


def test_the_live_page_tells_each_turns_story(
    browser: Any, demo_db: tuple[Path, str], tmp_path: Path
) -> None:
    db, session = demo_db
    with loopback() as provider, running(db, provider.openai_base_url) as serve:
        model = httpx.get(f"{serve.url}/v1/sessions/{session}/timeline").json()
        browser.get(serve.url + "/")
        link = _wait(browser, f'#sessions a[data-session-id="{session}"]')[0]
        link.click()
        _check_the_story(browser, model)
        assert "following live" in browser.find_element("css selector", "#live").text
        browser.save_screenshot(str(tmp_path / "live-timeline.png"))
        _follows_a_live_session(browser, serve, tmp_path)
    assert (tmp_path / "live-timeline.png").stat().st_size > 10_000


def _follows_a_live_session(browser: Any, serve: Serve, tmp_path: Path) -> None:
    with serve.client() as c:
        post_turn(c, "live-1", "hello", rid="first")
        browser.get(f"{serve.url}/#session=live-1")
        assert _wait(browser, '#timeline .row[data-request-id="first"]')
        assert len(browser.find_elements("css selector", "#timeline .row")) == 1
        with c.stream("POST", "/v1/sessions/live-1/turns",
                      json={"question": "slow 40", "request_id": "second"}):  # fmt: skip
            rows = _wait(browser, '#timeline .row[data-end="in_flight"]', 1)
            assert rows and "in flight" in rows[0].text
            browser.save_screenshot(str(tmp_path / "live-in-flight.png"))
        # the client went away; the turn still commits, and the page shows it
        rows = _wait(browser, '#timeline .row[data-request-id="second"][data-end="committed"]')
        assert rows, browser.find_element("css selector", "#timeline").text
        assert (
            "History (2 committed turns)" in browser.find_element("css selector", "#history").text
        )


def test_the_static_file_tells_the_same_story(
    browser: Any, demo_db: tuple[Path, str], tmp_path: Path
) -> None:
    db, session = demo_db

    out = tmp_path / "timeline.html"
    cmd = [sys.executable, "-m", "turnledger", "log", str(db), "--session", session]
    done = subprocess.run([*cmd, "--html", str(out)], capture_output=True, timeout=60)
    assert done.returncode == 0, done.stderr
    page = out.read_text(encoding="utf-8")

    async def read() -> dict[str, Any]:
        store = await SQLiteStore.open(str(db), read_only=True)
        try:
            assert await session_page(store, session) == page
            return timeline_model(session, await store.read(session))
        finally:
            await store.aclose()

    model = trio.run(read)
    # self-contained: nothing to fetch (no external script, style, font or image)
    assert re.search(r"(src|href)\s*=|<link|@import|url\((?!#)", page) is None
    browser.get(out.as_uri())
    _check_the_story(browser, model)
    assert not browser.find_elements("css selector", "#sessions a")
    # without --session there is no page to draw; an unknown session is not found
    assert (
        subprocess.run([*cmd[:5], "--html", str(out)], capture_output=True, timeout=60).returncode
        == 2
    )
    missing = [*cmd[:5], "--session", "nope", "--html", str(tmp_path / "n.html")]
    assert subprocess.run(missing, capture_output=True, timeout=60).returncode == 4
    assert not (tmp_path / "n.html").exists()
    browser.save_screenshot(str(tmp_path / "static-timeline.png"))


def test_the_static_file_draws_the_supersede_arrow(browser: Any, tmp_path: Path) -> None:
    async def build() -> str:
        store = MemoryStore()
        await _supersede_session(store)
        return render_page(timeline_model("sup", await store.read("sup")))

    out = tmp_path / "supersede.html"
    out.write_text(trio.run(build), encoding="utf-8")
    browser.get(out.as_uri())
    old = _wait(browser, '#timeline .row[data-request-id="old"]')[0]
    assert "↷ superseded by new" in old.text
    assert "</script>{{js}}" in old.text  # the question is shown as text
    new = browser.find_element("css selector", '#timeline .row[data-request-id="new"]')
    assert "↶ supersedes old" in new.text
    assert "tokens 12 in + 3 out" in new.text
    assert len(_wait(browser, "svg.arrows > path")) == 1
    browser.save_screenshot(str(tmp_path / "supersede.png"))


def test_the_timeline_loads_no_io_library() -> None:
    # The static page is written without the server stack or the runtime.
    code = (
        "import sys, turnledger.serve as s; s.timeline_model; s.render_page; "
        "print(sorted(m for m in ('trio', 'httpx', 'starlette', 'hypercorn', 'sqlite3') "
        "if m in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, check=True, timeout=60)
    assert out.stdout.decode().strip() == "[]"
