"""Running the service: Hypercorn's trio worker, the hub, signals.

:func:`run_serve` runs from one typed value, :class:`ServeOptions`; the
command line only builds it (``turnledger serve`` adds the options of
:func:`add_serve_arguments` and the provider and budget options it shares
with ``chat``). SIGTERM or SIGINT stops accepting connections; turns in
flight may end within the grace period, then leaving the hub writes the
rest as ``interrupted``, and the process exits 0, at most about a second
after the grace period (``_BACKSTOP``) whatever the clients do.
"""

from __future__ import annotations

import argparse
import os
import signal
import socket
from collections.abc import AsyncIterator, Callable
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from typing import TYPE_CHECKING, Any

import attrs
import structlog
import trio

from .._errors import ProviderSettingsError, StoreError
from ..adapters.providers import PROVIDER_KINDS, ProviderSettings
from ..events import OnBusy, Window
from ..sessions import RetentionPolicy

if TYPE_CHECKING:
    from ._app import ServeSettings

__all__ = ["ServeOptions", "ServeOptionsError", "add_serve_arguments", "run_serve"]

log = structlog.get_logger("turnledger.serve")

_LOOPBACK = {"127.0.0.1", "::1", "localhost"}
#: Seconds past --grace that Hypercorn waits for connections before it
#: cancels them: the hub has written every turn's end by --grace (plus the
#: moment its closing writes take), and streams close their connections.
_BACKSTOP = 1.0


class ServeOptionsError(ValueError):
    """Options that cannot work together (``turnledger serve`` exits 2);
    raised before anything is opened or bound."""


def add_serve_arguments(p: argparse.ArgumentParser) -> None:
    """The options of ``turnledger serve`` that only it has (the command line
    adds the provider and budget options it shares with ``chat``)."""
    p.add_argument("--db", required=True, help="event log: SQLite file, .jsonl or postgresql://")
    p.add_argument("--host", default="127.0.0.1", help="address to bind (default: %(default)s)")
    p.add_argument("--port", type=int, default=8421, help="port (default: %(default)s; 0: any)")
    p.add_argument("--token-env", metavar="NAME", default=None,
                   help="variable holding the bearer token every route then requires "
                   "(required to bind anything but loopback)")  # fmt: skip
    p.add_argument("--system", default="", help="system prompt of new sessions")
    p.add_argument("--on-busy", choices=["reject", "supersede"], default="reject",
                   help="a question while a turn is in flight: refused (409) or it replaces "
                   "the turn (default: %(default)s)")  # fmt: skip
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
    p.add_argument("--allow-origin", action="append", default=[], metavar="ORIGIN",
                   help="a browser origin (scheme://host[:port]) whose pages may use the API "
                   "without a token; repeatable (default: only the service's own)")  # fmt: skip
    p.add_argument("--header-timeout", type=float, default=10.0, metavar="SECONDS",
                   help="how long a connection may take to send a request's headers, and "
                   "stay idle between requests (default: %(default)s)")  # fmt: skip
    from ..cli._lifecycle import parse_age  # (the parser of `turnledger prune --older-than`)

    p.add_argument("--prune-older-than", type=parse_age, default=None, metavar="AGE",
                   help="retention: erase sessions idle for longer than AGE (30d, 12h, ...), "
                   "checked every --prune-every")  # fmt: skip
    p.add_argument("--prune-max-turns", type=int, default=None, metavar="N",
                   help="retention: keep each session's newest N committed turns")  # fmt: skip
    p.add_argument("--prune-every", type=float, default=3600.0, metavar="SECONDS",
                   help="how often the retention runs, the first time at start "
                   "(default: %(default)s)")  # fmt: skip
    p.add_argument("--node-id", default=None, metavar="ID",
                   help="run as this node of a cluster of serve processes on one PostgreSQL "
                   "store: any node takes any request (see docs/cluster.md)")  # fmt: skip
    p.add_argument("--advertise", default=None, metavar="URL",
                   help="the address GET /v1/nodes shows for this node "
                   "(with --node-id)")  # fmt: skip
    p.add_argument("--lease", type=float, default=None, metavar="SECONDS",
                   help="PostgreSQL: how long a session (and a node) stays owned without "
                   "renewal; a paused node loses its sessions after it (default: 10)")  # fmt: skip
    p.add_argument("--preview-retention", type=float, default=30.0, metavar="SECONDS",
                   help="with --node-id: how long a finished turn's deltas stay in the "
                   "database for reattaching clients (default: %(default)s)")  # fmt: skip
    p.add_argument("--keep-results-bytes", type=int, default=64 * 1024 * 1024, metavar="N",
                   help="memory for finished turns' results kept for reconnects, oldest "
                   "dropped first; a reconnect to a dropped one reads the store "
                   "(default: %(default)s, 64 MiB)")  # fmt: skip


