"""Previews through PostgreSQL: what batching buys, and cross-node latency.

Two measurements, each against its baseline in the same run:

1. ``publish``: S streams (default 100) in one process each publish D deltas
   (default 40) G seconds apart (default 0.02 s: 5,000 deltas/s in all), and
   a follower per stream (``Previews.follow``, same process, so one clock)
   records when each delta reached it. Variant ``batched`` is the shipped
   publisher (every row queued while a statement runs goes in the next one,
   with one NOTIFY per turn); variant ``per-delta`` writes each delta in a
   statement of its own on the same connection (the baseline). Printed:
   statements, rows per statement, and publish-to-follower latency p50/p99.

2. ``cross-node``: two ``turnledger serve --node-id`` processes on one
   PostgreSQL schema and the loopback model server. S turns run on node 1
   (each POSTed there, its stream read by client A); for each, client B
   follows the same turn on node 2 (``GET .../stream``, ``Last-Event-ID: 0``).
   A delta's cross-node latency is the time it reached B minus the time it
   reached A (one clock: both clients are this process), counted for deltas
   that reached A after B's stream had started. Baseline: the same delta's
   latency between two clients both on node 1 (A and a second local
   reattach, C), which is what the local relay costs.

    python benchmarks/cluster_previews.py [--streams S] [--deltas D] [--gap G]
        [--rounds R] [--only publish|cross-node]

:func:`cross_node_latency` takes the URLs of running nodes, so a cluster
harness (``benchmarks/cluster.py``) can call it on its own nodes.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any
from urllib.parse import quote

import attrs
import httpx
import trio

HERE = Path(__file__).resolve()
DSN = os.environ.get("TURNLEDGER_TEST_PG_DSN", "postgresql://postgres@127.0.0.1:5432/test")


@attrs.frozen
class Latencies:
    """Latencies in seconds, and how many samples were left out."""

    samples: list[float]
    skipped: int = 0

    def quantile(self, q: float) -> float:
        xs = sorted(self.samples)
        return xs[min(len(xs) - 1, int(q * len(xs)))] if xs else float("nan")


def _ms(x: float) -> str:
    return f"{x * 1000:.1f} ms"


@contextmanager
def fresh_schema(base: str = DSN) -> Iterator[str]:
    """A DSN whose ``search_path`` is a new schema, dropped afterwards."""
    import psycopg

    schema = f"bench_previews_{uuid.uuid4().hex[:12]}"
    with psycopg.connect(base, autocommit=True) as admin:
        admin.execute(f'CREATE SCHEMA "{schema}"')
    sep = "&" if "?" in base else "?"
    try:
        yield f"{base}{sep}options={quote(f'-csearch_path={schema}')}"
    finally:
        with psycopg.connect(base, autocommit=True) as admin:
            admin.execute(f'DROP SCHEMA "{schema}" CASCADE')


# --- 1. publishing: batched against one statement per delta --------------------


async def publish_cost(
    dsn: str, streams: int, deltas: int, gap: float, batched: bool
) -> tuple[Latencies, int, int, int]:
    """Publish-to-follower latencies, statements and rows written, and the
    followers' read statements, of one run."""
    from turnledger.adapters.stores import PostgresStore, open_previews

    store = await PostgresStore.open(dsn)
    async with store, open_previews(store) as previews:
        sent: dict[tuple[int, int], float] = {}
        lat: list[float] = []
        never = trio.Event()

        async def ended() -> bool:
            return never.is_set()

        async def follow(i: int) -> None:
            async for batch in previews.follow("bench", f"t{i}", 0, ended=ended):
                now = time.perf_counter()
                lat.extend(now - sent[i, d.seq] for d in batch)

        async def publish(i: int) -> None:
            for n in range(1, deltas + 1):
                sent[i, n] = time.perf_counter()
                row = ("bench", f"t{i}", n, "delta", f"{n:04d}".encode())
                if batched:
                    previews.publish("bench", f"t{i}", n, f"{n:04d}")
                else:
                    await previews._write([row])  # the baseline: a statement per delta
                await trio.sleep(gap)
            previews.end("bench", f"t{i}", deltas + 1)

        before = previews.batches
        rows_before = previews.rows_published
        reads_before = previews.reads
        table = f"{store.table}_previews"
        async with trio.open_nursery() as nursery:
            for i in range(streams):
                nursery.start_soon(follow, i)
            await trio.sleep(0.2)  # every follower registered
            for i in range(streams):
                nursery.start_soon(publish, i)
        await previews.flushed()
        global TABLE_BYTES_PER_ROW
        TABLE_BYTES_PER_ROW = await trio.to_thread.run_sync(_bytes_per_row, dsn, table)
        return (
            Latencies(lat),
            previews.batches - before,
            previews.rows_published - rows_before,
            previews.reads - reads_before,
        )


#: What the previews table (with its index) took per row in the last
#: ``publish_cost`` run.
TABLE_BYTES_PER_ROW = 0.0


