"""``turnledger chat``, run as a user runs it: real processes, real files."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from _procs import within

from ._run import NASTY, loopback_process, read_terminal, tl

pytestmark = pytest.mark.slow


def test_chat_through_a_pipe_commits_two_turns(tmp_path: Path) -> None:
    r = tl("chat", "--db", "x.db", cwd=tmp_path, stdin="q1\nq2\n")
    assert r.returncode == 0, r.stderr
    assert r.stdout.splitlines() == [
        "(loopback) You said: 'q1'. The request held 0 earlier turn(s).",
        "(loopback) You said: 'q2'. The request held 1 earlier turn(s).",
    ]
    replay = tl("replay", "x.db", "--json", cwd=tmp_path)
    assert replay.returncode == 0
    (session,) = [json.loads(line) for line in replay.stdout.splitlines()]
    assert [t["question"] for t in session["turns"]] == ["q1", "q2"]
    assert session["session_id"] == "chat" and session["phase"] == "committed"
    log = tl("log", "x.db", cwd=tmp_path)
    assert log.returncode == 0
    lines = log.stdout.splitlines()
    # every event: session_started + 2 x (submitted, started, committed)
    assert sum(" turn_committed " in line for line in lines) == 2
    assert sum(" turn_submitted " in line for line in lines) == 2
    assert sum(" stream_started " in line for line in lines) == 2
    assert any(" session_started " in line for line in lines)
    # a second chat continues the same session: history is carried
    r2 = tl("chat", "--db", "x.db", cwd=tmp_path, stdin="q3\n")
    assert "held 2 earlier turn(s)" in r2.stdout
    sessions = tl("sessions", "x.db", "--json", cwd=tmp_path)
    (summary,) = [json.loads(line) for line in sessions.stdout.splitlines()]
    assert (summary["turns"], summary["last_outcome"]) == (3, "committed")


def test_changed_settings_on_an_existing_session_are_refused_until_new(tmp_path: Path) -> None:
    first = tl("chat", "--db", "x.db", "--system", "Be brief.", cwd=tmp_path, stdin="q1\n")
    assert first.returncode == 0, first.stderr
    # the same session with another system prompt: refused before any turn
    changed = tl("chat", "--db", "x.db", "--system", "Be long.", cwd=tmp_path, stdin="q2\n")
    assert changed.returncode == 2
    assert "--new" in changed.stderr and changed.stdout == ""
    # --new starts a fresh session with the new settings; the old one is as it was
    fresh = tl("chat", "--db", "x.db", "--system", "Be long.", "--new", cwd=tmp_path, stdin="q2\n")
    assert fresh.returncode == 0, fresh.stderr
    sessions = tl("replay", "x.db", "--json", cwd=tmp_path)
    by_id = {s["session_id"]: s for s in map(json.loads, sessions.stdout.splitlines())}
    assert [t["question"] for t in by_id["chat"]["turns"]] == ["q1"]
    (other,) = [s for sid, s in by_id.items() if sid != "chat"]
    assert other["session_id"].startswith("chat-")
    assert [t["question"] for t in other["turns"]] == ["q2"]


def test_chat_over_a_journal_and_replay_at_an_earlier_event(tmp_path: Path) -> None:
    r = tl("chat", "--db", "x.jsonl", "--session", "j", cwd=tmp_path, stdin="one\ntwo\n")
    assert r.returncode == 0, r.stderr
    # after the first commit (seq 4) the history held one turn
    at = tl("replay", "x.jsonl", "--at", "4", "--json", cwd=tmp_path)
    (state,) = [json.loads(line) for line in at.stdout.splitlines()]
    assert [t["question"] for t in state["turns"]] == ["one"] and state["version"] == 4
    for line in (tmp_path / "x.jsonl").read_text(encoding="utf-8").splitlines():
        json.loads(line)  # jq-friendly: one JSON object per line


def test_rejected_and_failed_turns_exit_1_and_keep_history(tmp_path: Path) -> None:
    big = "x" * 500
    r = tl("chat", "--db", "x.db", "--max-request-bytes", "300", cwd=tmp_path, stdin=f"ok\n{big}\n")
    assert r.returncode == 1
    assert "rejected, reason=over_budget" in r.stderr
    replay = tl("replay", "x.db", "--json", cwd=tmp_path)
    assert len(json.loads(replay.stdout)["turns"]) == 1


def test_ctrl_c_cancels_the_turn_and_keeps_the_chat_open(tmp_path: Path) -> None:
    # A server that streams slowly: Ctrl-C lands mid-answer.
    with loopback_process(tmp_path, "a slow answer " * 40, chunk_size=2, pause=0.02) as base_url:
        chat = subprocess.Popen(
            [sys.executable, "-m", "turnledger", "chat", "--db", "c.db", "--model", "m",
             "--base-url", base_url],
            cwd=tmp_path, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
            text=True, env={**os.environ, "PYTHONUNBUFFERED": "1"},
        )  # fmt: skip
        assert chat.stdin is not None and chat.stdout is not None
        chat.stdin.write("first question\n")
        chat.stdin.flush()
        assert within(60, lambda: chat.stdout.read(10)) == "a slow ans"  # the answer is streaming
        chat.send_signal(signal.SIGINT)
        time.sleep(0.5)
        assert chat.poll() is None, "Ctrl-C during a turn must not end the chat"
        _, err = chat.communicate("second question\n", timeout=60)
        assert chat.returncode == 0  # a turn cancelled with Ctrl-C is no failure
        assert "discarded, reason=cancelled" in err
    replay = tl("replay", "c.db", "--json", cwd=tmp_path)
    (state,) = [json.loads(line) for line in replay.stdout.splitlines()]
    assert [t["question"] for t in state["turns"]] == ["second question"]


def test_ctrl_c_at_the_prompt_exits_cleanly(tmp_path: Path) -> None:
    chat = subprocess.Popen(
        [sys.executable, "-m", "turnledger", "chat", "--db", "c.db"],
        cwd=tmp_path, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
        text=True, env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )  # fmt: skip
    try:
        assert chat.stdin is not None and chat.stdout is not None
        chat.stdin.write("hello\n")
        chat.stdin.flush()
        # the answer arrived: the chat is up and back at its prompt
        assert "You said: 'hello'" in within(60, chat.stdout.readline)
        chat.send_signal(signal.SIGINT)
        # stdin stays open: only the Ctrl-C can end the chat here
        returncode = chat.wait(timeout=30)
        _, err = chat.communicate(timeout=30)
    finally:
        chat.kill()
    assert returncode == 0, err
    assert "Traceback" not in err


@pytest.mark.parametrize(
    "args",
    [
        ["--base-url", "http://127.0.0.1:9/v1"],  # no --model
        ["--timeout", "0"],
        ["--max-request-bytes", "-5"],
        ["--base-url", "http://127.0.0.1:9/v1", "--model", "m", "--param", "model=1"],
        ["--param", "temperature=NaN"],
        ["--param", "nojson"],
        ["--provider", "ollama", "--param", "options=3"],
        ["--base-url", "http://[::1", "--model", "m"],
        ["--base-url", "http://127.0.0.1:9/v1", "--model", "m", "--api-key-env", "TL_UNSET_KEY"],
        ["--session", ""],
        ["--session", b"s\xff"],  # a non-UTF-8 byte: a lone surrogate in argv
        ["--system", ""],
        ["--system", b"be \xffbrief"],
        ["--base-url", "ftp://127.0.0.1:9/v1", "--model", "m"],
        ["--base-url", "127.0.0.1:8080", "--model", "m"],
        ["--base-url", "http://", "--model", "m"],
        ["--base-url", "http://127.0.0.1:port/v1", "--model", "m"],
        ["--max-tokens", "0"],
        ["--max-tokens", "-3"],
    ],
)
def test_chat_usage_errors_exit_2_before_touching_anything(
    tmp_path: Path, args: list[str | bytes]
) -> None:
    env_clean = {k: v for k, v in os.environ.items() if k != "TL_UNSET_KEY"}
    r = subprocess.run(
        [sys.executable, "-m", "turnledger", "chat", "--db", "x.db", *args],
        cwd=tmp_path, input="q\n", capture_output=True, text=True, timeout=60, env=env_clean,
    )  # fmt: skip
    assert r.returncode == 2, r.stderr
    assert "Traceback" not in r.stderr
    assert list(tmp_path.iterdir()) == []  # no store was created


def test_logging_options_work_after_the_command_and_hide_passwords(tmp_path: Path) -> None:
    r = tl("chat", "--db", "x.db", "--log-json", "-v", cwd=tmp_path, stdin="q\n")
    assert r.returncode == 0
    lines = [json.loads(line) for line in r.stderr.splitlines()]
    assert {"message_received", "transition"} <= {line["event"] for line in lines}
    dsn = "postgresql://postgres:hunter2SECRET@127.0.0.1:1/test"
    r = tl("sessions", dsn, cwd=tmp_path)
    assert r.returncode == 3
    assert "hunter2SECRET" not in r.stderr and "postgres:***@127.0.0.1" in r.stderr


def test_undecodable_input_lines_are_refused_one_by_one(tmp_path: Path) -> None:
    # A strict UTF-8 locale: a bad line is refused with a message, and every
    # valid line, before or after it, is submitted.
    r = subprocess.run(
        [sys.executable, "-m", "turnledger", "chat", "--db", "x.db"],
        cwd=tmp_path, input=b"ok1\n\xff\xfe binary\nok2\nnul\x00byte\r\nok3", capture_output=True,
        timeout=60, env={**os.environ, "PYTHONIOENCODING": "utf-8:strict"},
    )  # fmt: skip
    err = r.stderr.decode()
    assert r.returncode == 1, err  # two lines were not submitted
    assert "Traceback" not in err
    assert "[line 2 refused: not UTF-8 (byte 0xff at offset 0)]" in err
    assert "[line 4 refused: it holds a NUL character]" in err
    replay = tl("replay", "x.db", "--json", cwd=tmp_path)
    questions = [t["question"] for t in json.loads(replay.stdout)["turns"]]
    assert questions == ["ok1", "ok2", "ok3"]


def test_chat_escapes_control_characters_on_a_terminal_only(tmp_path: Path) -> None:
    import pty

    answer = f"two lines:{NASTY}\nend"
    with loopback_process(tmp_path, answer) as base_url:
        command = [sys.executable, "-m", "turnledger", "chat", "--model", "m", "--base-url",
                   base_url]  # fmt: skip
        piped = subprocess.run(
            [*command, "--db", "p.db"], cwd=tmp_path, input=b"q\n", capture_output=True, timeout=60
        )
        main, terminal = pty.openpty()
        try:
            chat = subprocess.run(
                [*command, "--db", "t.db"], cwd=tmp_path, input=b"q\n", stdout=terminal,
                stderr=subprocess.PIPE, timeout=60, env={**os.environ, "OPENAI_API_KEY": "k"},
            )  # fmt: skip
            os.close(terminal)
            seen = read_terminal(main)
        finally:
            os.close(main)
    assert chat.returncode == 0, chat.stderr
    on_terminal = seen.decode().replace("\r\n", "\n")  # the terminal's own line ends
    assert on_terminal == "two lines:\\x1b]0;owned\\x07\\x1b[2J\\x0d\\x9b\\u202e\nend\n"
    # through a pipe the answer is the text itself
    assert piped.stdout.decode() == f"two lines:{NASTY}\nend\n"
