"""Tool calls from both protocols: assembled from pieces, parsed strictly,
sent back with the tools; over real HTTP (the loopback server)."""

from __future__ import annotations

import json
from typing import Any

import httpx
import pytest

from turnledger.adapters.providers import (
    OllamaChat,
    OllamaResponseDecoder,
    OllamaStreamDecoder,
    OpenAIChat,
    OpenAIResponseDecoder,
    OpenAIStreamDecoder,
)
from turnledger.events import RequestId, ToolCall, ToolSpec
from turnledger.sessions import ChatMessage, ChatRequest, Completion
from turnledger.testing import (
    Reply,
    ollama_tool_call_lines,
    open_loopback_server,
    openai_tool_call_chunks,
    sse_event,
    tool_call_reply,
)

from ._helpers import Sink, decode_reads, every_split

CALLS = (
    ToolCall("call_a", "clock", "{}"),
    ToolCall("call_b", "calc", '{"expr":"6*7","note":"é 你好 \\"q\\""}'),
)
TOOLS = (
    ToolSpec("clock", "the time"),
    ToolSpec("calc", "arithmetic", '{"type":"object","properties":{"expr":{"type":"string"}}}'),
)


def test_openai_tool_call_deltas_split_at_every_byte_boundary() -> None:
    data = b"".join(openai_tool_call_chunks(CALLS, text="Let me check.", chunk_size=2))
    for reads in every_split(data):
        preview, completion = decode_reads(OpenAIStreamDecoder, reads)
        assert completion == Completion("Let me check.", "tool_calls", None, CALLS)
        assert preview == "Let me check."


def test_arguments_are_kept_compact_whatever_spacing_the_server_used() -> None:
    spaced = (ToolCall("c", "calc", '{ "expr" : "1 + 1" ,\n "n": [1, 2] }'),)
    data = b"".join(openai_tool_call_chunks(spaced, chunk_size=1))
    _, completion = decode_reads(OpenAIStreamDecoder, [data])
    assert isinstance(completion, Completion)
    assert completion.tool_calls == (ToolCall("c", "calc", '{"expr":"1 + 1","n":[1,2]}'),)


@pytest.mark.parametrize(
    "arguments",
    ["[1]", '"text"', '{"a":1', '{"a":NaN}', '{"a":1,"a":2}', "", "{}{}", '{"a":1} x'],
)
def test_arguments_that_are_not_one_strict_json_object_are_protocol(arguments: str) -> None:
    data = b"".join(openai_tool_call_chunks((ToolCall("c", "calc", arguments),)))
    _, outcome = decode_reads(OpenAIStreamDecoder, [data])
    assert outcome == "protocol"


def _chunk(delta: dict[str, Any], finish: str | None = None) -> bytes:
    return sse_event({"choices": [{"index": 0, "delta": delta, "finish_reason": finish}]})


def _first(index: int, call_id: str | None, name: str | None) -> dict[str, Any]:
    piece: dict[str, Any] = {"index": index, "function": {"arguments": "{}"}}
    if call_id is not None:
        piece["id"] = call_id
    if name is not None:
        piece["function"]["name"] = name
    return piece


@pytest.mark.parametrize(
    "pieces",
    [
        [_first(1, "c", "calc")],  # skips index 0
        [_first(0, None, "calc")],  # no id
        [_first(0, "c", None)],  # no name
        [_first(0, "c", "calc"), {"index": 0, "id": "other"}],  # id changes
        [_first(0, "c", "calc"), {"index": 0, "function": {"name": "clock"}}],
        [{"index": 0, "id": "c", "type": "code", "function": {"name": "x", "arguments": ""}}],
    ],
)
def test_malformed_tool_call_pieces_are_refused(pieces: list[dict[str, Any]]) -> None:
    data = b"".join(
        [
            *(_chunk({"tool_calls": [p]}) for p in pieces),
            _chunk({}, "tool_calls"),
            b"data: [DONE]\n\n",
        ]
    )
    _, outcome = decode_reads(OpenAIStreamDecoder, [data])
    assert outcome in ("protocol", "malformed")


def test_a_legacy_function_call_and_a_call_after_the_finish_are_protocol() -> None:
    legacy = _chunk({"function_call": {"name": "calc", "arguments": "{}"}})
    _, outcome = decode_reads(OpenAIStreamDecoder, [legacy])
    assert outcome == "protocol"
    late = b"".join(
        [
            _chunk({"content": "x"}, "stop"),
            _chunk({"tool_calls": [_first(0, "c", "calc")]}),
            b"data: [DONE]\n\n",
        ]
    )
    _, outcome = decode_reads(OpenAIStreamDecoder, [late])
    assert outcome == "protocol"


