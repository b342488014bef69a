"""``turnledger chat`` on a terminal: the real command in a pseudo-terminal,
driven key by key as a person types."""

from __future__ import annotations

import io
import json
import os
import re
import sys
from collections.abc import Iterator
from pathlib import Path

import pexpect
import pytest

from ._run import loopback_process, tl

pytestmark = pytest.mark.slow

LEFT, UP = "\x1b[D", "\x1b[A"
DIM = "\x1b[2m"


def spawn(tmp_path: Path, *args: str, **env: str) -> pexpect.spawn:
    environment = {
        **os.environ,
        "TERM": "xterm",
        "XDG_DATA_HOME": str(tmp_path / "xdg"),
        # A pseudo-terminal does not answer cursor position requests.
        "PROMPT_TOOLKIT_NO_CPR": "1",
        **env,
    }
    environment.pop("NO_COLOR", None) if "NO_COLOR" not in env else None
    return pexpect.spawn(
        sys.executable,
        ["-m", "turnledger", "chat", "--db", "t.db", *args],
        cwd=str(tmp_path),
        env=environment,
        encoding="utf-8",
        timeout=30,
        dimensions=(40, 120),
    )


def questions(tmp_path: Path, session: str | None = None) -> list[str]:
    r = tl("replay", "t.db", "--json", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    states = [json.loads(line) for line in r.stdout.splitlines()]
    return [t["question"] for s in states for t in s["turns"] if session in (None, s["session_id"])]


def finish(child: pexpect.spawn) -> str:
    """What the child printed until it ended, without the control sequences
    that set terminal modes (they move no cursor)."""
    child.expect(pexpect.EOF)
    child.close()
    return re.sub(r"\x1b\[[0-9;?]*[hlmJK]", "", str(child.before))


@pytest.fixture
def slow_server(tmp_path: Path) -> Iterator[str]:
    with loopback_process(tmp_path, "a slow answer " * 40, chunk_size=2, pause=0.03) as url:
        yield url


def test_arrow_keys_edit_the_line_and_never_reach_the_model(tmp_path: Path) -> None:
    child = spawn(tmp_path)
    child.expect("session   chat: a new session")
    child.expect("you>")
    child.send(f"helo{LEFT}{LEFT}l\r")  # "helo" with an "l" put back
    child.expect("earlier turn")
    child.expect("you>")
    child.send(f"{UP}{LEFT}{LEFT}{LEFT}{LEFT}H\x7f\r")  # recall, move, type, delete
    child.expect("held 1 earlier turn")
    child.expect("you>")
    child.send("/exit\r")
    finish(child)
    assert child.exitstatus == 0
    assert questions(tmp_path) == ["hello", "hello"]


def test_a_multi_line_paste_is_one_question(tmp_path: Path) -> None:
    child = spawn(tmp_path)
    child.expect("you>")
    child.send("\x1b[200~first line\nsecond line\nthird line\x1b[201~\r")
    child.expect("earlier turn")
    child.expect("you>")
    child.send("a\x1b\rb\r")  # Esc-Enter: an explicit new line
    child.expect("held 1 earlier turn")
    child.expect("you>")
    child.send("\x04")  # ^D ends the chat, with a newline
    rest = finish(child)
    assert child.exitstatus == 0 and rest.endswith("\n")
    assert questions(tmp_path) == ["first line\nsecond line\nthird line", "a\nb"]


def test_exit_quit_help_new_and_history(tmp_path: Path) -> None:
    child = spawn(tmp_path)
    child.expect("you>")
    child.send("/help\r")
    child.expect("/history")
    child.expect("you>")
    child.send("one\r")
    child.expect("earlier turn")
    child.send("/history\r")
    child.expect(r"\[1\] you: one")
    child.send("/new\r")
    child.expect("a new session: (chat-[0-9-]+)")
    fresh = child.match.group(1)
    child.send("two\r")
    child.expect("held 0 earlier turn")  # the fresh session starts empty
    child.send("/bogus\r")
    child.expect("unknown command /bogus")
    child.send("/quit\r")
    rest = finish(child)
    assert child.exitstatus == 0 and rest.endswith("\n")
    assert questions(tmp_path, "chat") == ["one"] and questions(tmp_path, fresh) == ["two"]
    # a second run resumes, and says so
    again = spawn(tmp_path)
    again.expect("session   chat: resumed 1 turns")
    again.send("/exit\r")
    finish(again)
    assert again.exitstatus == 0
    # a bare "exit" at the prompt ends the chat too and never reaches the model
    bare = spawn(tmp_path)
    bare.expect("you>")
    bare.send("exit\r")
    rest = finish(bare)
    assert bare.exitstatus == 0 and rest.endswith("\n")
    assert questions(tmp_path, "chat") == ["one"]


def test_the_spinner_shows_until_the_first_byte_and_goes(tmp_path: Path) -> None:
    with loopback_process(tmp_path, "here it is", delay=1.0) as url:
        child = spawn(tmp_path, "--base-url", url, "--model", "m")
        child.expect("you>")
        child.send("q\r")
        child.expect("waiting…")
        # then the line is wiped and the answer is written over it
        child.expect("\r\x1b\\[Khere it is")
        child.send("/exit\r")
        finish(child)
    assert child.exitstatus == 0


def test_a_discarded_turn_is_dimmed_and_marked_then_ctrl_c_exits_0(
    tmp_path: Path, slow_server: str
) -> None:
    child = spawn(tmp_path, "--base-url", slow_server, "--model", "m")
    child.expect("you>")
    child.send("tell me\r")
    child.expect("a slow")
    child.sendintr()  # Ctrl-C mid-answer: that turn is cancelled
    child.expect_exact(f"{DIM}a slow")  # the text shown is redrawn dimmed
    child.expect(r"\[not saved: discarded, reason=cancelled\]")
    child.expect("you>")
    child.sendintr()  # Ctrl-C at the prompt: a normal end
    rest = finish(child)
    assert child.exitstatus == 0 and rest.endswith("\n")
    assert questions(tmp_path) == []


def test_no_color_keeps_colour_out_and_says_it_in_words(tmp_path: Path, slow_server: str) -> None:
    child = spawn(tmp_path, "--base-url", slow_server, "--model", "m", NO_COLOR="1")
    child.expect("you>")
    child.send("tell me\r")
    child.expect("a slow")
    child.sendintr()
    child.expect(r"\[not saved: discarded, reason=cancelled\]")
    seen = str(child.before)
    child.expect("you>")
    child.send("/exit\r")
    finish(child)
    assert child.exitstatus == 0
    assert DIM not in seen and "\x1b[31m" not in seen and "\x1b[1m" not in seen


def test_log_lines_start_on_a_line_of_their_own(tmp_path: Path) -> None:
    # the transitions, as console lines on stderr (colourless with NO_COLOR)
    child = spawn(tmp_path, "-v", NO_COLOR="1")
    child.logfile_read = seen = io.StringIO()
    child.expect("you>")
    child.send("q\r")
    child.expect("tag=turn_committed")
    child.expect("you>")
    child.send("/exit\r")
    finish(child)
    shown = re.sub(r"\x1b\[[0-9;?]*[hlmJK]", "", seen.getvalue())
    lines = [line.rstrip("\r").rpartition("\r")[2] for line in shown.split("\n")]
    logged = [line for line in lines if "transition" in line]
    assert len(logged) >= 3 and "\x1b[2m" not in seen.getvalue()
    assert "\x1b[3" not in seen.getvalue()  # no colour: NO_COLOR
    for line in logged:  # each begins with its timestamp, after no answer text
        assert re.match(r"\d{4}-\d\d-\d\dT", line), line
