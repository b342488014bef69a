"""What handing a question to the node that owns its session costs.

    python benchmarks/cluster_handover.py [--dsn DSN] [--turns N] [--concurrent N]

Two ``turnledger serve --node-id`` processes (n1, n2) on one PostgreSQL
schema (a fresh one, dropped after; default DSN
``postgresql://postgres@127.0.0.1:5432/test`` or ``$TURNLEDGER_TEST_PG_DSN``),
one loopback model server answering at once. n1 owns every session (each got
its first question there). Then each turn is asked either

- ``local``    on n1, the owner: the baseline, measured in the same run;
- ``handover`` on n2, which hands it to n1 through the inbox (an INSERT and
  a NOTIFY, n1 claims it, runs it, writes the reply and NOTIFYs back) and
  follows the turn to its outcome through the log,

alternating turn by turn (so the machine's load falls on both alike), one at
a time for the latency (time from the POST to the outcome event, medians and
p99), then ``--concurrent`` at once for turns per second. Prints both, their
ratio, and the load average before and after.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path
from urllib.parse import quote

import httpx

from turnledger.testing import LoopbackServer, Reply, openai_sse_chunks

ROOT = Path(__file__).parents[1]


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


@contextmanager
def node(dsn: str, base_url: str, name: str, log: Path) -> Iterator[str]:
    cmd = [sys.executable, "-m", "turnledger", "serve", "--db", dsn, "--port", "0",
           "--base-url", base_url, "--model", "m", "--log-json", "--node-id", name,
           "--max-starting", "0"]  # fmt: skip
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src")}
    with open(log, "wb") as err:
        proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=err, env=env)
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline().decode()
        assert "listening on " in line, line
        yield line.split("listening on ", 1)[1].strip()
    finally:
        proc.terminate()
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(10)


def turn(client: httpx.Client, session: str, question: str) -> float:
    """Seconds from the POST to the outcome event (which must be committed)."""
    t0 = time.perf_counter()
    with client.stream("POST", f"/v1/sessions/{session}/turns", json={"question": question}) as r:
        assert r.status_code == 200, r.read()
        text = "".join(r.iter_text())
    assert "event: outcome" in text and '"kind":"committed"' in text, text[-300:]
    return time.perf_counter() - t0


def p99(xs: list[float]) -> float:
    return sorted(xs)[min(len(xs) - 1, int(len(xs) * 0.99))]


def concurrent(url: str, sessions: list[str], n: int) -> float:
    """Turns per second with ``n`` clients at once, each on its own sessions."""
    done = 0
    lock = threading.Lock()

    def client(k: int) -> None:
        nonlocal done
        with httpx.Client(base_url=url, timeout=60) as c:
            for sid in sessions[k::n]:
                turn(c, sid, "again")
                with lock:
                    done += 1

    threads = [threading.Thread(target=client, args=(k,)) for k in range(n)]
    t0 = time.perf_counter()
    for t in threads:
        t.start()
    for t in threads:
        t.join(300)
    return done / (time.perf_counter() - t0)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--dsn", default=os.environ.get("TURNLEDGER_TEST_PG_DSN",
                   "postgresql://postgres@127.0.0.1:5432/test"))  # fmt: skip
    p.add_argument("--turns", type=int, default=200, help="turns of each kind, one at a time")
    p.add_argument("--concurrent", type=int, default=20, help="clients at once, then")
    args = p.parse_args()
    load0 = os.getloadavg()
    answer = openai_sse_chunks("ok", usage=(3, 1))
    with ExitStack() as stack:
        server = stack.enter_context(LoopbackServer(lambda _: Reply(body=answer)).start_in_thread())
        dsn = stack.enter_context(fresh_schema(args.dsn))
        logs = Path(stack.enter_context(_tmpdir()))
        n1 = stack.enter_context(node(dsn, server.openai_base_url, "n1", logs / "n1.log"))
        n2 = stack.enter_context(node(dsn, server.openai_base_url, "n2", logs / "n2.log"))
        a = stack.enter_context(httpx.Client(base_url=n1, timeout=60))
        b = stack.enter_context(httpx.Client(base_url=n2, timeout=60))
        sessions = [f"s{i}" for i in range(args.turns * 2)]
        for sid in sessions:  # n1 owns them all
            turn(a, sid, "first")
        for sid in sessions[:20]:  # warm both paths
            turn(a, sid, "warm")
            turn(b, sid, "warm")
        local: list[float] = []
        handover: list[float] = []
        for i in range(args.turns):
            if i % 2:
                local.append(turn(a, sessions[2 * i], "q"))
                handover.append(turn(b, sessions[2 * i + 1], "q"))
            else:
                handover.append(turn(b, sessions[2 * i + 1], "q"))
                local.append(turn(a, sessions[2 * i], "q"))
        half = len(sessions) // 2
        rate_local = concurrent(n1, sessions[:half], args.concurrent)
        rate_handover = concurrent(n2, sessions[half:], args.concurrent)
    load1 = os.getloadavg()
    ms = 1000
    print(f"turns: {args.turns} of each kind one at a time; then {args.concurrent} clients")
    print(f"load average before {load0[0]:.2f}, after {load1[0]:.2f} ({os.cpu_count()} cores)")
    print(f"{'':10} {'p50 ms':>8} {'p99 ms':>8} {'turns/s':>9}")
    for name, xs, rate in (("local", local, rate_local), ("handover", handover, rate_handover)):
        print(f"{name:10} {statistics.median(xs) * ms:8.1f} {p99(xs) * ms:8.1f} {rate:9.1f}")
    print(
        f"handover / local: p50 {statistics.median(handover) / statistics.median(local):.2f}x,"
        f" turns/s {rate_handover / rate_local:.2f}x"
    )


@contextmanager
def _tmpdir() -> Iterator[str]:
    import tempfile

    with tempfile.TemporaryDirectory(prefix="tl-handover-") as d:
        yield d


if __name__ == "__main__":
    main()
