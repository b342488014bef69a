"""Reopening a long session: from its latest snapshot plus the events after
it, against a full replay, in the same process.

    python benchmarks/snapshots.py [--turns N] [--tail N] [--rounds N]
        [--store sqlite|journal|postgres] [--dsn DSN] [--keys]

One session of ``--turns`` committed turns (default 10,000: 30,001 events; a
100-character question and a 600-character answer each) is written to a
fresh store, with a snapshot taken ``--tail`` turns before the end (default
10, so the reopen also folds 30 events). Then, ``--rounds`` times in
alternation (default 7):

- ``full replay``   ``replay(await store.read_decoded(sid, DEFAULT_CODEC))``:
                    how a session reopened before snapshots
- ``snapshot``      ``recover_state``: the latest snapshot's head read,
                    checked (SHA-256) and parsed, its anchor event checked
                    and the events after it folded; what an actor does on
                    start (its older turns not read yet)
- ``older part``    then, what the first need of an older turn adds: the
                    snapshot's older part read, checked and built

Both states are compared (equal, or the run fails). Figures are wall-clock
medians (CPU time of the process beside them: on a loaded machine the wall
clock of a few worker-thread round trips is mostly waiting for a core); the
ratio is the median of per-round ratios. The goal (issue 26):
at least 20x. ``--keys`` runs both on an encrypted store (sealed snapshot).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import trio

sys.path.insert(0, str(Path(__file__).parent))

from stores import session_started, turn
from turnledger.adapters.encryption import StaticKeys
from turnledger.adapters.stores import open_store, snapshots_beside
from turnledger.events import DEFAULT_CODEC
from turnledger.runtime._snapshots import recover_state
from turnledger.sessions import replay
from turnledger.sessions._snapshot import take_snapshot

GOAL = 20.0
SID = "long-session"


class _Quiet:
    def warning(self, event: str, **kw: Any) -> None:
        raise SystemExit(f"the snapshot was not used: {kw}")

    def debug(self, event: str, **kw: Any) -> None:
        pass


async def run(args: argparse.Namespace, where: str) -> None:
    keys = StaticKeys({"b": bytes(range(32))}, "b") if args.keys else None
    store = await open_store(where, keys=keys)
    snaps = await snapshots_beside(where)
    if keys is not None:
        snaps = store.seal_snapshots(snaps)  # type: ignore[attr-defined]
    try:
        await store.append(SID, [session_started(SID)], 0)
        version = 1
        cut = args.turns - args.tail
        for i in range(args.turns):
            version = await store.append(SID, turn(SID, i), version)
            if i + 1 == cut:
                events = await store.read(SID)
                state = replay(DEFAULT_CODEC.decode(e) for e in events)
                snap = take_snapshot(SID, state, events[-1].tag, events[-1].recorded_at)
                await snaps.save(snap)
                print(f"snapshot after event {snap.version}: {len(snap.body) / 1e6:.1f} MB")
        full_s: list[float] = []
        snap_s: list[float] = []
        full_c: list[float] = []
        snap_c: list[float] = []
        older_s: list[float] = []
        for _ in range(args.rounds):
            c0, t0 = time.process_time(), time.perf_counter()
            full = replay(await store.read_decoded(SID, DEFAULT_CODEC))
            full_s.append(time.perf_counter() - t0)
            full_c.append(time.process_time() - c0)
            c0, t0 = time.process_time(), time.perf_counter()
            fast, used = await recover_state(store, SID, snaps, _Quiet())
            snap_s.append(time.perf_counter() - t0)
            snap_c.append(time.process_time() - c0)
            t0 = time.perf_counter()
            assert len(list(fast.turns)) == args.turns  # the older part, read when needed
            older_s.append(time.perf_counter() - t0)
            assert used == snap.version and fast == full and len(full.turns) == args.turns
        base, quick = statistics.median(full_s), statistics.median(snap_s)
        ratio = statistics.median(f / s for f, s in zip(full_s, snap_s, strict=True))
        cpu = statistics.median(f / s for f, s in zip(full_c, snap_c, strict=True))
        verdict = "ok" if ratio >= GOAL else "UNDER"
        print(f"{args.store}{' (encrypted)' if keys else ''}: {args.turns} turns "
              f"({version} events), {args.rounds} rounds, wall-clock medians")  # fmt: skip
        print(
            f"  full replay  {1e3 * base:8.1f} ms  ({1e3 * statistics.median(full_c):.1f} ms CPU)"
        )
        print(f"  snapshot     {1e3 * quick:8.1f} ms  ({1e3 * statistics.median(snap_c):.1f} ms "
              f"CPU; + {3 * args.tail} events after it)")  # fmt: skip
        print(f"  ratio        {ratio:8.1f}x  (goal >= {GOAL:.0f}x: {verdict}; CPU {cpu:.1f}x)")
        print(f"  older part   {1e3 * statistics.median(older_s):8.1f} ms  (read, checked and "
              "built when an older turn is first needed)")  # fmt: skip
        if ratio < GOAL:
            sys.exit(1)
    finally:
        await snaps.aclose()
        await store.aclose()


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--turns", type=int, default=10_000)
    p.add_argument("--tail", type=int, default=10)
    p.add_argument("--rounds", type=int, default=7)
    p.add_argument("--store", choices=["sqlite", "journal", "postgres"], default="sqlite")
    p.add_argument("--dsn", default="postgresql://postgres@127.0.0.1:5432/test")
    p.add_argument("--keys", action="store_true", help="an encrypted store")
    args = p.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        where = {
            "sqlite": str(Path(tmp, "long.db")),
            "journal": str(Path(tmp, "long.jsonl")),
            "postgres": args.dsn,
        }[args.store]
        trio.run(run, args, where)


if __name__ == "__main__":
    main()
