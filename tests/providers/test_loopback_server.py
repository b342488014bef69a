"""The loopback provider server itself (turnledger.testing)."""

from __future__ import annotations

import socket

import httpx
import pytest
import trio

from turnledger.testing import (
    Abort,
    LoopbackServer,
    Reply,
    Stall,
    WritePause,
    chat_responder,
    error_reply,
    open_loopback_server,
    openai_sse_chunks,
    openai_stream_reply,
    sse_event,
)

pytestmark = pytest.mark.loopback


def test_runs_in_a_thread_for_synchronous_code() -> None:
    server = LoopbackServer([openai_stream_reply("one"), openai_stream_reply("two")])
    with server.start_in_thread(), httpx.Client() as client:
        url = server.openai_base_url + "/chat/completions"
        first = client.post(url, json={"messages": []})
        second = client.post(url, json={"messages": []})
        third = client.post(url, json={"messages": []})
        server.enqueue(error_reply(429))
        fourth = client.post(url, json={"messages": []})
    assert first.headers["content-type"] == "text/event-stream"
    assert '"content":"one"' in first.text and '"content":"two"' in second.text
    assert third.status_code == 503 and "no reply" in third.text  # the script ran out
    assert fourth.status_code == 429
    assert [e.completed for e in server.exchanges] == [True] * 4
    # keep-alive: several requests over one connection
    assert not any(e.client_disconnected for e in server.exchanges)


def test_a_single_reply_is_served_to_every_request() -> None:
    server = LoopbackServer(error_reply(418, "teapot"))
    with server.start_in_thread(), httpx.Client() as client:
        codes = [client.get(server.base_url + "/x").status_code for _ in range(3)]
    assert codes == [418] * 3


async def test_records_what_it_saw() -> None:
    async with open_loopback_server(chat_responder("hey")) as server, httpx.AsyncClient() as c:
        r = await c.post(
            server.base_url + "/api/chat?x=1",
            json={"messages": [{"role": "user", "content": "hi"}], "stream": False},
            headers={"X-Test": "1"},
        )
    assert r.json()["message"]["content"] == "hey"
    (ex,) = server.exchanges
    assert (ex.method, ex.target, ex.path) == ("POST", "/api/chat?x=1", "/api/chat")
    assert ex.header("X-TEST") == "1"
    assert ex.json()["messages"][0]["content"] == "hi"
    assert ex.status == 200 and ex.completed and ex.ended.is_set()
    assert "headers" not in repr(ex)  # headers (keys!) are kept out of the repr


async def test_chat_responder_sequences_and_404() -> None:
    async with open_loopback_server(chat_responder(["a", "b"])) as server, httpx.AsyncClient() as c:
        url = server.openai_base_url + "/chat/completions"
        bodies = [
            (await c.post(url, json={"messages": [], "stream": False})).json() for _ in range(3)
        ]
        missing = await c.post(server.base_url + "/nope", json={})
    assert [b["choices"][0]["message"]["content"] for b in bodies] == ["a", "b", "b"]
    assert missing.status_code == 404


async def raw_exchange(server: LoopbackServer, read: float = 2.0) -> bytes:
    stream = await trio.open_tcp_stream("127.0.0.1", server.port)
    await stream.send_all(
        b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 2\r\n\r\n{}"
    )
    out = b""
    with trio.move_on_after(read):
        while True:
            data = await stream.receive_some()
            if not data:
                break
            out += data
    await stream.aclose()
    return out


async def test_framings_and_write_splits() -> None:
    replies = [
        Reply(body=(b"abc", b"de"), write_size=1),
        Reply(body=(b"abc", b"de"), framing="length", write_size=7),
        Reply(body=(b"abc", b"de"), framing="close", headers=[("X-A", "b")]),
    ]
    async with open_loopback_server(replies) as server:
        chunked = await raw_exchange(server, 0.3)
        length = await raw_exchange(server, 0.3)
        close = await raw_exchange(server)
    assert chunked.endswith(b"\r\n\r\n3\r\nabc\r\n2\r\nde\r\n0\r\n\r\n")
    assert b"Transfer-Encoding: chunked" in chunked
    assert b"Content-Length: 5\r\n" in length and length.endswith(b"\r\n\r\nabcde")
    assert b"Connection: close" in close and b"X-A: b" in close and close.endswith(b"abcde")


async def test_abort_and_hang() -> None:
    async with open_loopback_server(
        [Reply(body=(b"abc", Abort(), b"never")), Reply(body=(b"abc", WritePause(0.01), Stall()))]
    ) as server:
        aborted = await raw_exchange(server)
        hung = await raw_exchange(server, 0.3)
        await server.exchanges[1].wait_ended()
    assert aborted.endswith(b"3\r\nabc\r\n") and b"never" not in aborted
    assert server.exchanges[0].aborted and not server.exchanges[0].completed
    assert hung.endswith(b"3\r\nabc\r\n")
    assert server.exchanges[1].client_disconnected


async def test_a_malformed_request_gets_400() -> None:
    async with open_loopback_server(openai_stream_reply("x")) as server:
        with socket.create_connection(("127.0.0.1", server.port)) as s:
            s.sendall(b"NOT HTTP AT ALL\r\n\r\n")
            data = await trio.to_thread.run_sync(s.recv, 1000)
    assert data.startswith(b"HTTP/1.1 400")


def test_builders() -> None:
    assert sse_event("a\nb", event="e", id="1") == b"event: e\nid: 1\ndata: a\ndata: b\n\n"
    chunks = openai_sse_chunks("abcdef", chunk_size=4, usage=(1, 2))
    assert len(chunks) == 1 + 2 + 1 + 1 + 1  # role, 2 deltas, finish, usage, DONE
    assert chunks[-1] == b"data: [DONE]\n\n"
    with pytest.raises(ValueError):
        openai_sse_chunks("x", chunk_size=0)
