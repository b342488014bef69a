"""``turnledger serve`` under load; every figure and ratio is measured in this run.

N concurrent SSE clients (default 1,000) each POST one turn to one ``serve``
process (SQLite store) and read its stream of D deltas (default 200) to the
outcome; the model server is the loopback server, in a process of its own.
From before the first client connects until the last outcome, a prober in
another process GETs ``/healthz``; the service "answers throughout" when
every probe got its 200 within PROBE_DEADLINE (1 s; see below). Afterwards
the store is read: every turn must be committed exactly once, none lost or
duplicated. The run fails (exit 1) otherwise.

The baseline, in the same run: a bare Hypercorn SSE endpoint (a plain ASGI
function on Hypercorn's trio worker, no framework, no model server, no
store) streaming the same D delta events, in the same wire format, to the
same N clients, probed the same way. It runs on the same worker and
listener as ``serve`` (``turnledger.serve._listen``: every pending
connection accepted per scheduler pass), so the CPU comparison is of the
application alone. ``--variants bare-one,bare,serve`` adds the bare
endpoint on Hypercorn as shipped (trio's listener: one accept per pass),
whose probes show what the batch listener is for. The service's CPU per
delta (user + system time of its process, from /proc) is compared with the
bare endpoint's.

    python benchmarks/serve.py [--clients N] [--deltas D] [--rounds R] [--variants ...]
    python benchmarks/serve.py --rounds 3 --variants bare,serve-before,serve --before /tmp/main/src

``--before SRC`` (with the variant ``serve-before``) runs the same
``turnledger serve`` command from another source tree (``git archive main
src | tar -x -C /tmp/main``), with that tree's defaults, against the same
model server and clients, so a change is measured against the code before
it in the same run. Where the time of a burst goes: ``profile_burst.md``.

Prints, per variant, the median over rounds of: turns/s, p50/p99 time to
first delta, CPU µs per delta, and the probes answered in time (all rounds)
with the slowest; then the CPU ratios to bare (goal: at most 1×) and, with
serve-before, the time-to-first-delta ratios serve/serve-before.
"""

from __future__ import annotations

import argparse
import os
import signal
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx
import orjson
import trio

HERE = Path(__file__).resolve()


# --- the child processes -------------------------------------------------------


def _loopback_main(deltas: int) -> None:
    from turnledger.testing import LoopbackServer, Reply, openai_sse_chunks

    text = "".join(f"{i:04d}" for i in range(deltas))
    reply = Reply(body=openai_sse_chunks(text, chunk_size=4))
    with LoopbackServer(reply).start_in_thread() as server:
        print(server.openai_base_url, flush=True)
        signal.sigwait({signal.SIGTERM, signal.SIGINT})


def _bare_main(deltas: int, accept: str) -> None:
    from hypercorn.config import Config
    from hypercorn.trio import serve

    frames = [
        f"id: {i}\nevent: delta\ndata: ".encode() + orjson.dumps({"text": f"{i - 1:04d}"}) + b"\n\n"
        for i in range(1, deltas + 1)
    ]
    outcome = b'event: outcome\ndata: {"kind":"committed"}\n\n'

    async def app(scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] == "lifespan":
            while True:
                message = await receive()
                await send({"type": message["type"] + ".complete"})
                if message["type"] == "lifespan.shutdown":
                    return
        if scope["path"] == "/healthz":
            await send({"type": "http.response.start", "status": 200, "headers": []})
            await send({"type": "http.response.body", "body": b'{"ok":true}'})
            return
        while (await receive()).get("more_body"):
            pass
        headers = [(b"content-type", b"text/event-stream")]
        await send({"type": "http.response.start", "status": 200, "headers": headers})
        await send({"type": "http.response.body", "body": b"event: turn\ndata: {}\n\n",
                    "more_body": True})  # fmt: skip
        for frame in frames:
            await send({"type": "http.response.body", "body": frame, "more_body": True})
        await send({"type": "http.response.body", "body": outcome})

    async def main() -> None:
        import socket

        from turnledger.serve._listen import BatchListener, serve_on

        sock = socket.socket()
        sock.bind(("127.0.0.1", 0))
        sock.listen(1024)  # as turnledger serve listens
        config = Config()
        config.bind = [f"fd://{sock.fileno()}"]
        config.backlog = 1024
        config.accesslog = None
        config.errorlog = None
        print(f"http://127.0.0.1:{sock.getsockname()[1]}", flush=True)
        stop = trio.Event()

        async def on_signal() -> None:
            with trio.open_signal_receiver(signal.SIGTERM) as signals:
                async for _ in signals:
                    stop.set()
                    return

        async with trio.open_nursery() as nursery:
            nursery.start_soon(on_signal)
            if accept == "batch":
                # The same worker and listener as turnledger serve.
                await serve_on(app, config, BatchListener(sock), shutdown_trigger=stop.wait)
            else:
                # Hypercorn as shipped: trio's SocketListener, one accept per pass.
                await serve(app, config, shutdown_trigger=stop.wait)  # type: ignore[arg-type]

    trio.run(main)


