"""A loopback provider server: real HTTP/1.1 on 127.0.0.1, scripted faults.

It speaks whatever its script says, so it can play an OpenAI-compatible
server (SSE), Ollama (NDJSON), or a broken one: any status, headers and
media type; a body as chunks with pauses; writes split into pieces of N
bytes; an abrupt close; a stall before the headers or mid-stream. Requests
are parsed with h11; responses are written by hand so that the framing
itself can be scripted (chunked, Content-Length, or close-delimited). The
replies of real servers are built by :mod:`._replies`.

Run it inside a trio nursery::

    async with open_loopback_server([openai_stream_reply("Hi!")]) as server:
        provider = OpenAIChat(base_url=server.openai_base_url, api_key="k")

or in a thread of its own, from synchronous code (a session-scoped pytest
fixture, a demo)::

    with LoopbackServer(chat_responder("Hi!")).start_in_thread() as server:
        ...

A :data:`ReplyScript` is a :class:`Reply` (served to every request), a
sequence of replies (served in order; when it runs out, a plain-text 503),
or a :data:`Responder`, a function of the :class:`Exchange` (the request as
received) returning a reply. More replies can be queued at any time with
:meth:`LoopbackServer.enqueue`. In a reply's body, :class:`WritePause`
pauses the writes, :class:`Stall` stops writing and keeps the connection
open, :class:`Abort` closes it. Every exchange is recorded in
:attr:`LoopbackServer.exchanges`: method, path, headers, body, and how it
ended (completed, aborted by the script, or the client went away:
:attr:`Exchange.client_disconnected`). A provider asking about a model
(``GET .../models``, ``GET /props``, ``POST /api/show``...) is a *probe*:
recorded in :attr:`LoopbackServer.probes`, answered by a responder or else
404, never by a queued or listed reply. :func:`~._servers.model_server`
plays whole servers with a context window.
"""

from __future__ import annotations

import collections
import json
import socket
import threading
from collections.abc import AsyncIterator, Callable, Iterable, Iterator, Sequence
from contextlib import asynccontextmanager, contextmanager, suppress
from typing import TYPE_CHECKING, Any, Literal, TypeAlias

import attrs
import h11
import trio

if TYPE_CHECKING:
    from ..serve._listen import BatchListener

__all__ = [
    "Abort",
    "Exchange",
    "LoopbackServer",
    "Part",
    "Reply",
    "ReplyScript",
    "Responder",
    "Stall",
    "WritePause",
    "open_loopback_server",
]

_MAX_REQUEST_BODY = 16 * 1024 * 1024


# --- script ------------------------------------------------------------------


@attrs.frozen
class WritePause:
    """Stop writing for ``seconds``."""

    seconds: float


@attrs.frozen
class Stall:
    """Stop writing and keep the connection open until the client goes away."""


@attrs.frozen
class Abort:
    """Close the connection at once, mid-body (no terminating chunk)."""


Part: TypeAlias = bytes | WritePause | Stall | Abort


def _parts(body: Iterable[Part | str]) -> tuple[Part, ...]:
    return tuple(p.encode() if isinstance(p, str) else p for p in body)


def _pairs(headers: Iterable[tuple[str, str]]) -> tuple[tuple[str, str], ...]:
    return tuple((str(k), str(v)) for k, v in headers)


@attrs.frozen(kw_only=True)
class Reply:
    """One scripted response.

    Attributes:
        status: the status code.
        media_type: the ``Content-Type`` (``None``: no such header).
        body: what to write, in order: bytes (or str, UTF-8 encoded),
            :class:`WritePause`, :class:`Stall`, :class:`Abort`.
        headers: further headers, in order.
        framing: ``chunked`` (each bytes part is one chunk), ``length``
            (``Content-Length`` of all bytes parts; an :class:`Abort`
            then leaves the body short) or ``close`` (no length: the body
            ends when the server closes the connection).
        write_size: split every write (framing bytes included) into writes
            of at most this many bytes (e.g. 1 or 7).
        write_pause: sleep between two such split writes.
        headers_delay: wait this long before sending the status line.
        hang_before_headers: never answer; wait until the client goes away.
    """

    status: int = 200
    media_type: str | None = "text/event-stream"
    body: tuple[Part, ...] = attrs.field(default=(), converter=_parts)
    headers: tuple[tuple[str, str], ...] = attrs.field(default=(), converter=_pairs)
    framing: Literal["chunked", "length", "close"] = "chunked"
    write_size: int | None = None
    write_pause: float = 0.0
    headers_delay: float = 0.0
    hang_before_headers: bool = False


