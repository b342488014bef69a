"""What encryption at rest costs: CPU of appends and of replay, sealed
against plaintext, on SQLite or the journal, in the same process.

    python benchmarks/encryption.py [--sessions N] [--turns N] [--rounds N]
        [--store sqlite|journal]

Appends: ``--sessions`` sessions (default 200), all at once, each appending
``--turns`` turns (default 30) of 3 events (TurnSubmitted, StreamStarted,
TurnCommitted; a 100-character question, a 600-character answer) one after
the other, to a fresh store: ``plaintext`` is the store as it is, ``sealed``
the same store opened with ``keys=`` (every payload sealed with AES-256-GCM
under its session's data key). Replay: each session of that store read
with ``read_decoded(sid, DEFAULT_CODEC)`` and folded by
``turnledger.sessions.replay``, session by session, as the hub reopens one,
measured twice: ``open+replay`` opens the store and replays every session
(a restart: the journal parses its file on open, the SQLite store reads its
rows, every data key is unwrapped), then ``replay`` replays them all again
with the store open (a session reopened after passivation: the journal
holds its events parsed, the sealed journal the events it opened).

What is measured is the process's CPU time (``time.process_time``: every
thread, the store's I/O threads included), not wall time, so waiting for
the disk does not hide the cost. Each round runs plaintext then sealed on
fresh files; figures are medians over ``--rounds`` rounds, and each ratio is
the median of the per-round ratios. The goal (issue 26): at most 1.3x.
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

from stores import dataset, session_started
from turnledger.adapters.encryption import StaticKeys
from turnledger.adapters.stores import open_store
from turnledger.events import DEFAULT_CODEC, StoredEvent
from turnledger.sessions import replay

GOAL = 1.3
KEYS = StaticKeys({"bench": bytes(range(32))}, "bench")


async def _appends(
    path: Path, keys: Any, sids: list[str], turns: list[list[list[StoredEvent]]]
) -> float:
    store = await open_store(path, keys=keys)
    try:
        for sid in sids:
            await store.append(sid, [session_started(sid)], 0)

        async def session(n: int) -> None:
            version = 1
            for batch in turns[n]:
                version = await store.append(sids[n], batch, version)

        t0 = time.process_time()
        async with trio.open_nursery() as nursery:
            for n in range(len(sids)):
                nursery.start_soon(session, n)
        return time.process_time() - t0
    finally:
        await store.aclose()


async def _replay(path: Path, keys: Any, sids: list[str], turns: int) -> tuple[float, float]:
    """CPU seconds of (opening the store and replaying every session, then
    replaying every session again with the store open)."""
    t0 = time.process_time()
    store = await open_store(path, keys=keys)
    try:
        for sid in sids:
            state = replay(await store.read_decoded(sid, DEFAULT_CODEC))
            assert len(state.turns) == turns
        t1 = time.process_time()
        for sid in sids:
            state = replay(await store.read_decoded(sid, DEFAULT_CODEC))
            assert len(state.turns) == turns
        return t1 - t0, time.process_time() - t1
    finally:
        await store.aclose()


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--sessions", type=int, default=200)
    p.add_argument("--turns", type=int, default=30)
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--store", choices=["sqlite", "journal"], default="sqlite")
    args = p.parse_args()
    sids, turns = dataset(args.sessions, args.turns)
    events = args.sessions * (1 + 3 * args.turns)
    suffix = ".db" if args.store == "sqlite" else ".jsonl"
    cpu: dict[str, list[float]] = {k: [] for k in ("ap", "as", "rp", "rs", "op", "os")}
    for _ in range(args.rounds):
        with tempfile.TemporaryDirectory() as tmp:
            plain, sealed = Path(tmp, "plain" + suffix), Path(tmp, "sealed" + suffix)
            cpu["ap"].append(trio.run(_appends, plain, None, sids, turns))
            cpu["as"].append(trio.run(_appends, sealed, KEYS, sids, turns))
            for name, path, keys in (("p", plain, None), ("s", sealed, KEYS)):
                opened, again = trio.run(_replay, path, keys, sids, args.turns)
                cpu["o" + name].append(opened)
                cpu["r" + name].append(again)
    print(f"{args.store}: {args.sessions} sessions x {args.turns} turns ({events} events), "
          f"{args.rounds} rounds; CPU seconds, medians")  # fmt: skip
    ok = True
    for name, a, b in (
        ("appends", "ap", "as"),
        ("open+replay", "op", "os"),
        ("replay", "rp", "rs"),
    ):
        base, enc = statistics.median(cpu[a]), statistics.median(cpu[b])
        ratio = statistics.median(s / q for s, q in zip(cpu[b], cpu[a], strict=True))
        verdict = "ok" if ratio <= GOAL else "OVER"
        ok &= ratio <= GOAL
        print(f"  {name:11} plaintext {base:7.3f}s  sealed {enc:7.3f}s  "
              f"({1e6 * base / events:5.1f} vs {1e6 * enc / events:5.1f} µs/event)  "
              f"ratio {ratio:4.2f}x (goal <= {GOAL}x: {verdict})")  # fmt: skip
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
