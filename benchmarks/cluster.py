"""Several ``turnledger serve`` nodes on one PostgreSQL; every figure is measured in this run.

    python benchmarks/cluster.py [--dsn DSN] [--nodes 1,2,3] [--clients N] [--turns N]
        [--routing sticky|random|nginx] [--streams N] [--pg-only]

Needs a PostgreSQL server (default ``postgresql://postgres@127.0.0.1:5432/test``,
or ``$TURNLEDGER_TEST_PG_DSN``) and, for ``--routing nginx``, Debian's nginx.
Each row starts a fresh schema, the loopback model server in a child process
and N serve nodes (``turnledger.testing.cluster``), and stops them after.

- ``turns/s``: ``--clients`` clients at once, each asking ``--turns``
  questions of its own session one after the other, each answered in
  ``--deltas`` deltas ``--pause`` s apart; wall time from the first POST to
  the last outcome. ``ratio`` is against the 1-node row of the same run.
  Routing: ``sticky`` sends client i to node i mod N (a session stays on
  the node that owns it: works without hand-over between nodes); ``random``
  picks a node per call, ``nginx`` goes through nginx round robin (both
  need nodes that hand questions to a session's owner, issue 28 part A).
- ``ttfd p50/p99``: time to first delta, from sending the POST to the
  first ``delta`` event.
- ``db ms/turn``: CPU of the PostgreSQL backends the nodes connected
  (found by their ``application_name``, read from ``/proc/PID/stat``), per
  turn; the server's shared processes (WAL writer, checkpointer) are not
  counted.
- ``cross-node preview``: ``--streams`` turns at once, each POSTed to one
  node and followed at the same time from another with ``GET .../stream``;
  per delta, its arrival there minus its arrival on the owner's stream;
  p50/p99. Needs turns streamed from any node (issue 28 part B): without
  it the row says what the other node answered.
- ``NOTIFY``: notifications per second one connection sends (one per
  transaction; 100 per transaction, one statement each; 100 in one
  statement) and a listener receives.
- ``lease renewal``: one renewal of a store holding M sessions' leases
  (the store's own statement), per session.

The machine's load average is printed: on a shared machine, compare ratios
within a run, not absolute figures across runs.
"""

from __future__ import annotations

import argparse
import os
import random
import statistics
import sys
import threading
import time
import uuid
from collections.abc import Callable, Sequence
from pathlib import Path
from tempfile import TemporaryDirectory
from typing import Any

import httpx
import trio

sys.path.insert(0, str(Path(__file__).parent))

from postgres import fresh_schema

from turnledger.testing.cluster import (
    Cluster,
    TurnPlan,
    TurnRecord,
    drive_turn,
    open_cluster,
    pick_random,
)

_TICK = os.sysconf("SC_CLK_TCK")


def _cpu_of(pid: int) -> float | None:
    try:
        with open(f"/proc/{pid}/stat") as f:
            rest = f.read().rpartition(")")[2].split()
    except OSError:
        return None
    return (int(rest[11]) + int(rest[12])) / _TICK


class BackendMeter:
    """CPU of the server backends that processes ``pids`` connected (the
    store names each connection ``turnledger pid=PID host=...``): sampled
    every ``every`` s (backends come and go), summed at the end."""

    def __init__(self, base: str, pids: Sequence[int], every: float = 0.25) -> None:
        self.base, self.every = base, every
        self.names = [f"turnledger pid={pid} %" for pid in pids]
        self.first: dict[int, float] = {}
        self.last: dict[int, float] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _sample(self, conn: Any, *, baseline: bool) -> None:
        rows = conn.execute(
            "SELECT pid FROM pg_stat_activity WHERE application_name LIKE ANY(%s)", (self.names,)
        ).fetchall()
        for (pid,) in rows:
            cpu = _cpu_of(pid)
            if cpu is None:
                continue
            # A backend born during the run spent all its CPU in it.
            self.first.setdefault(pid, cpu if baseline else 0.0)
            self.last[pid] = cpu

    def _run(self) -> None:
        import psycopg

        with psycopg.connect(self.base, autocommit=True) as conn:
            self._sample(conn, baseline=True)
            self._started.set()
            while not self._stop.wait(self.every):
                self._sample(conn, baseline=False)
            self._sample(conn, baseline=False)

    def __enter__(self) -> BackendMeter:
        self._started = threading.Event()
        self._thread.start()
        self._started.wait(30)
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(30)

    @property
    def seconds(self) -> float:
        return sum(self.last[p] - self.first[p] for p in self.last)


def _pct(values: Sequence[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))] if ordered else float("nan")


def _routes(cluster: Cluster, routing: str, rng: random.Random) -> Callable[[int], Any]:
    """For client i, its ``pick`` for drive_turn."""
    nodes = [n.url for n in cluster.nodes]

    def for_client(i: int) -> Callable[[Sequence[str]], str]:
        if routing == "nginx":
            assert cluster.nginx is not None
            proxy = cluster.nginx.url
            return lambda used: proxy
        if routing == "random":
            return pick_random(lambda: nodes, random.Random(rng.random()))
        mine = nodes[i % len(nodes)]
        return lambda used: mine

    return for_client