@attrs.define(eq=False)
class Exchange:
    """One request the server received, and how its response went."""

    method: str
    #: The request target (path and query).
    target: str
    headers: list[tuple[str, str]] = attrs.field(repr=False)
    body: bytes = attrs.field(repr=False)
    #: The status sent (``None`` if no headers were sent).
    status: int | None = None
    #: The whole scripted response was written.
    completed: bool = False
    #: The script aborted the connection (:class:`Abort`).
    aborted: bool = False
    #: The client closed the connection before the response was complete.
    client_disconnected: bool = False
    #: Set when the exchange is over, whichever way (a threading.Event, so
    #: it can be waited on from another thread).
    ended: threading.Event = attrs.field(factory=threading.Event, repr=False)

    @property
    def path(self) -> str:
        return self.target.partition("?")[0]

    def header(self, name: str) -> str | None:
        """The first value of header ``name`` (case-insensitive)."""
        name = name.lower()
        for key, value in self.headers:
            if key == name:
                return value
        return None

    def json(self) -> Any:
        """The body parsed as JSON."""
        return json.loads(self.body)

    async def wait_ended(self, timeout: float = 5.0) -> None:
        """Wait (in trio) until the exchange is over."""
        with trio.fail_after(timeout):
            while not self.ended.is_set():
                await trio.sleep(0.005)


Responder: TypeAlias = Callable[[Exchange], Reply]
ReplyScript: TypeAlias = Reply | Sequence[Reply] | Responder


def _is_probe(exchange: Exchange) -> bool:
    path, method = exchange.path, exchange.method
    if method == "POST":
        return path == "/api/show"
    return method == "GET" and (
        path.endswith("/models") or path == "/props" or path.startswith("/api/v0/models/")
    )


def _not_found() -> Reply:
    return Reply(
        status=404,
        media_type="application/json",
        body=(b'{"error":"not found"}',),
        framing="length",
    )


def _exhausted() -> Reply:
    return Reply(
        status=503,
        media_type="text/plain",
        body=(b"loopback: the script has no reply for this request\n",),
        framing="length",
    )


# --- the server ----------------------------------------------------------------


class _ClientGone(Exception):
    pass


