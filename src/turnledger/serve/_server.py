"""Running the service: Hypercorn's trio worker, the hub, signals.

``turnledger serve`` (and ``python -m turnledger.serve``) parse their
options here. SIGTERM or SIGINT stops accepting connections; turns in
flight may end within the grace period, then leaving the hub writes the
rest as ``interrupted``, and the process exits 0.
"""

from __future__ import annotations

import argparse
import os
import signal
import socket
from collections.abc import AsyncIterator, Callable
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from typing import Any

import structlog
import trio

from ..adapters.providers import PROVIDER_KINDS

__all__ = ["ServeOptionsError", "add_serve_arguments", "run_serve"]

log = structlog.get_logger("turnledger.serve")

_LOOPBACK = {"127.0.0.1", "::1", "localhost"}


class ServeOptionsError(ValueError):
    """Options that cannot work together (``turnledger serve`` exits 2);
    raised before anything is opened or bound."""


def add_serve_arguments(p: argparse.ArgumentParser) -> None:
    """The options of ``turnledger serve``."""
    p.add_argument("--db", required=True, help="event log: SQLite file, .jsonl or postgresql://")
    p.add_argument("--host", default="127.0.0.1", help="address to bind (default: %(default)s)")
    p.add_argument("--port", type=int, default=8421, help="port (default: %(default)s; 0: any)")
    p.add_argument("--token-env", metavar="NAME", default=None,
                   help="variable holding the bearer token every route then requires "
                   "(required to bind anything but loopback)")  # fmt: skip
    p.add_argument("--provider", choices=list(PROVIDER_KINDS), default="openai",
                   help="the model server's protocol (default: %(default)s)")  # fmt: skip
    p.add_argument("--base-url", help="model server (default: a built-in loopback server)")
    p.add_argument("--model", default=None, help="model name (default: loopback)")
    p.add_argument("--api-key-env", default=None, metavar="NAME",
                   help="variable holding the provider's API key")  # fmt: skip
    p.add_argument("--system", default="", help="system prompt of new sessions")
    p.add_argument("--on-busy", choices=["reject", "supersede"], default="reject",
                   help="a question while a turn is in flight: refused (409) or it replaces "
                   "the turn (default: %(default)s)")  # fmt: skip
    p.add_argument("--max-request-bytes", type=int, default=None, metavar="N",
                   help="cap on the request body sent to the model (default: none)")  # fmt: skip
    p.add_argument("--max-prompt-tokens", type=int, default=None, metavar="N",
                   help="cap on the estimated prompt tokens (default: none)")  # fmt: skip
    p.add_argument("--timeout", type=float, default=120.0, metavar="SECONDS",
                   help="turn deadline (default: %(default)s)")  # fmt: skip
    p.add_argument("--idle-timeout", type=float, default=30.0, metavar="SECONDS",
                   help="seconds without a delta before a turn times out (default: "
                   "%(default)s)")  # fmt: skip
    p.add_argument("--snapshot-every", type=int, default=None, metavar="N",
                   help="keep snapshots of long sessions (DB.snapshots, or a table for "
                   "PostgreSQL), one every N events, to reopen from (default: none)")  # fmt: skip
    p.add_argument("--grace", type=float, default=5.0, metavar="SECONDS",
                   help="on SIGTERM, how long turns in flight may take to end")  # fmt: skip
    p.add_argument("--max-body-bytes", type=int, default=1_048_576, metavar="N",
                   help="largest request body accepted (default: %(default)s)")  # fmt: skip
    p.add_argument("--max-starting", type=int, default=32, metavar="N",
                   help="turns starting at once, until their first delta (default: "
                   "%(default)s; 0: no limit); more wait in order")  # fmt: skip
    p.add_argument("--start-hold", type=float, default=0.5, metavar="SECONDS",
                   help="the longest a turn keeps its starting slot while its model "
                   "has sent nothing yet (default: %(default)s)")  # fmt: skip
    p.add_argument("--max-connections", type=int, default=2000, metavar="N",
                   help="connections to the model server (default: %(default)s)")  # fmt: skip
    p.add_argument("--keep-results-bytes", type=int, default=64 * 1024 * 1024, metavar="N",
                   help="memory for finished turns' results kept for reconnects, oldest "
                   "dropped first; a reconnect to a dropped one reads the store "
                   "(default: %(default)s, 64 MiB)")  # fmt: skip


def _token(args: argparse.Namespace) -> str | None:
    if args.token_env:
        token = os.environ.get(args.token_env)
        if not token:
            raise ServeOptionsError(f"--token-env: {args.token_env} is not set")
        return token
    if args.host not in _LOOPBACK:
        raise ServeOptionsError(f"binding {args.host} requires a token (--token-env NAME)")
    return None


def _provider(args: argparse.Namespace, base_url: str, client: Any) -> Any:
    key: str | None
    if not args.base_url:
        key = ""
    elif args.api_key_env:
        key = os.environ.get(args.api_key_env)
        if key is None:
            raise ServeOptionsError(f"--api-key-env: {args.api_key_env} is not set")
    else:
        key = None
    return PROVIDER_KINDS[args.provider].provider_class()(
        base_url=base_url, api_key=key, client=client
    )