def _bytes_per_row(dsn: str, table: str) -> float:
    import psycopg

    with psycopg.connect(dsn) as conn:
        row = conn.execute(
            "SELECT pg_total_relation_size(%s::regclass), (SELECT count(*) FROM "
            + psycopg.sql.Identifier(table).as_string(conn)
            + ")",
            (table,),
        ).fetchone()
    assert row is not None
    return float(row[0]) / max(1, int(row[1]))


# --- 2. cross-node latency over HTTP ----------------------------------------------


async def _read_frames(response: httpx.Response, arrived: dict[int, float]) -> str | None:
    """Record each delta's arrival by its id; the outcome's kind."""
    buf = b""
    kind = None
    async for chunk in response.aiter_raw():
        now = time.perf_counter()
        buf += chunk
        *frames, buf = buf.split(b"\n\n")
        for frame in frames:
            lines = frame.split(b"\n")
            if lines[0].startswith(b"id: ") and lines[1] == b"event: delta":
                arrived[int(lines[0][4:])] = now
            elif b"event: outcome" in lines:
                kind = "committed" if b'"kind":"committed"' in frame else "other"
    return kind


async def cross_node_latency(
    owner_url: str, other_url: str, streams: int, question: str, prefix: str = "x"
) -> tuple[Latencies, Latencies, int]:
    """Run ``streams`` turns on ``owner_url``; follow each on ``other_url``
    and once more on ``owner_url``. Returns the cross-node latencies, the
    same-node ones (the baseline) and the turns committed."""
    limits = httpx.Limits(max_connections=3 * streams + 10)
    timeout = httpx.Timeout(300.0)
    cross: list[float] = []
    local: list[float] = []
    skipped = 0
    committed = 0
    async with (
        httpx.AsyncClient(base_url=owner_url, limits=limits, timeout=timeout) as a,
        httpx.AsyncClient(base_url=other_url, limits=limits, timeout=timeout) as b,
    ):

        async def follower(
            client: httpx.AsyncClient, sid: str, arrived: dict[int, float], ready: list[float]
        ) -> None:
            url = f"/v1/sessions/{sid}/turns/r/stream"
            async with client.stream("GET", url, headers={"Last-Event-ID": "0"}) as r:
                ready.append(time.perf_counter())
                await _read_frames(r, arrived)

        async def one(i: int) -> None:
            nonlocal skipped, committed
            sid = f"{prefix}-{i}"
            at_a: dict[int, float] = {}
            at_b: dict[int, float] = {}
            at_c: dict[int, float] = {}
            ready_b: list[float] = []
            ready_c: list[float] = []
            body = {"question": question, "request_id": "r"}
            posted = a.stream("POST", f"/v1/sessions/{sid}/turns", json=body)
            async with trio.open_nursery() as nursery, posted as r:
                nursery.start_soon(follower, b, sid, at_b, ready_b)
                nursery.start_soon(follower, a, sid, at_c, ready_c)
                if await _read_frames(r, at_a) == "committed":
                    committed += 1
            for arrived, ready, into in ((at_b, ready_b, cross), (at_c, ready_c, local)):
                for n, t in at_a.items():
                    if ready and t > ready[0] + 0.05 and n in arrived:
                        into.append(arrived[n] - t)
                    elif into is cross:
                        skipped += 1

        async with trio.open_nursery() as nursery:
            for i in range(streams):
                nursery.start_soon(one, i)
    return Latencies(cross, skipped), Latencies(local), committed


def _spawn(args: list[str]) -> tuple[subprocess.Popen[bytes], str]:
    proc = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)
    assert proc.stdout is not None
    line = proc.stdout.readline().decode().strip()
    if not line:
        raise RuntimeError(f"{args} did not start (exit {proc.wait(30)})")
    return proc, line.rsplit(" ", 1)[-1]


def _loopback_main() -> None:
    import signal

    from turnledger.testing import LoopbackServer, Reply, WritePause, openai_sse_chunks

    def reply(exchange: Any) -> Reply:
        # "D G": D deltas of 4 characters, G seconds apart.
        d, g = exchange.json()["messages"][-1]["content"].split()
        chunks = openai_sse_chunks("".join(f"{i:04d}" for i in range(int(d))), chunk_size=4)
        body: list[Any] = []
        for chunk in chunks:
            body += [chunk, WritePause(float(g))]
        return Reply(body=body)

    with LoopbackServer(reply).start_in_thread() as server:
        print(server.openai_base_url, flush=True)
        signal.sigwait({signal.SIGTERM, signal.SIGINT})


