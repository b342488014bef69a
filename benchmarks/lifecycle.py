"""Erasure speed: erasing one session among many on SQLite, against the
cost of appending one turn to the same file.

    python benchmarks/lifecycle.py [--sessions 10000] [--turns 3] [--repeat 31]

A file of ``--sessions`` sessions (default 10,000), each a SessionStarted and
``--turns`` turns of 3 events (a 100-character question and a 600-character
answer), written with group commit. Then, alternating, ``--repeat`` times:

- ``append``  one turn appended to another session (3 events, one COMMIT,
              fsynced with ``synchronous=FULL``): the baseline, the cost of
              the smallest durable write to this file
- ``erase``   ``SQLiteStore.erase`` of one session, a different one each
              time: the DELETE under ``secure_delete`` (freed cells and pages
              zeroed), the erasure record, the COMMIT, and the WAL checkpoint
              that copies the zeroed pages into the file and truncates the log

Prints the median and the 10th/90th percentiles of each (wall clock, in ms)
and the ratio of the medians; the goal is an erasure under 50 ms. Every
number comes from this run, on this machine.
"""

from __future__ import annotations

import argparse
import random
import statistics
import tempfile
import time
from pathlib import Path

import trio

from turnledger.adapters.stores import SQLiteStore
from turnledger.events import (
    DEFAULT_CODEC,
    Event,
    RequestId,
    SessionStarted,
    StoredEvent,
    StreamStarted,
    TurnCommitted,
    TurnSubmitted,
)

QUESTION = "What does the ledger keep, and for how long? " * 2 + "¿Y por qué? 为什么?"
ANSWER = ("Every committed turn, until it is erased on purpose. " * 12)[:600]


def _turn(sid: str, n: int) -> list[Event]:
    rid = RequestId(f"{sid}-{n}")
    return [
        TurnSubmitted(rid, QUESTION[:100], n, 0, 900),
        StreamStarted(rid),
        TurnCommitted(rid, ANSWER, "stop"),
    ]


def _encode(sid: str, events: list[Event], after: int) -> list[StoredEvent]:
    now = time.time()
    return [
        DEFAULT_CODEC.encode(ev, session_id=sid, seq=after + i, recorded_at=now)
        for i, ev in enumerate(events, 1)
    ]


async def _fill(store: SQLiteStore, sessions: int, turns: int) -> list[str]:
    ids = [f"session-{i:06d}" for i in range(sessions)]

    async def write(sid: str) -> None:
        events: list[Event] = [SessionStarted("a system prompt", "m")]
        for n in range(turns):
            events += _turn(sid, n)
        await store.append(sid, _encode(sid, events, 0), 0)

    for i in range(0, sessions, 1000):
        async with trio.open_nursery() as nursery:
            for sid in ids[i : i + 1000]:
                nursery.start_soon(write, sid)
    return ids


def _ms(samples: list[float]) -> str:
    q = statistics.quantiles(samples, n=10)
    return (
        f"median {statistics.median(samples) * 1000:7.2f} ms   "
        f"p10 {q[0] * 1000:7.2f}   p90 {q[-1] * 1000:7.2f}"
    )


async def run(sessions: int, turns: int, repeat: int) -> None:
    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / "bench.db"
        store = await SQLiteStore.open(path)
        try:
            t0 = time.perf_counter()
            ids = await _fill(store, sessions, turns)
            filled = time.perf_counter() - t0
            size = path.stat().st_size
            print(
                f"{sessions:,} sessions of {1 + 3 * turns} events written in {filled:.1f} s "
                f"({size / 1e6:.1f} MB)"
            )
            rng = random.Random(1)
            victims = rng.sample(ids, repeat)
            grower = ids[0]
            version = 1 + 3 * turns
            appends: list[float] = []
            erases: list[float] = []
            for i, victim in enumerate(victims):
                if victim == grower:
                    continue
                batch = _encode(grower, _turn(grower, 1000 + i), version)
                t = time.perf_counter()
                version = await store.append(grower, batch, version)
                appends.append(time.perf_counter() - t)
                t = time.perf_counter()
                await store.erase(victim)
                erases.append(time.perf_counter() - t)
            assert len(await store.session_ids()) == sessions - len(erases)
        finally:
            await store.aclose()
    print(f"  append one turn (baseline)  {_ms(appends)}")
    print(f"  erase one session           {_ms(erases)}")
    ratio = statistics.median(erases) / statistics.median(appends)
    print(f"  erase / append (medians)    {ratio:6.2f}x")
    goal = statistics.median(erases) * 1000
    print(f"  erase median {goal:.2f} ms  (goal < 50 ms: {'met' if goal < 50 else 'NOT met'})")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--sessions", type=int, default=10_000)
    p.add_argument("--turns", type=int, default=3)
    p.add_argument("--repeat", type=int, default=31)
    args = p.parse_args()
    trio.run(run, args.sessions, args.turns, args.repeat)


if __name__ == "__main__":
    main()
