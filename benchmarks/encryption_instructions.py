"""Sealed against plaintext SQLite replay from a fresh open, for an
instruction count: one callgrind dump each.

    valgrind --tool=callgrind --dump-before=os_getppid \\
        python benchmarks/encryption_instructions.py [--sessions N] [--turns N]

Instructions do not move with the machine's load, where CPU time on a
shared machine does by 10% and more (``benchmarks/encryption.py`` measures
CPU time). The script fills two SQLite files, plaintext and sealed
(``benchmarks/stores.py``'s data set, as ``benchmarks/encryption.py``
writes it), runs each contender once as a warm-up, then each once more with
an ``os.getppid()`` before it: run under ``--dump-before=os_getppid``,
callgrind writes one part per contender (``callgrind.out.<pid>.2`` is the
first contender, ``.3`` the second; the last part is the exit), and ``grep
totals`` of a part is its instruction count (every thread). Run natively, it prints the CPU time of
each, for a check. For a before/after comparison, run it again with
``PYTHONPATH=OTHER/src``.

Contenders: ``open+replay plaintext`` and ``open+replay sealed``: open the
store (the sealed one with its key ring and keys), read every session with
``read_decoded`` and fold it with ``replay``, close.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).parent))

import trio
from encryption import KEYS, _appends

from stores import dataset
from turnledger.adapters.stores import open_store
from turnledger.events import DEFAULT_CODEC
from turnledger.sessions import replay


async def _open_replay(path: Path, keys: Any, sids: list[str], turns: int) -> None:
    store = await open_store(path, keys=keys)
    try:
        for sid in sids:
            assert len(replay(await store.read_decoded(sid, DEFAULT_CODEC)).turns) == turns
    finally:
        await store.aclose()


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--sessions", type=int, default=200)
    p.add_argument("--turns", type=int, default=30)
    args = p.parse_args()
    sids, turns = dataset(args.sessions, args.turns)
    with tempfile.TemporaryDirectory() as tmp:
        plain, sealed = Path(tmp, "plain.db"), Path(tmp, "sealed.db")
        trio.run(_appends, plain, None, sids, turns)
        trio.run(_appends, sealed, KEYS, sids, turns)
        contenders = [
            ("open+replay plaintext", plain, None),
            ("open+replay sealed", sealed, KEYS),
        ]
        for _, path, keys in contenders:  # warm-up
            trio.run(_open_replay, path, keys, sids, args.turns)
        for name, path, keys in contenders:
            os.getppid()  # callgrind: --dump-before=os_getppid
            t0 = time.process_time()
            trio.run(_open_replay, path, keys, sids, args.turns)
            print(f"{name:22} {time.process_time() - t0:7.3f} s CPU")
        os.getppid()  # the last contender's part ends here, before the exit


if __name__ == "__main__":
    main()
