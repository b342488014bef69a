"""What the session runtime costs, measured against baselines in the same run.

    python benchmarks/actors.py [--quick]

Prints medians of several runs and the ratios that matter:

- memory per idle session actor (10,000 sessions, tracemalloc) against a bare
  trio task waiting on a memory channel of the same size, before any turn
  and after one (its history, and the request task it keeps between turns);
- turns per second through 1,000 concurrent sessions, instant provider,
  MemoryStore, logs filtered out (as a service at level WARNING would run);
  the same with every log line rendered to JSON (into /dev/null);
- the runtime's cost per turn against calling decide/evolve directly;
- for context: an awaited request/reply through a memory channel, and
  send_nowait drained in bursts.

Throughput is wall-clock time; costs per turn and per message are CPU time
(``time.process_time``) of the same runs, which a machine shared with other
work shifts much less.

Every timed section (hub and decide/evolve alike) starts with ``gc.collect()``:
a finished ``trio.run`` stays reachable through trio's own reference cycles,
with everything its tasks held (a whole MemoryStore), so without it one
run's garbage was collected inside a later run's timed section (a full
collection of ~40,000 objects billed to 2,000 turns). The collector stays
enabled during the section: what the timed turns allocate is collected and
billed to them, as in a service that runs one hub.
"""

from __future__ import annotations

import argparse
import gc
import logging
import os
import statistics
import sys
import time
import tracemalloc
from collections.abc import Callable
from typing import Any

import structlog
import trio
import trio.testing

from turnledger.events import DEFAULT_CODEC, RequestId, SessionStarted, Window
from turnledger.sessions import (
    Completed,
    ResponseStarted,
    Start,
    Submit,
    decide,
    evolve,
    initial_state,
    open_hub,
)
from turnledger.testing import MemoryStore, ScriptedProvider

MAILBOX = 16


def quiet_logs() -> None:
    structlog.configure(wrapper_class=structlog.make_filtering_bound_logger(logging.WARNING))


def json_logs_to_devnull() -> None:
    structlog.configure(
        processors=[
            structlog.contextvars.merge_contextvars,
            structlog.processors.add_log_level,
            structlog.processors.JSONRenderer(),
        ],
        wrapper_class=structlog.make_filtering_bound_logger(logging.DEBUG),
        logger_factory=structlog.PrintLoggerFactory(open(os.devnull, "w")),  # noqa: SIM115
    )


def collect_garbage() -> None:
    """Start a timed section with no garbage left by earlier runs.

    A finished ``trio.run`` stays reachable through the runner's own reference
    cycles (with everything its tasks held: a whole MemoryStore) until the
    cyclic GC finds it; without this, that collection lands in whichever
    later run's timed section triggers it. The collector stays on: what the
    timed turns themselves allocate is collected during the section and billed
    to them, as in a service running one hub.
    """
    gc.collect()


def median_of(runs: int, fn: Callable[[], float]) -> float:
    return statistics.median(fn() for _ in range(runs))


# --- memory -------------------------------------------------------------------


def _traced() -> int:
    gc.collect()
    return tracemalloc.get_traced_memory()[0]


def bare_task_bytes(n: int) -> float:
    async def wait(rx: trio.MemoryReceiveChannel[Any]) -> None:
        async for _ in rx:
            pass

    async def main() -> float:
        before = _traced()
        senders = []
        async with trio.open_nursery() as nursery:
            for _ in range(n):
                tx, rx = trio.open_memory_channel[Any](MAILBOX)
                senders.append(tx)
                nursery.start_soon(wait, rx)
            await trio.testing.wait_all_tasks_blocked()
            per = (_traced() - before) / n
            for tx in senders:
                tx.close()
        return per

    tracemalloc.start()
    try:
        return trio.run(main)
    finally:
        tracemalloc.stop()


