"""PostgresStore throughput across sessions and processes, against baselines.

    python benchmarks/postgres.py [--dsn DSN] [--sessions N] [--turns N] [--repeat N]

Needs a PostgreSQL server (default ``postgresql://postgres@127.0.0.1:5432/test``,
or ``$TURNLEDGER_TEST_PG_DSN``); every run uses a fresh schema, dropped after.
Runs with whichever turnledger the interpreter imports, so the same script
measures an older checkout's store for a before/after comparison.

A *turn* goes through a hub (``open_hub``, an instant scripted provider, logs
filtered out): ``--sessions`` sessions (default 1,000) each ask ``--turns``
questions (default 3) one after the other, all sessions at once; the clock
covers creating the sessions (taking their leases, reading them, the first
event) and every turn. Contenders, each the median of ``--repeat`` rounds; a
round runs each contender once, so a change in the machine's load during the
run falls on every contender alike:

- ``sqlite``       one hub on ``SQLiteStore`` (synchronous=FULL, group commit)
- ``postgres``     one hub on ``PostgresStore``, in this process
- ``1 process``    one hub process on ``PostgresStore`` with every session, timed
                   by this process from "go" to its report
- ``2 processes``  two hub processes, half the sessions each, started together,
                   timed until both have reported (a process closes its hub
                   only then, as the single process does after its clock)

Each hub process is started in a session of its own (``setsid``), as
separately started services are. Linux gives each session (autogroup) one
fair share of the CPU when other sessions want it: started in this script's
session, two hub processes would share one process's share on a loaded
machine, and the ratio would measure the scheduler, not the store. On an idle
machine it changes nothing.

Beside each row, the CPU it cost per turn, from ``/proc`` (Linux): ``hub``
is this process or the hub processes (all their threads), ``server`` every
``postgres`` process on this machine (when the server runs here and
``/proc`` shows its processes), ``others`` the rest of the machine's busy
time over the run, in cores: other processes, and kernel work charged to no
process (soft interrupts of the loopback network among them). With ``h`` and
``s`` the hub's and the server's CPU per turn and one hub process busy with
its one interpreter lock, two processes on two cores can at best reach
``2h / (h + s)`` times one; the script prints that bound.
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
import resource
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import NamedTuple
from urllib.parse import quote

import structlog
import trio

from turnledger.adapters.stores import PostgresStore, SQLiteStore
from turnledger.events import (
    DEFAULT_CODEC,
    Event,
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
import logging, resource, sys, time, structlog, trio
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

        cpu = resource.getrusage(resource.RUSAGE_SELF)
        async with trio.open_nursery() as nursery:
            for i in range(sessions):
                nursery.start_soon(one, f"{prefix}-{i}")
        end = resource.getrusage(resource.RUSAGE_SELF)
        used = end.ru_utime - cpu.ru_utime + end.ru_stime - cpu.ru_stime
        print(f"done {used}", flush=True)
        # Closed only once every process is done: one hub's shutdown must
        # not take CPU from another's turns, nor be counted as others' load.
        await trio.to_thread.run_sync(sys.stdin.readline)

trio.run(main, sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4]))
"""


class Run(NamedTuple):
    """One timed run: wall seconds and CPU seconds over the same span."""

    seconds: float
    hub: float  # the hub process(es), or this process's loop
    server: float | None  # every postgres process here, if /proc shows them
    others: float | None  # everything else on the machine


_TICK = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100


def _own_cpu() -> float:
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


def _machine_cpu() -> float | None:
    """CPU seconds the whole machine has been busy (``/proc/stat``)."""
    try:
        with open("/proc/stat") as f:
            user, nice, system, _idle, _iowait, irq, softirq = f.readline().split()[1:8]
    except OSError:
        return None
    return sum(int(v) for v in (user, nice, system, irq, softirq)) / _TICK


def _server_cpu() -> float | None:
    """CPU seconds of every ``postgres`` process on this machine, or None
    when ``/proc`` shows none (a server elsewhere)."""
    total, found = 0.0, False
    for pid in os.listdir("/proc") if os.path.isdir("/proc") else ():
        if not pid.isdigit():
            continue
        try:
            with open(f"/proc/{pid}/stat") as f:
                stat = f.read()
        except OSError:
            continue
        name, _, rest = stat.partition("(")[2].rpartition(")")
        if name.startswith("postgres"):
            fields = rest.split()
            total += (int(fields[11]) + int(fields[12])) / _TICK
            found = True
    return total if found else None


class Meter:
    """Wall time and CPU from :meth:`start` to :meth:`stop`."""

    def start(self) -> None:
        self.machine, self.server = _machine_cpu(), _server_cpu()
        self.own = _own_cpu()
        self.t0 = time.perf_counter()

    def stop(self, hub: float | None = None) -> Run:
        """``hub``: the hub processes' CPU; default this process's."""
        seconds = time.perf_counter() - self.t0
        own = _own_cpu() - self.own
        machine, server = _machine_cpu(), _server_cpu()
        spent = None if server is None or self.server is None else server - self.server
        others = None
        if machine is not None and self.machine is not None:
            ours = own + (hub or 0.0) + (spent or 0.0)
            others = max(0.0, machine - self.machine - ours)
        return Run(seconds, own if hub is None else hub, spent, others)


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