def _app_settings() -> ServeSettings:
    # The application (starlette, the serve extra) loads only to run, so the
    # command line's parser never needs the extra.
    from ._app import ServeSettings

    return ServeSettings()


@attrs.frozen(kw_only=True)
class ServeOptions:
    """Everything :func:`run_serve` runs from: where to listen, the store,
    the provider, the hub's settings for new sessions and budgets, and the
    application's :class:`~turnledger.serve.ServeSettings` (its bearer
    token, trusted origins, body and burst limits; ``run_serve`` adds the
    budget a new session's first question must fit, from the provider).
    ``turnledger serve`` builds one from its options; a program may build
    its own."""

    #: The event log: a SQLite file, a ``.jsonl`` journal or PostgreSQL (see ``open_store``).
    db: str
    #: The model server (the key is read from its variable, never held here).
    provider: ProviderSettings = attrs.field(factory=ProviderSettings)
    #: The model of new sessions; ``None`` only with the built-in endpoint
    #: ``run_serve`` is given (then ``loopback``).
    model: str | None = None
    host: str = "127.0.0.1"
    #: 0: any free port (the address is printed).
    port: int = 8421
    #: The system prompt of new sessions.
    system: str = ""
    #: A question while a turn is in flight: refused (409) or it replaces the turn.
    on_busy: OnBusy = "reject"
    #: Keep at most this many turns in the context (:class:`Window`); ``None``: every turn.
    history_window: int | None = None
    max_request_bytes: int | None = None
    max_prompt_tokens: int | None = None
    #: The model's context window; ``None``: ask the server, else a fallback.
    context_window: int | None = None
    #: Tokens of the window kept for the answer; ``None``: a default share.
    output_reserve: int | None = None
    #: Seconds a turn may take in all.
    turn_deadline: float = 120.0
    #: Seconds without a delta before a turn times out (and the model
    #: server's HTTP read timeout is at least this).
    idle_timeout: float = 30.0
    #: On SIGTERM, how long turns in flight may take to end.
    grace: float = 5.0
    #: Connections to the model server.
    max_connections: int = 2000
    #: Seconds a connection may take to send a request's headers, and stay
    #: idle between requests.
    header_timeout: float = 10.0
    #: Sessions idle too long erased, old turns trimmed (``None``: kept),
    #: applied at start and every ``prune_every`` seconds.
    retention: RetentionPolicy | None = None
    prune_every: float = 3600.0
    #: The keys of an encrypted store (a ``KeyProvider``, see docs/encryption.md);
    #: ``None``: a plain store (an encrypted one then answers 503).
    keys: Any = None
    #: Keep snapshots of long sessions beside the store, one every this many
    #: events (see docs/snapshots.md); ``None``: none.
    snapshot_every: int | None = None
    #: Run as this node of a cluster (PostgreSQL only; see docs/cluster.md).
    node_id: str | None = None
    #: The address ``GET /v1/nodes`` shows for this node.
    advertise: str | None = None
    #: PostgreSQL: seconds a session's lease, and the node's heartbeat, last
    #: without renewal; ``None``: the store's default (10).
    lease: float | None = None
    #: Seconds a finished turn's deltas stay in the database (``node_id`` only).
    preview_retention: float = 30.0
    #: What the application needs besides the hub and the store.
    app: ServeSettings = attrs.field(factory=_app_settings)


