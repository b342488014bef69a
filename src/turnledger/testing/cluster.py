"""A cluster on one machine, for tests and benchmarks: N ``turnledger serve``
nodes on one PostgreSQL, the loopback model server in a child process of its
own, and nginx (Debian's package) in front of the nodes.

Every process is a real one, started here and killed when its ``with`` block
ends; every wait for one has a deadline. :func:`open_cluster` starts them all;
:func:`nginx_config` is the configuration ``docs/scaling.md`` explains;
:func:`drive_turn` is one client's turn: a POST to one node, a reattach with
``Last-Event-ID`` to another mid-stream, sometimes a cancel through a third.

The model answers ``slow N PAUSE TAG`` with N deltas PAUSE seconds apart
(:func:`answer_for` is the answer), and ``GET /stats`` with how often it was
asked each question.
"""

from __future__ import annotations

import json
import os
import random
import select
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Callable, Iterator, Sequence
from contextlib import ExitStack, contextmanager
from pathlib import Path
from typing import Any

import attrs
import httpx
import trio

from ._loopback import Exchange, LoopbackServer, Reply, WritePause
from ._replies import openai_sse_chunks

__all__ = [
    "Cluster",
    "ModelServer",
    "Nginx",
    "Node",
    "TurnPlan",
    "TurnRecord",
    "answer_for",
    "drive_turn",
    "find_nginx",
    "model_responder",
    "nginx_config",
    "open_cluster",
    "pick_random",
    "running_model",
    "running_nginx",
    "running_node",
    "serve_supports",
]

# -- the model ----------------------------------------------------------------


def answer_for(question: str) -> str:
    """What the cluster's model answers ``question`` (``slow N PAUSE TAG``:
    N parts that name the tag; anything else: an echo)."""
    words = question.split()
    if len(words) >= 4 and words[0] == "slow":
        return "".join(f"{words[3]}:{i:03d} " for i in range(1, int(words[1]) + 1))
    return f"echo: {question}"


def model_responder() -> Callable[[Exchange], Reply]:
    """The loopback server's responder: slow streams, and ``GET /stats``
    (``{question: times asked}``)."""
    asked: Counter[str] = Counter()

    def respond(exchange: Exchange) -> Reply:
        if exchange.method == "GET" and exchange.path.rstrip("/").endswith("/stats"):
            body = json.dumps(dict(asked)).encode()
            return Reply(media_type="application/json", body=[body], framing="length")
        question = exchange.json()["messages"][-1]["content"]
        asked[question] += 1
        words = question.split()
        slow = len(words) >= 4 and words[0] == "slow"
        pause = float(words[2]) if slow else 0.0
        body_parts: list[Any] = []
        answer = answer_for(question)
        # One chunk per part of the answer, PAUSE apart.
        size = len(answer) // int(words[1]) if slow else 64
        for chunk in openai_sse_chunks(answer, chunk_size=max(size, 1), usage=(9, 4)):
            body_parts += [chunk, WritePause(pause)] if pause else [chunk]
        return Reply(body=body_parts)

    return respond


def _model_main() -> None:  # the child process of running_model()
    async def main() -> None:
        server = LoopbackServer(model_responder())
        async with trio.open_nursery() as nursery:
            await nursery.start(server.serve)
            print(f"listening on {server.openai_base_url}", flush=True)
            # Until the parent closes stdin (or kills this process).
            await trio.to_thread.run_sync(sys.stdin.read, abandon_on_cancel=True)
            nursery.cancel_scope.cancel()

    trio.run(main)


# -- processes ----------------------------------------------------------------


def _readline_within(proc: subprocess.Popen[bytes], timeout: float) -> str:
    assert proc.stdout is not None
    deadline = time.monotonic() + timeout
    line = b""
    while not line.endswith(b"\n"):
        left = deadline - time.monotonic()
        if left <= 0 or not select.select([proc.stdout], [], [], left)[0]:
            msg = f"no line from pid {proc.pid} within {timeout}s (got {line!r})"
            raise TimeoutError(msg)
        chunk = os.read(proc.stdout.fileno(), 1)
        if not chunk:
            msg = f"pid {proc.pid} exited (got {line!r}, code {proc.wait(timeout)})"
            raise RuntimeError(msg)
        line += chunk
    return line.decode().strip()


