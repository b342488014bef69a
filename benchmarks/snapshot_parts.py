"""Where reopening a long session from its snapshot spends its time, part
by part, against the full replay it replaces, in the same run.

    python benchmarks/snapshot_parts.py [--turns N] [--rounds N]

The session of ``benchmarks/snapshots.py`` (``--turns`` committed turns,
default 10,000; a 100-character question and a 600-character answer each),
in a fresh SQLite store, with its snapshot taken 10 turns before the end.
Each round times every part once, in turn (so the machine's load weighs
on all alike), ``--rounds`` rounds (default 7), wall clock; each part is
printed as its median and its share of the full replay's median:

- ``full replay``  ``replay(await store.read_decoded(sid, DEFAULT_CODEC))``
- ``read head``    ``SQLiteSnapshots.latest``: the snapshot's head, from its file
- ``checksum``     SHA-256 of the head (``load_snapshot`` checks it first)
- ``parse``        ``orjson.loads`` of the head (without the cyclic collector,
                   as ``load_snapshot`` does it)
- ``build``        the state from the parsed head (the newest turns and
                   endings, every older request id, the settings)
- ``tail``         the events after the snapshot, read and folded
- ``reopen``       ``recover_state``: all of the above, as an actor does it
- ``older part``   what the first need of an older turn adds: the older
                   part read from the file, checked (SHA-256), parsed and
                   built, on a state just loaded from the head
- ``reopen+older`` ``recover_state(lazy=False)``: the reopen with the older
                   part read at once, the whole history in memory

The 20x goal of issue 26 leaves the reopen 1/20 of the full replay.
"""

from __future__ import annotations

import argparse
import gc
import hashlib
import statistics
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import orjson
import trio

sys.path.insert(0, str(Path(__file__).parent))

from stores import session_started, turn
from turnledger.adapters.stores import open_store, snapshots_beside
from turnledger.events import DEFAULT_CODEC, StoredEvent
from turnledger.runtime._snapshots import recover_state
from turnledger.sessions import replay
from turnledger.sessions._snapshot import _state, load_snapshot, take_snapshot

SID = "long-session"
TAIL = 10


class _Quiet:
    def warning(self, event: str, **kw: Any) -> None:
        raise SystemExit(f"the snapshot was not used: {kw}")

    def debug(self, event: str, **kw: Any) -> None:
        pass


async def run(args: argparse.Namespace, where: str) -> None:
    store = await open_store(where)
    snaps = await snapshots_beside(where)
    try:
        events: list[StoredEvent] = [session_started(SID)]
        for i in range(args.turns):
            events += turn(SID, i)
        cut = len(events) - 3 * TAIL
        await store.append(SID, events[:cut], 0)
        await store.append(SID, events[cut:], cut)
        stored = await store.read(SID)
        state = replay(DEFAULT_CODEC.decode(e) for e in stored[:cut])
        snap = take_snapshot(SID, state, stored[cut - 1].tag, stored[cut - 1].recorded_at)
        await snaps.save(snap)
        body = snap.body
        older_bytes = len(snap.older)

        async def full() -> object:
            return replay(await store.read_decoded(SID, DEFAULT_CODEC))

        async def read_body() -> object:
            return await snaps.latest(SID)

        async def checksum() -> object:
            return hashlib.sha256(body).hexdigest()

        async def parse() -> object:
            gc.disable()  # as load_snapshot does
            try:
                return orjson.loads(body)
            finally:
                gc.enable()

        doc = orjson.loads(body)

        async def build() -> object:
            gc.disable()  # as load_snapshot does
            try:
                return _state(doc, snap, None)
            finally:
                gc.enable()

        async def tail() -> object:
            after = await store.read(SID, after=snap.version)
            return replay((DEFAULT_CODEC.decode(e) for e in after), state)

        async def reopen() -> object:
            return await recover_state(store, SID, snaps, _Quiet())

        head_only = await snaps.latest(SID)
        assert head_only is not None

        async def older() -> object:
            loaded = load_snapshot(head_only)
            t0 = time.perf_counter()
            assert len(list(loaded.turns)) == len(state.turns)
            return time.perf_counter() - t0

        async def reopen_all() -> object:
            return await recover_state(store, SID, snaps, _Quiet(), lazy=False)

        parts: list[tuple[str, Callable[[], Awaitable[object]]]] = [
            ("full replay", full),
            ("read head", read_body),
            ("checksum", checksum),
            ("parse", parse),
            ("build", build),
            ("tail", tail),
            ("reopen", reopen),
            ("older part", older),
            ("reopen+older", reopen_all),
        ]
        times: dict[str, list[float]] = {name: [] for name, _ in parts}
        for _ in range(args.rounds):  # each round times every part: load hits all alike
            for name, fn in parts:
                t0 = time.perf_counter()
                got = await fn()
                took = time.perf_counter() - t0
                times[name].append(got if isinstance(got, float) else took)
        base = statistics.median(times["full replay"])
        print(f"sqlite: {args.turns} turns ({len(events)} events), snapshot after event "
              f"{snap.version}: head {len(body) / 1e3:.1f} kB, older part "
              f"{older_bytes / 1e6:.1f} MB, "
              f"{args.rounds} rounds, wall-clock medians")  # fmt: skip
        print(f"  {'full replay':12} {1e3 * base:8.1f} ms   budget for 20x: {50 * base:.1f} ms")
        for name, _ in parts[1:]:
            t = statistics.median(times[name])
            print(f"  {name:12} {1e3 * t:8.1f} ms   {100 * t / base:5.1f}% of full replay "
                  f"({base / t:6.1f}x)")  # fmt: skip
    finally:
        await snaps.aclose()
        await store.aclose()


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--turns", type=int, default=10_000)
    p.add_argument("--rounds", type=int, default=7)
    args = p.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        trio.run(run, args, str(Path(tmp, "long.db")))


if __name__ == "__main__":
    main()
