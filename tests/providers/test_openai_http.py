"""OpenAIChat over real HTTP (the loopback server) and httpx's MockTransport."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import httpx
import pytest
import structlog
import trio
from structlog.testing import capture_logs

from turnledger import ProviderError
from turnledger.adapters.providers import OpenAIChat, RetryPolicy, StreamLimits
from turnledger.events import RequestId, Usage
from turnledger.sessions import ChatMessage, ChatRequest, Completion
from turnledger.testing import (
    Abort,
    Reply,
    WritePause,
    error_reply,
    open_loopback_server,
    openai_json_reply,
    openai_sse_chunks,
    openai_stream_reply,
)

from ._helpers import Sink, outcome, run_turn, seeded_state, turns

pytestmark = pytest.mark.loopback

REQUEST = ChatRequest(
    RequestId("r-1"), "gpt-test", (ChatMessage("system", "Be brief."), ChatMessage("user", "Hi?"))
)


def provider(server: Any, **kw: Any) -> OpenAIChat:
    kw.setdefault("api_key", "sk-test")
    kw.setdefault("timeout", httpx.Timeout(5.0))
    return OpenAIChat(base_url=server.openai_base_url, trust_env=False, **kw)


async def complete(p: OpenAIChat, sink: Sink | None = None) -> Completion:
    async with p:
        return await p.complete(REQUEST, sink or Sink())


async def failure(p: OpenAIChat) -> ProviderError:
    with pytest.raises(ProviderError) as info:
        await complete(p)
    return info.value


# -- the request ----------------------------------------------------------------------


async def test_sends_exactly_the_encoded_body_and_the_right_headers() -> None:
    async with open_loopback_server(openai_stream_reply("Hello!")) as server:
        p = provider(
            server,
            temperature=0.2,
            max_tokens=64,
            stop=["\n\n"],
            include_usage=True,
            extra={"seed": 7},
            headers={"X-Trace": "t1"},
        )
        sink = Sink()
        assert await complete(p, sink) == Completion("Hello!", "stop")
        (ex,) = server.exchanges
    assert ex.method == "POST" and ex.path == "/v1/chat/completions"
    assert ex.body == p.encoder.encode(REQUEST.model, REQUEST.messages)
    assert list(json.loads(ex.body)) == [
        "model",
        "messages",
        "stream",
        "temperature",
        "max_tokens",
        "stop",
        "stream_options",
        "seed",
    ]
    assert ex.json()["stream_options"] == {"include_usage": True}
    assert ex.header("authorization") == "Bearer sk-test"
    assert ex.header("accept") == "text/event-stream"
    assert ex.header("content-type") == "application/json"
    assert ex.header("x-trace") == "t1"
    assert sink.started_calls == 1
    assert "".join(sink.deltas) == "Hello!"


def test_extra_fields_cannot_replace_the_session_s() -> None:
    with pytest.raises(ValueError, match="messages"):
        OpenAIChat(extra={"messages": []})


async def test_environment_variables(monkeypatch: pytest.MonkeyPatch) -> None:
    async with open_loopback_server(openai_stream_reply("env")) as server:
        monkeypatch.setenv("OPENAI_BASE_URL", server.openai_base_url)
        monkeypatch.setenv("OPENAI_API_KEY", "sk-from-env")
        async with OpenAIChat(trust_env=False) as p:
            assert (await p.complete(REQUEST, Sink())).answer == "env"
        assert server.exchanges[0].header("authorization") == "Bearer sk-from-env"
        monkeypatch.delenv("OPENAI_API_KEY")
        async with OpenAIChat(trust_env=False) as p:
            await p.complete(REQUEST, Sink())
        assert server.exchanges[1].header("authorization") is None


# -- what real servers do --------------------------------------------------------------


async def test_keep_alive_comments_on_a_slow_generation() -> None:
    chunks = openai_sse_chunks("slow answer", chunk_size=5)
    body: list[Any] = []
    for c in chunks:
        body += [b": ping - 2024-01-01 00:00:00.000000+00:00\n\n", WritePause(0.01), c]
    async with open_loopback_server(Reply(body=tuple(body))) as server:
        assert (await complete(provider(server))).answer == "slow answer"


async def test_usage_is_optional_and_kept_when_sent() -> None:
    async with open_loopback_server(
        [openai_stream_reply("a"), openai_stream_reply("b", usage=(5, 1))]
    ) as server:
        assert (await complete(provider(server, include_usage=True))).usage is None
        assert (await complete(provider(server, include_usage=True))).usage == Usage(5, 1, 6)


# -- refusing before the body --------------------------------------------------------


async def test_a_server_that_never_answers_hits_the_read_timeout() -> None:
    async with open_loopback_server(Reply(hang_before_headers=True)) as server:
        exc = await failure(provider(server, timeout=httpx.Timeout(5.0, read=0.1)))
    assert (exc.reason, str(exc)) == ("timeout", "read timeout")


async def test_connection_refused_is_a_transport_failure() -> None:
    async with open_loopback_server() as server:
        url = server.openai_base_url
    p = OpenAIChat(base_url=url, trust_env=False)  # the server is gone
    exc = await failure(p)
    assert (exc.reason, str(exc)) == ("transport", "connect error")


async def test_one_byte_server_writes() -> None:
    reply = openai_stream_reply("你好，Java 🌱", chunk_size=2, write_size=1)
    async with open_loopback_server(reply) as server:
        for read_size in (1, 7, None):
            assert (await complete(provider(server, read_size=read_size))).answer == "你好，Java 🌱"


# -- cancellation --------------------------------------------------------------------------


async def test_cancelling_before_the_headers_closes_the_connection() -> None:
    async with open_loopback_server(Reply(hang_before_headers=True)) as server:
        with trio.move_on_after(0.2):
            await complete(provider(server))
        await server.exchanges[0].wait_ended()
        assert server.exchanges[0].client_disconnected


# -- non-streaming ----------------------------------------------------------------------------


async def test_non_streaming() -> None:
    async with open_loopback_server(openai_json_reply("Whole answer.")) as server:
        p = provider(server, stream=False)
        sink = Sink()
        c = await complete(p, sink)
        ex = server.exchanges[0]
    assert c == Completion("Whole answer.", "stop", Usage(1, 1, 2))
    assert ex.json()["stream"] is False and ex.header("accept") == "application/json"
    assert sink.started_calls == 1 and sink.deltas == ["Whole answer."]


async def test_non_streaming_refuses_an_event_stream() -> None:
    async with open_loopback_server(openai_stream_reply("x")) as server:
        exc = await failure(provider(server, stream=False))
    assert exc.reason == "protocol"


# -- retries -----------------------------------------------------------------------------------


async def test_no_retry_by_default() -> None:
    async with open_loopback_server([error_reply(503), openai_stream_reply("ok")]) as server:
        exc = await failure(provider(server))
        assert exc.reason == "http_status" and len(server.exchanges) == 1


async def test_a_bounded_retry_before_the_first_byte_is_logged_per_attempt() -> None:
    replies = [
        error_reply(503),
        error_reply(429, headers=[("Retry-After", "0")]),
        openai_stream_reply("third time"),
    ]
    async with open_loopback_server(replies) as server:
        p = provider(server, retry=RetryPolicy(attempts=3, base_delay=0.01))
        with capture_logs() as logs:
            assert (await complete(p)).answer == "third time"
        assert len(server.exchanges) == 3
    retries = [line for line in logs if line["event"] == "provider_retry"]
    assert [(r["attempt"], r["detail"]) for r in retries] == [(1, "HTTP 503"), (2, "HTTP 429")]
    assert retries[1]["delay"] == 0
    assert {line["request_id"] for line in logs} == {"r-1"}
    assert [line["attempt"] for line in logs if line["event"] == "provider_request"] == [1, 2, 3]


async def test_retries_are_bounded() -> None:
    async with open_loopback_server(error_reply(503)) as server:
        exc = await failure(provider(server, retry=RetryPolicy(attempts=2, base_delay=0)))
        assert exc.reason == "http_status" and len(server.exchanges) == 2


async def test_nothing_is_retried_once_the_stream_started() -> None:
    body = (*openai_sse_chunks("cut", finish_reason=None, done=False), Abort())
    async with open_loopback_server(Reply(body=body)) as server:
        exc = await failure(provider(server, retry=RetryPolicy(attempts=3, base_delay=0)))
        assert exc.reason == "transport" and len(server.exchanges) == 1


def mock_client(handler: Callable[[httpx.Request], httpx.Response]) -> httpx.AsyncClient:
    return httpx.AsyncClient(transport=httpx.MockTransport(handler))


async def test_retry_after_is_honoured(autojump_clock: trio.abc.Clock) -> None:
    calls: list[float] = []

    def handler(request: httpx.Request) -> httpx.Response:
        calls.append(trio.current_time())
        if len(calls) == 1:
            return httpx.Response(429, headers={"Retry-After": "7"}, text="slow down")
        body = b"".join(openai_sse_chunks("ok"))
        return httpx.Response(200, headers={"Content-Type": "text/event-stream"}, content=body)

    client = mock_client(handler)
    p = OpenAIChat(base_url="http://test/v1", client=client, retry=RetryPolicy(max_retry_after=10))
    assert (await p.complete(REQUEST, Sink())).answer == "ok"
    assert calls[1] - calls[0] == pytest.approx(7, abs=0.01)
    await client.aclose()


async def test_a_retry_after_beyond_the_cap_ends_the_retries(
    autojump_clock: trio.abc.Clock,
) -> None:
    def handler(request: httpx.Request) -> httpx.Response:
        return httpx.Response(503, headers={"Retry-After": "3600"})

    async with mock_client(handler) as client:
        p = OpenAIChat(base_url="http://test/v1", client=client, retry=RetryPolicy())
        start = trio.current_time()
        exc = await failure(p)
        assert exc.reason == "http_status" and trio.current_time() - start < 1


async def test_connect_errors_are_retried() -> None:
    async with open_loopback_server() as server:
        url = server.openai_base_url
    p = OpenAIChat(base_url=url, trust_env=False, retry=RetryPolicy(attempts=3, base_delay=0.01))
    with capture_logs() as logs:
        exc = await failure(p)
    assert exc.reason == "transport"
    assert [line["attempt"] for line in logs if line["event"] == "provider_retry"] == [1, 2]


@pytest.mark.parametrize(
    ("error", "reason", "detail"),
    [
        (httpx.ConnectTimeout("x"), "timeout", "connect timeout"),
        (httpx.ReadTimeout("x"), "timeout", "read timeout"),
        (httpx.WriteTimeout("x"), "timeout", "write timeout"),
        (httpx.PoolTimeout("x"), "timeout", "pool timeout"),
        (httpx.ConnectError("x"), "transport", "connect error"),
        (httpx.ReadError("x"), "transport", "read error"),
        (httpx.RemoteProtocolError("x"), "transport", "the server broke the HTTP exchange"),
        (httpx.DecodingError("x"), "malformed", "the response's content encoding is invalid"),
        (httpx.UnsupportedProtocol("x"), "transport", "unsupported URL scheme"),
    ],
)
async def test_httpx_errors_map_to_reasons(error: Exception, reason: str, detail: str) -> None:
    def handler(request: httpx.Request) -> httpx.Response:
        raise error

    async with mock_client(handler) as client:
        exc = await failure(OpenAIChat(base_url="http://test/v1", client=client))
    assert (exc.reason, str(exc)) == (reason, detail)
    assert exc.__cause__ is error


# -- secrets --------------------------------------------------------------------------------

SENTINEL = "sk-SENTINEL-do-not-leak-8f3a"


async def test_the_api_key_never_appears_in_logs_messages_or_reprs() -> None:
    replies = [
        error_reply(401, json.dumps({"error": f"bad key {SENTINEL}"})),
        Reply(media_type="text/html", body=(SENTINEL.encode(),)),
        Reply(body=(*openai_sse_chunks("x", done=False), Abort())),
        Reply(body=(b'data: {"error":{"message":"' + SENTINEL.encode() + b'"}}\n\n',)),
        Reply(body=(b"data: {\n\n",)),
        error_reply(503),
        error_reply(503),  # (retried once)
        openai_stream_reply("fine"),
    ]
    texts: list[str] = []
    async with open_loopback_server(replies) as server:
        p = provider(server, api_key=SENTINEL, retry=RetryPolicy(attempts=2, base_delay=0))
        with capture_logs() as logs:
            for _ in range(6):
                with pytest.raises(ProviderError) as info:
                    await p.complete(REQUEST, Sink())
                exc: BaseException | None = info.value
                while exc is not None:
                    texts += [str(exc), repr(exc)]
                    exc = exc.__cause__ or exc.__context__
            await p.complete(REQUEST, Sink())
        texts += [repr(p), str(p), repr(vars(p)), repr(p._transport.__dict__)]
        await p.aclose()
        assert server.exchanges[0].header("authorization") == f"Bearer {SENTINEL}"  # it was sent
    texts.append(repr(logs))
    assert logs
    for text in texts:
        assert SENTINEL not in text


# -- the client --------------------------------------------------------------------------------


async def test_aclose_closes_only_an_owned_client() -> None:
    owned = OpenAIChat(base_url="http://test/v1")
    await owned.aclose()
    assert owned._client.is_closed
    client = httpx.AsyncClient()
    async with OpenAIChat(base_url="http://test/v1", client=client):
        pass
    assert not client.is_closed
    await client.aclose()


# -- through the session core -------------------------------------------------------------------


async def test_a_turn_through_the_pure_core() -> None:
    before = seeded_state()
    reply = openai_stream_reply("Paris.", usage=(9, 2))
    async with open_loopback_server(reply) as server, provider(server, include_usage=True) as p:
        result = await run_turn(p, before, "Capital of France?", "q-1")
    assert outcome(result) == "commit"
    assert turns(result.after) == [*turns(before), ("Capital of France?", "Paris.")]
    assert result.events[-1].usage == Usage(9, 2, 11)  # type: ignore[union-attr]


async def test_structlog_is_never_configured_by_the_library() -> None:
    before = structlog.get_config()
    async with open_loopback_server(openai_stream_reply("x")) as server:
        await complete(provider(server))
    assert structlog.get_config() == before


def test_limits_default_and_seed() -> None:
    assert StreamLimits().max_json_depth == 16
    assert StreamLimits.seed().max_events == 256
    assert OpenAIChat(base_url="http://x/v1").limits == StreamLimits()