def _check_token(token: str) -> None:
    # An HTTP header cannot carry it as it is: no request would match.
    if not token.strip():
        raise ServeOptionsError("--token-env: the token is blank")
    if token != token.strip() or not token.isprintable() or " " in token:
        raise ServeOptionsError("--token-env: the token has spaces or control characters")


def _origins(given: frozenset[str]) -> frozenset[str]:
    """The trusted origins as browsers send them (``scheme://host[:port]``,
    lowercase)."""
    from ._app import check_origin

    try:
        return frozenset(check_origin(o) for o in given)
    except ValueError as exc:
        raise ServeOptionsError(f"--allow-origin: {exc}") from None


def _check(options: ServeOptions, endpoint: object) -> str:
    """Refuse options that cannot work together, before anything is opened
    or bound; the model of new sessions."""
    app = options.app
    if options.node_id is not None and not options.preview_retention > 0:
        raise ServeOptionsError("--preview-retention must be more than 0 seconds")
    if app.token is None and options.host not in _LOOPBACK:
        raise ServeOptionsError(f"binding {options.host} requires a token (--token-env NAME)")
    if app.token is not None:
        _check_token(app.token)
    _origins(app.allowed_origins)
    if not options.header_timeout > 0:
        raise ServeOptionsError("--header-timeout must be more than 0 seconds")
    if options.retention is not None and not options.prune_every > 0:
        raise ServeOptionsError("--prune-every must be more than 0 seconds")
    if app.max_starting < 0:
        raise ServeOptionsError("--max-starting must be 0 (no limit) or more")
    if not app.start_hold > 0:
        raise ServeOptionsError("--start-hold must be more than 0 seconds")
    if app.keep_results_bytes < 0:
        raise ServeOptionsError("--keep-results-bytes must be 0 (keep none) or more")
    _check_cluster(options)
    window, reserve = options.context_window, options.output_reserve
    if window is not None and reserve is not None and reserve >= window:
        raise ServeOptionsError("--output-reserve must be below --context-window")
    try:
        configured = options.provider.endpoint()
    except ProviderSettingsError as exc:
        raise ServeOptionsError(str(exc)) from None
    if configured is None and endpoint is None:
        raise ServeOptionsError("--base-url is required")
    if options.model:
        return options.model
    if configured is not None:
        source = "--base-url" if configured.source == "base_url" else configured.source
        raise ServeOptionsError(f"--model is required with an endpoint (from {source})")
    return "loopback"


def _check_cluster(options: ServeOptions) -> None:
    """Clustering needs PostgreSQL: the nodes share sessions through it."""
    from ..adapters.stores import store_kind
    from ..adapters.stores.postgres import check_node_id

    given = [
        flag
        for flag, value in (
            ("--node-id", options.node_id),
            ("--advertise", options.advertise),
            ("--lease", options.lease),
        )
        if value is not None
    ]
    if given and store_kind(options.db) != "postgres":
        raise ServeOptionsError(
            f"{', '.join(given)}: clustering needs a PostgreSQL store (--db postgresql://...);"
            " the nodes share their sessions through it"
        )
    if options.advertise is not None and options.node_id is None:
        raise ServeOptionsError("--advertise goes with --node-id")
    if options.node_id is not None:
        if options.keys is not None:
            raise ServeOptionsError("--node-id: an encrypted store cannot be clustered yet")
        try:
            check_node_id(options.node_id)
        except ValueError as exc:
            raise ServeOptionsError(f"--node-id: {exc}") from None
    if options.lease is not None and not options.lease > 0:
        raise ServeOptionsError("--lease must be more than 0 seconds")


def _store_options(options: ServeOptions) -> dict[str, Any]:
    opened: dict[str, Any] = {}
    if options.node_id is not None:
        opened.update(node_id=options.node_id, advertise=options.advertise)
    if options.lease is not None:
        opened["lease"] = options.lease
    return opened


