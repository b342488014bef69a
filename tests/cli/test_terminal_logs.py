"""Log lines on a terminal: ``demo`` and ``chat`` tell their story in a
pseudo-terminal with no log line inside it; the log comes after the story,
or as it happens with ``-v``; a fact the command says in its own words is not
said again as a log line. JSON lines (piped, ``--log-json``) keep every line.
"""

from __future__ import annotations

import io
import json
import os
import re
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pexpect
import pytest
import structlog

from turnledger.cli._logs import MAX_HELD_LINES, CommandLog
from turnledger.runtime._log import EVENTS

from ._run import tl

pytestmark = pytest.mark.slow

#: A log record, as the console or JSON renders one: an ISO time stamp with
#: its level, a JSON ``event`` key, or a log event name followed by fields.
RECORD = re.compile(
    r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d+Z \[|\"event\": ?\"|"
    r"\b(?:" + "|".join(map(re.escape, EVENTS)) + r")\b\s+\w+="
)
#: The line the held log lines come under.
HEADING = re.compile(r"^── turnledger (\w+) logged (.+) \(held until the end; -v shows")
#: Controls a terminal acts on (colour, cursor moves, modes).
CONTROLS = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")


def spawn(tmp_path: Path, command: str, *args: str, **env: str) -> pexpect.spawn:
    environment = {
        **os.environ,
        "TERM": "xterm",
        "XDG_DATA_HOME": str(tmp_path / "xdg"),
        "PROMPT_TOOLKIT_NO_CPR": "1",
        **env,
    }
    if "NO_COLOR" not in env:
        environment.pop("NO_COLOR", None)
    return pexpect.spawn(
        sys.executable,
        ["-m", "turnledger", command, *args],
        cwd=str(tmp_path),
        env=environment,
        encoding="utf-8",
        timeout=90,
        dimensions=(40, 200),
    )


def screen_lines(child: pexpect.spawn, seen: io.StringIO) -> list[str]:
    """The lines the child wrote, as a person reads them: no controls, and
    of a line redrawn with a carriage return only what is left."""
    child.expect(pexpect.EOF)
    child.close()
    text = CONTROLS.sub("", seen.getvalue())
    return [line.rstrip("\r").rpartition("\r")[2] for line in text.split("\n")]


def run_demo(tmp_path: Path, *args: str, **env: str) -> tuple[list[str], int]:
    child = spawn(tmp_path, "demo", "--db", "d.db", *args, **env)
    child.logfile_read = seen = io.StringIO()
    lines = screen_lines(child, seen)
    return lines, child.exitstatus


def test_demo_tells_its_story_then_shows_the_log_after_it(tmp_path: Path) -> None:
    lines, status = run_demo(tmp_path)  # colours on: stripped by screen_lines
    assert status == 0, "\n".join(lines)
    headings = [i for i, line in enumerate(lines) if HEADING.match(line)]
    assert len(headings) == 1, "\n".join(lines)
    story, log = lines[: headings[0]], lines[headings[0] + 1 :]
    # the whole story, and no log record in any line of it
    assert story[0].startswith("turnledger demo: a scripted conversation")
    assert any(line.startswith("See the whole story:") for line in story)
    assert "  openai-responses  committed (finish_reason=stop)" in story
    assert [line for line in story if RECORD.search(line)] == []
    # after it, the warnings the story held back: as many as the heading says
    records = [line for line in log if RECORD.search(line)]
    match = HEADING.match(lines[headings[0]])
    assert match is not None and match.group(2) == f"{len(records)} warnings"
    assert len(records) >= 2 and all("context_window_fallback" in r for r in records)
    assert all(re.match(r"\d{4}-\d\d-\d\dT", r) for r in records)  # each a line of its own


def test_demo_with_v_shows_the_log_as_it_happens_on_lines_of_their_own(tmp_path: Path) -> None:
    lines, status = run_demo(tmp_path, "-v", NO_COLOR="1")
    assert status == 0, "\n".join(lines)
    assert not [line for line in lines if HEADING.match(line)]  # nothing was held
    records = [i for i, line in enumerate(lines) if RECORD.search(line)]
    # live: transitions among the scenes, before the replay from disk
    replaying = lines.index("── Replaying the log from disk")
    assert len([i for i in records if i < replaying and "transition" in lines[i]]) > 10
    for i in records:  # each starts a line of its own, with its time stamp
        assert re.match(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d+Z \[", lines[i]), lines[i]
    story = [line for i, line in enumerate(lines) if i not in set(records)]
    assert "  replayed history matches the live session (2 turns)" in story


def chat(tmp_path: Path, *args: str, **env: str) -> list[str]:
    """A chat with the built-in loopback server in a pseudo-terminal: one
    question, then /exit; the lines it showed."""
    child = spawn(tmp_path, "chat", "--db", "t.db", *args, **env)
    child.logfile_read = seen = io.StringIO()
    child.expect("you>")
    child.send("hello\r")
    child.expect("held 0 earlier turn")
    child.expect("you>")
    child.send("/exit\r")
    lines = screen_lines(child, seen)
    assert child.exitstatus == 0, "\n".join(lines)
    return lines


WINDOW = (
    "  window    context window 8192 tokens (fallback: the server does not report a "
    "context window), 2048 kept for the answer; prompt budget ~6144 tokens"
)


def test_chat_says_the_window_once_in_its_own_words(tmp_path: Path) -> None:
    lines = chat(tmp_path)
    # the loopback server reports no window: the fallback, and why, in the window line
    assert WINDOW in lines
    assert [line for line in lines if RECORD.search(line)] == []
    assert not [line for line in lines if "context_window" in line]
    assert not [line for line in lines if HEADING.match(line)]  # nothing else to show
    assert any("(loopback) You said: 'hello'" in line for line in lines)


def test_chat_with_v_logs_the_turn_as_it_happens_but_not_the_window(tmp_path: Path) -> None:
    lines = chat(tmp_path, "-v", NO_COLOR="1")
    assert WINDOW in lines
    records = [line for line in lines if RECORD.search(line)]
    assert [r for r in records if "tag=turn_committed" in r]
    # (the session_started transition carries the window's fields, as the event does)
    assert not [r for r in records if re.search(r"\] context_window(_fallback)? ", r)]
    for line in records:
        assert re.match(r"\d{4}-\d\d-\d\dT", line), line


def test_chat_with_log_json_on_a_terminal_keeps_every_line(tmp_path: Path) -> None:
    lines = chat(tmp_path, "--log-json")
    logged = [json.loads(line) for line in lines if line.startswith("{")]
    events = [x["event"] for x in logged]
    # JSON lines as they happen, these two included (the window line says it too)
    assert "context_window_fallback" in events and "context_window" in events
    assert "transition" in events
    assert WINDOW in lines
    assert not [line for line in lines if HEADING.match(line)]


def test_piped_chat_keeps_the_json_lines(tmp_path: Path) -> None:
    r = tl("chat", "--db", "p.db", cwd=tmp_path, stdin="hello\n")
    assert r.returncode == 0, r.stderr
    events = [json.loads(line)["event"] for line in r.stderr.splitlines()]
    assert "context_window_fallback" in events and "context_window" in events
    assert not HEADING.search(r.stderr) and "window" not in r.stdout


# --- the command's log, in this process -----------------------------------------


class _Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


@pytest.fixture
def terminal() -> Iterator[_Terminal]:
    yield _Terminal()
    structlog.reset_defaults()


def _log(**fields: Any) -> None:
    structlog.get_logger("turnledger.test").warning(**fields)


def test_held_lines_wait_for_release_and_are_shown_once(terminal: _Terminal) -> None:
    log = CommandLog(terminal, json=None, verbosity=0, hold=True)
    log.configure()
    assert log.holding and not log.json
    _log(event="append_conflict", attempt=1)
    structlog.get_logger().error("store_error", error="StoreFull")
    structlog.get_logger().info("transition", tag="turn_committed")  # below WARNING
    assert terminal.getvalue() == ""
    log.release("demo")
    shown = terminal.getvalue().splitlines()
    assert shown[0] == ""
    assert shown[1].startswith("── turnledger demo logged 1 error, 1 warning (held")
    assert len(shown) == 4 and "append_conflict" in shown[2] and "store_error" in shown[3]
    log.release("demo")
    assert terminal.getvalue().splitlines() == shown


def test_held_lines_are_bounded(terminal: _Terminal) -> None:
    log = CommandLog(terminal, json=None, verbosity=0, hold=True)
    log.configure()
    for i in range(MAX_HELD_LINES + 7):
        _log(event="append_conflict", attempt=i)
    log.release("chat")
    shown = terminal.getvalue().splitlines()
    assert len([line for line in shown if "append_conflict" in line]) == MAX_HELD_LINES
    assert shown[-1] == "… and 7 more log lines, not kept"
    assert f"logged {MAX_HELD_LINES + 7} warnings" in shown[1]


@pytest.mark.parametrize(
    ("json_", "verbosity", "hold", "holding"),
    [
        (None, 1, True, False),
        (True, 0, True, False),
        (None, 0, False, False),
        (None, 0, True, True),
    ],
)
def test_only_a_story_on_a_terminal_without_v_is_held(
    terminal: _Terminal, json_: bool | None, verbosity: int, hold: bool, holding: bool
) -> None:
    log = CommandLog(terminal, json=json_, verbosity=verbosity, hold=hold)
    log.configure()
    _log(event="append_conflict", attempt=1)
    assert log.holding is holding
    assert ("append_conflict" in terminal.getvalue()) is not holding


@pytest.mark.parametrize("json_", [None, True])
def test_a_told_event_is_noted_and_left_to_the_command_on_a_console(
    terminal: _Terminal, json_: bool | None
) -> None:
    log = CommandLog(terminal, json=json_, verbosity=0, hold=True, told=["context_window_fallback"])
    log.configure()
    assert log.noted("context_window_fallback") is None
    _log(event="context_window_fallback", model="m", detail="no window reported")
    noted = log.noted("context_window_fallback")
    assert noted is not None and noted["detail"] == "no window reported"
    log.release("chat")
    # JSON keeps the line; a console leaves it to the command's own words
    assert ("context_window_fallback" in terminal.getvalue()) is (json_ is True)