async def _hub_turns(store: EventStore, sessions: int, turns: int) -> Run:
    async with open_hub(store, ScriptedProvider.instant(), model="m") as hub:

        async def one(sid: str) -> None:
            for t in range(turns):
                await (await hub.submit(sid, f"question {t}?")).outcome()

        meter = Meter()
        meter.start()
        async with trio.open_nursery() as nursery:
            for i in range(sessions):
                nursery.start_soon(one, f"s-{i}")
        return meter.stop()


def sqlite_hub(sessions: int, turns: int) -> Run:
    async def run() -> Run:
        with tempfile.TemporaryDirectory(dir=os.environ.get("BENCH_DIR")) as d:
            store = await SQLiteStore.open(Path(d) / "events.db")
            async with store:
                return await _hub_turns(store, sessions, turns)

    return trio.run(run)


def postgres_hub(base: str, sessions: int, turns: int) -> Run:
    async def run() -> Run:
        with fresh_schema(base) as dsn:
            store = await PostgresStore.open(dsn)
            async with store:
                return await _hub_turns(store, sessions, turns)

    return trio.run(run)


def processes(base: str, count: int, sessions: int, turns: int) -> Run:
    """From "go" until every hub process reported done (each in a session
    of its own: see the module's notes)."""
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
                start_new_session=True,
            )
            for n in range(count)
        ]
        try:
            for p in procs:
                assert p.stdout is not None and p.stdout.readline().strip() == b"ready"
            meter = Meter()
            meter.start()
            for p in procs:
                assert p.stdin is not None
                p.stdin.write(b"go\n")
            hub = 0.0
            for p in procs:
                assert p.stdout is not None
                word, cpu = p.stdout.readline().split()
                assert word == b"done"
                hub += float(cpu)
            run = meter.stop(hub)
            for p in procs:
                assert p.stdin is not None
                p.stdin.write(b"close\n")
            for p in procs:
                assert p.wait(timeout=60) == 0
            return run
        finally:
            for p in procs:
                if p.poll() is None:
                    p.kill()
                    p.wait()


async def _create(dsn: str) -> None:
    await (await PostgresStore.open(dsn)).aclose()


def _turn(sid: str, version: int, t: int) -> list[StoredEvent]:
    rid = RequestId(f"{sid}/{t}")
    events: list[Event] = [
        TurnSubmitted(rid, f"question {t}?", t, 0, 200),
        StreamStarted(rid),
        TurnCommitted(rid, "ok", "stop"),
    ]
    return [
        DEFAULT_CODEC.encode(e, session_id=sid, seq=version + i, recorded_at=time.time())
        for i, e in enumerate(events, 1)
    ]


def bare_psycopg(base: str, sessions: int, turns: int) -> Run:
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
        meter = Meter()
        meter.start()
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
        return meter.stop()


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


def _median(values: Sequence[float | None]) -> float | None:
    known = [v for v in values if v is not None]
    return statistics.median(known) if known else None


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
    contenders: dict[str, Callable[[], Run]] = {
        "sqlite": lambda: sqlite_hub(n, turns),
        "postgres": lambda: postgres_hub(base, n, turns),
        "1 process": lambda: processes(base, 1, n, turns),
        "2 processes": lambda: processes(base, 2, n, turns),
        "bare psycopg": lambda: bare_psycopg(base, n, turns),
    }
    runs: dict[str, list[Run]] = {name: [] for name in contenders}
    for _ in range(repeat):
        for name, contender in contenders.items():
            runs[name].append(contender())
    rate = {k: n_turns / statistics.median(r.seconds for r in v) for k, v in runs.items()}
    cpu: dict[str, tuple[float | None, float | None]] = {}
    print(f"  {'':13s} {'turns/s':>9s}  {'µs/turn':>9s}   CPU µs/turn: hub  server   others")
    for name, r in rate.items():
        hub = _median([x.hub / n_turns * 1e6 for x in runs[name]])
        server = _median([x.server and x.server / n_turns * 1e6 for x in runs[name]])
        others = _median([x.others and x.others / x.seconds for x in runs[name]])
        cpu[name] = (hub, server)
        print(
            f"  {name:13s} {r:9,.0f}  {1e6 / r:9.1f}   {hub or 0:16,.0f}  "
            + ("     -" if server is None or name == "sqlite" else f"{server:6,.0f}")
            + ("" if others is None else f"  {others:4.2f} cores")
        )
    p50, p99 = append_latency(base, args.appends)
    print(f"  append of 3 events, one at a time: p50 {p50 * 1e3:.2f} ms, p99 {p99 * 1e3:.2f} ms")
    print(
        f"  postgres / sqlite           {rate['postgres'] / rate['sqlite']:6.2f}x  (goal >= 0.5x)"
    )
    print(
        f"  2 processes / 1 process     {rate['2 processes'] / rate['1 process']:6.2f}x"
        "  (goal >= 1.3x)"
    )
    h, srv = cpu["1 process"]
    if h is not None and srv is not None:
        print(f"    at best on 2 cores, from 1 process's CPU: 2h/(h+s) = {2 * h / (h + srv):.2f}x")
    print(f"  postgres / bare psycopg     {rate['postgres'] / rate['bare psycopg']:6.2f}x")


if __name__ == "__main__":
    main()
