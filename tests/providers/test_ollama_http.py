"""OllamaChat over real HTTP, and the same session logic over both providers."""

from __future__ import annotations

import json
from typing import Any

import httpx
import pytest

from turnledger import ProviderError
from turnledger.adapters.providers import OllamaChat, OpenAIChat
from turnledger.events import RequestId, Usage
from turnledger.sessions import ChatMessage, ChatRequest, Completion, Provider
from turnledger.testing import (
    Abort,
    Exchange,
    Reply,
    Stall,
    chat_responder,
    error_reply,
    ollama_json_reply,
    ollama_ndjson_lines,
    ollama_stream_reply,
    open_loopback_server,
)

from ._helpers import Sink, outcome, run_turn, seeded_state, turns

pytestmark = pytest.mark.loopback

REQUEST = ChatRequest(RequestId("o-1"), "llama3.2", (ChatMessage("user", "Hi?"),))


def ollama(server: Any, **kw: Any) -> OllamaChat:
    kw.setdefault("timeout", httpx.Timeout(5.0))
    return OllamaChat(base_url=server.base_url, trust_env=False, **kw)


async def failure(p: OllamaChat) -> ProviderError:
    with pytest.raises(ProviderError) as info:
        async with p:
            await p.complete(REQUEST, Sink())
    return info.value


async def test_a_streamed_answer() -> None:
    async with open_loopback_server(ollama_stream_reply("你好，Java 🌱", chunk_size=3)) as server:
        sink = Sink()
        async with ollama(server, options={"temperature": 0}, keep_alive="1m", read_size=1) as p:
            c = await p.complete(REQUEST, sink)
        (ex,) = server.exchanges
    assert c == Completion("你好，Java 🌱", "stop", Usage(10, 3, 13))
    assert sink.deltas == ["你好，", "Jav", "a 🌱"]
    assert ex.path == "/api/chat" and ex.header("accept") == "application/x-ndjson"
    assert ex.body == p.encoder.encode(REQUEST.model, REQUEST.messages)
    assert json.loads(ex.body)["options"] == {"temperature": 0}
    assert json.loads(ex.body)["keep_alive"] == "1m"


async def test_non_streaming() -> None:
    async with open_loopback_server(ollama_json_reply("Whole.")) as server:
        sink = Sink()
        async with ollama(server, stream=False) as p:
            c = await p.complete(REQUEST, sink)
        assert server.exchanges[0].json()["stream"] is False
    assert c == Completion("Whole.", "stop", Usage(10, 5, 15))
    assert sink.deltas == ["Whole."]


async def test_ollama_host_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    async with open_loopback_server(ollama_stream_reply("env")) as server:
        monkeypatch.setenv("OLLAMA_HOST", f"127.0.0.1:{server.port}")  # no scheme, as Ollama has it
        async with OllamaChat(trust_env=False) as p:
            assert (await p.complete(REQUEST, Sink())).answer == "env"


@pytest.mark.parametrize(
    ("reply", "reason"),
    [
        (
            error_reply(404, '{"error":"model \'x\' not found, try pulling it first"}'),
            "http_status",
        ),
        (Reply(media_type="text/event-stream", body=(b"data: {}\n\n",)), "protocol"),
        (
            Reply(
                media_type="application/x-ndjson",
                body=(*ollama_ndjson_lines("a", done=False), b'{"error":"out of memory"}\n'),
            ),
            "provider_error",
        ),
        (
            Reply(
                media_type="application/x-ndjson", body=tuple(ollama_ndjson_lines("a", done=False))
            ),
            "incomplete_stream",
        ),
        (
            Reply(
                media_type="application/x-ndjson",
                body=(*ollama_ndjson_lines("a", done=False), Abort()),
            ),
            "transport",
        ),
        (Reply(media_type="application/x-ndjson", body=(b"{not json}\n",)), "malformed"),
    ],
    ids=["404", "wrong_media", "error_line", "no_done", "abort", "malformed"],
)
async def test_failures(reply: Reply, reason: str) -> None:
    async with open_loopback_server(reply) as server:
        exc = await failure(ollama(server))
    assert exc.reason == reason


async def test_an_idle_stream_times_out() -> None:
    reply = Reply(
        media_type="application/x-ndjson", body=(*ollama_ndjson_lines("a", done=False), Stall())
    )
    async with open_loopback_server(reply) as server:
        exc = await failure(ollama(server, timeout=httpx.Timeout(5.0, read=0.1)))
        await server.exchanges[0].wait_ended()
        assert server.exchanges[0].client_disconnected
    assert (exc.reason, str(exc)) == ("timeout", "read timeout")


async def test_done_reason_length_is_discarded_by_the_session() -> None:
    reply = ollama_stream_reply("Cut at the token limit", done_reason="length")
    async with open_loopback_server(reply) as server, ollama(server) as p:
        result = await run_turn(p, seeded_state(), "Q?", "q-len")
    assert outcome(result) == "incomplete_finish"
    assert result.after.turns == result.before.turns


# -- the same session logic over both providers ---------------------------------------

QUESTIONS = ["What is 2+2?", "And times 3?", "Say it in 中文 🌱"]


def _answer(messages: list[dict[str, Any]]) -> str:
    # Deterministic, and proof of what the server got: the turn number and
    # the question it answers.
    users = [m["content"] for m in messages if m["role"] == "user"]
    return f"Answer {len(users)} to «{users[-1]}»"


@pytest.mark.parametrize("stream", [True, False], ids=["stream", "whole"])
@pytest.mark.parametrize("which", ["openai", "ollama"])
async def test_a_three_turn_conversation_commits_the_same_way(which: str, stream: bool) -> None:
    async with open_loopback_server(chat_responder(_answer, chunk_size=3)) as server:
        p: Provider
        if which == "openai":
            p = OpenAIChat(base_url=server.openai_base_url, stream=stream, trust_env=False)
        else:
            p = OllamaChat(base_url=server.base_url, stream=stream, trust_env=False)
        state = seeded_state(history=())
        sizes = []
        for i, q in enumerate(QUESTIONS):
            result = await run_turn(p, state, q, f"{which}-{i}")
            assert outcome(result) == "commit"
            state = result.after
            sizes.append(result.request_bytes)
        await p.aclose()  # type: ignore[attr-defined]
        exchanges: list[Exchange] = server.exchanges
    assert turns(state) == [(q, f"Answer {i + 1} to «{q}»") for i, q in enumerate(QUESTIONS)]
    # what was measured is what went over the wire, and history went with it
    assert [len(e.body) for e in exchanges] == sizes
    assert [len(e.json()["messages"]) for e in exchanges] == [2, 4, 6]
