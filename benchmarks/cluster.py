"""Several ``turnledger serve`` nodes on one PostgreSQL; every figure is measured in this run.

    python benchmarks/cluster.py [--dsn DSN] [--nodes 1,2,3] [--clients N] [--turns N]
        [--routing sticky,random,nginx] [--streams N,M] [--pg-only]

Needs a PostgreSQL server (default ``postgresql://postgres@127.0.0.1:5432/test``,
or ``$TURNLEDGER_TEST_PG_DSN``) and, for ``--routing nginx``, Debian's nginx.
Each row starts a fresh schema, the loopback model server in a child process
and N serve nodes (``turnledger.testing.cluster``), and stops them after.

- ``turns/s``: ``--clients`` clients at once, each asking ``--turns``
  questions of its own session one after the other, each answered in
  ``--deltas`` deltas ``--pause`` s apart; wall time from the first POST to
  the last outcome. ``ratio`` is against the 1-node row of the same run.
  Routing (``--routing``, a comma-separated list, one table each; default
  ``sticky,random``): ``sticky`` sends client i to node i mod N (a session
  stays on the node that owns it: no hand-over); ``random`` picks a node per
  call and ``nginx`` goes through nginx round robin (a question reaching a
  node that does not own its session is handed to the owner).
- ``ttfd p50/p99``: time to first delta, from sending the POST to the
  first ``delta`` event.
- ``db ms/turn``: CPU of the PostgreSQL backends the nodes connected
  (found by their ``application_name``, read from ``/proc/PID/stat``), per
  turn; the server's shared processes (WAL writer, checkpointer) are not
  counted.
- ``cross-node preview`` (2 nodes or more): ``--streams`` turns at once
  (a list: 100 and, to show the path on a less crowded machine, 10)
  (``--cross-deltas`` deltas ``--cross-pause`` s apart), each POSTed to
  node 1 and followed at the same time on node 2 and, the baseline, once
  more on node 1 (``cluster_previews.cross_node_latency``); per delta, its
  arrival on the follower minus its arrival on the owner's stream; p50/p99,
  and the CPU per delta of each node and of the database's backends.
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

from cluster_previews import Latencies, cross_node_latency
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


def cluster_row(
    base: str, nodes: int, routing: str, args: argparse.Namespace, *, cross: bool
) -> dict[str, Any]:
    question = f"slow {args.deltas} {args.pause}"
    with (
        fresh_schema(base) as dsn,
        TemporaryDirectory() as tmp,
        open_cluster(
            dsn,
            Path(tmp),
            nodes,
            nginx=routing == "nginx",
            node_args=("--idle-timeout", "300"),
        ) as cluster,  # fmt: skip
    ):
        with BackendMeter(base, [n.proc.pid for n in cluster.nodes]) as meter:
            seconds, records = trio.run(
                _turns, cluster, routing, args.clients, args.turns, question
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
        if cross and nodes >= 2:
            row["cross"] = [
                _cross_row(cluster, args, int(n)) for n in args.streams.split(",") if int(n)
            ]
    return row


def _cross_row(cluster: Cluster, args: argparse.Namespace, streams: int) -> dict[str, Any]:
    """``cross_node_latency`` on this cluster's first two nodes (turns run
    on node 1, followed on node 2 and once more on node 1), after a warm-up,
    with the CPU each node and the database's backends spent per delta."""
    owner, other = cluster.nodes[0], cluster.nodes[1]
    d, g = args.cross_deltas, args.cross_pause
    trio.run(cross_node_latency, owner.url, other.url, 2, "slow 3 0.01 warm", f"warm{streams}")
    pids = [owner.proc.pid, other.proc.pid]
    before = [_cpu_of(pid) or 0.0 for pid in pids]
    load = os.getloadavg()[0]
    with BackendMeter(args.dsn, pids) as meter:
        cross, same, committed = trio.run(
            cross_node_latency, owner.url, other.url, streams, f"slow {d} {g} x", f"x{streams}"
        )
    cpu = [(_cpu_of(pid) or 0.0) - b for pid, b in zip(pids, before, strict=True)]
    deltas = streams * d
    return {
        "streams": streams,
        "cross": cross,
        "same": same,
        "committed": committed,
        "load": load,
        "cpu_us_per_delta": [1e6 * c / deltas for c in cpu],
        "db_us_per_delta": 1e6 * meter.seconds / deltas,
    }


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
    p.add_argument("--routing", default="sticky,random", help="sticky, random, nginx: a list")
    p.add_argument("--streams", default="100,10", help="cross-node: streams at once, a list")
    p.add_argument("--cross-deltas", type=int, default=40)
    p.add_argument("--cross-pause", type=float, default=0.05)
    p.add_argument("--notifies", type=int, default=20_000)
    p.add_argument("--leases", default="100,1000,5000", help="lease renewal: leases held")
    p.add_argument("--pg-only", action="store_true", help="only NOTIFY and lease renewal")
    args = p.parse_args()
    base = args.dsn
    print(f"load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores; "
          f"python {sys.version.split()[0]}")  # fmt: skip
    print("\nPostgreSQL NOTIFY")
    for label, rate in notify_rate(base, args.notifies).items():
        print(f"  {label:32} {rate:>10,.0f}")
    print("\nlease renewal, per session (one UPDATE for all of a store's leases)")
    for m, per in lease_renewal(base, [int(m) for m in args.leases.split(",")]).items():
        print(f"  {m:>5} leases  {per * 1e6:8.1f} us/session  ({per * m * 1e3:.1f} ms a renewal)")
    if args.pg_only:
        return
    routings = args.routing.split(",")
    if not set(routings) <= {"sticky", "random", "nginx"}:
        p.error(f"--routing: sticky, random or nginx, not {args.routing!r}")
    crosses = []
    for k, routing in enumerate(routings):
        print(f"\n{args.clients} clients x {args.turns} turns, {args.deltas} deltas"
              f" {args.pause}s apart, routing {routing}, load average"
              f" {os.getloadavg()[0]:.1f}")  # fmt: skip
        print(f"  {'nodes':>5} {'turns/s':>8} {'ratio':>6} {'ttfd p50':>9} {'ttfd p99':>9}"
              f" {'db ms/turn':>10} {'committed':>10}")  # fmt: skip
        first: float | None = None
        for n in (int(x) for x in args.nodes.split(",")):
            # The cross-node previews once per node count (first routing).
            row = cluster_row(base, n, routing, args, cross=k == 0)
            first = first or row["turns_per_s"]
            rate, ok = row["turns_per_s"], f"{row['committed']}/{row['turns']}"
            print(f"  {n:>5} {rate:>8.1f} {rate / first:>6.2f}"
                  f" {row['ttfd_p50'] * 1e3:>7.0f}ms {row['ttfd_p99'] * 1e3:>7.0f}ms"
                  f" {row['db_ms_per_turn']:>10.2f} {ok:>10}")  # fmt: skip
            if "cross" in row:
                crosses.append((n, row["cross"]))
    for n, runs in crosses:
        for cross in runs:
            print(f"\ncross-node preview, {n} nodes: {cross['streams']} streams at once,"
                  f" {args.cross_deltas} deltas {args.cross_pause}s apart, load average"
                  f" {cross['load']:.1f} at its start")  # fmt: skip
            print_cross(cross)
    print(f"\nload average at end: {os.getloadavg()[0]:.1f}")


def print_cross(cross: dict[str, Any]) -> None:
    """The cross-node row: its latencies against the same-node baseline."""
    rows: tuple[tuple[str, Latencies], ...] = (
        ("owner -> other node", cross["cross"]),
        ("owner -> owner (baseline)", cross["same"]),
    )
    for label, lat in rows:
        print(f"  {label:26} p50 {lat.quantile(0.5) * 1e3:7.1f} ms  p99"
              f" {lat.quantile(0.99) * 1e3:7.1f} ms  ({len(lat.samples)} deltas)")  # fmt: skip
    owner, other = cross["cpu_us_per_delta"]
    print(f"  committed {cross['committed']}; CPU per delta: owner node {owner:.0f} us,"
          f" following node {other:.0f} us, database backends"
          f" {cross['db_us_per_delta']:.0f} us")  # fmt: skip


if __name__ == "__main__":
    main()