#: "The service answers /healthz throughout" means: a probe starts every
#: PROBE_EVERY seconds for the whole load (from before the first client
#: connects until after the last outcome), each on a new connection and
#: whether or not the one before has finished, and EVERY probe gets its
#: 200 within PROBE_DEADLINE seconds, TCP connect included. One second is
#: the default timeout of a Kubernetes liveness/readiness probe: a slower
#: answer is what would get the process restarted or taken out of rotation.
#: Probes wait up to PROBE_GIVE_UP seconds, so a late answer is still
#: measured (and reported), but it counts as a failure.
PROBE_EVERY = 0.25
PROBE_DEADLINE = 1.0
PROBE_GIVE_UP = 30.0


def _probe_main(url: str) -> None:
    # Runs in a process of its own, so the probe measures the service, not
    # the busy client process. Each probe is timed in two parts: the TCP
    # connect (a full accept queue shows here) and the response after it
    # (a connection waiting to be accepted, or a starved event loop, shows
    # here). Prints "connect,response,failure,start" per probe (inf when a
    # part did not finish; start in seconds after the first) when told to stop.
    import socket
    import threading
    from urllib.parse import urlsplit

    parts = urlsplit(url)
    address = (parts.hostname or "127.0.0.1", parts.port or 80)
    # A loopback Host: without a token, serve answers no other (403).
    request = b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n"
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    results: list[tuple[float, float, str, float]] = []
    began = time.perf_counter()

    def probe() -> None:
        connect = response = float("inf")
        failed = ""
        start = t = time.perf_counter()
        try:
            with socket.create_connection(address, timeout=PROBE_GIVE_UP) as sock:
                connect = time.perf_counter() - t
                t = time.perf_counter()
                sock.sendall(request)
                reply = b""
                while b"\r\n\r\n" not in reply:
                    more = sock.recv(4096)
                    if not more:
                        break
                    reply += more
                if reply.startswith(b"HTTP/1.1 200"):
                    response = time.perf_counter() - t
                else:
                    failed = f"{reply[:12].decode(errors='replace')!r}".replace(" ", "_")
        except OSError as exc:
            failed = type(exc).__name__
        if not failed and connect + response > PROBE_DEADLINE:
            failed = "late"
        if failed:
            # Which step failed or was late, after how long, and when into
            # the load it started.
            step = "connect" if connect == float("inf") else "response"
            took = time.perf_counter() - start
            failed = f"{step}:{failed}:{took:.1f}s@{start - began:.0f}s"
        results.append((connect, response, failed, start - began))

    probe()
    print("ready", flush=True)
    threads = []
    while not stop.is_set():
        thread = threading.Thread(target=probe)
        thread.start()
        threads.append(thread)
        stop.wait(PROBE_EVERY)
    for thread in threads:
        thread.join()
    print(" ".join(f"{c},{r},{f},{at}" for c, r, f, at in results), flush=True)


def _spawn(
    args: list[str], env: dict[str, str] | None = None
) -> tuple[subprocess.Popen[bytes], str]:
    proc = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, env=env)
    assert proc.stdout is not None
    line = proc.stdout.readline().decode().strip()
    if not line:
        raise RuntimeError(f"{args} did not start (exit {proc.wait()})")
    return proc, line.rsplit(" ", 1)[-1]


def _cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


# --- the load ----------------------------------------------------------------------