def cpu_seconds(pid: int) -> float:
    """User + system CPU time of a process so far (Linux ``/proc``)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


#: The pids of the nodes the last ``two_nodes`` started.
NODE_PIDS: list[int] = []


@contextmanager
def two_nodes(dsn: str) -> Iterator[tuple[str, str]]:
    """The loopback model server and two serve nodes on ``dsn``."""
    procs: list[subprocess.Popen[bytes]] = []
    try:
        loop, base = _spawn([sys.executable, str(HERE), "--loopback-child"])
        procs.append(loop)
        urls = []
        for node in ("n1", "n2"):
            cmd = [sys.executable, "-m", "turnledger", "serve", "--db", dsn, "--port", "0",
                   "--base-url", base, "--model", "m", "--node-id", node,
                   "--idle-timeout", "120", "--max-starting", "0"]  # fmt: skip
            proc, url = _spawn(cmd)
            procs.append(proc)
            urls.append(url)
        NODE_PIDS[:] = [procs[1].pid, procs[2].pid]
        yield urls[0], urls[1]
    finally:
        for p in reversed(procs):
            p.terminate()
            try:
                p.wait(30)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait(30)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n", 1)[0])
    p.add_argument("--streams", type=int, default=100)
    p.add_argument("--deltas", type=int, default=40)
    p.add_argument("--gap", type=float, default=0.02)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--only", choices=["publish", "cross-node"], default=None)
    p.add_argument("--loopback-child", action="store_true", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.loopback_child:
        _loopback_main()
        return
    print(f"load average at start: {os.getloadavg()[0]:.1f} ({os.cpu_count()} cores)")
    s, d, g = args.streams, args.deltas, args.gap
    if args.only in (None, "publish"):
        results: dict[str, list[tuple[Latencies, int, int, int]]] = {
            "batched": [],
            "per-delta": [],
        }
        for _ in range(args.rounds):
            for kind in results:
                with fresh_schema() as dsn:
                    run = trio.run(publish_cost, dsn, s, d, g, kind == "batched")
                    results[kind].append(run)
        print(f"\npublish: {s} streams x {d} deltas, {g}s apart; median of {args.rounds} rounds")
        p99s = {}
        for kind, runs in results.items():
            p50 = statistics.median(r[0].quantile(0.5) for r in runs)
            p99s[kind] = p99 = statistics.median(r[0].quantile(0.99) for r in runs)
            stmts = statistics.median(r[1] for r in runs)
            per = statistics.median(r[2] / max(1, r[1]) for r in runs)
            reads = statistics.median(r[3] / max(1, r[2]) for r in runs)
            print(f"  {kind:10} statements {stmts:7.0f}  rows/statement {per:6.1f}"
                  f"  follower reads/row {reads:5.2f}"
                  f"  publish->follower p50 {_ms(p50)}  p99 {_ms(p99)}")  # fmt: skip
        print(f"  p99 per-delta / batched: {p99s['per-delta'] / p99s['batched']:.1f}x")
        print(f"  previews table: {TABLE_BYTES_PER_ROW:.0f} bytes a row, index included"
              f" ({d} deltas + 1 end row a turn)")  # fmt: skip
    if args.only in (None, "cross-node"):
        question = f"{d} {g}"
        rounds: list[tuple[Latencies, Latencies, int]] = []
        cpu: list[tuple[float, float]] = []
        for r in range(args.rounds):
            with fresh_schema() as dsn, two_nodes(dsn) as (one, two):
                # Warm up first: what the nodes import and build on their
                # first requests is not a delta's cost.
                trio.run(cross_node_latency, one, two, 2, "3 0.01", f"warm{r}")
                before = [cpu_seconds(pid) for pid in NODE_PIDS]
                rounds.append(trio.run(cross_node_latency, one, two, s, question, f"r{r}"))
                n1, n2 = (cpu_seconds(pid) - b for pid, b in zip(NODE_PIDS, before, strict=True))
                cpu.append((n1, n2))
        print(f"\ncross-node: {s} streams x {d} deltas, {g}s apart; median of {args.rounds} rounds")
        for label, i in (("other node", 0), ("same node (baseline)", 1)):
            lats = [x[0] if i == 0 else x[1] for x in rounds]
            p50 = statistics.median(x.quantile(0.5) for x in lats)
            p99 = statistics.median(x.quantile(0.99) for x in lats)
            n = statistics.median(len(x.samples) for x in lats)
            print(f"  {label:22} p50 {_ms(p50)}  p99 {_ms(p99)}  ({n:.0f} deltas a round)")
        print(f"  committed: {[x[2] for x in rounds]} of {s} a round")
        # Node 1 runs the turns (model stream, log, two local streams each,
        # publishing); node 2 only follows (one stream each). Per delta of
        # all the turns, load-independent as CPU time.
        all_deltas = s * d
        n1 = statistics.median(c[0] for c in cpu) / all_deltas * 1e6
        n2 = statistics.median(c[1] for c in cpu) / all_deltas * 1e6
        print(f"  CPU per delta: owner node {n1:.0f} us (runs, publishes, 2 local streams),"
              f" following node {n2:.0f} us (1 followed stream)")  # fmt: skip
    print(f"load average at end: {os.getloadavg()[0]:.1f}")


if __name__ == "__main__":
    main()
