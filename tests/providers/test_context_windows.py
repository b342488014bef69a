"""Context windows over real HTTP: discovery from each kind of server, the
fallback when it cannot tell, overflow recognised, usage asked for and read,
and long conversations that keep committing."""

from __future__ import annotations

import json
from typing import Any

import httpx
import pytest
from structlog.testing import capture_logs

from turnledger import ProviderError
from turnledger.adapters.providers import PROVIDER_KINDS, AnthropicChat, OpenAIChat
from turnledger.adapters.stores import MemoryStore
from turnledger.events import (
    DEFAULT_CODEC,
    RequestId,
    SessionStarted,
    TurnCommitted,
    TurnDiscarded,
    TurnRetried,
    TurnSubmitted,
)
from turnledger.sessions import (
    ChatMessage,
    ChatRequest,
    CommittedResult,
    ModelInfo,
    open_hub,
)
from turnledger.testing import Exchange, Reply, ServerKind, model_server, open_loopback_server

from ._helpers import Sink

pytestmark = pytest.mark.loopback

KEY = "sk-window-test-0123456789"
REQUEST = ChatRequest(RequestId("w-1"), "loopback", (ChatMessage("user", "Hi?"),))


def provider_for(kind: ServerKind, server: Any, **kw: Any) -> Any:
    kw.setdefault("timeout", httpx.Timeout(5.0))
    if kind in ("ollama", "anthropic", "openai-responses"):
        k = PROVIDER_KINDS[kind]
        return k.provider_class()(base_url=server.base_url + k.loopback_path, trust_env=False, **kw)
    return OpenAIChat(base_url=server.openai_base_url, trust_env=False, **kw)


@pytest.mark.parametrize(
    ("kind", "window"),
    [("vllm", 4096), ("llamacpp", 2048), ("ollama", 3000), ("openai", None), ("silent", None)],
)
async def test_each_server_tells_its_window_or_none(kind: ServerKind, window: int | None) -> None:
    async with (
        open_loopback_server(model_server(kind, n_ctx=window or 1000)) as server,
        provider_for(kind, server) as p,
    ):
        info = await p.describe("loopback")
        again = await p.describe("loopback")
    assert again is info  # asked once per model
    if window is None:
        assert info.context_window is None and info.source == "fallback"
        assert info.detail
    else:
        assert info == ModelInfo(window, "discovered", True, None)
    assert len(server.probes) <= 3 and not server.exchanges


async def test_lm_studio_model_list() -> None:
    def respond(ex: Exchange) -> Reply:
        if ex.path == "/api/v0/models/qwen":
            body = {"id": "qwen", "max_context_length": 32768}
            return Reply(media_type="application/json", body=(json.dumps(body),))
        return Reply(status=404, media_type="application/json", body=(b"{}",), framing="length")

    async with open_loopback_server(respond) as server, provider_for("openai", server) as p:
        info = await p.describe("qwen")
    assert (info.context_window, info.source) == (32768, "discovered")
    assert [e.path for e in server.probes] == ["/v1/models", "/props", "/api/v0/models/qwen"]


async def test_a_given_window_asks_nothing() -> None:
    async with (
        open_loopback_server(model_server("vllm", n_ctx=4096)) as server,
        provider_for("vllm", server, max_tokens=300) as p,
    ):
        info = await p.describe("loopback", context_window=1000)
    assert info == ModelInfo(1000, "user", True, 300)
    assert server.probes == []


@pytest.mark.parametrize(
    ("kind", "props", "why"),
    [
        ("llamacpp", {"n_ctx": 0}, "implausible window (0)"),
        ("llamacpp", {"n_ctx": 10**12}, "implausible window (1000000000000)"),
        ("llamacpp", {"n_ctx": "4096"}, "not an integer"),
        ("llamacpp", b"{garbage", "does not report"),
        ("vllm", {"data": [{"id": "loopback", "max_model_len": 0}]}, "implausible window (0)"),
        ("ollama", b"\xff\xfe", "not JSON"),
        ("ollama", {"model_info": {"llama.context_length": 10**12}}, "implausible"),
    ],
)
async def test_garbage_windows_fall_back(kind: ServerKind, props: Any, why: str) -> None:
    async with (
        open_loopback_server(model_server(kind, n_ctx=1, props=props)) as server,
        provider_for(kind, server, api_key=KEY) as p,
    ):
        info = await p.describe("loopback")
    assert info.context_window is None and info.source == "fallback"
    assert why in info.detail and KEY not in info.detail
    # the key went with the probes, as with chat requests
    assert all(e.header("authorization") == f"Bearer {KEY}" for e in server.probes)


