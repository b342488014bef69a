"""The batch listener and Hypercorn's worker over it, on real sockets."""

from __future__ import annotations

import contextlib
import socket
import time
from collections.abc import AsyncIterator, Iterator
from contextlib import contextmanager
from functools import partial
from typing import Any

import pytest
import trio

from turnledger.serve._listen import BatchListener, serve_on


def _listening(backlog: int = 128) -> socket.socket:
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    sock.listen(backlog)
    return sock


@contextmanager
def _pending(sock: socket.socket, n: int) -> Iterator[list[socket.socket]]:
    """``n`` client connections, each sending its number, all waiting in the
    listening socket's accept queue (the kernel completes the handshakes)."""
    clients = [socket.create_connection(sock.getsockname()) for _ in range(n)]
    try:
        for i, c in enumerate(clients):
            c.sendall(f"{i:04d}".encode())
        yield clients
    finally:
        for c in clients:
            c.close()


class _Passes(trio.abc.Instrument):
    """Counts scheduler passes (the run loop checks for I/O once per pass)."""

    def __init__(self) -> None:
        self.n = 0

    def before_io_wait(self, timeout: float) -> None:
        self.n += 1


@pytest.fixture
async def passes() -> AsyncIterator[_Passes]:
    instrument = _Passes()
    trio.lowlevel.add_instrument(instrument)
    yield instrument
    trio.lowlevel.remove_instrument(instrument)


async def test_all_pending_connections_are_taken_in_one_pass(passes: _Passes) -> None:
    sock = _listening()
    with _pending(sock, 50):
        listener = BatchListener(sock)
        first = await listener.accept()
        before = passes.n
        rest = [await listener.accept() for _ in range(49)]
        # The 49 others were taken with the first: no pass in between.
        assert passes.n == before
        streams = [first, *rest]
        seen = sorted([(await s.receive_some(4)).decode() for s in streams])
        assert seen == [f"{i:04d}" for i in range(50)]
        for s in streams:
            await s.aclose()
        await listener.aclose()


async def test_trio_socket_listener_takes_one_connection_per_pass(passes: _Passes) -> None:
    # What BatchListener is for: trio's own listener yields after each accept.
    sock = _listening()
    with _pending(sock, 5):
        listener = trio.SocketListener(trio.socket.from_stdlib_socket(sock))
        streams = []
        for _ in range(5):
            before = passes.n
            streams.append(await listener.accept())
            assert passes.n == before + 1
        for s in streams:
            await s.aclose()
        await listener.aclose()


async def test_serve_listeners_hands_each_connection_to_one_handler_once() -> None:
    sock = _listening(backlog=512)
    seen: list[str] = []
    with _pending(sock, 300):
        listener = BatchListener(sock, batch=64)  # several batches

        async def handler(stream: trio.SocketStream) -> None:
            seen.append((await stream.receive_some(4)).decode())
            await stream.send_all(b"ok")

        async with trio.open_nursery() as nursery:
            nursery.start_soon(trio.serve_listeners, handler, [listener])
            with trio.fail_after(20):
                while len(seen) < 300:
                    await trio.sleep(0.01)
            nursery.cancel_scope.cancel()
    assert sorted(seen) == [f"{i:04d}" for i in range(300)]
    assert sock.fileno() == -1  # serve_listeners closed the listener, which owns the socket


async def test_accept_waits_for_a_connection_and_a_close_ends_it() -> None:
    sock = _listening()
    listener = BatchListener(sock)
    address = sock.getsockname()
    got: list[bytes] = []

    async def accept_one() -> None:
        stream = await listener.accept()
        got.append(await stream.receive_some(4))
        await stream.aclose()

    async with trio.open_nursery() as nursery:
        nursery.start_soon(accept_one)
        await trio.sleep(0.05)
        assert not got  # nothing pending: accept waits
        client = await trio.to_thread.run_sync(socket.create_connection, address)
        client.sendall(b"late")
    client.close()
    assert got == [b"late"]

    # A connection taken but never handed out is closed with the listener.
    with _pending(sock, 3) as clients:
        stream = await listener.accept()
        await listener.aclose()
        await stream.aclose()
        for c in clients[1:]:
            c.settimeout(5)
            # The server side was closed (reset: it had not read the data).
            with pytest.raises(ConnectionResetError):
                c.recv(1)
    with pytest.raises(trio.ClosedResourceError):
        await listener.accept()


