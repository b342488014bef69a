"""Two hub processes, one session, through PostgreSQL: one owner at a time."""

from __future__ import annotations

import subprocess
import sys

import pytest

from _procs import readline_within

pytestmark = pytest.mark.postgres

# A hub process: tries to take the session, reports, and on "go" retries.
_HUB = """
import logging, sys, trio, structlog
from turnledger import SessionOwnedElsewhere
from turnledger.adapters.stores import open_store
from turnledger.sessions import open_hub
from turnledger.testing import ScriptedProvider

# stdout is the report pipe: keep log lines out of it
structlog.configure(wrapper_class=structlog.make_filtering_bound_logger(logging.CRITICAL))

def line():
    return sys.stdin.readline().strip()

async def main(dsn):
    store = await open_store(dsn)
    async with open_hub(store, ScriptedProvider(), model="m") as hub:
        try:
            turn = await hub.submit("shared", "first?")
        except SessionOwnedElsewhere as exc:
            print("elsewhere", exc, flush=True)
            await trio.to_thread.run_sync(line)          # the owner has gone
            with trio.fail_after(20):
                while True:
                    try:
                        history = await hub.history("shared")
                        turn = await hub.submit("shared", "taken over?")
                        break
                    except SessionOwnedElsewhere:
                        await trio.sleep(0.05)
            result = await turn.outcome()
            history = await hub.history("shared")
            print("took-over", result.kind, len(history), flush=True)
            return
        print("owner", (await turn.outcome()).kind, flush=True)
        for q in ("second?", "third?"):
            await (await hub.submit("shared", q)).outcome()
        print("history", len(await hub.history("shared")), flush=True)
        await trio.to_thread.run_sync(line)
    import os
    os._exit(0)  # gone without a goodbye: the server must free the session

trio.run(main, sys.argv[1])
"""


def _spawn(dsn: str) -> subprocess.Popen[bytes]:
    return subprocess.Popen(
        [sys.executable, "-c", _HUB, dsn],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        bufsize=0,
    )


def test_two_hub_processes_one_owner_then_takeover(pg_dsn: str) -> None:
    first = _spawn(pg_dsn)
    try:
        assert readline_within(first) == "owner committed"
        second = _spawn(pg_dsn)
        try:
            refusal = readline_within(second)
            # the typed error, naming the process that holds the session
            assert refusal.startswith("elsewhere") and f"pid={first.pid}" in refusal
            assert readline_within(first) == "history 3"
            assert first.stdin is not None and second.stdin is not None
            first.stdin.write(b"exit\n")
            assert first.wait(timeout=30) == 0
            second.stdin.write(b"go\n")
            # the second hub owns it now and sees the whole history, plus its turn
            assert readline_within(second) == "took-over committed 4"
            assert second.wait(timeout=30) == 0
        finally:
            if second.poll() is None:
                second.kill()
    finally:
        if first.poll() is None:
            first.kill()


async def test_the_sessions_command_shows_who_owns_each_session(pg_dsn: str) -> None:
    import json
    import os
    import socket
    from pathlib import Path

    import trio

    from turnledger.adapters.stores import PostgresStore
    from turnledger.events import DEFAULT_CODEC, SessionStarted

    def tl(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-m", "turnledger", *args],
            capture_output=True, text=True, timeout=60, cwd=Path(__file__).parent,
        )  # fmt: skip

    store = await PostgresStore.open(pg_dsn)
    try:
        for sid in ("owned", "free"):
            start = SessionStarted(system="", model="m")
            await store.append(
                sid, [DEFAULT_CODEC.encode(start, session_id=sid, seq=1, recorded_at=1.7e9)], 0
            )
        await store.acquire("owned")
        r = await trio.to_thread.run_sync(tl, "sessions", pg_dsn)
        assert r.returncode == 0, r.stderr
        lines = {line.split()[0]: line for line in r.stdout.splitlines()[1:]}
        assert f"{socket.gethostname()} {os.getpid()}, epoch 1, until " in lines["owned"]
        assert lines["free"].endswith(" -")
        r = await trio.to_thread.run_sync(tl, "sessions", pg_dsn, "--json")
        rows = {row["session_id"]: row for row in map(json.loads, r.stdout.splitlines())}
        owner = rows["owned"]["owner"]
        assert (owner["pid"], owner["epoch"], owner["live"]) == (os.getpid(), 1, True)
        assert rows["free"]["owner"] is None
    finally:
        await store.aclose()


async def test_a_hub_whose_session_was_taken_over_mid_turn_tells_its_caller_why(
    pg_dsn: str,
) -> None:
    import psycopg
    import trio
    import trio.testing

    from turnledger import LeaseLost, SessionClosed, SessionOwnedElsewhere
    from turnledger.adapters.stores import PostgresStore
    from turnledger.events import DEFAULT_CODEC, RequestId, TurnDiscarded
    from turnledger.sessions import DiscardedResult, open_hub
    from turnledger.testing import Begin, Chunk, Finish, Hook, ScriptedProvider

    gate = trio.Event()

    async def wait(_: object) -> None:
        await gate.wait()

    first = await PostgresStore.open(pg_dsn)
    second = await PostgresStore.open(pg_dsn)
    script = [Begin(), Chunk("so far"), Hook(wait), Finish()]
    try:
        async with (
            open_hub(first, ScriptedProvider(lambda req: script), model="m") as mine,
            open_hub(second, ScriptedProvider(), model="m") as theirs,
        ):
            turn = await mine.submit("s", "q", request_id="r1")
            with trio.fail_after(10):
                while [e.tag for e in await first.read("s")][-1:] != ["stream_started"]:
                    await trio.sleep(0.02)
            # The first store's lease connection is cut (a partition, say):
            # the second hub takes the session over and closes the turn.
            with trio.fail_after(20):
                while True:
                    with psycopg.connect(pg_dsn, autocommit=True) as conn:
                        conn.execute(
                            "SELECT pg_terminate_backend(backend)"
                            " FROM turnledger_events_leases WHERE session_id = 's'"
                        )
                    try:
                        await theirs.open_session("s")
                        break
                    except SessionOwnedElsewhere:  # renewed in between
                        await trio.sleep(0.1)
            gate.set()
            named = r"stopped before the turn was decided: LeaseLost: .*taken over"
            with pytest.raises(SessionClosed, match=named) as info:
                await turn.outcome()
            assert isinstance(info.value.__cause__, LeaseLost)
            assert mine.statistics().actors_failed == 1
            again = await (await theirs.submit("s", "q", request_id="r1")).outcome()
            assert again == DiscardedResult(
                RequestId("r1"), "interrupted", "recovered in flight", repeated=True
            )
        events = await second.read_decoded("s", DEFAULT_CODEC)
        assert [e for e in events if isinstance(e, TurnDiscarded)] == [
            TurnDiscarded(RequestId("r1"), "interrupted", "recovered in flight", 0)
        ]
    finally:
        await first.aclose()
        await second.aclose()