def _stop(proc: subprocess.Popen[bytes], sig: int = signal.SIGKILL, wait: float = 10) -> None:
    if proc.poll() is None:
        proc.send_signal(sig)
        try:
            proc.wait(wait)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(wait)
    for pipe in (proc.stdin, proc.stdout):
        if pipe is not None:
            pipe.close()


def _child_env() -> dict[str, str]:
    src = str(Path(__file__).resolve().parents[2])
    path = os.environ.get("PYTHONPATH", "")
    return {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in (src, path) if p)}


@attrs.define
class ModelServer:
    """The loopback model server, in a child process."""

    proc: subprocess.Popen[bytes]
    #: ``http://127.0.0.1:PORT/v1``
    base_url: str

    def stats(self) -> Counter[str]:
        """How often the model was asked each question."""
        r = httpx.get(self.base_url + "/stats", timeout=10)
        r.raise_for_status()
        return Counter({str(k): int(v) for k, v in r.json().items()})


@contextmanager
def running_model() -> Iterator[ModelServer]:
    """The loopback model server in a child process, for the block."""
    code = "from turnledger.testing.cluster import _model_main; _model_main()"
    proc = subprocess.Popen(
        [sys.executable, "-c", code],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        env=_child_env(),
        bufsize=0,
        start_new_session=True,
    )
    try:
        line = _readline_within(proc, 30)
        yield ModelServer(proc, line.split("listening on ", 1)[1])
    finally:
        _stop(proc)


@attrs.define
class Node:
    """One ``turnledger serve`` child."""

    name: str
    proc: subprocess.Popen[bytes]
    #: ``http://127.0.0.1:PORT``
    url: str
    #: Its stderr: the JSON log lines.
    log: Path

    @property
    def alive(self) -> bool:
        return self.proc.poll() is None

    def kill(self, sig: int = signal.SIGKILL) -> None:
        """Send ``sig``; with SIGKILL, wait for the process to be gone."""
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
            if sig == signal.SIGKILL:
                self.proc.wait(10)


_HELP: dict[str, str] = {}


def serve_supports(flag: str) -> bool:
    """Whether this checkout's ``turnledger serve`` takes ``flag``."""
    if "serve" not in _HELP:
        done = subprocess.run(
            [sys.executable, "-m", "turnledger", "serve", "--help"],
            capture_output=True,
            text=True,
            timeout=60,
            env=_child_env(),
            check=True,
        )
        _HELP["serve"] = done.stdout
    return flag in _HELP["serve"].split()


@contextmanager
def running_node(dsn: str, base_url: str, folder: Path, name: str, *extra: str) -> Iterator[Node]:
    """``turnledger serve --db DSN`` on a free port of 127.0.0.1, with
    ``--node-id NAME`` where the command takes it."""
    folder.mkdir(parents=True, exist_ok=True)
    log = folder / f"{name}.log"
    ident = ["--node-id", name] if serve_supports("--node-id") else []
    command = [sys.executable, "-m", "turnledger", "serve", "--db", dsn, "--port", "0",
               "--base-url", base_url, "--model", "m", "--log-json", *ident, *extra]  # fmt: skip
    with open(log, "wb") as err:
        # A session of its own (setsid), as a separately started service has:
        # Linux shares the CPU between sessions (autogroup), and nodes started
        # in this process's session would share one share on a busy machine.
        proc = subprocess.Popen(
            command, stdout=subprocess.PIPE, stderr=err, env=_child_env(), start_new_session=True
        )
    try:
        try:
            line = _readline_within(proc, 60)
        except (TimeoutError, RuntimeError) as exc:
            msg = f"node {name} did not start: {exc}\n{log.read_text()[-2000:]}"
            raise RuntimeError(msg) from None
        yield Node(name, proc, line.split("listening on ", 1)[1], log)
    finally:
        _stop(proc)


# -- nginx --------------------------------------------------------------------


def find_nginx() -> str | None:
    """Debian's nginx binary, if installed."""
    return shutil.which("nginx") or next(
        (p for p in ("/usr/sbin/nginx",) if os.access(p, os.X_OK)), None
    )