async def test_a_close_wakes_a_waiting_accept() -> None:
    listener = BatchListener(_listening())
    with trio.fail_after(5):
        async with trio.open_nursery() as nursery:

            async def waiting() -> None:
                with pytest.raises(trio.ClosedResourceError):
                    await listener.accept()

            nursery.start_soon(waiting)
            await trio.sleep(0.05)
            await listener.aclose()


def test_only_a_listening_stream_socket_is_taken() -> None:
    with socket.socket() as unbound, pytest.raises(ValueError, match="listening"):
        BatchListener(unbound)
    with socket.socket(type=socket.SOCK_DGRAM) as udp, pytest.raises(ValueError, match="STREAM"):
        BatchListener(udp)
    with _listening() as sock, pytest.raises(ValueError, match="batch"):
        BatchListener(sock, batch=0)


async def test_hypercorn_serves_an_app_on_the_listener_until_the_trigger() -> None:
    from hypercorn.config import Config

    events: list[str] = []

    async def app(scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] == "lifespan":
            while True:
                message = await receive()
                events.append(message["type"])
                await send({"type": message["type"] + ".complete"})
                if message["type"] == "lifespan.shutdown":
                    return
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": scope["path"].encode()})

    sock = _listening()
    address = sock.getsockname()
    config = Config()
    config.accesslog = None
    config.errorlog = None
    stop = trio.Event()

    def get(path: str) -> bytes:
        with socket.create_connection(address, timeout=10) as c:
            c.sendall(f"GET {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n".encode())
            reply = b""
            while more := c.recv(4096):
                reply += more
            return reply

    with trio.fail_after(20):
        async with trio.open_nursery() as nursery:
            listener = BatchListener(sock)
            await nursery.start(
                partial(serve_on, app, config, listener, shutdown_trigger=stop.wait)
            )
            replies = await trio.to_thread.run_sync(lambda: [get(f"/p{i}") for i in range(20)])
            stop.set()
    for i, reply in enumerate(replies):
        assert reply.startswith(b"HTTP/1.1 200") and f"\r\n/p{i}\r\n".encode() in reply
    assert events == ["lifespan.startup", "lifespan.shutdown"]
    assert sock.fileno() == -1
    started = time.monotonic()
    with pytest.raises(OSError):
        socket.create_connection(address, timeout=2)
    assert time.monotonic() - started < 2  # refused, not queued


@contextmanager
def _no_file_descriptors() -> Iterator[list[int]]:
    """Every file descriptor the process may open taken (accept(2) then fails
    with EMFILE); the caller frees them by closing the listed ones."""
    import errno
    import os
    import resource

    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    highest = max(int(fd) for fd in os.listdir("/proc/self/fd"))
    resource.setrlimit(resource.RLIMIT_NOFILE, (highest + 1, hard))
    taken: list[int] = []
    try:
        while True:
            try:
                taken.append(os.dup(0))
            except OSError as exc:
                assert exc.errno == errno.EMFILE
                break
        yield taken
    finally:
        for fd in taken:
            with contextlib.suppress(OSError):
                os.close(fd)
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))


async def test_running_out_of_file_descriptors_is_one_line_per_burst_and_waited_out() -> None:
    import os

    from structlog.testing import capture_logs

    sock = _listening()
    listener = BatchListener(sock)
    with _pending(sock, 1), capture_logs() as logs, _no_file_descriptors() as taken:

        async def free_later() -> None:
            await trio.sleep(0.55)  # about five refused tries, 0.1 s apart
            for fd in taken:
                os.close(fd)
            taken.clear()

        async with trio.open_nursery() as nursery:
            nursery.start_soon(free_later)
            with trio.fail_after(10):
                stream = await listener.accept()
    assert (await stream.receive_some(4)) == b"0000"
    await stream.aclose()
    await listener.aclose()
    events = [e["event"] for e in logs]
    assert events == ["accept_refused", "accept_resumed"], logs
    assert logs[0]["error"] == "EMFILE" and "ulimit -n" in logs[0]["detail"]
    assert logs[1]["refused"] >= 3
