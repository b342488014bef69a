"""Many sessions in one process: memory per idle session, and how fast idle
sessions are passivated and brought back.

    python benchmarks/sessions.py [--sessions N] [--revive N] [--workers N]

Memory. ``--sessions`` sessions (default 100,000) on one hub over a
``MemoryStore``, instant provider, one turn each (a 100-character question,
a 600-character answer), then idle: every actor still running, waiting on its
mailbox. Printed: the process's resident set (``VmRSS``) before the hub and
once all are idle, and the difference per session (everything a session
costs: its actor, its state with its one turn, and its events in the
store), plus what the same number of bare trio tasks waiting on a memory
channel costs, measured the same way in the same process beforehand.

Passivation. ``--revive`` sessions (default 10,000) with one turn each in a
SQLite file (WAL, synchronous=FULL). A hub with ``passivate_after`` opens
them all (each actor replays its session from the file: *reactivation*),
then leaves them idle until its janitor stops every actor (*passivation*:
the hub's clock is a trio ``MockClock`` moved past the deadline), then opens
them all again. Printed: sessions per second for the first opening, for the
passivation sweep (from the clock's jump to the last actor stopped), and for
bringing the passivated sessions back, and the CPU time per session of
both openings (every thread of the process: steadier than wall-clock time on
a loaded machine). Sessions are opened by ``--workers`` tasks at once (default 100).

Each part runs ``--repeat`` times (default 3; the memory part once unless
asked, it builds 100,000 sessions) and medians are printed.
"""

from __future__ import annotations

import argparse
import gc
import logging
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, "src")

import structlog
import trio
import trio.testing

from turnledger.adapters.stores import SQLiteStore
from turnledger.events import (
    DEFAULT_CODEC,
    Event,
    RequestId,
    SessionStarted,
    StreamStarted,
    TurnCommitted,
    TurnSubmitted,
    Usage,
)
from turnledger.sessions import open_hub
from turnledger.testing import MemoryStore, ScriptedProvider

QUESTION = "how does the ledger keep a turn whole? " + "x" * 60
ANSWER = "the answer is committed only when complete. " * 14


def quiet_logs() -> None:
    structlog.configure(wrapper_class=structlog.make_filtering_bound_logger(logging.WARNING))


def rss_bytes() -> int:
    """The resident set of this process, from /proc (Linux)."""
    with open("/proc/self/status", encoding="ascii") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    raise RuntimeError("no VmRSS in /proc/self/status")


async def _in_slices(n: int, workers: int, fn: Any) -> None:
    async def worker(k: int) -> None:
        for i in range(k, n, workers):
            await fn(i)

    async with trio.open_nursery() as nursery:
        for k in range(min(workers, n)):
            nursery.start_soon(worker, k)


# --- memory -------------------------------------------------------------------


def bare_tasks_rss(n: int) -> float:
    """RSS per bare trio task waiting on a memory channel (mailbox of 16)."""

    async def wait(rx: trio.MemoryReceiveChannel[Any]) -> None:
        async for _ in rx:
            pass

    async def main() -> float:
        gc.collect()
        before = rss_bytes()
        senders = []
        async with trio.open_nursery() as nursery:
            for _ in range(n):
                tx, rx = trio.open_memory_channel[Any](16)
                senders.append(tx)
                nursery.start_soon(wait, rx)
            await trio.testing.wait_all_tasks_blocked()
            gc.collect()
            per = (rss_bytes() - before) / n
            for tx in senders:
                tx.close()
        return per

    return trio.run(main)


def idle_sessions_rss(n: int, workers: int) -> tuple[float, float, float, float]:
    """(RSS per idle session, seconds to run the n turns, RSS before, after)."""
    provider = ScriptedProvider.instant(ANSWER)

    async def main() -> tuple[float, float, float, float]:
        gc.collect()
        before = rss_bytes()
        store = MemoryStore()
        async with open_hub(store, provider, model="m", passivate_after=None) as hub:

            async def one(i: int) -> None:
                await (await hub.submit(f"session-{i:06d}", QUESTION)).outcome()

            t0 = time.perf_counter()
            await _in_slices(n, workers, one)
            elapsed = time.perf_counter() - t0
            await trio.testing.wait_all_tasks_blocked()
            gc.collect()
            after = rss_bytes()
            stats = hub.statistics()
            assert stats.actors == n, stats
            assert len(await hub.history(f"session-{n - 1:06d}")) == 1
            return (after - before) / n, elapsed, before, after

    return trio.run(main)


# --- passivation ----------------------------------------------------------------


def _turn_events(sid: str) -> list[Any]:
    rid = RequestId(f"{sid}/r0")
    events: list[Event] = [
        SessionStarted("be brief", "m"),
        TurnSubmitted(rid, QUESTION, 0, 0, 900),
        StreamStarted(rid),
        TurnCommitted(rid, ANSWER, "stop", Usage(120, 160, 280)),
    ]
    return [
        DEFAULT_CODEC.encode(ev, session_id=sid, seq=k, recorded_at=0.0)
        for k, ev in enumerate(events, 1)
    ]


async def _fill(path: Path, sids: list[str]) -> None:
    store = await SQLiteStore.open(path, synchronous="NORMAL")
    try:
        for sid in sids:
            await store.append(sid, _turn_events(sid), 0)
    finally:
        await store.aclose()


