"""Layer 4 for the typed-event protocols (Anthropic Messages, OpenAI
Responses): events -> a turn, pure, at every byte boundary; what each
protocol's endings and out-of-order events become."""

from __future__ import annotations

import json
import random
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from structlog.testing import capture_logs

from turnledger import ProviderError
from turnledger.adapters.providers import (
    AnthropicChat,
    AnthropicEventValidator,
    AnthropicStreamDecoder,
    ResponsesEventValidator,
    ResponsesStreamDecoder,
    ServerSentEvent,
    StreamLimits,
)
from turnledger.events import RequestId, ToolCall, Usage
from turnledger.sessions import ChatMessage, ChatRequest, Completion
from turnledger.testing import (
    anthropic_error_event,
    anthropic_sse_events,
    anthropic_stream_reply,
    open_loopback_server,
    responses_error_event,
    responses_sse_events,
    sse_event,
)

from ._helpers import Sink, decode_reads, every_split, random_splits, splits

CALLS = (ToolCall("call_a", "clock", "{}"), ToolCall("call_b", "calc", '{"expr":"6*7"}'))
TEXT = '你好，Java 🌱 and "quotes" \\ too'


def anthropic(*events: bytes) -> Completion | str:
    return decode_reads(AnthropicStreamDecoder, [b"".join(events)])[1]


def responses(*events: bytes) -> Completion | str:
    return decode_reads(ResponsesStreamDecoder, [b"".join(events)])[1]


def typed(kind: str, **data: Any) -> bytes:
    return sse_event({"type": kind, **data}, event=kind)


# -- whole answers at every split ---------------------------------------------------


@pytest.mark.parametrize(
    ("decoder", "events", "finish"),
    [
        (AnthropicStreamDecoder, anthropic_sse_events(TEXT, chunk_size=3), "stop"),
        (
            AnthropicStreamDecoder,
            anthropic_sse_events(
                TEXT, stop_reason="tool_use", calls=CALLS, thinking="mm", chunk_size=9
            ),
            "tool_calls",
        ),
        (ResponsesStreamDecoder, responses_sse_events(TEXT, chunk_size=5), "stop"),
        (
            ResponsesStreamDecoder,
            responses_sse_events(TEXT, calls=CALLS, chunk_size=16),
            "tool_calls",
        ),
        (ResponsesStreamDecoder, responses_sse_events(TEXT, named=False, chunk_size=16), "stop"),
    ],
    ids=["anthropic", "anthropic_tools", "responses", "responses_tools", "responses_unnamed"],
)
def test_an_answer_split_at_every_byte_boundary(
    decoder: Any, events: list[bytes], finish: str
) -> None:
    data = b"".join(events)
    calls = CALLS if finish == "tool_calls" else ()
    # Every two-way split of the plain answers; the longer tool streams are
    # read whole, a byte at a time, 7 at a time and at random cuts.
    cuts = (
        every_split(data)
        if not calls
        else [[data], splits(data, 1), splits(data, 7), *random_splits(data, random.Random(1))]
    )
    for reads in cuts:
        preview, completion = decode_reads(decoder, reads)
        assert completion == Completion(TEXT, finish, Usage(10, 2, 12), calls)
        assert preview == TEXT


def test_stop_reasons_in_the_session_s_words() -> None:
    for sent, reported in [
        ("end_turn", "stop"),
        ("stop_sequence", "stop"),
        ("max_tokens", "max_tokens"),
        ("refusal", "refusal"),
        ("pause_turn", "pause_turn"),
        ("a-reason-from-the-future", "unknown_24_chars"),
    ]:
        c = anthropic(*anthropic_sse_events("Hi", stop_reason=sent))
        assert isinstance(c, Completion) and c.finish_reason == reported, sent


def test_cached_prompt_tokens_count_as_prompt() -> None:
    usage = {"input_tokens": 3, "cache_creation_input_tokens": 100, "cache_read_input_tokens": 7}
    start = {"role": "assistant", "content": [], "usage": {**usage, "output_tokens": 1}}
    c = anthropic(
        typed("message_start", message=start),
        typed("message_delta", delta={"stop_reason": "end_turn"}, usage={"output_tokens": 4}),
        typed("message_stop"),
    )
    assert c == Completion("", "stop", Usage(110, 4, 114))


def test_responses_incomplete_and_refusal_are_reported_for_the_session_to_judge() -> None:
    c = responses(*responses_sse_events("cut", incomplete="max_output_tokens"))
    assert isinstance(c, Completion) and c.finish_reason == "max_output_tokens"
    events = responses_sse_events("")
    refusal = sse_event(
        {
            "type": "response.refusal.delta",
            "output_index": 0,
            "item_id": "m",
            "content_index": 0,
            "delta": "I can't",
        }
    )
    item = {"type": "message", "id": "m", "role": "assistant", "content": []}
    added = sse_event({"type": "response.output_item.added", "output_index": 0, "item": item})
    done = sse_event({"type": "response.output_item.done", "output_index": 0, "item": item})
    c = responses(events[0], added, refusal, done, events[-1])
    assert c == Completion("", "refusal", Usage(10, 2, 12))