async def _turns(
    cluster: Cluster, routing: str, clients: int, turns: int, question: str
) -> tuple[float, list[TurnRecord]]:
    rng = random.Random(7)
    route = _routes(cluster, routing, rng)
    records: list[TurnRecord] = []
    limits = httpx.Limits(max_connections=2 * clients + 10, max_keepalive_connections=clients)
    async with httpx.AsyncClient(limits=limits, timeout=httpx.Timeout(120.0)) as client:

        async def one(i: int) -> None:
            pick = route(i)
            for t in range(turns):
                plan = TurnPlan(f"b{i}", f"b{i}-t{t}", f"{question} b{i}-t{t}", 0)
                records.append(await drive_turn(client, pick, plan, deadline=300))

        t0 = time.perf_counter()
        async with trio.open_nursery() as nursery:
            for i in range(clients):
                nursery.start_soon(one, i)
        seconds = time.perf_counter() - t0
    return seconds, records


async def _cross_node(cluster: Cluster, streams: int, question: str) -> dict[str, Any]:
    """Owner's stream against another node's stream of the same turn."""
    a, b = cluster.nodes[0].url, cluster.nodes[1].url
    gaps: list[float] = []
    refused: list[str] = []
    limits = httpx.Limits(max_connections=3 * streams, max_keepalive_connections=2 * streams)
    async with httpx.AsyncClient(limits=limits, timeout=httpx.Timeout(120.0)) as client:

        async def one(i: int) -> None:
            sid, rid = f"x{i}", f"x{i}-t0"
            acked = trio.Event()
            owner: dict[int, float] = {}
            other: dict[int, float] = {}

            async def read(method: str, url: str, into: dict[int, float], **kw: Any) -> None:
                async with client.stream(method, url, **kw) as r:
                    if not r.headers.get("content-type", "").startswith("text/event-stream"):
                        refused.append(f"{r.status_code} {(await r.aread())[:120]!r}")
                        return
                    ident = None
                    async for line in r.aiter_lines():
                        if line.startswith("event: turn"):
                            acked.set()
                        elif line.startswith("id: "):
                            ident = int(line[4:])
                        elif line.startswith("data: ") and ident is not None:
                            into.setdefault(ident, time.monotonic())
                            ident = None

            async def follow() -> None:
                await acked.wait()
                url = f"{b}/v1/sessions/{sid}/turns/{rid}/stream"
                await read("GET", url, other, headers={"Last-Event-ID": "0"})

            body = {"question": f"{question} {rid}", "request_id": rid}
            async with trio.open_nursery() as nursery:
                nursery.start_soon(follow)
                await read("POST", f"{a}/v1/sessions/{sid}/turns", owner, json=body)
            gaps.extend(other[k] - owner[k] for k in owner.keys() & other.keys())

        async with trio.open_nursery() as nursery:
            for i in range(streams):
                nursery.start_soon(one, i)
    return {"gaps": gaps, "refused": refused}


def cluster_row(base: str, nodes: int, args: argparse.Namespace) -> dict[str, Any]:
    question = f"slow {args.deltas} {args.pause}"
    with (
        fresh_schema(base) as dsn,
        TemporaryDirectory() as tmp,
        open_cluster(
            dsn,
            Path(tmp),
            nodes,
            nginx=args.routing == "nginx",
            node_args=("--idle-timeout", "300"),
        ) as cluster,  # fmt: skip
    ):
        with BackendMeter(base, [n.proc.pid for n in cluster.nodes]) as meter:
            seconds, records = trio.run(
                _turns, cluster, args.routing, args.clients, args.turns, question
            )
        ok = sum(1 for r in records if r.outcome and r.outcome["kind"] == "committed")
        ttfd = [r.first_delta_at - r.posted_at for r in records if r.first_delta_at is not None]
        row: dict[str, Any] = {
            "nodes": nodes,
            "turns": len(records),
            "committed": ok,
            "seconds": seconds,
            "turns_per_s": len(records) / seconds,
            "ttfd_p50": _pct(ttfd, 0.5),
            "ttfd_p99": _pct(ttfd, 0.99),
            "db_ms_per_turn": 1000 * meter.seconds / max(1, len(records)),
        }
        if nodes >= 2 and args.streams:
            row["cross"] = trio.run(_cross_node, cluster, args.streams, question)
    return row