def _provider(options: ServeOptions, base_url: str, client: Any, *, loopback: bool) -> Any:
    key_env = options.provider.api_key_env
    if not loopback and key_env and os.environ.get(key_env) is None:
        raise ServeOptionsError(f"--api-key-env: {key_env} is not set")
    try:
        return options.provider.open(
            base_url=base_url, api_key="" if loopback else None, client=client
        )
    except ProviderSettingsError as exc:
        raise ServeOptionsError(f"bad request settings: {exc}") from None


def _client(options: ServeOptions) -> Any:
    # One connection per turn in flight: httpx's default pool (100) would
    # queue the turns of a busy service behind each other.
    import httpx

    default = PROVIDER_KINDS[options.provider.kind].provider_class().default_timeout
    # The session's idle timeout decides how long a silent model server
    # may take; a shorter HTTP read timeout would end the turn first (as a
    # provider "read timeout") whatever the option says.
    read = max(default.read or 0.0, options.idle_timeout)
    timeout = httpx.Timeout(
        connect=default.connect, read=read, write=default.write, pool=default.pool
    )
    n = options.max_connections
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
    options: ServeOptions,
    endpoint: Callable[[], AbstractAsyncContextManager[str]] | None = None,
) -> int:
    """Serve until SIGTERM/SIGINT; returns the exit code (0 after a clean stop).

    Without a base URL (neither ``options.provider.base_url`` nor the
    protocol's variable), ``endpoint()`` provides the model server's URL
    (the command line passes the built-in loopback server that ``chat``
    uses); that server is never sent a key.

    Raises:
        ServeOptionsError: options that cannot work together, raised before
            anything is opened or bound.

    Cancellation: cancelling stops accepting connections and closes the hub
    at once (turns in flight are written as ``interrupted``), the store and
    the socket; SIGTERM and SIGINT are the graceful way.
    """
    # The server stack (the ``serve`` extra) is imported only to run: the
    # command line builds its parser from this module without it.
    from hypercorn.config import Config

    from ..adapters.stores import PostgresStore, open_store
    from ..sessions import Budget, CharTokenEstimator, open_hub
    from ._app import NewSessionBudget, create_app
    from ._cluster import Node
    from ._listen import BatchListener

    model = _check(options, endpoint)
    if options.node_id is not None:
        # Every log line of this process names its node (an actor's task
        # keeps it when it starts its own context).
        structlog.contextvars.bind_contextvars(node_id=options.node_id)
    configured = options.provider.endpoint()
    served = trio.Event()
    loopback = configured is None and endpoint is not None
    opened = endpoint() if loopback and endpoint is not None else _given(_url(configured))
    async with opened as base_url:
        client = _client(options)
        try:  # the provider's settings fail before anything is bound
            provider = _provider(options, base_url, client, loopback=loopback)
        except BaseException:
            await client.aclose()
            raise
        sock = _bind(options.host, options.port)
        host, port = sock.getsockname()[:2]
        try:
            store = await open_store(options.db, keys=options.keys, **_store_options(options))
        except StoreError as exc:
            sock.close()
            await client.aclose()
            if options.node_id is not None and "node id" in str(exc):
                raise ServeOptionsError(f"--node-id: {exc}") from None
            raise
        except BaseException:
            sock.close()
            await client.aclose()
            raise
        snapshots = None
        try:
            if options.snapshot_every is not None:
                from ..adapters.stores import snapshots_beside

                snapshots = await snapshots_beside(options.db)
            async with client, provider, trio.open_nursery() as nursery:
                stop = trio.Event()

                async def on_signal() -> None:
                    with trio.open_signal_receiver(signal.SIGTERM, signal.SIGINT) as signals:
                        async for _ in signals:
                            stop.set()

                nursery.start_soon(on_signal)
                config = Config()
                # Streams end once the hub has closed (every turn then has its
                # outcome) and then close their connection, and idle
                # connections close at once: this is only a backstop.
                config.graceful_timeout = options.grace + _BACKSTOP
                config.accesslog = None
                config.errorlog = None
                # Hypercorn's idle timer runs from a connection's start until
                # a request's headers are complete, and between requests: a
                # half-sent request holds its connection this long at most.
                config.keep_alive_timeout = options.header_timeout
                settings = attrs.evolve(
                    options.app, allowed_origins=_origins(options.app.allowed_origins)
                )
                if settings.new_session_budget is None:
                    # What a first question must fit, measured as the hub
                    # will measure it (the provider's encoder).
                    budget = Budget(
                        options.max_request_bytes,
                        provider.encoder,
                        options.max_prompt_tokens,
                        CharTokenEstimator(),
                    )
                    settings = attrs.evolve(
                        settings,
                        new_session_budget=NewSessionBudget(
                            budget=budget, model=model, system=options.system
                        ),
                    )
                window = options.history_window
                async with (
                    _previews(options, store) as previews,
                    open_hub(
                        store,
                        provider,
                        model=model,
                        system=options.system,
                        policy=None if window is None else Window(window),
                        on_busy=options.on_busy,
                        max_request_bytes=options.max_request_bytes,
                        max_prompt_tokens=options.max_prompt_tokens,
                        context_window=options.context_window,
                        output_reserve=options.output_reserve,
                        turn_deadline=options.turn_deadline,
                        idle_timeout=options.idle_timeout,
                        retention=options.retention,
                        snapshots=snapshots,
                        snapshot_every=options.snapshot_every,
                    ) as hub,
                ):
                    node = None
                    if isinstance(store, PostgresStore) and store.inbox is not None:
                        node = Node(store, hub)
                    app = create_app(
                        hub,
                        store,
                        settings,
                        nursery=nursery,
                        stopping=stop,
                        node=node,
                        previews=previews,
                    )
                    pruning = trio.CancelScope()
                    if options.retention is not None:
                        nursery.start_soon(_prune_every, hub, options.prune_every, pruning)
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
                    pruning.cancel()
                    # Stopped accepting; turns in flight may end within the grace.
                    with trio.move_on_after(options.grace):
                        if node is not None:
                            await _hand_over(node, hub, store)
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


