"""PostgresStore throughput across sessions and processes, against baselines.

    python benchmarks/postgres.py [--dsn DSN] [--sessions N] [--turns N] [--repeat N]

Needs a PostgreSQL server (default ``postgresql://postgres@127.0.0.1:5432/test``,
or ``$TURNLEDGER_TEST_PG_DSN``); every run uses a fresh schema, dropped after.
Runs with whichever turnledger the interpreter imports, so the same script
measures an older checkout's store for a before/after comparison.

A *turn* goes through a hub (``open_hub``, an instant scripted provider, logs
filtered out): ``--sessions`` sessions (default 1,000) each ask ``--turns``
questions (default 3) one after the other, all sessions at once; the clock
covers creating the sessions and every turn. Contenders, each the median of
``--repeat`` runs:

- ``sqlite``       one hub on ``SQLiteStore`` (synchronous=FULL, group commit)
- ``postgres``     one hub on ``PostgresStore``, in this process
- ``1 process``    one hub process on ``PostgresStore`` with every session, timed
                   by this process from "go" to its report
- ``2 processes``  two hub processes, half the sessions each, started together
- ``bare psycopg`` a plain psycopg loop, one connection: per turn one
                   transaction inserting the 3 events' rows (no version check,
                   no hub): the floor of one transaction per turn
- ``append``       p50/p99 latency of one ``PostgresStore.append`` of a turn's
                   3 events, one session, one append at a time
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from urllib.parse import quote

import structlog
import trio

from turnledger.adapters.stores import PostgresStore, SQLiteStore
from turnledger.events import (
    DEFAULT_CODEC,
    EventStore,
    RequestId,
    StoredEvent,
    StreamStarted,
    TurnCommitted,
    TurnSubmitted,
)
from turnledger.sessions import open_hub
from turnledger.testing import ScriptedProvider

DEFAULT_DSN = "postgresql://postgres@127.0.0.1:5432/test"

_CHILD = """
import logging, sys, time, structlog, trio
from turnledger.adapters.stores import PostgresStore
from turnledger.sessions import open_hub
from turnledger.testing import ScriptedProvider

structlog.configure(wrapper_class=structlog.make_filtering_bound_logger(logging.WARNING))

async def main(dsn, prefix, sessions, turns):
    store = await PostgresStore.open(dsn)
    async with store, open_hub(store, ScriptedProvider.instant(), model="m") as hub:
        print("ready", flush=True)
        await trio.to_thread.run_sync(sys.stdin.readline)

        async def one(sid):
            for t in range(turns):
                await (await hub.submit(sid, f"question {t}?")).outcome()

        async with trio.open_nursery() as nursery:
            for i in range(sessions):
                nursery.start_soon(one, f"{prefix}-{i}")
        print("done", flush=True)