def nginx_config(
    upstreams: Sequence[str], *, listen: str, prefix: Path, user: str | None = None
) -> str:
    """An nginx configuration that listens on ``listen`` (``[host:]port``),
    round-robins over ``upstreams`` (``host:port``) and streams Server-Sent
    Events as they come; its pid file, logs and buffers go under ``prefix``,
    and its worker runs as ``user`` (``None``: nginx's default).

    Open-source nginx checks health passively: a node that refuses a
    connection or times out once (``max_fails=1``) is left out for
    ``fail_timeout`` seconds, and the request goes to the next node
    (``proxy_next_upstream``; a POST only when it never reached the node).
    """
    servers = "\n".join(f"        server {u} max_fails=1 fail_timeout=5s;" for u in upstreams)
    temp = "\n".join(
        f"    {kind}_temp_path {prefix / kind};"
        for kind in ("client_body", "proxy", "fastcgi", "uwsgi", "scgi")
    )
    as_user = f"user {user};\n" if user else ""
    return f"""\
{as_user}daemon off;
master_process on;
worker_processes 1;
worker_rlimit_nofile 16384;
pid {prefix / "nginx.pid"};
error_log {prefix / "error.log"} warn;
events {{
    worker_connections 8192;
}}
http {{
    access_log off;
{temp}
    upstream turnledger {{
{servers}
        keepalive 256;
    }}
    server {{
        listen {listen};
        location / {{
            proxy_pass http://turnledger;
            proxy_http_version 1.1;
            proxy_set_header Connection "";
            # Without a token, serve answers a loopback Host only.
            proxy_set_header Host 127.0.0.1;
            proxy_set_header X-Forwarded-For $remote_addr;
            # Server-Sent Events: every delta at once, and long streams.
            proxy_buffering off;
            proxy_cache off;
            proxy_read_timeout 1h;
            proxy_connect_timeout 2s;
            proxy_next_upstream error timeout;
            proxy_next_upstream_tries 3;
        }}
    }}
}}
"""


@attrs.define
class Nginx:
    """nginx in front of the nodes (a child, not a daemon)."""

    proc: subprocess.Popen[bytes]
    #: ``http://127.0.0.1:PORT``
    url: str
    config: Path


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _wait_listening(port: int, proc: subprocess.Popen[bytes], timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while True:
        if proc.poll() is not None:
            msg = f"nginx exited with code {proc.returncode}"
            raise RuntimeError(msg)
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=1):
                return
        except OSError:
            if time.monotonic() > deadline:
                msg = f"nginx is not listening on {port} after {timeout}s"
                raise TimeoutError(msg) from None
            time.sleep(0.05)


@contextmanager
def running_nginx(upstreams: Sequence[str], folder: Path) -> Iterator[Nginx]:
    """nginx with :func:`nginx_config` for ``upstreams``, for the block."""
    binary = find_nginx()
    if binary is None:
        msg = "nginx is not installed (apt-get install nginx)"
        raise FileNotFoundError(msg)
    folder.mkdir(parents=True, exist_ok=True)
    for kind in ("client_body", "proxy", "fastcgi", "uwsgi", "scgi"):
        (folder / kind).mkdir(exist_ok=True)
    port = _free_port()
    config = folder / "nginx.conf"
    # As root (CI), the worker runs as root too: it writes under ``folder``.
    user = "root root" if os.geteuid() == 0 else None
    config.write_text(nginx_config(upstreams, listen=f"127.0.0.1:{port}", prefix=folder, user=user))
    # -e: the error log before the configuration is read (not /var/log).
    command = [binary, "-p", str(folder), "-c", str(config), "-e", str(folder / "error.log")]
    proc = subprocess.Popen(command, stdout=subprocess.DEVNULL, start_new_session=True)
    try:
        try:
            _wait_listening(port, proc, 15)
        except (TimeoutError, RuntimeError) as exc:
            log = (folder / "error.log").read_text() if (folder / "error.log").exists() else ""
            msg = f"{exc}\n{log[-2000:]}"
            raise RuntimeError(msg) from None
        yield Nginx(proc, f"http://127.0.0.1:{port}", config)
    finally:
        # SIGTERM: the master stops its worker, then itself; a master that
        # does not is killed with its whole process group (its own session).
        if proc.poll() is None:
            proc.terminate()
            try:
                proc.wait(10)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait(10)


# -- the cluster --------------------------------------------------------------


@attrs.define
class Cluster:
    """Nodes on one database, their model, and nginx if asked for."""

    dsn: str
    nodes: list[Node]
    model: ModelServer
    nginx: Nginx | None

    def alive(self) -> list[Node]:
        return [n for n in self.nodes if n.alive]