def idle_actor_bytes(n: int, passivate_after: float | None, *, turns: int = 0) -> float:
    """Bytes per idle session actor; with ``turns``, after that many turns
    each (its history, and the request task it keeps between turns)."""

    async def main() -> float:
        store = MemoryStore()
        for i in range(n):
            sid = f"session-{i:05}"
            ev = DEFAULT_CODEC.encode(SessionStarted("", "m"), session_id=sid, seq=1, recorded_at=0)
            await store.append(sid, [ev], 0)
        provider = ScriptedProvider.instant()
        async with open_hub(
            store, provider, model="m", passivate_after=passivate_after, mailbox_size=MAILBOX
        ) as hub:
            await trio.testing.wait_all_tasks_blocked()
            before = _traced()
            for i in range(n):
                sid = f"session-{i:05}"
                await hub.open_session(sid)
                for t in range(turns):
                    await (await hub.submit(sid, f"q{t}")).outcome()
            await trio.testing.wait_all_tasks_blocked()
            per = (_traced() - before) / n
            assert hub.statistics().actors == n
        return per

    tracemalloc.start()
    try:
        return trio.run(main)
    finally:
        tracemalloc.stop()


# --- throughput ---------------------------------------------------------------


def hub_turns(sessions: int, turns: int, policy: Any = None) -> tuple[float, float, Any]:
    """Seconds (wall clock, then CPU) for ``sessions`` callers each running
    ``turns`` turns at once, and the hub's statistics."""

    async def main() -> tuple[float, float, Any]:
        store = MemoryStore()
        provider = ScriptedProvider.instant()
        async with open_hub(store, provider, model="m", policy=policy) as hub:
            # start the actors first: measure turns, not session creation
            for i in range(sessions):
                await hub.open_session(f"s{i}")

            async def caller(sid: str) -> None:
                for t in range(turns):
                    result = await (await hub.submit(sid, f"question {t}")).outcome()
                    assert result.kind == "committed", result

            collect_garbage()
            t0, c0 = time.perf_counter(), time.process_time()
            async with trio.open_nursery() as nursery:
                for i in range(sessions):
                    nursery.start_soon(caller, f"s{i}")
            elapsed, cpu = time.perf_counter() - t0, time.process_time() - c0
            return elapsed, cpu, hub.statistics()

    return trio.run(main)


def pure_turns(turns: int, policy: Any, *, codec: bool = False) -> float:
    """CPU seconds for ``turns`` turns through decide/evolve alone (no I/O),
    with ``codec``: plus encoding each event into its stored envelope."""
    state: Any = initial_state()
    for ev in decide(state, Start("", "m", policy)):
        state = evolve(state, ev)
    encode = DEFAULT_CODEC.encode if codec else None
    collect_garbage()
    t0 = time.process_time()
    for t in range(turns):
        rid = RequestId(f"r{t}")
        for msg in (
            Submit(rid, f"question {t}"),
            ResponseStarted(rid),
            Completed(rid, "ok", "stop"),
        ):
            for ev in decide(state, msg):
                if encode is not None:
                    encode(ev, session_id="s", seq=state.version + 1, recorded_at=0.0)
                state = evolve(state, ev)
    return time.process_time() - t0


# --- message passing, for context ---------------------------------------------


def ping_pong(n: int) -> float:
    """CPU seconds per awaited request/reply through memory channels."""

    async def main() -> float:
        req_tx, req_rx = trio.open_memory_channel[int](0)
        rep_tx, rep_rx = trio.open_memory_channel[int](0)

        async def server() -> None:
            async for x in req_rx:
                await rep_tx.send(x)

        async with trio.open_nursery() as nursery:
            nursery.start_soon(server)
            t0 = time.process_time()
            for i in range(n):
                await req_tx.send(i)
                await rep_rx.receive()
            elapsed = time.process_time() - t0
            await req_tx.aclose()
        return elapsed / n

    return trio.run(main)


