"""Accepting connections in batches, and Hypercorn's trio worker over that listener.

Why: ``trio.SocketListener.accept`` takes one connection and then yields to
the scheduler, and ``trio.serve_listeners`` (which Hypercorn's trio worker
uses) calls it in a loop. So one connection is accepted per scheduler
pass. When a thousand streams are busy a pass is long, and a connection
that arrives behind a burst (a health probe, say) waits in the kernel's
accept queue for one pass per connection ahead of it: seconds, although
its TCP handshake completed at once.

:class:`BatchListener` takes every connection pending on the socket (up to
``batch``) each time the queue is found non-empty, with one schedule point
for the whole batch; ``serve_listeners`` then starts all their handlers
before it yields. :func:`serve_on` is Hypercorn's ``worker_serve`` for one
plain-TCP listener given by the caller: Hypercorn builds its
``SocketListener`` itself and has no seam for another listener, so this
module repeats its worker loop (lifespan, shutdown trigger, graceful
timeout) over Hypercorn's own connection handler, ``TCPServer``.
"""

from __future__ import annotations

import errno
import socket
from collections import deque
from collections.abc import Awaitable, Callable
from functools import partial
from typing import Any, final

import structlog
import trio

__all__ = ["BatchListener", "serve_on"]

# As trio's SocketListener: accept(2) errors that concern one connection
# (it was reset or refused before we took it), so the next one is tried.
_SKIP_NAMES = (
    "EPERM ECONNABORTED EPROTO ENETDOWN ENOPROTOOPT EHOSTDOWN ENONET EHOSTUNREACH EOPNOTSUPP "
    "ENETUNREACH ENOSR ESOCKTNOSUPPORT EPROTONOSUPPORT ETIMEDOUT ECONNRESET"
)
_SKIP = {getattr(errno, name) for name in _SKIP_NAMES.split() if hasattr(errno, name)}
_CLOSED = {errno.EBADF, errno.ENOTSOCK}
#: accept(2) errors that say the process is out of a resource (file
#: descriptors, mostly): the listener waits and tries again.
_CAPACITY = {errno.EMFILE, errno.ENFILE, errno.ENOMEM, errno.ENOBUFS}
#: Seconds between tries while out of a resource (as trio's serve_listeners).
CAPACITY_PAUSE = 0.1

log = structlog.get_logger("turnledger.serve")


@final
class BatchListener(trio.abc.Listener[trio.SocketStream]):
    """A listener that accepts all pending connections of a socket at once.

    ``sock`` is a bound, listening stdlib TCP socket; the listener owns it
    (closing the listener closes it). ``batch`` caps the connections taken
    in one go, so a flood still lets the loop run between batches.

    :meth:`accept` returns a connection taken earlier without a schedule
    point (it still raises ``Cancelled`` if cancelled); when none is left it
    takes every pending connection with one non-blocking ``accept(2)`` each
    until the queue is empty, then yields once, or waits until the socket
    is readable. Errors that concern a single connection are skipped, as
    ``trio.SocketListener`` does. Running out of file descriptors
    (``EMFILE``...) is waited out, with one log line per burst (see
    :meth:`_take_or_wait`); other errors are raised once the connections
    already taken have been handed out.
    """

    def __init__(self, sock: socket.socket, *, batch: int = 1024) -> None:
        if sock.type != socket.SOCK_STREAM:
            raise ValueError("BatchListener requires a SOCK_STREAM socket")
        if not sock.getsockopt(socket.SOL_SOCKET, socket.SO_ACCEPTCONN):
            raise ValueError("BatchListener requires a listening socket")
        if batch < 1:
            raise ValueError("batch must be at least 1")
        sock.setblocking(False)
        self.socket = sock
        self.batch = batch
        self._taken: deque[socket.socket] = deque()

    async def accept(self) -> trio.SocketStream:
        """The next connection (see the class docstring for when it yields).

        Raises:
            trio.ClosedResourceError: the listener was closed.
            OSError: ``accept(2)`` failed for a reason other than one
                connection's or a lack of resources.
        """
        if self._taken:
            await trio.lowlevel.checkpoint_if_cancelled()
        else:
            while not await self._take_or_wait():
                await trio.lowlevel.wait_readable(self.socket)
            # One schedule point for the whole batch.
            await trio.lowlevel.checkpoint()
        return trio.SocketStream(trio.socket.from_stdlib_socket(self._taken.popleft()))

    async def _take_or_wait(self) -> int:
        """:meth:`_take`, waiting out a lack of file descriptors (or memory).

        A burst of refused accepts is one warning line when it starts and
        one when it ends (with how many tries failed), not a traceback per
        try: the connections wait in the kernel's queue meanwhile, and the
        cure is a higher file limit (``ulimit -n``), which the line names.

        Cancellation: nothing was taken.
        """
        refused = 0
        while True:
            try:
                n = self._take()
            except OSError as exc:
                if exc.errno not in _CAPACITY:
                    raise
                if not refused:
                    log.warning(
                        "accept_refused",
                        error=errno.errorcode.get(exc.errno or 0, str(exc.errno)),
                        detail="out of file descriptors or memory: connections wait; "
                        "raise the file limit (ulimit -n, systemd LimitNOFILE=)",
                    )
                refused += 1
                await trio.sleep(CAPACITY_PAUSE)
                continue
            if refused:
                log.warning("accept_resumed", refused=refused)
            return n

    def _take(self) -> int:
        """Accept pending connections (at most ``batch``); how many were taken."""
        if self.socket.fileno() == -1:
            raise trio.ClosedResourceError("the listener was closed")
        n = 0
        while n < self.batch:
            try:
                conn, _ = self.socket.accept()
            except BlockingIOError:
                break
            except OSError as exc:
                if exc.errno in _SKIP:
                    continue
                if exc.errno in _CLOSED:
                    raise trio.ClosedResourceError("the listener was closed") from None
                if n:  # hand out what was taken; accept(2) will say it again
                    break
                raise
            self._taken.append(conn)
            n += 1
        return n

    async def aclose(self) -> None:
        """Close the socket and every connection taken but not handed out."""
        if self.socket.fileno() != -1:
            trio.lowlevel.notify_closing(self.socket)
        self.socket.close()
        while self._taken:
            self._taken.popleft().close()
        await trio.lowlevel.checkpoint()


