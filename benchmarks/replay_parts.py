"""Where replay's time goes: each stage of reading sessions back, alone.

    python benchmarks/replay_parts.py [--sessions N] [--turns N] [--repeat N]

The same data set as ``benchmarks/stores.py`` (sessions of SessionStarted
plus 3 events per turn, 600-character answers in mixed scripts), in a
SQLite file, read on this thread without the store (no reader thread, no
trio): each stage is timed over every session, CPU time, best of
``--repeat``, in µs per event.

- ``fetch``            ``SELECT seq, tag, schema_version, CAST(payload AS
                       BLOB)``, the store's replay query, ``fetchall``
- ``fetch as text``    the same with ``payload`` as text (what the bare
                       baselines read: SQLite's UTF-8 decoded into ``str``)
- ``orjson``           ``orjson.loads`` of each payload (bytes)
- ``json``             ``json.loads`` of each payload (text)
- ``codec``            ``DEFAULT_CODEC.decode_rows``: parse + typed events
- ``state decoder``    ``StateDecoder.decode_rows``: parse + the fold's tuples
- ``fold_items``       the fast fold of those tuples into the state
- ``replay``           the reference fold (``evolve`` per event) of typed events
- ``bare json`` / ``bare orjson``  the baselines of stores.py, whole
- ``typed bulk`` / ``bulk+fold``   the stages of those contenders, summed
"""

from __future__ import annotations

import argparse
import json
import sqlite3
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, "src")
sys.path.insert(0, str(Path(__file__).parent))

import orjson
import trio

import stores
from turnledger.events import DEFAULT_CODEC
from turnledger.sessions import replay
from turnledger.sessions._replay import StateDecoder, fold_items

QUERY = (
    "SELECT seq, tag, schema_version, {payload} FROM events"
    " WHERE session_id = ? AND seq > 0 ORDER BY seq"
)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--sessions", type=int, default=200)
    parser.add_argument("--turns", type=int, default=30)
    parser.add_argument("--repeat", type=int, default=7)
    args = parser.parse_args()
    sids = [f"session-{n:05d}" for n in range(args.sessions)]
    n_events: int = args.sessions * (1 + 3 * args.turns)
    with tempfile.TemporaryDirectory() as d:
        path = Path(d) / "replay.db"
        trio.run(stores._fill, path, sids, args.turns)
        conn = sqlite3.connect(path)
        blob = QUERY.format(payload="CAST(payload AS BLOB)")
        text = QUERY.format(payload="payload")
        rows = [conn.execute(blob, (s,)).fetchall() for s in sids]
        text_rows = [conn.execute(text, (s,)).fetchall() for s in sids]
        decoder = StateDecoder()
        items = [decoder.decode_rows(s, r) for s, r in zip(sids, rows, strict=True)]
        typed = [DEFAULT_CODEC.decode_rows(s, r) for s, r in zip(sids, rows, strict=True)]
        for it, ev in zip(items, typed, strict=True):
            assert fold_items(it) == replay(ev)

        def cost(fn: Callable[[], Any]) -> float:
            best = float("inf")
            for _ in range(args.repeat):
                t0 = time.process_time()
                fn()
                best = min(best, time.process_time() - t0)
            return best * 1e6 / n_events

        parts = {
            "fetch": lambda: [conn.execute(blob, (s,)).fetchall() for s in sids],
            "fetch as text": lambda: [conn.execute(text, (s,)).fetchall() for s in sids],
            "orjson": lambda: [[orjson.loads(r[3]) for r in rs] for rs in rows],
            "json": lambda: [[json.loads(r[3]) for r in rs] for rs in text_rows],
            "codec": lambda: [
                DEFAULT_CODEC.decode_rows(s, r) for s, r in zip(sids, rows, strict=True)
            ],
            "state decoder": lambda: [
                decoder.decode_rows(s, r) for s, r in zip(sids, rows, strict=True)
            ],
            "fold_items": lambda: [fold_items(it) for it in items],
            "replay": lambda: [replay(ev) for ev in typed],
            "pairs_fold": lambda: [
                stores.pairs_fold(s, ev) for s, ev in zip(sids, typed, strict=True)
            ],
            "bare json": lambda: stores.bare_replay(path, sids),
            "bare orjson": lambda: stores.bare_replay(path, sids, orjson.loads),
        }
        got = {name: cost(fn) for name, fn in parts.items()}
        conn.close()
    print(
        f"{args.sessions} sessions x {1 + 3 * args.turns} events; CPU µs per event, best of "
        f"{args.repeat}"
    )
    for name, us in got.items():
        print(f"  {name:16s} {us:6.2f}")
    typed_bulk = got["fetch"] + got["codec"] + got["pairs_fold"]
    bulk_fold = got["fetch"] + got["state decoder"] + got["fold_items"]
    reference = got["fetch"] + got["codec"] + got["replay"]
    print(
        f"  typed bulk = fetch + codec + pairs_fold        {typed_bulk:6.2f}"
        f"   bare orjson / it {got['bare orjson'] / typed_bulk:5.2f}x"
    )
    print(
        f"  bulk+fold = fetch + state decoder + fold_items {bulk_fold:6.2f}"
        f"   bare json / it {got['bare json'] / bulk_fold:5.2f}x"
    )
    print(
        f"  (the reference fold: fetch + codec + replay    {reference:6.2f}"
        f"   bare json / it {got['bare json'] / reference:5.2f}x)"
    )


if __name__ == "__main__":
    main()
