"""The Anthropic and Responses request bodies: what the projection measures
is the body byte for byte, whatever the messages; and each body is the
document its API expects."""

from __future__ import annotations

import json
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from turnledger.adapters.providers import AnthropicEncoder, ResponsesEncoder
from turnledger.events import RequestId, ToolCall, ToolSpec
from turnledger.sessions import Budget, ChatMessage, History, Turn, build_messages, plan
from turnledger.sessions._projection import naive_plan

awkward = st.text(
    alphabet=st.one_of(
        st.sampled_from('你好“”"\\\n\r\t\x00\x1f\u2028 🌱é'),
        st.characters(exclude_categories=("Cs",)),
    ),
    max_size=30,
)
calls = st.lists(
    st.builds(
        ToolCall,
        awkward.filter(bool),
        st.from_regex(r"[a-z_]{1,10}", fullmatch=True),
        st.sampled_from(["{}", '{"a":1}', '{"q":"你好 \\"x\\""}']),
    ),
    min_size=1,
    max_size=3,
)
message = st.one_of(
    st.builds(ChatMessage, st.sampled_from(["user", "assistant"]), awkward),
    st.builds(ChatMessage, st.just("assistant"), awkward, calls),
    st.builds(lambda c, i: ChatMessage("tool", c, tool_call_id=i, name="f"), awkward, awkward),
)
ENCODERS = [
    AnthropicEncoder(),
    AnthropicEncoder(cache=True),
    AnthropicEncoder(max_tokens=9, extra={"temperature": 0.5, "stop_sequences": ["\n"]}),
    ResponsesEncoder(),
    ResponsesEncoder(extra={"max_output_tokens": 64}),
]
TOOLS = (ToolSpec("clock", "the time"), ToolSpec("calc", ""))


@settings(max_examples=150)
@given(
    model=awkward,
    system=st.one_of(st.none(), awkward),
    msgs=st.lists(message, min_size=1, max_size=6),
    which=st.integers(0, len(ENCODERS) - 1),
    tools=st.booleans(),
)
def test_the_measured_size_is_the_body_byte_for_byte(
    model: str, system: str | None, msgs: list[ChatMessage], which: int, tools: bool
) -> None:
    enc = ENCODERS[which]
    if system is not None:
        msgs = [ChatMessage("system", system), *msgs]
    specs = TOOLS if tools else ()
    body = enc.encode(model, msgs, specs, "required")
    measured = enc.frame_size(model, len(msgs)) + sum(map(enc.message_size, msgs))
    assert measured + enc.tools_size(specs, "required") == len(body)
    doc = json.loads(body)
    assert doc["model"] == model and doc["stream"] is True
    if isinstance(enc, AnthropicEncoder):
        _check_anthropic(enc, doc, msgs)
    else:
        assert doc["store"] is False and "previous_response_id" not in doc
        items = [i for m in msgs for i in _responses_items(m)]
        assert doc["input"] == items


def _text(content: Any) -> str:
    return content if isinstance(content, str) else "".join(b["text"] for b in content)


def _check_anthropic(enc: AnthropicEncoder, doc: dict[str, Any], msgs: list[ChatMessage]) -> None:
    rest = msgs
    if msgs[0].role == "system":
        assert _text(doc["system"]) == msgs[0].content
        rest = msgs[1:]
    else:
        assert "system" not in doc
    assert len(doc["messages"]) == len(rest)
    for sent, m in zip(doc["messages"], rest, strict=True):
        if m.role == "tool":
            assert sent["role"] == "user"
            assert sent["content"][0]["tool_use_id"] == m.tool_call_id
            assert sent["content"][0]["content"] == m.content
        elif m.tool_calls:
            uses = [b for b in sent["content"] if b["type"] == "tool_use"]
            assert [(b["id"], b["name"], b["input"]) for b in uses] == [
                (c.call_id, c.name, json.loads(c.arguments)) for c in m.tool_calls
            ]
        else:
            assert _text(sent["content"]) == m.content
    if enc.cache:
        last = doc["messages"][-1]["content"][-1]
        assert last["cache_control"] == {"type": "ephemeral"}
        marks = json.dumps(doc).count('"cache_control"')
        assert marks == (2 if "system" in doc else 1)  # Anthropic allows 4


def _responses_items(m: ChatMessage) -> list[dict[str, Any]]:
    if m.role == "tool":
        return [{"type": "function_call_output", "call_id": m.tool_call_id, "output": m.content}]
    plain = [{"role": m.role, "content": m.content}]
    if not m.tool_calls:
        return plain
    return (plain if m.content else []) + [
        {"type": "function_call", "call_id": c.call_id, "name": c.name, "arguments": c.arguments}
        for c in m.tool_calls
    ]


@settings(max_examples=80)
@given(
    system=awkward,
    pairs=st.lists(st.tuples(awkward, awkward), max_size=8),
    question=awkward,
    budget=st.one_of(st.none(), st.integers(0, 1200)),
    which=st.integers(0, len(ENCODERS) - 1),
)
def test_the_projection_chooses_what_the_naive_loop_chooses(
    system: str, pairs: list[tuple[str, str]], question: str, budget: int | None, which: int
) -> None:
    turns = History([Turn(RequestId(f"r{i}"), q, a) for i, (q, a) in enumerate(pairs)])
    b = Budget(budget, ENCODERS[which])
    fast = plan("claude-x", system, turns, 0, question, b)
    assert fast == naive_plan("claude-x", system, turns, 0, question, b)
    if fast.fits:
        sent = build_messages(system, turns, fast.turns_sent, question)
        assert len(b.encoder.encode("claude-x", sent)) == fast.request_bytes


def test_bad_requests_are_refused() -> None:
    with pytest.raises(ValueError, match="system"):
        AnthropicEncoder().encode("m", [ChatMessage("system", "s")])
    with pytest.raises(ValueError, match="first"):
        AnthropicEncoder().encode("m", [ChatMessage("user", "q"), ChatMessage("system", "s")])
    with pytest.raises(ValueError, match="tool_choice"):
        AnthropicEncoder().encode("m", [ChatMessage("user", "q")], TOOLS, "calc")
    for owned in ("messages", "max_tokens", "system"):
        with pytest.raises(ValueError, match=owned):
            AnthropicEncoder(extra={owned: 1})
    for owned in ("input", "store", "previous_response_id"):
        with pytest.raises(ValueError, match=owned):
            ResponsesEncoder(extra={owned: 1})


def test_tools_in_each_api_s_words() -> None:
    q = [ChatMessage("user", "q")]
    doc = json.loads(AnthropicEncoder().encode("m", q, TOOLS, "required"))
    assert doc["tools"][0] == {
        "name": "clock",
        "description": "the time",
        "input_schema": {"type": "object", "properties": {}},
    }
    assert "description" not in doc["tools"][1] and doc["tool_choice"] == {"type": "any"}
    doc = json.loads(ResponsesEncoder().encode("m", q, TOOLS, "auto"))
    assert doc["tools"][0] == {
        "type": "function",
        "name": "clock",
        "description": "the time",
        "parameters": {"type": "object", "properties": {}},
        "strict": False,
    }
    assert doc["tool_choice"] == "auto"