async def serve_on(
    app: Any,
    config: Any,
    listener: trio.abc.Listener[trio.SocketStream],
    *,
    shutdown_trigger: Callable[[], Awaitable[object]],
    task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED,
) -> None:
    """Serve the ASGI ``app`` with Hypercorn's trio worker on ``listener``.

    As ``hypercorn.trio.serve(app, config, shutdown_trigger=...)`` for one
    plain-TCP socket (``config.bind``, TLS and QUIC settings are not used),
    but accepting from the given listener, which it closes. Once
    ``shutdown_trigger()`` returns, no connection is accepted; those open
    get ``config.graceful_timeout`` seconds to finish; then the app's
    lifespan shutdown runs.
    """
    # Hypercorn's own pieces, as its worker_serve uses them (0.17 and 0.18).
    from hypercorn.trio.lifespan import Lifespan
    from hypercorn.trio.statsd import StatsdLogger
    from hypercorn.trio.tcp_server import TCPServer
    from hypercorn.trio.worker_context import WorkerContext
    from hypercorn.utils import ShutdownError, raise_shutdown, wrap_app

    config.set_statsd_logger_class(StatsdLogger)
    wrapped = wrap_app(app, config.wsgi_max_body_size, None)
    state: dict[str, Any] = {}
    lifespan = Lifespan(wrapped, config, state)
    context = WorkerContext(None)
    async with trio.open_nursery() as lifespan_nursery:
        await lifespan_nursery.start(lifespan.handle_lifespan)
        await lifespan.wait_for_startup()
        async with trio.open_nursery() as server_nursery:
            task_status.started()
            try:
                async with trio.open_nursery(strict_exception_groups=True) as nursery:
                    nursery.start_soon(raise_shutdown, shutdown_trigger)
                    nursery.start_soon(raise_shutdown, context.terminate.wait)
                    handler = partial(TCPServer, wrapped, config, context, state.copy())
                    nursery.start_soon(
                        partial(
                            trio.serve_listeners,
                            handler,
                            [listener],
                            handler_nursery=server_nursery,
                        )
                    )
                    await trio.sleep_forever()
            except BaseExceptionGroup as error:
                _, other = error.split((ShutdownError, KeyboardInterrupt))
                if other is not None:
                    raise other from None
            finally:
                await context.terminated.set()
                server_nursery.cancel_scope.deadline = trio.current_time() + config.graceful_timeout
        await lifespan.wait_for_shutdown()
        lifespan_nursery.cancel_scope.cancel()
