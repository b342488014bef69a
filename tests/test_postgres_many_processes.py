"""PostgreSQL with several hub processes at once: the global feed under
concurrent writers, and a stalled owner that loses its sessions."""

from __future__ import annotations

import itertools
import os
import signal
import subprocess
from collections import Counter

import pytest
import trio

from _procs import readline_within, spawn
from turnledger.adapters.stores import PostgresStore
from turnledger.events import StoredEvent

pytestmark = pytest.mark.postgres

# A hub process hosting its own sessions: on "go", N sessions x T turns at once.
_WRITER = """
import logging, sys, trio, structlog
from turnledger.adapters.stores import PostgresStore
from turnledger.sessions import open_hub
from turnledger.testing import ScriptedProvider

structlog.configure(wrapper_class=structlog.make_filtering_bound_logger(logging.CRITICAL))

async def main(dsn, prefix, sessions, turns):
    store = await PostgresStore.open(dsn)
    async with store, open_hub(store, ScriptedProvider.instant(), model="m") as hub:
        print("ready", flush=True)
        await trio.to_thread.run_sync(sys.stdin.readline)
        kinds = []

        async def one(sid):
            for t in range(turns):
                kinds.append((await (await hub.submit(sid, f"q{t}?")).outcome()).kind)

        async with trio.open_nursery() as nursery:
            for i in range(sessions):
                nursery.start_soon(one, f"{prefix}-{i}")
        assert set(kinds) == {"committed"}, kinds
        events = sum([len(await store.read(f"{prefix}-{i}")) for i in range(sessions)])
        print("done", events, flush=True)

trio.run(main, sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4]))
"""


async def _line(proc: subprocess.Popen[bytes], timeout: float = 60.0) -> str:
    return await trio.to_thread.run_sync(readline_within, proc, timeout)


def _key(e: StoredEvent) -> tuple[int | None, str, int]:
    return e.position, e.session_id, e.seq


@pytest.mark.parametrize(("processes", "sessions"), [(2, 20), (4, 10)])
async def test_hub_processes_append_at_once_and_a_tailing_reader_sees_no_gap(
    pg_dsn: str, processes: int, sessions: int
) -> None:
    turns = 3
    store = await PostgresStore.open(pg_dsn)  # the reader (it creates the table)
    procs = [spawn(_WRITER, pg_dsn, f"p{n}", str(sessions), str(turns)) for n in range(processes)]
    try:
        for p in procs:
            assert await _line(p) == "ready"
        for p in procs:
            assert p.stdin is not None
            p.stdin.write(b"go\n")
        tailed: list[StoredEvent] = []
        reads = 0

        async def tail_once() -> int:
            nonlocal reads
            batch = await store.read_all(after=tailed[-1].position or 0 if tailed else 0, limit=50)
            reads += 1
            tailed.extend(batch)
            return len(batch)

        reports: list[str] = []

        async def wait_for(p: subprocess.Popen[bytes]) -> None:
            reports.append(await _line(p))

        with trio.fail_after(120):
            async with trio.open_nursery() as nursery:
                for p in procs:
                    nursery.start_soon(wait_for, p)
                while len(reports) < len(procs):
                    await tail_once()
                    await trio.sleep(0.005)
            while await tail_once():
                pass
        for p in procs:
            assert p.wait(timeout=30) == 0
        written = sum(int(r.split()[1]) for r in reports)
        # Each process wrote its sessions: SessionStarted, then per turn
        # submitted, stream started, committed.
        assert written == processes * sessions * (1 + 3 * turns)
        assert reads > processes  # the reader tailed while the writers ran
        replay = await store.read_all()
        # No gap that filled in later: what the tailing reader saw, read by
        # read, is exactly the feed read once at the end.
        assert [_key(e) for e in tailed] == [_key(e) for e in replay]
        assert len(replay) == written
        # Every event once, each session's events in seq order.
        assert len({(e.session_id, e.seq) for e in replay}) == written
        by_session: dict[str, list[int]] = {}
        for e in replay:
            by_session.setdefault(e.session_id, []).append(e.seq)
        assert len(by_session) == processes * sessions
        for seqs in by_session.values():
            assert seqs == list(range(1, len(seqs) + 1))
        # The writers really ran side by side: their events interleave.
        owners = [e.session_id.split("-")[0] for e in replay]
        switches = sum(a != b for a, b in itertools.pairwise(owners))
        assert switches >= processes
    finally:
        await store.aclose()
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait(30)


