"""``turnledger replay``, ``log`` and ``sessions``: real processes, real files."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from _procs import within

from ._run import NASTY, tl

pytestmark = pytest.mark.slow


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


def test_control_characters_are_escaped_by_the_read_commands(tmp_path: Path) -> None:
    # A session id and a question (echoed in the answer) carrying terminal
    # controls: ESC, BEL, CR, a C1 CSI, a bidi override.
    r = tl("chat", "--db", "x.db", "--session", f"s{NASTY}", cwd=tmp_path, stdin=f"q{NASTY}\n")
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
    assert state["session_id"] == f"s{NASTY}" and state["turns"][0]["question"] == f"q{NASTY}"


def test_a_reader_that_stops_early_ends_the_command_quietly(tmp_path: Path) -> None:
    r = tl("chat", "--db", "x.db", cwd=tmp_path, stdin="".join(f"q{i}\n" for i in range(60)))
    assert r.returncode == 0, r.stderr
    log = subprocess.Popen(
        [sys.executable, "-m", "turnledger", "log", "x.db", "--text"],
        cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
    )  # fmt: skip
    assert log.stdout is not None and log.stderr is not None
    assert within(60, log.stdout.readline).startswith(b"session chat")
    log.stdout.close()  # as `| head -1` does
    err = within(60, log.stderr.read)
    assert log.wait(timeout=60) == 0, err
    assert b"Traceback" not in err and b"BrokenPipe" not in err