@pytest.mark.parametrize(
    ("kind", "body"),
    [
        ("openai", b'{"error":{"code":"context_length_exceeded","message":"SECRET-BODY"}}'),
        ("llamacpp", b'{"error":{"message":"SECRET-BODY exceeds the available context size"}}'),
        ("ollama", b'{"error":"SECRET-BODY: the input length exceeds the context length"}'),
        (
            "anthropic",
            b'{"type":"error","error":{"type":"invalid_request_error",'
            b'"message":"SECRET-BODY prompt is too long: 250000 tokens > 200000 maximum"}}',
        ),
        (
            "openai-responses",
            b'{"error":{"code":"context_length_exceeded","message":"SECRET-BODY"}}',
        ),
    ],
)
async def test_an_overflow_error_is_its_own_reason(kind: ServerKind, body: bytes) -> None:
    reply = Reply(status=400, media_type="application/json", body=(body,), framing="length")
    async with open_loopback_server(reply) as server, provider_for(kind, server) as p:
        with pytest.raises(ProviderError) as info:
            await p.complete(REQUEST, Sink())
    assert info.value.reason == "context_overflow"
    assert "SECRET-BODY" not in str(info.value) and "SECRET-BODY" not in repr(info.value)


async def test_another_400_stays_http_status() -> None:
    reply = Reply(status=400, media_type="application/json", body=(b"{}",), framing="length")
    async with open_loopback_server(reply) as server, provider_for("openai", server) as p:
        with pytest.raises(ProviderError) as info:
            await p.complete(REQUEST, Sink())
    assert info.value.reason == "http_status"