def test_non_streamed_openai_tool_calls() -> None:
    reply = tool_call_reply(CALLS, stream=False)
    _, completion = decode_reads(OpenAIResponseDecoder, [b"".join(reply.body)])  # type: ignore[arg-type]
    assert completion == Completion("", "tool_calls", None, CALLS)


def test_ollama_tool_calls_streamed_and_not() -> None:
    data = b"".join(ollama_tool_call_lines(CALLS))
    expected = tuple(ToolCall(f"call_{i}", c.name, c.arguments) for i, c in enumerate(CALLS))
    for reads in every_split(data):
        _, completion = decode_reads(OllamaStreamDecoder, reads)
        assert completion == Completion("", "stop", None, expected)
    reply = tool_call_reply(CALLS, protocol="ollama", stream=False)
    _, completion = decode_reads(OllamaResponseDecoder, [b"".join(reply.body)])  # type: ignore[arg-type]
    assert completion == Completion("", "stop", None, expected)


@pytest.mark.parametrize(
    "call",
    [
        {"function": {"name": "calc", "arguments": [1]}},
        {"function": {"name": "", "arguments": {}}},
        {"function": "calc"},
    ],
)
def test_bad_ollama_tool_calls_are_refused(call: dict[str, Any]) -> None:
    line = json.dumps({"message": {"role": "assistant", "tool_calls": [call]}, "done": True})
    _, outcome = decode_reads(OllamaStreamDecoder, [line.encode() + b"\n"])
    assert outcome in ("protocol", "malformed")


ROUND = (
    ChatMessage("user", "what time is it, and 6*7?"),
    ChatMessage("assistant", "", CALLS),
    ChatMessage("tool", "12:00", tool_call_id="call_a", name="clock"),
    ChatMessage("tool", "42", tool_call_id="call_b", name="calc"),
)
REQUEST = ChatRequest(RequestId("r"), "m", ROUND, TOOLS, "required", 1)


async def over_http(protocol: str, stream: bool) -> tuple[Completion, Any, bytes]:
    """One request with tools, answered with CALLS over real HTTP read byte
    by byte: (the completion, the JSON body sent, the body the encoder makes)."""
    reply: Reply = tool_call_reply(CALLS, protocol=protocol, stream=stream)
    cls: Any = OpenAIChat if protocol == "openai" else OllamaChat
    async with open_loopback_server(reply) as server:
        url = server.openai_base_url if protocol == "openai" else server.base_url
        kw = {"stream": stream, "read_size": 1, "timeout": httpx.Timeout(5.0)}
        async with cls(base_url=url, trust_env=False, **kw) as p:
            completion = await p.complete(REQUEST, Sink())
        (ex,) = server.exchanges
    assert ex.body == p.encoder.encode("m", ROUND, TOOLS, "required")
    return completion, json.loads(ex.body), ex.body


@pytest.mark.loopback
@pytest.mark.parametrize("stream", [True, False])
async def test_openai_over_http_sends_tools_and_reads_calls_byte_by_byte(stream: bool) -> None:
    completion, body, _ = await over_http("openai", stream)
    assert completion.tool_calls == CALLS
    assert body["tool_choice"] == "required"
    assert [t["function"]["name"] for t in body["tools"]] == ["clock", "calc"]
    assert body["messages"][1]["tool_calls"][1]["function"]["arguments"] == CALLS[1].arguments
    assert body["messages"][3] == {"role": "tool", "content": "42", "tool_call_id": "call_b"}


@pytest.mark.loopback
@pytest.mark.parametrize("stream", [True, False])
async def test_ollama_over_http_sends_tools_and_reads_calls(stream: bool) -> None:
    completion, body, _ = await over_http("ollama", stream)
    assert [(c.name, c.arguments) for c in completion.tool_calls] == [
        (c.name, c.arguments) for c in CALLS
    ]
    assert "tool_choice" not in body and len(body["tools"]) == 2
    assert body["messages"][1]["tool_calls"][1] == {
        "function": {"name": "calc", "arguments": json.loads(CALLS[1].arguments)}
    }
    assert body["messages"][3] == {"role": "tool", "content": "42", "tool_name": "calc"}