# A hub process on session "s" with a short lease. Its provider answers at
# once, except for a question with "slow" in it: it says "streaming" and takes
# three seconds (during which the test stops the process).
_OWNER = """
import logging, sys, trio, structlog
from turnledger import SessionOwnedElsewhere
from turnledger.adapters.stores import PostgresStore
from turnledger.sessions import Completion, open_hub
from turnledger.testing import ScriptedProvider

structlog.configure(wrapper_class=structlog.make_filtering_bound_logger(logging.CRITICAL))

class Provider:
    encoder = ScriptedProvider().encoder

    async def complete(self, request, sink):
        await sink.started()
        if "slow" in request.messages[-1].content:
            print("streaming", flush=True)
            await trio.sleep(3)
        return Completion("an answer", "stop")

async def main(dsn, role):
    store = await PostgresStore.open(dsn, lease=1.5, renew_every=0.3)
    async with store, open_hub(store, Provider(), model="m") as hub:
        if role == "first":
            print("first", (await (await hub.submit("s", "one?")).outcome()).kind, flush=True)
            turn = await hub.submit("s", "slow?")
            try:
                result = await turn.outcome()
                print("outcome", result.kind, flush=True)
            except Exception as exc:
                print("refused", type(exc).__name__, type(exc.__cause__).__name__, flush=True)
            return
        with trio.fail_after(30):
            while True:
                try:
                    turn = await hub.submit("s", "three?")
                    break
                except SessionOwnedElsewhere:
                    await trio.sleep(0.1)
        result = await turn.outcome()
        history = await hub.history("s")
        print("second", result.kind, len(history), len(await store.read("s")), flush=True)

trio.run(main, sys.argv[1], sys.argv[2])
"""


async def test_a_stalled_owner_loses_the_session_and_cannot_write_after(pg_dsn: str) -> None:
    first = spawn(_OWNER, pg_dsn, "first")
    second: subprocess.Popen[bytes] | None = None
    try:
        assert await _line(first) == "first committed"
        assert await _line(first) == "streaming"
        os.kill(first.pid, signal.SIGSTOP)  # mid-turn: the answer is on its way
        second = spawn(_OWNER, pg_dsn, "second")
        # After the lease ran out the second process takes the session over,
        # recovers the turn in flight as interrupted, and commits its own.
        report = (await _line(second)).split()
        assert report[:3] == ["second", "committed", "2"]
        version = int(report[3])
        assert second.wait(timeout=30) == 0
        os.kill(first.pid, signal.SIGCONT)
        # The first wakes up with its answer: the append is refused as stale.
        assert await _line(first) == "refused SessionClosed LeaseLost"
        assert first.wait(timeout=30) == 0
        store = await PostgresStore.open(pg_dsn, read_only=True)
        try:
            events = await store.read("s")
            [lease] = await store.owners() or [None]
        finally:
            await store.aclose()
        assert lease is None  # the second released it on exit; the first owns nothing
        assert len(events) == version  # nothing written by the first after the stop
        ends = [
            (e.payload["request_id"], e.tag, e.payload.get("reason"))
            for e in events
            if e.tag in ("turn_committed", "turn_discarded")
        ]
        questions = [e.payload["request_id"] for e in events if e.tag == "turn_submitted"]
        assert len(questions) == 3 and len(ends) == 3
        assert [(tag, reason) for _, tag, reason in ends] == [
            ("turn_committed", None),
            ("turn_discarded", "interrupted"),
            ("turn_committed", None),
        ]
        assert Counter(rid for rid, _, _ in ends) == Counter(questions)  # each turn ended once
    finally:
        for p in (first, second):
            if p is not None and p.poll() is None:
                os.kill(p.pid, signal.SIGCONT)
                p.kill()
                p.wait(30)