async def test_usage_is_asked_for_and_read() -> None:
    async with (
        open_loopback_server(model_server("vllm", n_ctx=4096)) as server,
        provider_for("vllm", server) as p,
    ):
        c = await p.complete(REQUEST, Sink())
    (ex,) = server.exchanges
    assert json.loads(ex.body)["stream_options"] == {"include_usage": True}
    assert c.usage is not None and c.usage.prompt_tokens == -(-len(ex.body) // 3)


async def test_ollama_sends_the_window_as_num_ctx_and_measures_it() -> None:
    async with (
        open_loopback_server(model_server("ollama", n_ctx=3000)) as server,
        provider_for("ollama", server, options={"temperature": 0}) as p,
    ):
        plain = p.encoder.encode("loopback", REQUEST.messages)
        await p.describe("loopback")
        body = p.encoder.encode("loopback", REQUEST.messages)
        size = p.encoder.frame_size("loopback", 1) + p.encoder.message_size(REQUEST.messages[0])
        await p.complete(REQUEST, Sink())
    assert "num_ctx" not in json.loads(plain)["options"]
    assert json.loads(body)["options"] == {"temperature": 0, "num_ctx": 3000}
    assert size == len(body) and server.exchanges[0].body == body


async def test_ollama_num_ctx_given_is_the_window() -> None:
    async with (
        open_loopback_server(model_server("ollama", n_ctx=3000)) as server,
        provider_for("ollama", server, options={"num_ctx": 1024}) as p,
    ):
        info = await p.describe("loopback")
    assert (info.context_window, info.source) == (1024, "user")
    assert server.probes == []


# --- through the hub -----------------------------------------------------------

QUESTION = "Please keep this in mind for later: " + "lorem ipsum dolor sit amet " * 30


async def _conversation(kind: ServerKind, n_ctx: int, turns: int, **hub: Any) -> list[Any]:
    store = MemoryStore()
    async with (
        open_loopback_server(model_server(kind, n_ctx=n_ctx)) as server,
        provider_for(kind, server) as p,
        open_hub(store, p, model="loopback", **hub) as h,
    ):
        for i in range(turns):
            result = await (await h.submit("s", f"{i}: {QUESTION}")).outcome()
            assert isinstance(result, CommittedResult), (i, result)
    return await store.read_decoded("s", DEFAULT_CODEC)


@pytest.mark.parametrize("kind", ["vllm", "llamacpp", "ollama"])
async def test_a_discovered_window_keeps_a_long_conversation_committing(kind: ServerKind) -> None:
    events = await _conversation(kind, 2048, 12)
    started = events[0]
    assert isinstance(started, SessionStarted)
    assert (started.context_window, started.window_source) == (2048, "discovered")
    committed = [e for e in events if isinstance(e, TurnCommitted)]
    assert len(committed) == 12
    assert not [e for e in events if isinstance(e, (TurnDiscarded, TurnRetried))]
    sent = [e for e in events if isinstance(e, TurnSubmitted)]
    assert sent[-1].turns_dropped > 0  # old turns went, whole


@pytest.mark.parametrize("kind", ["openai", "silent", "anthropic", "openai-responses"])
async def test_a_server_that_cannot_tell_overflows_at_most_once(kind: ServerKind) -> None:
    # The fallback (8,192) is far above the server's 1,024 tokens.
    with capture_logs() as logs:
        events = await _conversation(kind, 1024, 12)
    started = events[0]
    assert isinstance(started, SessionStarted)
    assert (started.context_window, started.window_source) == (8192, "fallback")
    assert [line for line in logs if line["event"] == "context_window_fallback"]
    overflows = [
        e
        for e in events
        if isinstance(e, (TurnRetried, TurnDiscarded)) and e.reason == "context_overflow"
    ]
    # the first overflow is retried before anything reached the caller; none follows
    assert len(overflows) == 1 and isinstance(overflows[0], TurnRetried)
    assert len([e for e in events if isinstance(e, TurnCommitted)]) == 12


@pytest.mark.parametrize("trouble", ["hang", "404", "garbage", "zero", "huge"])
async def test_discovery_trouble_never_fails_a_turn(trouble: str) -> None:
    answer = model_server("openai", n_ctx=100_000)

    def respond(ex: Exchange) -> Reply:
        if ex.path != "/props":
            return answer(ex)
        if trouble == "hang":
            return Reply(hang_before_headers=True)
        if trouble == "404":
            return Reply(status=404, media_type="text/plain", body=(b"no",), framing="length")
        body = {"garbage": b"[1, 2", "zero": b'{"n_ctx": 0}', "huge": b'{"n_ctx": 1e12}'}[trouble]
        return Reply(media_type="application/json", body=(body,), framing="length")

    store = MemoryStore()
    with capture_logs() as logs:
        async with (
            open_loopback_server(respond) as server,
            provider_for("openai", server) as p,
            open_hub(store, p, model="gpt-4o-mini") as hub,
        ):
            result = await (await hub.submit("s", "hello?")).outcome()
    assert isinstance(result, CommittedResult)
    started = (await store.read_decoded("s", DEFAULT_CODEC))[0]
    assert isinstance(started, SessionStarted)
    # the fallback table knows the family
    assert (started.context_window, started.window_source) == (128_000, "fallback")
    (warning,) = [line for line in logs if line["event"] == "context_window_fallback"]
    assert warning["log_level"] == "warning" and warning["model"] == "gpt-4o-mini"
    (chosen,) = [line for line in logs if line["event"] == "context_window"]
    assert chosen["window_source"] == "fallback" and "gpt-4o" in chosen["detail"]


async def test_a_chat_only_responder_survives_probes() -> None:
    answer = model_server("openai", n_ctx=1000)

    def respond(ex: Exchange) -> Reply:
        ex.json()  # written for chat requests: a GET has no JSON body, and this raises
        return answer(ex)

    async with open_loopback_server(respond) as server, provider_for("openai", server) as p:
        info = await p.describe("loopback")
        c = await p.complete(REQUEST, Sink())
    assert info.context_window is None and info.source == "fallback"
    assert [e.status for e in server.probes] == [404, 404, 404]
    assert c.answer == "Noted." and len(server.exchanges) == 1


async def test_anthropic_windows_come_from_the_table_of_known_models() -> None:
    # The API does not report a window: nothing is asked, a Claude model gets
    # its published window, and the answer's usage is read.
    store = MemoryStore()
    async with (
        open_loopback_server(model_server("anthropic", n_ctx=300_000)) as server,
        AnthropicChat(base_url=server.base_url, max_tokens=1000, trust_env=False) as p,
        open_hub(store, p, model="claude-sonnet-4-5") as h,
    ):
        info = await p.describe("claude-sonnet-4-5")
        result = await (await h.submit("s", QUESTION)).outcome()
    assert info == ModelInfo(
        None, "fallback", True, 1000, "the Anthropic API does not report context windows"
    )
    assert not server.probes
    assert isinstance(result, CommittedResult)
    started = (await store.read_decoded("s", DEFAULT_CODEC))[0]
    assert isinstance(started, SessionStarted)
    assert (started.context_window, started.window_source) == (200_000, "fallback")
    assert started.output_reserve == 1000
    (ex,) = server.exchanges
    assert result.usage is not None and result.usage.prompt_tokens == -(-len(ex.body) // 3)