class LoopbackServer:
    """A scripted HTTP/1.1 server on 127.0.0.1.

    Args:
        script: what to answer (see the module docstring); ``None``: only
            what is :meth:`enqueue`-d.
        port: 0 picks a free port.
    """

    def __init__(
        self, script: ReplyScript | None = None, *, host: str = "127.0.0.1", port: int = 0
    ):
        self._host = host
        self._port = port
        self._lock = threading.Lock()
        self._queue: collections.deque[Reply] = collections.deque()
        self._responder: Responder | None = None
        self._repeat: Reply | None = None
        if isinstance(script, Reply):
            self._repeat = script
        elif callable(script):
            self._responder = script
        elif script is not None:
            self._queue.extend(script)
        #: Every request received, in order, except probes.
        self.exchanges: list[Exchange] = []
        #: Every probe received, in order: a provider asking about a model
        #: (``GET .../models``, ``GET /props``, ``GET /api/v0/models/...``,
        #: ``POST /api/show``). Queued or listed replies never answer a
        #: probe: it gets 404, or the responder's reply (404 if the responder
        #: raises: it was written for chat requests only).
        self.probes: list[Exchange] = []
        self._bound_port: int | None = None

    # -- configuration ---------------------------------------------------------

    def enqueue(self, *replies: Reply) -> None:
        """Queue replies for the next requests (used before the script's own)."""
        with self._lock:
            self._queue.extend(replies)

    def _reply_for(self, exchange: Exchange) -> Reply:
        if _is_probe(exchange):
            if self._responder is not None:
                try:
                    return self._responder(exchange)
                except Exception:
                    # A responder written for chat requests only (one that
                    # parses the body as a chat request, say) knows nothing
                    # of this path.
                    return _not_found()
            return _not_found()
        with self._lock:
            if self._queue:
                return self._queue.popleft()
        if self._responder is not None:
            return self._responder(exchange)
        if self._repeat is not None:
            return self._repeat
        return _exhausted()

    @property
    def port(self) -> int:
        if self._bound_port is None:
            msg = "the server is not listening yet"
            raise RuntimeError(msg)
        return self._bound_port

    @property
    def base_url(self) -> str:
        """``http://127.0.0.1:PORT``"""
        return f"http://{self._host}:{self.port}"

    @property
    def openai_base_url(self) -> str:
        """``http://127.0.0.1:PORT/v1`` (for ``OpenAIChat(base_url=...)``)."""
        return self.base_url + "/v1"

    # -- serving ---------------------------------------------------------------

    async def serve(
        self, *, task_status: trio.TaskStatus[LoopbackServer] = trio.TASK_STATUS_IGNORED
    ) -> None:
        """Listen and serve until cancelled (use with ``nursery.start``)."""
        from ..serve._listen import BatchListener

        opened = await trio.open_tcp_listeners(self._port, host=self._host)
        self._bound_port = opened[0].socket.getsockname()[1]
        # Every pending connection is taken per scheduler pass: with trio's
        # listener (one per pass) a model server streaming to a thousand
        # clients took its new connections one long pass at a time, and
        # its callers' turns started one after another, seconds apart.
        listeners = [BatchListener(socket.socket(fileno=ln.socket.detach())) for ln in opened]
        async with trio.open_nursery() as nursery:
            for listener in listeners:
                nursery.start_soon(self._accept, listener, nursery)
            task_status.started(self)

    async def _accept(self, listener: BatchListener, nursery: trio.Nursery) -> None:
        async with listener:
            while True:
                stream = await listener.accept()
                nursery.start_soon(self._connection, stream)

    async def _connection(self, stream: trio.SocketStream) -> None:
        leftover = b""
        try:
            while True:
                exchange, leftover, closed = await self._read_request(stream, leftover)
                if exchange is None:
                    return
                (self.probes if _is_probe(exchange) else self.exchanges).append(exchange)
                keep = await self._respond(stream, exchange, self._reply_for(exchange), leftover)
                leftover = keep[1]
                if not keep[0] or closed:
                    return
        except (trio.BrokenResourceError, trio.ClosedResourceError, _ClientGone):
            return
        finally:
            await _close(stream)

    async def _read_request(
        self, stream: trio.SocketStream, leftover: bytes
    ) -> tuple[Exchange | None, bytes, bool]:
        conn = h11.Connection(h11.SERVER, max_incomplete_event_size=64 * 1024)
        if leftover:
            conn.receive_data(leftover)  # (b"" would mean end of stream to h11)
        request: h11.Request | None = None
        body = bytearray()
        while True:
            try:
                event = conn.next_event()
            except h11.RemoteProtocolError:
                await _send_all(stream, _simple_response(400, b"bad request\n"), None, 0.0)
                return None, b"", True
            if event is h11.NEED_DATA:
                data = await stream.receive_some(65536)
                if not data and request is None:
                    return None, b"", True  # the client closed an idle connection
                conn.receive_data(data)
            elif isinstance(event, h11.Request):
                request = event
            elif isinstance(event, h11.Data):
                body += event.data
                if len(body) > _MAX_REQUEST_BODY:
                    return None, b"", True
            elif isinstance(event, h11.EndOfMessage):
                break
            elif isinstance(event, h11.ConnectionClosed) or event is h11.PAUSED:
                return None, b"", True
        assert request is not None
        data, closed = conn.trailing_data
        exchange = Exchange(
            method=request.method.decode(),
            target=request.target.decode(),
            headers=[(k.decode().lower(), v.decode("latin-1")) for k, v in request.headers],
            body=bytes(body),
        )
        wants_close = any(
            k.lower() == b"connection" and b"close" in v.lower() for k, v in request.headers
        )
        return exchange, data, closed or wants_close

    async def _respond(
        self, stream: trio.SocketStream, exchange: Exchange, reply: Reply, leftover: bytes
    ) -> tuple[bool, bytes]:
        # A watcher reads from the client while the response is written, so
        # that a client going away is noticed even while the script pauses
        # or hangs; whatever it reads (a pipelined request) is kept.
        received = bytearray(leftover)
        gone = False
        result = "gone"

        async def watch(cancel: trio.CancelScope) -> None:
            nonlocal gone
            try:
                while True:
                    data = await stream.receive_some(65536)
                    if not data:
                        break
                    received.extend(data)
            except (trio.BrokenResourceError, trio.ClosedResourceError):
                pass
            gone = True
            cancel.cancel()

        try:
            async with trio.open_nursery() as nursery:
                nursery.start_soon(watch, nursery.cancel_scope)
                try:
                    result = await self._write(stream, exchange, reply)
                except (trio.BrokenResourceError, trio.ClosedResourceError):
                    gone = True
                nursery.cancel_scope.cancel()
        finally:
            # A client that closes right after the last byte did not leave early.
            exchange.client_disconnected = gone and not exchange.completed
            exchange.ended.set()
        if result == "done" and not gone:
            return True, bytes(received)
        return False, b""

    async def _write(self, stream: trio.SocketStream, exchange: Exchange, reply: Reply) -> str:
        if reply.hang_before_headers:
            await trio.sleep_forever()
        if reply.headers_delay:
            await trio.sleep(reply.headers_delay)
        size, pause = reply.write_size, reply.write_pause
        await _send_all(stream, _head(reply), size, pause)
        exchange.status = reply.status
        chunked = reply.framing == "chunked"
        for part in reply.body:
            if isinstance(part, bytes):
                if not part:
                    continue
                wire = b"%x\r\n%s\r\n" % (len(part), part) if chunked else part
                await _send_all(stream, wire, size, pause)
            elif isinstance(part, WritePause):
                await trio.sleep(part.seconds)
            elif isinstance(part, Stall):
                await trio.sleep_forever()
            else:
                exchange.aborted = True
                return "aborted"
        if chunked:
            await _send_all(stream, b"0\r\n\r\n", size, pause)
        exchange.completed = True
        return "done" if reply.framing != "close" else "closed"

    # -- running -----------------------------------------------------------------

    @contextmanager
    def start_in_thread(self) -> Iterator[LoopbackServer]:
        """Run the server in a thread with its own trio loop, for the duration
        of the ``with`` block (usable from synchronous code)."""
        ready = threading.Event()
        errors: list[BaseException] = []
        holder: dict[str, Any] = {}

        async def main() -> None:
            holder["token"] = trio.lowlevel.current_trio_token()
            async with trio.open_nursery() as nursery:
                holder["scope"] = nursery.cancel_scope
                await nursery.start(self.serve)
                ready.set()

        def run() -> None:
            try:
                trio.run(main)
            except BaseException as exc:  # reported to the starting thread
                errors.append(exc)
            finally:
                ready.set()

        thread = threading.Thread(target=run, name="turnledger-loopback", daemon=True)
        thread.start()
        ready.wait()
        if errors:
            raise errors[0]
        try:
            yield self
        finally:
            trio.from_thread.run_sync(holder["scope"].cancel, trio_token=holder["token"])
            thread.join(timeout=10)