@asynccontextmanager
async def _previews(options: ServeOptions, store: Any) -> AsyncIterator[Any]:
    # Only a node of a cluster publishes and follows previews.
    if options.node_id is None:
        yield None
        return
    from ..adapters.stores import open_previews

    async with open_previews(store, retain_after_end=options.preview_retention) as previews:
        yield previews


async def _hand_over(node: Any, hub: Any, store: Any) -> None:
    """A node stopping hands its sessions over: it refuses new work (other
    nodes' calls are told to look again), and lets each session go as soon
    as no turn of it is in flight, so that other nodes acquire them within
    the grace rather than after the leases run out.

    Cancellation: the grace ran out; the hub's close lets the rest go.
    """
    node.stopping = True
    try:
        await store.mark_stopping()
    except StoreError as exc:
        log.warning("node_mark_failed", error=type(exc).__name__)
    log.info("node_stopping", sessions=len(store.held_sessions()))
    while True:
        idle = hub.idle_sessions()
        if idle:
            async with trio.open_nursery() as nursery:
                for sid in idle:
                    nursery.start_soon(hub.drop, sid)
        if not hub.statistics().in_flight:
            return
        await trio.sleep(0.05)


def _url(configured: Any) -> str:
    assert configured is not None  # (_check refused options without one)
    return str(configured.url)


async def _prune_every(hub: Any, seconds: float, scope: trio.CancelScope) -> None:
    """The retention, at start and every ``seconds`` (each step is logged
    by the hub); a failed round is logged and the next one tries again."""
    with scope:
        while True:
            try:
                await hub.prune()
            except Exception as exc:
                log.error("retention_failed", error=type(exc).__name__)
            await trio.sleep(seconds)


async def _serve(app: Any, config: Any, listener: Any, stop: trio.Event, done: trio.Event) -> None:
    # The socket is bound and listening already, so the address printed
    # before this starts is good (a parent reads it with --port 0).
    from ._listen import serve_on

    try:
        await serve_on(app, config, listener, shutdown_trigger=stop.wait)
    finally:
        done.set()