@contextmanager
def open_cluster(
    dsn: str, folder: Path, nodes: int = 3, *, nginx: bool = True, node_args: Sequence[str] = ()
) -> Iterator[Cluster]:
    """``nodes`` serve processes on ``dsn`` (one model server behind them
    all) and, with ``nginx``, nginx in front; all stopped when the block ends."""
    with ExitStack() as stack:
        model = stack.enter_context(running_model())
        started = [
            stack.enter_context(
                running_node(dsn, model.base_url, folder / "nodes", f"node-{i + 1}", *node_args)
            )
            for i in range(nodes)
        ]
        proxy = None
        if nginx:
            upstreams = [n.url.removeprefix("http://") for n in started]
            proxy = stack.enter_context(running_nginx(upstreams, folder / "nginx"))
        yield Cluster(dsn, started, model, proxy)


# -- a client's turn ------------------------------------------------------------


@attrs.frozen
class TurnPlan:
    """What one client does with one turn."""

    session_id: str
    request_id: str
    question: str
    #: Leave the first connection after this many deltas (0: never).
    reattach_after: int
    #: After the reattach, cancel after this many more deltas (``None``: never).
    cancel_after: int | None = None


@attrs.define
class TurnRecord:
    """What one client saw of one turn."""

    plan: TurnPlan
    #: The ``turn`` event arrived: the service took the question.
    acked: bool = False
    #: ``(id, text)`` of every delta received, in order, over every connection.
    deltas: list[tuple[int, str]] = attrs.field(factory=list)
    #: The base URL each of ``deltas`` came from.
    sources: list[str] = attrs.field(factory=list)
    #: The ``outcome`` event's data.
    outcome: dict[str, Any] | None = None
    #: The cancel's answer, if one was sent.
    cancel_result: dict[str, Any] | None = None
    #: Which base URL took each call: ``("post"|"stream"|"cancel", url)``.
    calls: list[tuple[str, str]] = attrs.field(factory=list)
    #: Calls that failed and were tried again (``what: detail``).
    retries: list[str] = attrs.field(factory=list)
    posted_at: float = 0.0
    first_delta_at: float | None = None
    #: Arrival time of each delta, by id (the first arrival).
    arrivals: dict[int, float] = attrs.field(factory=dict)
    ended_at: float | None = None
    #: When (wall clock) a reattach (or a repeated POST) brought the outcome
    #: alone: the turn had ended by the time the node served it, and an ended
    #: turn's stream is its outcome (the answer is in it), not the deltas the
    #: client missed.
    bare_outcome_at: float | None = None

    @property
    def text(self) -> str:
        return "".join(t for _, t in self.deltas)


class _Retry(Exception):
    """A call to try again, on another node."""


#: Errors of a call that another node may answer.
_AGAIN = (httpx.TransportError, _Retry)
_RETRY_STATUS = frozenset({409, 502, 503, 504})


async def _events(response: httpx.Response) -> Any:
    """The SSE events of ``response`` as ``(event, id, data)``."""
    event, ident, data = "message", None, ""
    async for line in response.aiter_lines():
        if line == "":
            if data:
                yield event, ident, json.loads(data)
            event, ident, data = "message", None, ""
            continue
        field, _, value = line.partition(":")
        value = value[1:] if value.startswith(" ") else value
        if field == "event":
            event = value
        elif field == "id":
            ident = int(value)
        elif field == "data":
            data += value


