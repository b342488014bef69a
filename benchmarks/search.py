"""``turnledger search``: how to find text in 100,000 committed turns.

    python benchmarks/search.py [--sessions N] [--turns N] [--repeat N]

A SQLite store of ``--sessions`` sessions (default 1,000) of ``--turns``
turns each (default 100: 100,000 turns; a 100-character question and a
600-character answer, mixed scripts). One question holds a word found
nowhere else. Contenders, each finding that word (case ignored):

- ``full scan``  every session replayed into its state machine on the
                 store's reader thread (``read_decoded_many``), its committed
                 turns matched: any store kind, and only history is searched
- ``cli search`` what ``turnledger search DB WORD`` does: the same, but a
                 session whose stored payload text does not hold the word
                 (case folded) is not parsed at all (``find_turns``)
- ``LIKE``       one ``SELECT ... WHERE payload LIKE '%word%'`` over the
                 turn_submitted and turn_committed rows: a plain scan without
                 typing (it would still need the outcome of each question to
                 leave discarded ones out)
- ``FTS5``       a query of an FTS5 index over the same rows; the time to
                 build that index (once, ``FTS5 build``) is printed apart: a
                 store would have to keep it up to date on every append

Figures are medians over ``--repeat`` runs; ratios are against ``full scan``,
measured in the same run.
"""

from __future__ import annotations

import argparse
import sqlite3
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import trio

from turnledger.adapters.stores import SQLiteStore
from turnledger.cli._browse import _matches, find_turns
from turnledger.events import (
    DEFAULT_CODEC,
    Event,
    Ledger,
    RequestId,
    SessionStarted,
    StoredEvent,
    StreamStarted,
    TurnCommitted,
    TurnSubmitted,
    Usage,
)

QUESTION = "问题 {i}: how does an append-only log keep its promises? " + "Warum? " * 6
ANSWER = "回答 {i}: " + "Each event is written once and never changed; 之后只读. " * 11
NEEDLE = "Quetzalcoatl"


def session_events(sid: str, turns: int, needle_at: int | None) -> list[StoredEvent]:
    now = time.time()
    events: list[Event] = [SessionStarted("Answer briefly.", "bench-model", Ledger())]
    for i in range(turns):
        rid = RequestId(f"{sid}/r{i}")
        question = QUESTION.format(i=i) + (f" {NEEDLE}?" if i == needle_at else "")
        events += [
            TurnSubmitted(rid, question, i, 0, 900 + i),
            StreamStarted(rid),
            TurnCommitted(rid, ANSWER.format(i=i), "stop", Usage(120, 160, 280)),
        ]
    return [
        DEFAULT_CODEC.encode(ev, session_id=sid, seq=n, recorded_at=now)
        for n, ev in enumerate(events, 1)
    ]


async def fill(path: Path, sessions: int, turns: int) -> None:
    store = await SQLiteStore.open(path, synchronous="OFF")
    try:
        for n in range(sessions):
            needle_at = turns // 2 if n == sessions // 2 else None
            await store.append(f"s-{n:05d}", session_events(f"s-{n:05d}", turns, needle_at), 0)
    finally:
        await store.aclose()


async def _full_scan(path: Path) -> int:
    store = await SQLiteStore.open(path)
    try:
        ids = await store.session_ids()
        found = 0
        for i in range(0, len(ids), 256):
            hits = await store.read_decoded_many(
                ids[i : i + 256], DEFAULT_CODEC, _matches(NEEDLE.casefold())
            )
            found += sum(len(rows) for rows in hits.values())
        return found
    finally:
        await store.aclose()


def full_scan(path: Path) -> int:
    return trio.run(_full_scan, path)


async def _cli_search(path: Path) -> int:
    store = await SQLiteStore.open(path)
    try:
        hits = await find_turns(store, NEEDLE)
        return sum(len(rows) for rows in hits.values())
    finally:
        await store.aclose()


def cli_search(path: Path) -> int:
    return trio.run(_cli_search, path)


def like(path: Path) -> int:
    with sqlite3.connect(path) as db:
        rows = db.execute(
            "SELECT session_id, seq FROM events WHERE tag IN ('turn_submitted', "
            "'turn_committed') AND payload LIKE ?",
            (f"%{NEEDLE}%",),
        ).fetchall()
    return len(rows)


def fts_build(path: Path) -> None:
    with sqlite3.connect(path) as db:
        db.execute("DROP TABLE IF EXISTS bench_fts")
        db.execute("CREATE VIRTUAL TABLE bench_fts USING fts5(body, content='events', "
                   "content_rowid='position')")  # fmt: skip
        db.execute(
            "INSERT INTO bench_fts (rowid, body) SELECT position, payload FROM events "
            "WHERE tag IN ('turn_submitted', 'turn_committed')"
        )


def fts(path: Path) -> int:
    with sqlite3.connect(path) as db:
        rows = db.execute(
            "SELECT rowid FROM bench_fts WHERE bench_fts MATCH ?", (f'"{NEEDLE}"',)
        ).fetchall()
    return len(rows)


def timed(run: Callable[[], object]) -> tuple[float, object]:
    t0 = time.perf_counter()
    result = run()
    return time.perf_counter() - t0, result


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--sessions", type=int, default=1000)
    p.add_argument("--turns", type=int, default=100)
    p.add_argument("--repeat", type=int, default=5)
    args = p.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "search.db"
        seconds, _ = timed(lambda: trio.run(fill, path, args.sessions, args.turns))
        print(f"{args.sessions * args.turns:,} turns in {args.sessions:,} sessions "
              f"({path.stat().st_size / 2**20:.0f} MiB), written in {seconds:.1f} s")  # fmt: skip
        build, _ = timed(lambda: fts_build(path))
        medians: dict[str, float] = {}
        contenders = (("full scan", full_scan), ("cli search", cli_search), ("LIKE", like),
                      ("FTS5", fts))  # fmt: skip
        for name, run in contenders:
            times = []
            for _ in range(args.repeat):
                elapsed, found = timed(lambda run=run: run(path))  # type: ignore[misc]
                assert found == 1, (name, found)
                times.append(elapsed)
            medians[name] = statistics.median(times)
        base = medians["full scan"]
        print(f"{'contender':<11} {'median':>10} {'vs full scan':>13}")
        for name, value in medians.items():
            print(f"{name:<11} {value * 1000:>8.1f}ms {value / base:>12.3f}x")
        print(f"{'FTS5 build':<11} {build * 1000:>8.1f}ms {build / base:>12.3f}x  (once)")
    sys.stdout.flush()


if __name__ == "__main__":
    main()