trio.run(main, sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4]))
"""


@contextmanager
def fresh_schema(base: str) -> Iterator[str]:
    """A DSN whose search_path is a new schema, dropped afterwards."""
    import psycopg

    schema = f"tl_bench_{uuid.uuid4().hex[:12]}"
    with psycopg.connect(base, autocommit=True) as admin:
        admin.execute(f'CREATE SCHEMA "{schema}"')
        sep = "&" if "?" in base else "?"
        try:
            yield f"{base}{sep}options={quote(f'-c search_path={schema}')}"
        finally:
            admin.execute(f'DROP SCHEMA "{schema}" CASCADE')


async def _hub_turns(store: EventStore, sessions: int, turns: int) -> float:
    async with open_hub(store, ScriptedProvider.instant(), model="m") as hub:

        async def one(sid: str) -> None:
            for t in range(turns):
                await (await hub.submit(sid, f"question {t}?")).outcome()

        t0 = time.perf_counter()
        async with trio.open_nursery() as nursery:
            for i in range(sessions):
                nursery.start_soon(one, f"s-{i}")
        return time.perf_counter() - t0


def sqlite_hub(sessions: int, turns: int) -> float:
    async def run() -> float:
        with tempfile.TemporaryDirectory(dir=os.environ.get("BENCH_DIR")) as d:
            store = await SQLiteStore.open(Path(d) / "events.db")
            async with store:
                return await _hub_turns(store, sessions, turns)

    return trio.run(run)


def postgres_hub(base: str, sessions: int, turns: int) -> float:
    async def run() -> float:
        with fresh_schema(base) as dsn:
            store = await PostgresStore.open(dsn)
            async with store:
                return await _hub_turns(store, sessions, turns)

    return trio.run(run)


def processes(base: str, count: int, sessions: int, turns: int) -> float:
    """Wall time from "go" until every hub process reported done."""
    with fresh_schema(base) as dsn:
        # Create the table first, so the children do not race to.
        trio.run(lambda: _create(dsn))
        per = sessions // count
        procs = [
            subprocess.Popen(
                [sys.executable, "-c", _CHILD, dsn, f"p{n}", str(per), str(turns)],
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                bufsize=0,
            )
            for n in range(count)
        ]
        try:
            for p in procs:
                assert p.stdout is not None and p.stdout.readline().strip() == b"ready"
            t0 = time.perf_counter()
            for p in procs:
                assert p.stdin is not None
                p.stdin.write(b"go\n")
            for p in procs:
                assert p.stdout is not None and p.stdout.readline().strip() == b"done"
            elapsed = time.perf_counter() - t0
            for p in procs:
                assert p.wait(timeout=60) == 0
            return elapsed
        finally:
            for p in procs:
                if p.poll() is None:
                    p.kill()
                    p.wait()


async def _create(dsn: str) -> None:
    await (await PostgresStore.open(dsn)).aclose()


def _turn(sid: str, version: int, t: int) -> list[StoredEvent]:
    rid = RequestId(f"{sid}/{t}")
    events = [
        TurnSubmitted(rid, f"question {t}?", t, 0, 200),
        StreamStarted(rid),
        TurnCommitted(rid, "ok", "stop"),
    ]
    return [
        DEFAULT_CODEC.encode(e, session_id=sid, seq=version + i, recorded_at=time.time())
        for i, e in enumerate(events, 1)
    ]


def bare_psycopg(base: str, sessions: int, turns: int) -> float:
    """One connection, one transaction per turn inserting its rows."""
    import psycopg

    with fresh_schema(base) as dsn, psycopg.connect(dsn) as conn:
        conn.execute(
            "CREATE TABLE bare (position bigserial PRIMARY KEY, session_id text NOT NULL,"
            " seq integer NOT NULL, tag text NOT NULL, schema_version integer NOT NULL,"
            " payload jsonb NOT NULL, recorded_at double precision NOT NULL,"
            " UNIQUE (session_id, seq))"
        )
        conn.commit()
        work = [(f"s-{i}", t) for t in range(turns) for i in range(sessions)]
        t0 = time.perf_counter()
        for sid, t in work:
            rows = [
                (
                    e.session_id,
                    e.seq,
                    e.tag,
                    e.schema_version,
                    json.dumps(e.payload),
                    e.recorded_at,
                )
                for e in _turn(sid, 3 * t, t)
            ]
            with conn.transaction():
                conn.cursor().executemany(
                    "INSERT INTO bare (session_id, seq, tag, schema_version, payload,"
                    " recorded_at) VALUES (%s, %s, %s, %s, %s::jsonb, %s)",
                    rows,
                )
        return time.perf_counter() - t0


def append_latency(base: str, appends: int) -> tuple[float, float]:
    async def run() -> list[float]:
        with fresh_schema(base) as dsn:
            store = await PostgresStore.open(dsn)
            async with store:
                times = []
                version = 0
                for t in range(appends):
                    batch = _turn("one", version, t)
                    t0 = time.perf_counter()
                    version = await store.append("one", batch, version)
                    times.append(time.perf_counter() - t0)
                return times

    times = sorted(trio.run(run))
    return times[len(times) // 2], times[min(len(times) - 1, int(len(times) * 0.99))]


def median_of(repeat: int, run: Callable[[], float]) -> float:
    return statistics.median(run() for _ in range(repeat))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--dsn", default=os.environ.get("TURNLEDGER_TEST_PG_DSN", DEFAULT_DSN))
    parser.add_argument("--sessions", type=int, default=1000)
    parser.add_argument("--turns", type=int, default=3)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--appends", type=int, default=300, help="appends timed one by one")
    args = parser.parse_args()
    structlog.configure(wrapper_class=structlog.make_filtering_bound_logger(logging.WARNING))
    import turnledger

    n, turns, repeat, base = args.sessions, args.turns, args.repeat, args.dsn
    n_turns = n * turns
    print(
        f"python {platform.python_version()}, {os.cpu_count()} cpus; turnledger from "
        f"{Path(turnledger.__file__).parent}"
    )
    print(f"{n} concurrent sessions x {turns} turns = {n_turns} turns; median of {repeat}")
    secs = {
        "sqlite": median_of(repeat, lambda: sqlite_hub(n, turns)),
        "postgres": median_of(repeat, lambda: postgres_hub(base, n, turns)),
        "1 process": median_of(repeat, lambda: processes(base, 1, n, turns)),
        "2 processes": median_of(repeat, lambda: processes(base, 2, n, turns)),
        "bare psycopg": median_of(repeat, lambda: bare_psycopg(base, n, turns)),
    }
    rate = {k: n_turns / v for k, v in secs.items()}
    for name, r in rate.items():
        print(f"  {name:13s} {r:9,.0f} turns/s  {secs[name] * 1e6 / n_turns:9.1f} µs/turn")
    p50, p99 = append_latency(base, args.appends)
    print(f"  append of 3 events, one at a time: p50 {p50 * 1e3:.2f} ms, p99 {p99 * 1e3:.2f} ms")
    print(
        f"  postgres / sqlite           {rate['postgres'] / rate['sqlite']:6.2f}x  (goal >= 0.5x)"
    )
    print(
        f"  2 processes / 1 process     {rate['2 processes'] / rate['1 process']:6.2f}x"
        "  (goal >= 1.3x)"
    )
    print(f"  postgres / bare psycopg     {rate['postgres'] / rate['bare psycopg']:6.2f}x")


if __name__ == "__main__":
    main()