async def drive_turn(
    client: httpx.AsyncClient,
    pick: Callable[[Sequence[str]], str],
    plan: TurnPlan,
    *,
    deadline: float = 120.0,
    backoff: float = 0.2,
) -> TurnRecord:
    """One client's turn: POST it to one node, leave after
    ``plan.reattach_after`` deltas and reattach to another with
    ``Last-Event-ID``, cancel through a third if the plan says so, and read
    on to the outcome. A call that fails (a node gone, ``owned_elsewhere``,
    5xx) is tried again on another node with the same request id and the
    last delta id seen, until ``deadline`` seconds have passed.

    ``pick(used)`` names the base URL for the next call, avoiding ``used``
    where it can.

    Cancellation: the client's connections close; the turn goes on (a
    disconnect is never a cancel).
    """
    record = TurnRecord(plan)
    record.posted_at = time.monotonic()
    sid, rid = plan.session_id, plan.request_id
    used: list[str] = []
    with trio.fail_after(deadline):
        # The POST, again on another node until one takes the question.
        while not record.acked:
            url = pick(used)
            used.append(url)
            record.calls.append(("post", url))
            try:
                await _read(client, record, "POST", f"{url}/v1/sessions/{sid}/turns",
                            {"question": plan.question, "request_id": rid},
                            stop_after=plan.reattach_after)  # fmt: skip
            except _AGAIN as exc:
                record.retries.append(f"post: {exc!r}")
                await trio.sleep(backoff)
        cancel_due = plan.cancel_after
        while record.outcome is None:
            url = pick(used[-1:])
            used.append(url)
            record.calls.append(("stream", url))
            stop = None
            if cancel_due is not None and record.cancel_result is None:
                stop = len(record.deltas) + cancel_due
            try:
                await _read(client, record, "GET",
                            f"{url}/v1/sessions/{sid}/turns/{rid}/stream", None,
                            stop_after=stop)  # fmt: skip
            except _AGAIN as exc:
                record.retries.append(f"stream: {exc!r}")
                await trio.sleep(backoff)
                continue
            if record.outcome is None and stop is not None:
                await _cancel(client, record, pick, used[-2:], backoff)
    record.ended_at = time.monotonic()
    return record


async def _cancel(
    client: httpx.AsyncClient,
    record: TurnRecord,
    pick: Callable[[Sequence[str]], str],
    avoid: Sequence[str],
    backoff: float,
) -> None:
    """Cancel through a node other than ``avoid`` (the last two the turn
    used); a node that cannot be reached (killed) is avoided from then on,
    as a client would, and the cancel goes to another one."""
    sid, rid = record.plan.session_id, record.plan.request_id
    avoid = list(avoid)
    while record.cancel_result is None:
        url = pick(avoid)
        record.calls.append(("cancel", url))
        try:
            r = await client.post(f"{url}/v1/sessions/{sid}/turns/{rid}/cancel", json={})
        except httpx.TransportError as exc:
            record.retries.append(f"cancel: {exc!r}")
            avoid.append(url)
            await trio.sleep(backoff)
            continue
        if r.status_code in _RETRY_STATUS:
            record.retries.append(f"cancel: {r.status_code} {r.text[:200]}")
            await trio.sleep(backoff)
            continue
        r.raise_for_status()
        record.cancel_result = r.json()


async def _read(
    client: httpx.AsyncClient,
    record: TurnRecord,
    method: str,
    url: str,
    body: dict[str, Any] | None,
    *,
    stop_after: int | None,
) -> None:
    """Read one SSE response into ``record``; return early once
    ``stop_after`` deltas are in (closing the connection)."""
    base = url.split("/v1/", 1)[0]
    headers = {}
    if method == "GET":
        headers["Last-Event-ID"] = str(record.deltas[-1][0] if record.deltas else 0)
    here = 0
    async with client.stream(method, url, json=body, headers=headers) as r:
        if r.status_code in _RETRY_STATUS:
            await r.aread()
            raise _Retry(f"{r.status_code} {r.text[:200]}")
        if not r.headers.get("content-type", "").startswith("text/event-stream"):
            await r.aread()
            msg = f"{method} {url}: {r.status_code} {r.text[:300]}"
            raise AssertionError(msg)
        async for event, ident, data in _events(r):
            if event == "turn":
                record.acked = True
            elif event == "delta":
                here += 1
                now = time.monotonic()
                record.deltas.append((ident, data["text"]))
                record.sources.append(base)
                record.arrivals.setdefault(ident, now)
                if record.first_delta_at is None:
                    record.first_delta_at = now
                if stop_after and len(record.deltas) >= stop_after:
                    return
            elif event == "outcome":
                record.outcome = data
                # A repeated POST of an ended turn is its recorded outcome.
                if not here and (method == "GET" or data.get("repeated")):
                    record.bare_outcome_at = time.time()
                return
            elif event == "error":
                raise _Retry(f"error event {data}")
    if record.outcome is None and method == "GET":
        raise _Retry("the stream ended without an outcome")


def pick_random(
    urls: Callable[[], Sequence[str]], rng: random.Random
) -> Callable[[Sequence[str]], str]:
    """A ``pick`` for :func:`drive_turn`: a random node of ``urls()`` not in
    ``used`` where there is one."""

    def pick(used: Sequence[str]) -> str:
        now = list(urls())
        fresh = [u for u in now if u not in used]
        return rng.choice(fresh or now)

    return pick
