"""OllamaChat over real HTTP (its failures are in the shared contract table)."""

from __future__ import annotations

import json
from typing import Any

import httpx
import pytest

from turnledger.adapters.providers import OllamaChat
from turnledger.events import RequestId, Usage
from turnledger.sessions import ChatMessage, ChatRequest, Completion
from turnledger.testing import (
    ollama_json_reply,
    ollama_stream_reply,
    open_loopback_server,
)

from ._helpers import Sink, outcome, run_turn, seeded_state

pytestmark = pytest.mark.loopback

REQUEST = ChatRequest(RequestId("o-1"), "llama3.2", (ChatMessage("user", "Hi?"),))


def ollama(server: Any, **kw: Any) -> OllamaChat:
    kw.setdefault("timeout", httpx.Timeout(5.0))
    return OllamaChat(base_url=server.base_url, trust_env=False, **kw)


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


async def test_done_reason_length_is_discarded_by_the_session() -> None:
    reply = ollama_stream_reply("Cut at the token limit", done_reason="length")
    async with open_loopback_server(reply) as server, ollama(server) as p:
        result = await run_turn(p, seeded_state(), "Q?", "q-len")
    assert outcome(result) == "incomplete_finish"
    assert result.after.turns == result.before.turns