def passivation(path: Path, sids: list[str], workers: int) -> tuple[float, float, float]:
    """(first opening, passivation sweep, second opening), in sessions/s.

    The hub runs on a trio ``MockClock`` that stands still, so no actor
    passivates while the sessions are being opened however long that takes;
    the clock is then moved past ``passivate_after`` and the janitor's sweep
    stops them all. Rates are wall-clock time (``perf_counter``).
    """
    n = len(sids)
    after = 300.0
    clock = trio.testing.MockClock(rate=0)
    cpu: list[float] = []  # CPU seconds per session of each opening (every thread)

    async def main() -> tuple[float, float, float]:
        store = await SQLiteStore.open(path)  # synchronous=FULL
        try:
            provider = ScriptedProvider.instant(ANSWER)
            async with open_hub(store, provider, model="m", passivate_after=after) as hub:

                async def open_one(i: int) -> None:
                    state = await hub.open_session(sids[i])
                    assert len(state.turns) == 1

                async def open_all() -> float:
                    gc.collect()
                    t0, c0 = time.perf_counter(), time.process_time()
                    await _in_slices(n, workers, open_one)
                    cpu.append((time.process_time() - c0) / n)
                    return n / (time.perf_counter() - t0)

                first = await open_all()
                assert hub.statistics().actors == n
                await trio.testing.wait_all_tasks_blocked()
                gc.collect()
                t0 = time.perf_counter()
                clock.jump(after * 1.5)  # past due, and past the janitor's next sweep
                while hub.statistics().actors:
                    await trio.testing.wait_all_tasks_blocked()
                sweep = n / (time.perf_counter() - t0)
                assert hub.statistics().actors_passivated >= n
                again = await open_all()
                assert hub.statistics().actors == n
                return first, sweep, again
        finally:
            await store.aclose()

    rates = trio.run(main, clock=clock)
    last_cpu[:] = cpu
    return rates


#: CPU seconds per session of the last run's two openings (first, again).
last_cpu: list[float] = []


def in_fresh_process(part: str, n: int, workers: int) -> list[float]:
    """Run one memory measurement in a process of its own: memory a part
    freed is never reused by the next, so each starts from the same heap."""
    out = subprocess.run(
        [
            sys.executable,
            __file__,
            "--measure",
            part,
            "--sessions",
            str(n),
            "--workers",
            str(workers),
        ],
        check=True,
        capture_output=True,
        text=True,
    ).stdout
    return [float(x) for x in out.split()]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--sessions", type=int, default=100_000)
    parser.add_argument("--revive", type=int, default=10_000)
    parser.add_argument("--workers", type=int, default=100)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--memory-repeat", type=int, default=1)
    parser.add_argument("--only", choices=["memory", "passivation"])
    parser.add_argument("--measure", choices=["bare", "sessions"], help=argparse.SUPPRESS)
    args = parser.parse_args()
    quiet_logs()
    if args.measure == "bare":
        print(bare_tasks_rss(args.sessions))
        return
    if args.measure == "sessions":
        print(*idle_sessions_rss(args.sessions, args.workers))
        return
    print(
        f"python {platform.python_version()}, {os.cpu_count()} cpus, "
        f"trio {trio.__version__}; RSS at start {rss_bytes() / 2**20:.1f} MiB"
    )
    if args.only != "passivation":
        n = args.sessions
        bare = statistics.median(
            in_fresh_process("bare", n, args.workers)[0] for _ in range(args.memory_repeat)
        )
        runs = [in_fresh_process("sessions", n, args.workers) for _ in range(args.memory_repeat)]
        per = statistics.median(r[0] for r in runs)
        turns_s = statistics.median(n / r[1] for r in runs)
        last = runs[-1]
        print(f"\nmemory: {n:,} sessions, one turn each on MemoryStore, then idle")
        print(
            f"  RSS before the hub {last[2] / 2**20:9.1f} MiB, all idle {last[3] / 2**20:9.1f} MiB"
        )
        print(
            f"  per idle session   {per / 1024:9.2f} KiB  (actor, state, its events in the store)"
        )
        print(f"  per bare trio task {bare / 1024:9.2f} KiB  (waiting on a channel of 16)")
        print(f"  session / bare     {per / bare:9.2f}x")
        print(f"  {n:,} sessions     {per * n / 2**30:9.3f} GiB  (goal < 1 GiB)")
        print(f"  the turns ran at   {turns_s:9,.0f} turns/s ({args.workers} tasks)")
    if args.only != "memory":
        sids = [f"session-{i:06d}" for i in range(args.revive)]
        results = []
        cpus: list[list[float]] = []
        for _ in range(args.repeat):
            with tempfile.TemporaryDirectory(dir=os.environ.get("BENCH_DIR")) as d:
                path = Path(d) / "sessions.db"
                trio.run(_fill, path, sids)
                results.append(passivation(path, sids, args.workers))
                cpus.append(list(last_cpu))
        first, sweep, again = (statistics.median(r[k] for r in results) for k in range(3))
        print(
            f"\npassivation: {args.revive:,} sessions of one turn in SQLite (WAL, FULL), "
            f"{args.workers} tasks opening; median of {args.repeat}"
        )
        print(f"  first opening (replay)     {first:9,.0f} sessions/s")
        print(f"  passivation sweep          {sweep:9,.0f} sessions/s")
        print(f"  brought back (replay)      {again:9,.0f} sessions/s  (goal >= 5,000/s)")
        first_cpu, again_cpu = (statistics.median(c[k] for c in cpus) * 1e6 for k in range(2))
        print(
            f"  CPU per session (every thread): first opening {first_cpu:.0f} µs,"
            f" brought back {again_cpu:.0f} µs"
        )
        print("  runs: " + "; ".join(f"{a:,.0f} / {b:,.0f} / {c:,.0f}" for a, b, c in results))


if __name__ == "__main__":
    main()
