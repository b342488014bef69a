"""The command line, run as a user runs it: real processes, real files."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow


def tl(
    *args: str, cwd: Path, stdin: str | None = None, timeout: float = 60
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "turnledger", *args],
        cwd=cwd,
        input=stdin,
        capture_output=True,
        text=True,
        timeout=timeout,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )


def test_demo_runs_end_to_end_and_replays(tmp_path: Path) -> None:
    r = tl("demo", cwd=tmp_path)
    assert r.returncode == 0, r.stdout + r.stderr
    out = r.stdout
    db = tmp_path / "turnledger-demo.db"
    assert db.exists() and str(db) in out
    for expected in (
        "outcome: committed",
        "reason=timeout",
        "dropped to fit",
        "history unchanged by the trim and the timeout: yes",
        "reason=cancelled",
        "reason=http_status: HTTP 429",
        "reason=incomplete_finish: finish_reason=length",
        "recorded as completion_ignored",
        "replayed history matches the live session (2 turns)",
    ):
        assert expected in out, expected
    # the error body never reaches the transcript, the logs or the log file
    assert "/srv/app/limits.py" not in out + r.stderr
    assert b"/srv/app/limits.py" not in db.read_bytes()
    # and the file tells the same story to `log` and `replay`
    log = tl("log", str(db), "--json", cwd=tmp_path)
    rows = [json.loads(line) for line in log.stdout.splitlines()]
    tags = [row["event"] for row in rows]
    assert tags.count("turn_committed") == 2
    assert "completion_ignored" in tags
    late = next(row for row in rows if row["event"] == "completion_ignored")
    assert late["late_by"] > 0.3
    reasons = {row["reason"] for row in rows if row["event"] == "turn_discarded"}
    assert reasons == {"timeout", "cancelled", "http_status", "incomplete_finish"}
    replay = tl("replay", str(db), "--json", cwd=tmp_path)
    (session,) = [json.loads(line) for line in replay.stdout.splitlines()]
    assert len(session["turns"]) == 2


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


def test_chat_over_a_journal_and_replay_at_an_earlier_event(tmp_path: Path) -> None:
    r = tl("chat", "--db", "x.jsonl", "--session", "j", cwd=tmp_path, stdin="one\ntwo\n")
    assert r.returncode == 0, r.stderr
    # after the first commit (seq 4) the history held one turn
    at = tl("replay", "x.jsonl", "--at", "4", "--json", cwd=tmp_path)
    (state,) = [json.loads(line) for line in at.stdout.splitlines()]
    assert [t["question"] for t in state["turns"]] == ["one"] and state["version"] == 4
    for line in (tmp_path / "x.jsonl").read_text(encoding="utf-8").splitlines():
        json.loads(line)  # jq-friendly: one JSON object per line


def test_replay_at_an_event_reads_no_further(tmp_path: Path) -> None:
    # A log whose 4th event this release cannot read (a newer release wrote
    # it): the view after event 3 still replays; the whole log is refused.
    import trio

    from turnledger.adapters.stores import SQLiteStore
    from turnledger.events import DEFAULT_CODEC, StoredEvent
    from turnledger.testing import sample_events

    async def write() -> None:
        store = await SQLiteStore.open(tmp_path / "x.db")
        first = sample_events()[:3]  # started, submitted, rejected
        batch = [DEFAULT_CODEC.encode(e, session_id="s", seq=i, recorded_at=1.7e9)
                 for i, e in enumerate(first, 1)]  # fmt: skip
        batch.append(StoredEvent("s", 4, "from_the_future", 1, {"x": 1}, 1.7e9))
        await store.append("s", batch, 0)
        await store.aclose()

    trio.run(write)
    at = tl("replay", "x.db", "--at", "3", "--json", cwd=tmp_path)
    assert at.returncode == 0, at.stderr
    assert json.loads(at.stdout)["version"] == 3
    whole = tl("replay", "x.db", cwd=tmp_path)
    assert whole.returncode == 3
    assert "the log is corrupt: session 's' seq 4" in whole.stderr


@pytest.mark.parametrize("kind", ["sqlite", "postgres"])
def test_replay_at_an_event_before_a_damaged_payload(
    tmp_path: Path, kind: str, request: pytest.FixtureRequest
) -> None:
    # The 4th payload is not JSON (damage): the view after event 3 replays
    # without parsing it, a slice at a time like the whole log; the whole
    # log is refused as corrupt, naming the event.
    import trio

    from turnledger.adapters.stores import open_store
    from turnledger.events import DEFAULT_CODEC
    from turnledger.testing import sample_events

    db = request.getfixturevalue("pg_dsn") if kind == "postgres" else str(tmp_path / "x.db")

    async def write() -> None:
        store = await open_store(db)
        first = sample_events()[:4]  # started, submitted, rejected, stream started
        batch = [DEFAULT_CODEC.encode(e, session_id="s", seq=i, recorded_at=1.7e9)
                 for i, e in enumerate(first, 1)]  # fmt: skip
        await store.append("s", batch, 0)
        await store.aclose()

    trio.run(write)
    damage = "UPDATE {} SET {} = '{{\"request_id\": ' WHERE seq = 4"
    if kind == "postgres":
        import psycopg

        with psycopg.connect(db, autocommit=True) as conn:
            conn.execute(damage.format("turnledger_events", "payload_text"))
    else:
        import sqlite3

        with sqlite3.connect(db) as conn:
            conn.execute(damage.format("events", "payload"))
        conn.close()
    at = tl("replay", db, "--at", "3", "--json", cwd=tmp_path)
    assert at.returncode == 0, at.stderr
    state = json.loads(at.stdout)
    assert (state["version"], state["phase"]) == (3, "pending")
    whole = tl("replay", db, cwd=tmp_path)
    assert whole.returncode == 3, whole.stderr
    assert "session 's' seq 4" in whole.stderr and "not JSON" in whole.stderr
    later = tl("replay", db, "--at", "4", cwd=tmp_path)
    assert later.returncode == 3 and "seq 4" in later.stderr


def test_rejected_and_failed_turns_exit_1_and_keep_history(tmp_path: Path) -> None:
    big = "x" * 500
    r = tl("chat", "--db", "x.db", "--max-request-bytes", "300", cwd=tmp_path, stdin=f"ok\n{big}\n")
    assert r.returncode == 1
    assert "rejected, reason=over_budget" in r.stderr
    replay = tl("replay", "x.db", "--json", cwd=tmp_path)
    assert len(json.loads(replay.stdout)["turns"]) == 1


def test_exit_codes_for_scripts(tmp_path: Path) -> None:
    assert tl("replay", "missing.db", cwd=tmp_path).returncode == 4
    assert tl("log", "missing.jsonl", cwd=tmp_path).returncode == 4
    assert tl("replay", "--bogus", cwd=tmp_path).returncode == 2
    (tmp_path / "garbage.db").write_bytes(b"this is not a database" * 100)
    bad = tl("replay", "garbage.db", cwd=tmp_path)
    assert bad.returncode == 3 and "garbage.db" in bad.stderr
    tl("chat", "--db", "x.db", cwd=tmp_path, stdin="q\n")
    assert tl("log", "x.db", "--request", "nope", cwd=tmp_path).returncode == 4
    assert tl("replay", "x.db", "--session", "nope", cwd=tmp_path).returncode == 4
    for command in ("demo", "chat", "replay", "log", "sessions"):
        h = tl(command, "--help", cwd=tmp_path)
        assert h.returncode == 0 and "usage: turnledger" in h.stdout


def test_ctrl_c_cancels_the_turn_and_keeps_the_chat_open(tmp_path: Path) -> None:
    # A server that streams slowly: Ctrl-C lands mid-answer.
    script = tmp_path / "server.py"
    script.write_text(
        "import sys, time\n"
        "from turnledger.testing import LoopbackServer, chat_responder\n"
        "answer = lambda messages: 'a slow answer ' * 40\n"
        "server = LoopbackServer(chat_responder(answer, chunk_size=2, pause=0.02))\n"
        "with server.start_in_thread() as s:\n"
        "    print(s.openai_base_url, flush=True)\n"
        "    sys.stdin.read()\n"
    )
    server = subprocess.Popen(
        [sys.executable, str(script)], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    )
    try:
        assert server.stdout is not None
        base_url = server.stdout.readline().strip()
        chat = subprocess.Popen(
            [sys.executable, "-m", "turnledger", "chat", "--db", "c.db", "--model", "m",
             "--base-url", base_url],
            cwd=tmp_path, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
            text=True, env={**os.environ, "PYTHONUNBUFFERED": "1"},
        )  # fmt: skip
        assert chat.stdin is not None and chat.stdout is not None
        chat.stdin.write("first question\n")
        chat.stdin.flush()
        assert chat.stdout.read(10) == "a slow ans"  # the answer is streaming
        chat.send_signal(signal.SIGINT)
        time.sleep(0.5)
        assert chat.poll() is None, "Ctrl-C during a turn must not end the chat"
        _, err = chat.communicate("second question\n", timeout=60)
        assert chat.returncode == 1  # one turn did not commit
        assert "discarded, reason=cancelled" in err
    finally:
        server.communicate("", timeout=30)
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
        assert "You said: 'hello'" in chat.stdout.readline()
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


def test_read_commands_change_nothing_they_cannot_read(tmp_path: Path) -> None:
    import hashlib
    import sqlite3

    foreign = tmp_path / "foreign.db"
    conn = sqlite3.connect(foreign)
    conn.execute("CREATE TABLE t (x)")
    conn.commit()
    conn.close()
    (tmp_path / "empty.db").write_bytes(b"")
    (tmp_path / "notes.jsonl").write_bytes(b'{"name": "my precious data"}\n')
    before = {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in tmp_path.iterdir()}
    for name in before:
        for command in ("replay", "log", "sessions"):
            r = tl(command, name, cwd=tmp_path)
            assert r.returncode == 3, (command, name, r.stderr)
            assert name in r.stderr and "Traceback" not in r.stderr
    after = {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in tmp_path.iterdir()}
    assert after == before  # not a byte changed, no -wal or -shm file appeared


def test_a_corrupt_log_exits_3(tmp_path: Path) -> None:
    import trio

    from turnledger.adapters.stores import SQLiteStore
    from turnledger.events import StoredEvent

    async def write() -> None:
        store = await SQLiteStore.open(tmp_path / "c.db")
        await store.append("s", [StoredEvent("s", 1, "turn_exploded", 1, {}, 1.7e9)], 0)
        await store.aclose()

    trio.run(write)
    for command in ("replay", "log", "sessions"):
        r = tl(command, "c.db", cwd=tmp_path)
        assert r.returncode == 3 and "corrupt" in r.stderr, (command, r.stderr)


def test_logging_options_work_after_the_command_and_hide_passwords(tmp_path: Path) -> None:
    r = tl("chat", "--db", "x.db", "--log-json", "-v", cwd=tmp_path, stdin="q\n")
    assert r.returncode == 0
    lines = [json.loads(line) for line in r.stderr.splitlines()]
    assert {"message_received", "transition"} <= {line["event"] for line in lines}
    dsn = "postgresql://postgres:hunter2SECRET@127.0.0.1:1/test"
    r = tl("sessions", dsn, cwd=tmp_path)
    assert r.returncode == 3
    assert "hunter2SECRET" not in r.stderr and "postgres:***@127.0.0.1" in r.stderr


def _keyword_dsn(url: str, **fields: str) -> str:
    from psycopg.conninfo import conninfo_to_dict, make_conninfo

    return make_conninfo(**{**conninfo_to_dict(url), **fields})  # type: ignore[arg-type]


def test_a_libpq_keyword_dsn_goes_to_postgresql_and_no_password_is_shown(
    tmp_path: Path, pg_dsn: str
) -> None:
    # The server trusts the connection, so the password is never needed: it
    # only has to stay out of every file name and message.
    secret = "kwSECRET'pw"
    dsn = _keyword_dsn(pg_dsn, password=secret)
    assert dsn.startswith(("host=", "user=", "dbname=", "port=", "options=")), dsn
    r = tl("chat", "--db", dsn, "--session", "kw", cwd=tmp_path, stdin="q1\n")
    assert r.returncode == 0, r.stderr
    replay = tl("replay", dsn, "--json", cwd=tmp_path)
    assert replay.returncode == 0, replay.stderr
    assert [t["question"] for t in json.loads(replay.stdout)["turns"]] == ["q1"]
    assert list(tmp_path.iterdir()) == []  # no SQLite file named after the DSN
    for output in (r, replay):
        assert "kwSECRET" not in output.stdout + output.stderr


@pytest.mark.parametrize(
    "db",
    [
        "host=127.0.0.1 port=1 dbname=test user=postgres password=kwSECRET",
        "host=127.0.0.1 port=1 password='kwSECRET with blanks' dbname=test",
        "postgresql://postgres:kwSECRET@127.0.0.1:1/test",
        "postgresql://127.0.0.1:1/test?user=postgres&password=kwSECRET",
        "host=127.0.0.1 port=1 dbname=test",  # with PGPASSWORD=kwSECRET
    ],
)
def test_no_password_reaches_a_message_whatever_the_dsn_form(tmp_path: Path, db: str) -> None:
    env = {**os.environ, "PGPASSWORD": "kwSECRET", "PGCONNECT_TIMEOUT": "5"}
    for args in (["replay", db], ["log", db], ["sessions", db], ["chat", "--db", db]):
        r = subprocess.run(
            [sys.executable, "-m", "turnledger", *args],
            cwd=tmp_path, input="q\n", capture_output=True, text=True, timeout=60, env=env,
        )  # fmt: skip
        assert r.returncode == 3, (args, r.stderr)  # nothing listens on port 1
        assert "kwSECRET" not in r.stdout + r.stderr, (args, r.stderr)
        assert "cannot open" in r.stderr and "Traceback" not in r.stderr
    assert list(tmp_path.iterdir()) == []


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


@pytest.mark.parametrize(
    "args",
    [
        ["replay", "x.db", "--at", "-1"],
        ["replay", "x.db", "--session", ""],
        ["log", "x.db", "--session", b"\xfe"],
        ["log", "x.db", "--request", ""],
    ],
)
def test_read_command_usage_errors_exit_2(tmp_path: Path, args: list[str | bytes]) -> None:
    tl("chat", "--db", "x.db", cwd=tmp_path, stdin="q\n")
    r = subprocess.run(
        [sys.executable, "-m", "turnledger", *args], cwd=tmp_path, capture_output=True, timeout=60
    )
    err = r.stderr.decode()
    assert r.returncode == 2, err
    assert "usage: turnledger" in err and "Traceback" not in err


@pytest.mark.parametrize("special", ["directory", "/dev/null"])
def test_a_directory_or_a_device_as_db_is_named_as_such(tmp_path: Path, special: str) -> None:
    if special == "directory":
        db, what = str(tmp_path / "folder.db"), "is a directory"
        os.mkdir(db)
    else:
        db, what = special, "is a device"
    for args in (["chat", "--db", db], ["demo", "--db", db], ["replay", db], ["sessions", db]):
        r = tl(*args, cwd=tmp_path, stdin="q\n")
        assert r.returncode == 2, (args, r.stderr)
        assert what in r.stderr and "disk I/O" not in r.stderr, (args, r.stderr)
    assert [p.name for p in tmp_path.iterdir()] == (["folder.db"] if special == "directory" else [])


_NASTY = "\x1b]0;owned\x07\x1b[2J\r\x9b\u202e"


def test_control_characters_are_escaped_by_the_read_commands(tmp_path: Path) -> None:
    # A session id and a question (echoed in the answer) carrying terminal
    # controls: ESC, BEL, CR, a C1 CSI, a bidi override.
    r = tl("chat", "--db", "x.db", "--session", f"s{_NASTY}", cwd=tmp_path, stdin=f"q{_NASTY}\n")
    assert r.returncode == 0, r.stderr
    shown = [
        tl("replay", "x.db", cwd=tmp_path),
        tl("log", "x.db", cwd=tmp_path),
        tl("sessions", "x.db", cwd=tmp_path),
        tl("replay", "x.db", "--json", cwd=tmp_path),
        tl("log", "x.db", "--json", cwd=tmp_path),
    ]
    for out in shown:
        assert out.returncode == 0, out.stderr
        assert not any(c in out.stdout for c in "\x1b\x07\r\x9b\u202e"), out.args
    text = shown[0].stdout + shown[1].stdout + shown[2].stdout
    assert text.count("s\\x1b]0;owned\\x07\\x1b[2J\\x0d\\x9b\\u202e") == 3  # once each
    assert "user: q\\x1b]0;owned" in shown[0].stdout
    # JSON stays exact: the escapes decode to the same text
    (state,) = [json.loads(line) for line in shown[3].stdout.splitlines()]
    assert state["session_id"] == f"s{_NASTY}" and state["turns"][0]["question"] == f"q{_NASTY}"


def test_chat_escapes_control_characters_on_a_terminal_only(tmp_path: Path) -> None:
    import pty

    script = tmp_path / "server.py"
    script.write_text(
        "import sys\n"
        "from turnledger.testing import LoopbackServer, chat_responder\n"
        f"answer = lambda messages: {'two lines:' + _NASTY + chr(10) + 'end'!r}\n"
        "with LoopbackServer(chat_responder(answer)).start_in_thread() as s:\n"
        "    print(s.openai_base_url, flush=True)\n"
        "    sys.stdin.read()\n"
    )
    server = subprocess.Popen(
        [sys.executable, str(script)], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    )
    try:
        assert server.stdout is not None
        base_url = server.stdout.readline().strip()
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
            seen = b""
            while True:
                try:
                    chunk = os.read(main, 4096)
                except OSError:  # the terminal closed
                    break
                if not chunk:
                    break
                seen += chunk
        finally:
            os.close(main)
    finally:
        server.communicate("", timeout=30)
    assert chat.returncode == 0, chat.stderr
    on_terminal = seen.decode().replace("\r\n", "\n")  # the terminal's own line ends
    assert on_terminal == "two lines:\\x1b]0;owned\\x07\\x1b[2J\\x0d\\x9b\\u202e\nend\n"
    # through a pipe the answer is the text itself
    assert piped.stdout.decode() == f"two lines:{_NASTY}\nend\n"
