"""A fork's cost against the length of its source's history.

    python benchmarks/fork.py [--turns 10,1000,100000] [--repeat N]
        [--store memory,sqlite]

For each store and each history length, one source session of that many
committed turns (a 100-character question and a 600-character answer each,
three events per turn: ``benchmarks/stores.py``'s) is written to a fresh
store, and a hub opens it (its actor replays it once, as a running service
holds its sessions). Then, ``--repeat`` times (default 25):

- ``fork``       ``hub.fork(source, new_id)``: every turn of the source's
                 active branch shared by reference; the time of the call and
                 the rows it added to the store (the fork's events; the
                 source's row count is checked unchanged at the end). The
                 first fork is shown apart (``first``: warming up); the
                 median is of the others.

Beside each fork, the baseline: the same two rows appended to a new id by
the store alone (``2 rows``: what creating any session costs the store),
and the ratio of the two medians. A SQLite source is written, then the
store reopened (as a service restarted on it) before anything is measured.

And, once or three times, two figures that do grow with the history, for
scale, in the same run:

- ``copy``       what a fork that copies costs: the source's rows read and
                 appended again under a new session id (one append)
- ``first read`` ``replay_stored`` of one fork: its shared turns resolved
                 from the source's events (what reopening a fork costs)

Figures are wall-clock medians; ``x of 10`` is the fork's median against the
median of the smallest history in the same run.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

import trio

sys.path.insert(0, str(Path(__file__).parent))

from stores import session_started, turn
from turnledger.adapters.stores import MemoryStore, open_store
from turnledger.events import EventStore, StoredEvent
from turnledger.sessions import open_hub, replay_stored
from turnledger.testing import ScriptedProvider

SID = "source"
#: Turns per append while the source is written.
_BATCH = 2000


async def _write_source(store: EventStore, turns: int) -> None:
    version = await store.append(SID, [session_started(SID)], 0)
    for start in range(0, turns, _BATCH):
        batch = [ev for i in range(start, min(turns, start + _BATCH)) for ev in turn(SID, i)]
        version = await store.append(SID, batch, version)


async def _copy(store: EventStore, new_id: str) -> int:
    rows = await store.read(SID)
    copied = [
        StoredEvent(new_id, e.seq, e.tag, e.schema_version, e.payload, e.recorded_at) for e in rows
    ]
    await store.append(new_id, copied, 0)
    return len(copied)


async def measure(kind: str, turns: int, repeat: int, where: Path) -> dict[str, float]:
    path = where / f"fork-{turns}.db"
    store: EventStore = MemoryStore() if kind == "memory" else await open_store(path)
    try:
        await _write_source(store, turns)
        if kind != "memory":
            # Reopened, as a service restarted on it: the write-ahead log the
            # source's writing left is checkpointed on close, not paid for by
            # the first appends measured below.
            await store.aclose()
            store = await open_store(path)
        source_rows = len(await store.read(SID))
        async with open_hub(store, ScriptedProvider(), model="bench-model") as hub:
            await hub.open_session(SID)  # the source's actor runs, as in a service
            assert len(await hub.history(SID)) == turns
            times: list[float] = []
            plain: list[float] = []
            rows: list[int] = []
            for k in range(repeat):
                t0 = time.perf_counter()
                await hub.fork(SID, f"fork-{k}")
                times.append(time.perf_counter() - t0)
                written = await store.read(f"fork-{k}")
                rows.append(len(written))
                # the baseline: the same two rows appended to a new id by
                # the store alone (what creating any session costs it)
                same = [
                    StoredEvent(f"plain-{k}", e.seq, e.tag, e.schema_version, e.payload, 0.0)
                    for e in written
                ]
                t0 = time.perf_counter()
                await store.append(f"plain-{k}", same, 0)
                plain.append(time.perf_counter() - t0)
        t0 = time.perf_counter()
        state = await replay_stored(store, "fork-0")
        first_read = time.perf_counter() - t0
        assert len(state.turns) == turns
        copies: list[float] = []
        for k in range(1 if turns >= 100_000 else 3):
            t0 = time.perf_counter()
            copied = await _copy(store, f"copy-{k}")
            copies.append(time.perf_counter() - t0)
        assert copied == source_rows
        assert len(await store.read(SID)) == source_rows  # the source did not move
    finally:
        await store.aclose()
    assert set(rows) == {2}, rows
    return {
        "first": times[0],
        "fork": statistics.median(times[1:]),
        "plain": statistics.median(plain[1:]),
        "rows": float(rows[0]),
        "copy": statistics.median(copies),
        "copy_rows": float(source_rows),
        "first_read": first_read,
    }


async def main(args: argparse.Namespace) -> None:
    sizes = [int(n) for n in args.turns.split(",")]
    with tempfile.TemporaryDirectory() as tmp:
        for kind in args.store.split(","):
            print(f"\n{kind}")
            print(
                f"{'turns':>8} {'first':>10} {'fork':>10} {'x of ' + str(sizes[0]):>8}"
                f" {'2 rows':>10} {'fork/2 rows':>11} {'rows':>5}"
                f" {'copy':>10} {'copied rows':>12} {'first read':>11}"
            )
            base = None
            for n in sizes:
                got = await measure(kind, n, args.repeat, Path(tmp))
                base = base or got["fork"]
                print(
                    f"{n:>8} {got['first'] * 1e6:>8.0f}µs {got['fork'] * 1e6:>8.0f}µs"
                    f" {got['fork'] / base:>8.2f} {got['plain'] * 1e6:>8.0f}µs"
                    f" {got['fork'] / got['plain']:>11.2f}"
                    f" {got['rows']:>5.0f} {got['copy'] * 1e3:>8.1f}ms"
                    f" {got['copy_rows']:>12.0f} {got['first_read'] * 1e3:>9.1f}ms"
                )


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--turns", default="10,1000,100000")
    parser.add_argument("--repeat", type=int, default=25)
    parser.add_argument("--store", default="memory,sqlite")
    trio.run(main, parser.parse_args())