# -- endings and order that must not commit -------------------------------------------

A = anthropic_sse_events("Hello there", chunk_size=5)  # start, ping, block x4, delta, stop
START, PING, BLOCK_START, DELTA1, DELTA2, DELTA3, BLOCK_STOP, MESSAGE_DELTA, STOP = A
TEXT_DELTA = typed("content_block_delta", index=0, delta={"type": "text_delta", "text": "x"})

ANTHROPIC_FAILURES: dict[str, tuple[list[bytes], str]] = {
    "no_message_stop": (A[:-1], "incomplete_stream"),
    "empty_body": ([], "incomplete_stream"),
    "stop_without_stop_reason": ([*A[:-2], STOP], "incomplete_stream"),
    "error_event": ([*A[:4], anthropic_error_event()], "provider_error"),
    "error_first": ([anthropic_error_event("api_error")], "provider_error"),
    "delta_before_message_start": ([BLOCK_START, TEXT_DELTA], "protocol"),
    "second_message_start": ([START, START], "protocol"),
    "delta_for_a_block_never_started": ([START, TEXT_DELTA], "protocol"),
    "delta_after_block_stop": ([*A[:7], TEXT_DELTA], "protocol"),
    "block_skips_an_index": (
        [START, typed("content_block_start", index=1, content_block={"type": "text", "text": ""})],
        "protocol",
    ),
    "unknown_block_type": (
        [START, typed("content_block_start", index=0, content_block={"type": "server_tool_use"})],
        "protocol",
    ),
    "json_delta_in_a_text_block": (
        [
            START,
            BLOCK_START,
            typed(
                "content_block_delta",
                index=0,
                delta={"type": "input_json_delta", "partial_json": "{}"},
            ),
        ],
        "protocol",
    ),
    "text_after_message_delta": ([*A[:8], BLOCK_START], "protocol"),
    "event_after_message_stop": ([*A, PING], "protocol"),
    "stop_inside_a_block": ([*A[:4], STOP], "protocol"),
    "user_role": (
        [typed("message_start", message={"role": "user", "content": []})],
        "protocol",
    ),
    "name_differs_from_type": ([sse_event({"type": "ping"}, event="message_stop")], "protocol"),
    "bad_tool_input": (
        anthropic_sse_events("", stop_reason="tool_use", calls=(ToolCall("c", "f", '{"a":'),)),
        "protocol",
    ),
    "no_type": ([sse_event({"message": {}}, event="message_start")], "malformed"),
    "duplicate_key": ([b'event: ping\ndata: {"type":"ping","type":"ping"}\n\n'], "malformed"),
    "text_not_a_string": (
        [
            START,
            BLOCK_START,
            typed("content_block_delta", index=0, delta={"type": "text_delta", "text": 5}),
        ],
        "malformed",
    ),
}

R = responses_sse_events("Hello there", chunk_size=5)
R_CREATED, R_ADDED, R_PART, R_D1, R_D2, R_D3, R_DONE, R_PART_DONE, R_ITEM_DONE, R_COMPLETED = R


def _completed(text: str) -> bytes:
    part = {"type": "output_text", "text": text, "annotations": []}
    item = {"type": "message", "id": "msg_loopback", "role": "assistant", "content": [part]}
    response = {"status": "completed", "output": [item]}
    return typed("response.completed", response=response)


RESPONSES_FAILURES: dict[str, tuple[list[bytes], str]] = {
    "no_completed": (R[:-1], "incomplete_stream"),
    "empty_body": ([], "incomplete_stream"),
    "failed": (
        [R_CREATED, typed("response.failed", response={"error": {"code": "server_error"}})],
        "provider_error",
    ),
    "error_event": ([*R[:4], responses_error_event()], "provider_error"),
    "delta_before_created": ([R_ADDED], "protocol"),
    "second_created": ([R_CREATED, R_CREATED], "protocol"),
    "delta_for_an_item_never_added": ([R_CREATED, R_D1], "protocol"),
    "delta_after_item_done": ([*R[:9], R_D1], "protocol"),
    "text_done_differs": (
        [*R[:6], R_D3.replace(b"ere", b"ERE"), *R[6:]],
        "protocol",
    ),
    "completed_text_differs": ([*R[:-1], _completed("Hello THERE")], "protocol"),
    "completed_text_missing": ([*R[:-1], _completed("")], "protocol"),
    "event_after_completed": ([*R, R_D1], "protocol"),
    "item_out_of_order": (
        [R_CREATED, R_ADDED.replace(b'"output_index":0', b'"output_index":1')],
        "protocol",
    ),
    "no_output_list": (
        [R_CREATED, typed("response.completed", response={"status": "completed"})],
        "malformed",
    ),
    "not_json": ([R_CREATED, b"data: {nope\n\n"], "malformed"),
}