async def _load(url: str, clients: int, deltas: int) -> dict[str, Any]:
    limits = httpx.Limits(max_connections=clients + 10, max_keepalive_connections=clients + 10)
    timeout = httpx.Timeout(600.0)
    firsts: list[float] = []
    counts: list[int] = []
    outcomes: list[str] = []
    health: list[float] = []
    failures: list[str] = []
    #: What each client that did not get a committed outcome saw, by client.
    misses: dict[int, str] = {}

    async with httpx.AsyncClient(base_url=url, limits=limits, timeout=timeout) as client:

        async def one(i: int) -> None:
            started = time.perf_counter()
            first = None
            n = 0
            kind = "none"
            acked = False
            try:
                async with client.stream(
                    "POST", f"/v1/sessions/load-{i}/turns", json={"question": f"q{i}"}
                ) as r:
                    if r.status_code != 200:
                        body = (await r.aread())[:200].decode(errors="replace")
                        misses[i] = f"refused: HTTP {r.status_code} {body}"
                    else:
                        # Counting frames in the raw bytes keeps the clients'
                        # own CPU low (they share the machine with the service).
                        tail = b""
                        async for chunk in r.aiter_raw():
                            acked = acked or b"event: turn\n" in tail[-16:] + chunk
                            seen = tail[-16:] + chunk
                            found = seen.count(b"event: delta\n")
                            if found and first is None:
                                first = time.perf_counter() - started
                            n += found
                            tail = (tail + chunk)[-4096:]
                        last = tail.rsplit(b"event: outcome\ndata: ", 1)
                        if len(last) == 2:
                            outcome = orjson.loads(last[1].split(b"\n", 1)[0])
                            kind = outcome["kind"]
                            if kind != "committed":
                                why = outcome.get("reason"), outcome.get("detail")
                                misses[i] = f"acknowledged, outcome {kind} {why}"
                        else:
                            misses[i] = f"acknowledged={acked}, stream ended without an outcome"
            except httpx.HTTPError as exc:
                failures.append(type(exc).__name__)
                when = "after the turn event" if acked else "never accepted"
                misses[i] = f"{when}: {type(exc).__name__}"
            if first is not None:
                firsts.append(first)
            counts.append(n)
            outcomes.append(kind)

        # /healthz is probed from a process of its own, so the probe measures
        # the service, not this busy client process.
        prober = subprocess.Popen(
            [sys.executable, str(HERE), "--probe-child", url],
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
        )
        assert prober.stdout is not None
        # The first probe has been answered: probing covers the whole load.
        if prober.stdout.readline().strip() != b"ready":
            raise RuntimeError("the prober did not start")
        t0 = time.perf_counter()
        async with trio.open_nursery() as turns:
            for i in range(clients):
                turns.start_soon(one, i)
        elapsed = time.perf_counter() - t0
        prober.send_signal(signal.SIGTERM)
        out, _ = prober.communicate(timeout=30)
        probes = [pair.split(",") for pair in out.decode().split()]
        health = [float(c) + float(r) for c, r, _, _ in probes]
        probe_failures = [f for _, _, f, _ in probes if f]
        connects = [float(c) for c, _, _, _ in probes if c != "inf"]
        responses = [float(r) for _, r, _, _ in probes if r != "inf"]
        # When the slowest probe started, in seconds after the first probe
        # (which was answered just before the first client connected).
        slowest_at = float(probes[health.index(max(health))][3])
    firsts.sort()
    return {
        "elapsed": elapsed,
        "turns_per_s": clients / elapsed,
        "p50_first": firsts[len(firsts) // 2] if firsts else float("nan"),
        "p99_first": firsts[min(len(firsts) - 1, int(len(firsts) * 0.99))] if firsts else 0,
        "deltas": sum(counts),
        "complete": sum(1 for c in counts if c == deltas),
        "committed": outcomes.count("committed"),
        "failures": failures,
        "health_probes": len(health),
        "health_failed": len(probe_failures),
        "health_failures": probe_failures,
        "health_max": max(health) if health else float("nan"),
        "health_slowest_at": slowest_at,
        "health_connect": _median_max(connects),
        "health_response": _median_max(responses),
        "misses": misses,
    }


def _median_max(xs: list[float]) -> tuple[float, float]:
    return (statistics.median(xs), max(xs)) if xs else (float("nan"), float("nan"))


def _check_store(db: Path, clients: int) -> tuple[int, int, int, dict[str, str]]:
    """Committed sessions, lost ones, duplicated ones, and for each session
    without a committed turn the last event it holds ("" for none)."""
    con = sqlite3.connect(f"file:{db}?mode=ro", uri=True)
    try:
        rows = con.execute(
            "select session_id, tag, count(*) from events "
            "where tag in ('turn_submitted','turn_committed') group by 1, 2"
        ).fetchall()
        last = dict(
            con.execute(
                "select session_id, tag from events e where seq = "
                "(select max(seq) from events where session_id = e.session_id)"
            ).fetchall()
        )
    finally:
        con.close()
    committed = {s: n for s, t, n in rows if t == "turn_committed"}
    submitted = {s: n for s, t, n in rows if t == "turn_submitted"}
    duplicated = sum(1 for n in list(committed.values()) + list(submitted.values()) if n != 1)
    lost = clients - len(committed)
    missing = {
        f"load-{i}": last.get(f"load-{i}", "")
        for i in range(clients)
        if f"load-{i}" not in committed
    }
    return len(committed), lost, duplicated, missing


def _round(
    kind: str,
    clients: int,
    deltas: int,
    loopback_url: str,
    serve_args: list[str],
    before: str | None = None,
) -> dict[str, Any]:
    with tempfile.TemporaryDirectory() as tmp:
        db = Path(tmp) / "load.db"
        env = None
        if kind == "serve-before":
            # The same command from another source tree (the code before a
            # change), with serve's defaults of that tree.
            env = {**os.environ, "PYTHONPATH": str(before)}
            serve_args = []
        if kind.startswith("serve"):
            # Deadlines wide enough that a loaded machine measures speed,
            # not timeouts.
            cmd = [sys.executable, "-m", "turnledger", "serve", "--db", str(db), "--port", "0",
                   "--base-url", loopback_url, "--model", "m", "--idle-timeout", "300",
                   "--timeout", "600", *serve_args]  # fmt: skip
        else:
            accept = "one" if kind == "bare-one" else "batch"
            cmd = [sys.executable, str(HERE), "--bare-child", accept, "--deltas", str(deltas)]
        proc, url = _spawn(cmd, env)
        try:
            cpu0 = _cpu_seconds(proc.pid)
            result = trio.run(_load, url, clients, deltas)
            result["cpu"] = _cpu_seconds(proc.pid) - cpu0
        finally:
            proc.send_signal(signal.SIGTERM)
            result_code = proc.wait(60)
        result["exit"] = result_code
        if kind.startswith("serve"):
            result["store"] = _check_store(db, clients)
    result["cpu_us_per_delta"] = 1e6 * result["cpu"] / max(result["deltas"], 1)
    return result


_NAMES = {
    "bare": "bare Hypercorn SSE endpoint",
    "bare-one": "bare, Hypercorn's own accept loop",
    "serve": "turnledger serve (SQLite)",
    "serve-before": "turnledger serve, --before tree",
}


def _ms(pair: tuple[float, float]) -> str:
    return f"{1000 * pair[0]:.0f}/{1000 * pair[1]:.0f} ms"


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--clients", type=int, default=1000)
    p.add_argument("--deltas", type=int, default=200)
    p.add_argument("--rounds", type=int, default=1)
    p.add_argument(
        "--variants",
        default="bare,serve",
        help="comma-separated, run in this order each round (default: %(default)s); "
        "bare-one: the bare endpoint on Hypercorn as shipped (one accept per scheduler pass)",
    )
    p.add_argument(
        "--serve-arg",
        action="append",
        default=[],
        metavar="ARG",
        help="one more option for turnledger serve (repeat it), e.g. --serve-arg=--max-starting=32",
    )
    p.add_argument(
        "--before",
        metavar="SRC",
        help="a source tree (the directory holding turnledger/) to measure as the variant "
        "serve-before, e.g. main's src exported with git archive",
    )
    p.add_argument("--bare-child", choices=["batch", "one"], help=argparse.SUPPRESS)
    p.add_argument("--loopback-child", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--probe-child", metavar="URL", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.bare_child:
        _bare_main(args.deltas, args.bare_child)
        return
    if args.probe_child:
        _probe_main(args.probe_child)
        return
    if args.loopback_child:
        _loopback_main(args.deltas)
        return

    loopback, loopback_url = _spawn(
        [sys.executable, str(HERE), "--loopback-child", "--deltas", str(args.deltas)]
    )
    variants = args.variants.split(",")
    unknown = set(variants) - set(_NAMES)
    if unknown or "serve" not in variants:
        p.error(
            f"--variants: needs serve, may add bare, bare-one, serve-before; not {sorted(unknown)}"
        )
    if ("serve-before" in variants) != (args.before is not None):
        p.error("--before and the variant serve-before go together")
    runs: dict[str, list[dict[str, Any]]] = {kind: [] for kind in variants}
    ok = True
    try:
        for r in range(args.rounds):
            for kind in variants:  # interleaved, so noise hits all alike
                res = _round(
                    kind, args.clients, args.deltas, loopback_url, args.serve_arg, args.before
                )
                runs[kind].append(res)
                line = (
                    f"round {r + 1} {kind:<8}: {res['elapsed']:.2f}s, "
                    f"{res['complete']}/{args.clients} streams complete, "
                    f"{res['committed']} committed outcomes, {len(res['failures'])} errors, "
                    f"healthz {res['health_probes'] - res['health_failed']}/{res['health_probes']}"
                    f" within {PROBE_DEADLINE:g}s (max {1000 * res['health_max']:.0f} ms"
                    f" at {res['health_slowest_at']:.0f}s;"
                    " median/max connect "
                    f"{_ms(res['health_connect'])}, response {_ms(res['health_response'])})"
                    f", exit {res['exit']}"
                )
                if kind.startswith("serve"):
                    stored, lost, dup, missing = res["store"]
                    line += f"; store: {stored} committed, {lost} lost, {dup} duplicated"
                    ok &= lost == 0 and dup == 0 and res["committed"] == args.clients
                    # An acknowledged turn ("turn" event sent) that is missing
                    # from the store is a correctness bug; a client that was
                    # never accepted is a load figure. Say which each one was.
                    for session, tag in sorted(missing.items()):
                        seen = res["misses"].get(int(session.rsplit("-", 1)[1]), "committed")
                        where = f"last event {tag}" if tag else "no events in the store"
                        line += f"\n  not committed: {session}: client saw {seen}; {where}"
                    ok &= res["health_failed"] == 0
                ok &= res["complete"] == args.clients
                if res["health_failures"]:
                    shown = res["health_failures"][:6]
                    more = len(res["health_failures"]) - len(shown)
                    line += f"; failed probes: {' '.join(shown)}"
                    line += f" (and {more} more)" if more else ""
                if res["failures"]:
                    kinds = sorted(set(res["failures"]))
                    line += f"; client errors: {', '.join(kinds)}"
                print(line, flush=True)
    finally:
        loopback.send_signal(signal.SIGTERM)
        loopback.wait(30)

    def med(kind: str, key: str) -> float:
        return float(statistics.median(r[key] for r in runs[kind]))

    print()
    print(f"{args.clients} clients x {args.deltas} deltas, medians of {args.rounds} round(s):")
    print(
        f"{'variant':<44} {'turns/s':>9} {'p50 first':>10} {'p99 first':>10} {'CPU/delta':>11}"
        f" {'healthz ok':>11} {'max':>8}"
    )
    for kind in variants:
        probes = sum(r["health_probes"] for r in runs[kind])
        good = probes - sum(r["health_failed"] for r in runs[kind])
        worst = max(r["health_max"] for r in runs[kind])
        print(
            f"{_NAMES[kind]:<44} {med(kind, 'turns_per_s'):>9.1f} "
            f"{1000 * med(kind, 'p50_first'):>8.0f}ms {1000 * med(kind, 'p99_first'):>8.0f}ms "
            f"{med(kind, 'cpu_us_per_delta'):>9.1f}µs {f'{good}/{probes}':>11} "
            f"{1000 * worst:>6.0f}ms"
        )
    for kind in ("serve-before", "serve"):
        if kind in variants and "bare" in variants:
            ratio = med(kind, "cpu_us_per_delta") / med("bare", "cpu_us_per_delta")
            print(f"CPU per delta, {kind} / bare: {ratio:.2f}x (goal: at most 1x)")
    if "serve-before" in variants:
        for key in ("p50_first", "p99_first"):
            ratio = med("serve", key) / med("serve-before", key)
            print(f"time to first delta {key[:3]}, serve / serve-before: {ratio:.2f}x")
    print("every turn committed once, healthz answered throughout:", "yes" if ok else "NO")
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