def bursts(n: int, burst: int = 64) -> float:
    """CPU seconds per message sent with send_nowait and drained in bursts."""

    async def main() -> float:
        tx, rx = trio.open_memory_channel[int](burst)
        t0 = time.process_time()
        for _ in range(n // burst):
            for i in range(burst):
                tx.send_nowait(i)
            await trio.lowlevel.checkpoint()
            while True:
                try:
                    rx.receive_nowait()
                except trio.WouldBlock:
                    break
        return (time.process_time() - t0) / (n // burst * burst)

    return trio.run(main)


# --- report -------------------------------------------------------------------


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="fewer sessions and runs")
    args = parser.parse_args()
    runs = 3 if args.quick else 5
    idle_n = 2_000 if args.quick else 10_000
    sessions = 200 if args.quick else 1_000
    turns = 10
    quiet_logs()

    print(f"turnledger session runtime -- Python {sys.version.split()[0]}, trio {trio.__version__}")
    print(f"medians of {runs} runs\n")

    bare = median_of(runs, lambda: bare_task_bytes(idle_n))
    idle = median_of(runs, lambda: idle_actor_bytes(idle_n, 300.0))
    print(f"memory per idle session ({idle_n:,} sessions, mailbox {MAILBOX}, no turns yet)")
    print(f"  bare trio task waiting on a memory channel  {bare / 1024:7.2f} KB")
    after_turn = median_of(runs, lambda: idle_actor_bytes(idle_n, 300.0, turns=1))
    print(
        f"  session actor, state and mailbox            {idle / 1024:7.2f} KB"
        f"   ratio {idle / bare:4.2f}x"
    )
    print(
        f"  the same after one turn of each             {after_turn / 1024:7.2f} KB"
        f"   ratio {after_turn / bare:4.2f}x\n"
    )

    total = sessions * turns
    elapsed: list[float] = []
    cpu: list[float] = []
    stats = None
    for _ in range(runs):
        e, c, stats = hub_turns(sessions, turns)
        elapsed.append(e)
        cpu.append(c)
    hub_s = statistics.median(elapsed)
    gc.disable()
    try:
        no_gc = statistics.median(hub_turns(sessions, turns)[0] for _ in range(runs))
    finally:
        gc.enable()
    json_logs_to_devnull()
    logged = statistics.median(hub_turns(sessions, turns)[0] for _ in range(runs))
    quiet_logs()
    assert stats is not None
    print(
        f"throughput: {sessions:,} concurrent sessions x {turns} turns, instant provider,"
        " MemoryStore"
    )
    print(
        f"  logs filtered (WARNING)       {total / hub_s:9,.0f} turns/s"
        f"   {hub_s / total * 1e6:6.1f} us/turn"
    )
    print(
        f"  same, cyclic GC disabled      {total / no_gc:9,.0f} turns/s"
        f"   {no_gc / total * 1e6:6.1f} us/turn   ratio {no_gc / hub_s:4.2f}x"
    )
    print(
        f"  every line as JSON to devnull {total / logged:9,.0f} turns/s"
        f"   {logged / total * 1e6:6.1f} us/turn   ratio {logged / hub_s:4.2f}x"
    )
    print(
        f"  per turn: {stats.messages / total:.2f} mailbox messages,"
        f" {stats.appends / total:.2f} store appends,"
        f" {stats.events / stats.appends:.2f} events per append\n"
    )

    policy = Window(8)
    n_pure = 20_000
    pure = median_of(runs, lambda: pure_turns(n_pure, policy)) / n_pure
    pure_codec = median_of(runs, lambda: pure_turns(n_pure, policy, codec=True)) / n_pure
    n_one = 2_000
    one = median_of(runs, lambda: hub_turns(1, n_one, policy)[1]) / n_one
    conc = statistics.median(cpu) / total
    print("CPU cost per turn (3 messages: Submit, ResponseStarted, Completed)")
    print(f"  decide/evolve in a loop                  {pure * 1e6:7.1f} us")
    print(
        f"  decide/evolve + codec encode             {pure_codec * 1e6:7.1f} us"
        f"   ratio {pure_codec / pure:5.1f}x"
    )
    print(
        f"  hub, one session, turns one after another {one * 1e6:6.1f} us"
        f"   ratio {one / pure:5.1f}x"
    )
    print(
        f"  hub, {sessions:,} sessions at once             {conc * 1e6:7.1f} us"
        f"   ratio {conc / pure:5.1f}x\n"
    )

    pp = median_of(runs, lambda: ping_pong(20_000))
    bn = median_of(runs, lambda: bursts(200_000))
    print("message passing (CPU), for context")
    print(f"  awaited request/reply through memory channels {pp * 1e6:6.2f} us")
    print(
        f"  send_nowait drained in bursts of 64            {bn * 1e6:6.2f} us"
        f"   ratio {pp / bn:5.1f}x"
    )
    print(f"  hub turn at {sessions:,} sessions = {conc / pp:4.1f} request/replies")


if __name__ == "__main__":
    main()
