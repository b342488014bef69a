"""Replay's contenders for an instruction count: one callgrind dump each.

    valgrind --tool=callgrind --dump-before=os_getppid \\
        python benchmarks/replay_instructions.py [--before OTHER/src]

Instructions do not move with the machine's load, where CPU time on a
shared machine does by 10% and more. The script fills two SQLite files
(``benchmarks/stores.py``'s data set: 200 sessions of SessionStarted plus 30
turns, and 1,000 sessions of one turn), runs every contender once as a
warm-up, then each once more with an ``os.getppid()`` before it: run under
``--dump-before=os_getppid``, callgrind writes one part per contender
(``callgrind.out.<pid>.2`` is the first contender, in the order printed),
and ``grep totals`` of a part is its instruction count (every thread). Run
natively, it prints the CPU time of each, for a check.

Contenders:

- ``bare json``          bare ``SELECT`` + ``json.loads`` + a dict fold
- ``bare orjson``        the same with ``orjson.loads``
- ``typed bulk``         ``read_decoded_many`` with the codec: typed events,
                         folded by ``stores.pairs_fold``
- ``bulk+fold``          ``replay_sessions`` in slices of 100
- ``bulk+fold before``   the same with ``sessions/_replay.py`` of another
                         checkout (``--before``): before/after in one process
- ``recover fast``       per session, ``read_decoded`` through
                         ``StateDecoder`` + ``fold_items`` (how an actor
                         recovers its session)
- ``recover reference``  per session, the codec's typed events + ``replay``
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from types import ModuleType
from typing import Any

sys.path.insert(0, "src")
sys.path.insert(0, str(Path(__file__).parent))

import orjson
import trio

import stores
from turnledger.adapters.stores import SQLiteStore
from turnledger.events import DEFAULT_CODEC
from turnledger.sessions import _replay, replay


def _module_from(src: str) -> ModuleType:
    """``turnledger.sessions._replay`` of another checkout, imported beside
    this one's (its relative imports resolve to this checkout's package)."""
    path = Path(src) / "turnledger" / "sessions" / "_replay.py"
    spec = importlib.util.spec_from_file_location("turnledger.sessions._replay_before", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


async def _bulk(module: Any, path: Path, sids: list[str]) -> None:
    store = await SQLiteStore.open(path)
    try:
        for i in range(0, len(sids), 100):
            await module.replay_sessions(store, sids[i : i + 100])
    finally:
        await store.aclose()


async def _typed(path: Path, sids: list[str]) -> None:
    store = await SQLiteStore.open(path)
    try:
        for i in range(0, len(sids), 100):
            await store.read_decoded_many(sids[i : i + 100], DEFAULT_CODEC, stores.pairs_fold)
    finally:
        await store.aclose()


async def _recover(fast: bool, path: Path, sids: list[str]) -> None:
    store = await SQLiteStore.open(path)
    decoder = _replay.StateDecoder()
    try:
        for sid in sids:
            if fast:
                _replay.fold_items(await store.read_decoded(sid, decoder))
            else:
                replay(await store.read_decoded(sid, DEFAULT_CODEC))
    finally:
        await store.aclose()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--before", help="the src directory of another checkout")
    args = parser.parse_args()
    sids = [f"session-{n:05d}" for n in range(200)]
    one_sids = [f"session-{n:05d}" for n in range(1000)]
    with tempfile.TemporaryDirectory(dir=os.environ.get("BENCH_DIR")) as d:
        path, one = Path(d) / "replay.db", Path(d) / "one.db"
        trio.run(stores._fill, path, sids, 30)
        trio.run(stores._fill, one, one_sids, 1)
        contenders: dict[str, Callable[[], Any]] = {
            "bare json": lambda: stores.bare_replay(path, sids),
            "bare orjson": lambda: stores.bare_replay(path, sids, orjson.loads),
            "typed bulk": lambda: trio.run(_typed, path, sids),
            "bulk+fold": lambda: trio.run(_bulk, _replay, path, sids),
        }
        if args.before:
            before = _module_from(args.before)
            contenders["bulk+fold before"] = lambda: trio.run(_bulk, before, path, sids)
        contenders["recover fast"] = lambda: trio.run(_recover, True, one, one_sids)
        contenders["recover reference"] = lambda: trio.run(_recover, False, one, one_sids)
        for run in contenders.values():  # warm-up: imports, caches
            run()
        cpu = {}
        for name, run in contenders.items():
            os.getppid()  # a new callgrind part (--dump-before=os_getppid)
            c0 = time.process_time()
            run()
            cpu[name] = time.process_time() - c0
        os.getppid()
    events = len(sids) * 91
    print("callgrind parts, from .2 on, in this order (per: divide the part's totals by it):")
    for name, seconds in cpu.items():
        per, unit = (1000, "session") if name.startswith("recover") else (events, "event")
        print(f"  {name:20s} per {per:,} {unit}s   (CPU here {seconds / per * 1e6:7.2f} µs/{unit})")


if __name__ == "__main__":
    main()