def notify_rate(base: str, count: int) -> dict[str, float]:
    """Notifications per second: sent one per transaction, and 100 per
    transaction; the listener's receipt of the last one ends the clock."""
    import psycopg

    channel = f"tl_bench_{uuid.uuid4().hex[:8]}"
    out: dict[str, float] = {}
    with psycopg.connect(base, autocommit=True) as listener, psycopg.connect(base) as sender:
        listener.execute(f"LISTEN {channel}")
        modes = (("one per transaction", 1, 1), ("100 per transaction", 100, 1),
                 ("100 per statement", 100, 100))  # fmt: skip
        for label, per_tx, per_statement in modes:
            got = 0
            t0 = time.perf_counter()
            for i in range(0, count, per_tx):
                with sender.transaction():
                    for j in range(0, per_tx, per_statement):
                        sender.execute(
                            "SELECT pg_notify(%s, 's' || g || ':1')"
                            " FROM generate_series(%s::int, %s::int) AS g",
                            (channel, i + j, i + j + per_statement - 1),
                        )
            sent = time.perf_counter() - t0
            for _ in listener.notifies(timeout=30, stop_after=count):
                got += 1
            total = time.perf_counter() - t0
            assert got == count, (got, count)
            out[f"{label} sent/s"] = count / sent
            out[f"{label} received/s"] = count / total
    return out


def lease_renewal(base: str, sessions: Sequence[int]) -> dict[int, float]:
    """Seconds of one renewal of M leases, per lease (median of 20)."""
    from turnledger.adapters.stores import PostgresStore
    from turnledger.sessions import open_hub
    from turnledger.testing import ScriptedProvider

    out: dict[int, float] = {}
    for m in sessions:
        with fresh_schema(base) as dsn:

            async def main(m: int = m, dsn: str = dsn) -> float:
                store = await PostgresStore.open(dsn, lease=600)
                async with store, open_hub(store, ScriptedProvider.instant(), model="m") as hub:
                    async with trio.open_nursery() as nursery:
                        for i in range(m):
                            nursery.start_soon(hub.submit, f"l{i}", "q?")
                    leases = store._leases  # the store's own renewal, timed alone
                    assert len(leases.held) == m, (len(leases.held), m)
                    times = []
                    for _ in range(20):
                        t0 = time.perf_counter()
                        lost = await trio.to_thread.run_sync(leases.renew)
                        times.append(time.perf_counter() - t0)
                        assert lost == [], lost
                    return statistics.median(times)

            out[m] = trio.run(main) / m
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    default = os.environ.get("TURNLEDGER_TEST_PG_DSN", "postgresql://postgres@127.0.0.1:5432/test")
    p.add_argument("--dsn", default=default)
    p.add_argument("--nodes", default="1,2,3")
    p.add_argument("--clients", type=int, default=60)
    p.add_argument("--turns", type=int, default=3)
    p.add_argument("--deltas", type=int, default=10)
    p.add_argument("--pause", type=float, default=0.02)
    p.add_argument("--routing", choices=["sticky", "random", "nginx"], default="sticky")
    p.add_argument("--streams", type=int, default=100)
    p.add_argument("--notifies", type=int, default=20_000)
    p.add_argument("--pg-only", action="store_true", help="only NOTIFY and lease renewal")
    args = p.parse_args()
    base = args.dsn
    print(f"load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores; "
          f"python {sys.version.split()[0]}")  # fmt: skip
    print("\nPostgreSQL NOTIFY")
    for label, rate in notify_rate(base, args.notifies).items():
        print(f"  {label:32} {rate:>10,.0f}")
    print("\nlease renewal, per session (one UPDATE for all of a store's leases)")
    for m, per in lease_renewal(base, (100, 1000, 5000)).items():
        print(f"  {m:>5} leases  {per * 1e6:8.1f} us/session  ({per * m * 1e3:.1f} ms a renewal)")
    if args.pg_only:
        return
    print(
        f"\n{args.clients} clients x {args.turns} turns, {args.deltas} deltas {args.pause}s apart,"
        f" routing {args.routing}"
    )
    print(f"  {'nodes':>5} {'turns/s':>8} {'ratio':>6} {'ttfd p50':>9} {'ttfd p99':>9}"
          f" {'db ms/turn':>10} {'committed':>10}")  # fmt: skip
    first: float | None = None
    crosses = []
    for n in (int(x) for x in args.nodes.split(",")):
        row = cluster_row(base, n, args)
        first = first or row["turns_per_s"]
        print(f"  {n:>5} {row['turns_per_s']:>8.1f} {row['turns_per_s'] / first:>6.2f}"
              f" {row['ttfd_p50'] * 1e3:>7.0f}ms {row['ttfd_p99'] * 1e3:>7.0f}ms"
              f" {row['db_ms_per_turn']:>10.2f} {row['committed']:>5}/{row['turns']}")  # fmt: skip
        if "cross" in row:
            crosses.append((n, row["cross"]))
    for n, cross in crosses:
        gaps, refused = cross["gaps"], cross["refused"]
        print(f"\ncross-node preview, {args.streams} streams at once, {n} nodes:")
        if gaps:
            print(f"  {len(gaps)} deltas: p50 {_pct(gaps, 0.5) * 1e3:.1f} ms,"
                  f" p99 {_pct(gaps, 0.99) * 1e3:.1f} ms")  # fmt: skip
        if refused:
            print(f"  not measured for {len(refused)} streams: the other node answered"
                  f" {refused[0]} (turns streamed from any node: issue 28 part B)")  # fmt: skip


if __name__ == "__main__":
    main()