def _client(args: argparse.Namespace) -> Any:
    # One connection per turn in flight: httpx's default pool (100) would
    # queue the turns of a busy service behind each other.
    import httpx

    default = PROVIDER_KINDS[args.provider].provider_class().default_timeout
    # The session's --idle-timeout decides how long a silent model server
    # may take; a shorter HTTP read timeout would end the turn first (as a
    # provider "read timeout") whatever the option says.
    read = max(default.read or 0.0, args.idle_timeout)
    timeout = httpx.Timeout(
        connect=default.connect, read=read, write=default.write, pool=default.pool
    )
    n = args.max_connections
    return httpx.AsyncClient(
        timeout=timeout, limits=httpx.Limits(max_connections=n, max_keepalive_connections=n)
    )


@asynccontextmanager
async def _given(url: str) -> AsyncIterator[str]:
    yield url


def _bind(host: str, port: int) -> socket.socket:
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((host, port))
    sock.listen(1024)  # room for a burst of connections (the default would be 128)
    sock.set_inheritable(True)
    return sock


async def run_serve(
    args: argparse.Namespace,
    endpoint: Callable[[argparse.Namespace], AbstractAsyncContextManager[str]] | None = None,
) -> int:
    """Serve until SIGTERM/SIGINT; returns the exit code (0 after a clean stop).

    ``args`` holds the options of :func:`add_serve_arguments`. Without
    ``--base-url``, ``endpoint(args)`` provides the model server's URL (the
    command line passes the built-in loopback server that ``chat`` uses).
    """
    # The server stack (the ``serve`` extra) is imported only to run: the
    # command line builds its parser from this module without it.
    from hypercorn.config import Config

    from ..adapters.stores import open_store
    from ..sessions import open_hub
    from ._app import ServeSettings, create_app
    from ._listen import BatchListener

    token = _token(args)
    if args.max_starting < 0:
        raise ServeOptionsError("--max-starting must be 0 (no limit) or more")
    if not args.start_hold > 0:
        raise ServeOptionsError("--start-hold must be more than 0 seconds")
    if args.keep_results_bytes < 0:
        raise ServeOptionsError("--keep-results-bytes must be 0 (keep none) or more")
    if not args.base_url and endpoint is None:
        raise ServeOptionsError("--base-url is required")
    model = args.model or ("loopback" if not args.base_url else None)
    if model is None:
        raise ServeOptionsError("--model is required with --base-url")
    sock = _bind(args.host, args.port)
    host, port = sock.getsockname()[:2]
    served = trio.Event()
    opened = _given(args.base_url) if args.base_url or endpoint is None else endpoint(args)
    async with opened as base_url:
        client = _client(args)
        provider = _provider(args, base_url, client)
        from ..cli._stores import command_keys  # (the cli imports serve)

        store = await open_store(args.db, keys=command_keys())
        snapshots = None
        try:
            if args.snapshot_every is not None:
                from ..adapters.stores import snapshots_beside

                snapshots = await snapshots_beside(args.db)
            async with client, provider, trio.open_nursery() as nursery:
                stop = trio.Event()

                async def on_signal() -> None:
                    with trio.open_signal_receiver(signal.SIGTERM, signal.SIGINT) as signals:
                        async for _ in signals:
                            stop.set()

                nursery.start_soon(on_signal)
                config = Config()
                # Streams end once the hub has closed (every turn then has its
                # outcome), so this is only a backstop.
                config.graceful_timeout = args.grace + 15
                config.accesslog = None
                config.errorlog = None
                config.keep_alive_timeout = 75
                settings = ServeSettings(
                    token=token,
                    max_body_bytes=args.max_body_bytes,
                    max_starting=args.max_starting,
                    start_hold=args.start_hold,
                    keep_results_bytes=args.keep_results_bytes,
                )
                async with open_hub(
                    store,
                    provider,
                    model=model,
                    system=args.system,
                    on_busy=args.on_busy,
                    max_request_bytes=args.max_request_bytes,
                    max_prompt_tokens=args.max_prompt_tokens,
                    turn_deadline=args.timeout,
                    idle_timeout=args.idle_timeout,
                    snapshots=snapshots,
                    snapshot_every=args.snapshot_every,
                ) as hub:
                    app = create_app(hub, store, settings, nursery=nursery, stopping=stop)
                    # The server runs in the outer nursery: it outlives the hub,
                    # so streams still deliver the outcomes the hub's closing
                    # writes (``interrupted``) before the connections end.
                    # Connections are accepted in batches: behind a burst of
                    # new streams, /healthz would otherwise wait one scheduler
                    # pass per connection ahead of it (see _listen).
                    listener = BatchListener(sock)  # owns the socket from here
                    nursery.start_soon(_serve, app, config, listener, stop, served)
                    shown = f"[{host}]" if ":" in host else host
                    print(f"turnledger serve: listening on http://{shown}:{port}", flush=True)
                    await stop.wait()
                    # Stopped accepting; turns in flight may end within the grace.
                    with trio.move_on_after(args.grace):
                        while hub.statistics().in_flight:
                            await trio.sleep(0.05)
                    log.info("serve_stopping", in_flight=hub.statistics().in_flight)
                # Hypercorn finishes its connections, then the signal watcher goes.
                await served.wait()
                nursery.cancel_scope.cancel()
        finally:
            if snapshots is not None:
                await snapshots.aclose()
            await store.aclose()
            sock.close()  # closed already if the listener ran; closing again is harmless
    return 0


async def _serve(app: Any, config: Any, listener: Any, stop: trio.Event, done: trio.Event) -> None:
    # The socket is bound and listening already, so the address printed
    # before this starts is good (a parent reads it with --port 0).
    from ._listen import serve_on

    try:
        await serve_on(app, config, listener, shutdown_trigger=stop.wait)
    finally:
        done.set()