@pytest.mark.parametrize("name", ANTHROPIC_FAILURES)
def test_anthropic_failures(name: str) -> None:
    events, expected = ANTHROPIC_FAILURES[name]
    assert anthropic(*events) == expected


@pytest.mark.parametrize("name", RESPONSES_FAILURES)
def test_responses_failures(name: str) -> None:
    events, expected = RESPONSES_FAILURES[name]
    assert responses(*events) == expected


def test_a_long_answer_commits_though_the_closing_events_repeat_it_whole() -> None:
    # The Responses API repeats the answer in four closing events, each on
    # one line: far longer than the per-line limit of the chat protocols.
    text = "你好 🌱 \u0001 " * 3000
    events = responses_sse_events(text, chunk_size=50)
    assert max(map(len, events)) > 6 * StreamLimits().max_line_chars
    c = responses(*events)
    assert isinstance(c, Completion) and c.answer == text
    # and the answer's own limit still holds
    limits = StreamLimits(max_output_chars=len(text) - 1)
    assert decode_reads(ResponsesStreamDecoder, [b"".join(events)], limits)[1] == "limit"


def test_unknown_event_types_are_skipped() -> None:
    # Both vendors add event types; only the known ones can carry text.
    extra = typed("content_block_future", index=0, text="not the answer")
    c = anthropic(*A[:3], extra, *A[3:])
    assert isinstance(c, Completion) and c.answer == "Hello there"
    note = typed("response.reasoning_summary_text.delta", output_index=0, delta="thinking")
    c = responses(R_CREATED, note, *R[1:])
    assert isinstance(c, Completion) and c.answer == "Hello there"


@pytest.mark.loopback
async def test_thinking_is_logged_as_metadata_never_answer_text() -> None:
    request = ChatRequest(RequestId("t"), "claude-x", (ChatMessage("user", "Q?"),))
    reply = anthropic_stream_reply("Answer.", thinking="Let me think it over.")
    async with (
        open_loopback_server(reply) as server,
        AnthropicChat(base_url=server.base_url, trust_env=False) as provider,
    ):
        sink = Sink()
        with capture_logs() as logs:
            completion = await provider.complete(request, sink)
    assert completion.answer == "".join(sink.deltas) == "Answer."
    (ended,) = [line for line in logs if line["event"] == "provider_response_ended"]
    assert ended["thinking_chars"] == len("Let me think it over.")
    assert "Let me think" not in repr(logs)


def test_limits() -> None:
    limits = StreamLimits(max_output_chars=10)
    for decoder, events in [
        (AnthropicStreamDecoder, anthropic_sse_events("x" * 11)),
        (AnthropicStreamDecoder, anthropic_sse_events("ok", thinking="y" * 11)),
        (ResponsesStreamDecoder, responses_sse_events("x" * 11)),
        (
            ResponsesStreamDecoder,
            responses_sse_events("", calls=(ToolCall("c", "f", '{"a":"' + "z" * 9 + '"}'),)),
        ),
    ]:
        assert decode_reads(decoder, [b"".join(events)], limits)[1] == "limit"


def test_error_details_quote_only_known_tokens() -> None:
    key = "sk-ant-" + "S" * 44

    def message(validator: Any, *events: ServerSentEvent) -> str:
        with pytest.raises(ProviderError) as info:
            for event in events:
                validator.feed(event)
        return str(info.value)

    start = json.dumps({"type": "message_start", "message": {"role": key, "content": []}})
    assert message(AnthropicEventValidator(), ServerSentEvent(start)) == (
        "a message with role unknown role (51 chars)"
    )
    error = json.dumps({"type": "error", "error": {"type": key, "message": key}})
    assert message(AnthropicEventValidator(), ServerSentEvent(error, "error")) == (
        "the server sent an error (type=unknown code (51 chars))"
    )
    ok = json.dumps({"type": "message_start", "message": {"role": "assistant", "content": []}})
    block = json.dumps({"type": "content_block_start", "index": 0, "content_block": {"type": key}})
    assert message(AnthropicEventValidator(), ServerSentEvent(ok), ServerSentEvent(block)) == (
        "a content block of type unknown block type (51 chars)"
    )
    error = json.dumps({"type": "error", "code": key, "message": key})
    assert message(ResponsesEventValidator(), ServerSentEvent(error)) == (
        "the server sent an error (code=unknown code (51 chars))"
    )


@settings(max_examples=60)
@given(data=st.binary(max_size=400), rnd=st.randoms(use_true_random=False))
def test_arbitrary_bytes_end_typed_and_split_independent(data: bytes, rnd: random.Random) -> None:
    for decoder in (AnthropicStreamDecoder, ResponsesStreamDecoder):
        whole = decode_reads(decoder, [data])
        if len(data) > 1:
            for reads in random_splits(data, rnd, n=3):
                assert decode_reads(decoder, reads) == whole