@asynccontextmanager
async def open_loopback_server(
    script: ReplyScript | None = None, *, host: str = "127.0.0.1", port: int = 0
) -> AsyncIterator[LoopbackServer]:
    """Run a :class:`LoopbackServer` in a nursery for the ``async with`` block.

    Cancellation: leaving the block cancels the server and closes its connections.
    """
    server = LoopbackServer(script, host=host, port=port)
    async with trio.open_nursery() as nursery:
        await nursery.start(server.serve)
        try:
            yield server
        finally:
            nursery.cancel_scope.cancel()


# --- wire helpers ---------------------------------------------------------------

_REASONS = {
    200: "OK",
    400: "Bad Request",
    401: "Unauthorized",
    404: "Not Found",
    429: "Too Many Requests",
    500: "Internal Server Error",
    502: "Bad Gateway",
    503: "Service Unavailable",
    504: "Gateway Timeout",
}


def _head(reply: Reply) -> bytes:
    lines = [f"HTTP/1.1 {reply.status} {_REASONS.get(reply.status, 'Status')}"]
    if reply.media_type is not None:
        lines.append(f"Content-Type: {reply.media_type}")
    if reply.framing == "chunked":
        lines.append("Transfer-Encoding: chunked")
    elif reply.framing == "length":
        length = sum(len(p) for p in reply.body if isinstance(p, bytes))
        lines.append(f"Content-Length: {length}")
    else:
        lines.append("Connection: close")
    lines.extend(f"{k}: {v}" for k, v in reply.headers)
    return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1")


def _simple_response(status: int, body: bytes) -> bytes:
    reply = Reply(status=status, media_type="text/plain", body=(body,), framing="length")
    return _head(reply) + body


async def _send_all(stream: trio.SocketStream, data: bytes, size: int | None, pause: float) -> None:
    if size is None:
        await stream.send_all(data)
        return
    for i in range(0, len(data), size):
        if i and pause:
            await trio.sleep(pause)
        await stream.send_all(data[i : i + size])


async def _close(stream: trio.SocketStream) -> None:
    with (
        trio.CancelScope(shield=True),
        trio.move_on_after(1),
        suppress(trio.BrokenResourceError, trio.ClosedResourceError),
    ):
        await stream.aclose()
