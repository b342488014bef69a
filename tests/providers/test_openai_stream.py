"""Layer 4 for OpenAI-compatible streams: chunks -> a plain-text turn
(pure: no sockets), and the composed bytes -> completion decoder."""

from __future__ import annotations

import json
import random
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from turnledger import DecodeError, LimitExceeded, ProviderError, StreamProtocolError
from turnledger.adapters.providers import (
    OpenAIChunkValidator,
    OpenAIResponseDecoder,
    OpenAIStreamDecoder,
    ServerSentEvent,
    StreamLimits,
    parse_openai_completion,
)
from turnledger.events import Usage
from turnledger.sessions import Completion

from ._helpers import decode_reads, every_split, random_splits
from .seed_cases import CASES, chunk, content, ev


def run(reads: list[bytes], limits: StreamLimits | None = None) -> tuple[str, Completion | str]:
    """(preview delivered, completion or the failure's reason)"""
    return decode_reads(OpenAIStreamDecoder, reads, limits)


def body(*events: Any, done: bool = True) -> bytes:
    out = b"".join(e if isinstance(e, bytes) else ev(e) for e in events)
    return out + (b"data: [DONE]\n\n" if done else b"")


def reason(*events: Any, done: bool = True, limits: StreamLimits | None = None) -> Completion | str:
    return run([body(*events, done=done)], limits)[1]


def test_a_plain_answer() -> None:
    c = reason(chunk({"role": "assistant"}), chunk({"content": "Hi"}), chunk({}, "stop"))
    assert c == Completion("Hi", "stop")


# -- what real servers do -------------------------------------------------------


def test_real_server_shapes_are_accepted() -> None:
    events = [
        # a first delta with only the role; explicit nulls; logprobs null
        {
            "id": "1",
            "choices": [
                {
                    "index": 0,
                    "delta": {"role": "assistant"},
                    "logprobs": None,
                    "finish_reason": None,
                }
            ],
        },
        {
            "id": "2",
            "choices": [
                {
                    "index": 0,
                    "delta": {"role": None, "content": "Hel"},
                    "logprobs": None,
                    "finish_reason": None,
                }
            ],
        },
        {"id": "3", "choices": [{"index": 0, "delta": {"content": None}, "finish_reason": None}]},
        {
            "id": "4",
            "choices": [
                {
                    "index": 0,
                    "delta": {"content": "lo", "refusal": None, "tool_calls": []},
                    "finish_reason": None,
                }
            ],
        },
        # Azure's prompt filter results: no choices
        {"id": "5", "choices": [], "prompt_filter_results": []},
        # an empty content delta just before the finish
        {"id": "6", "choices": [{"index": 0, "delta": {"content": ""}, "finish_reason": None}]},
        {"id": "7", "choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}], "usage": None},
        # a usage frame without choices, then one with an empty list
        {"id": "8", "usage": {"prompt_tokens": 3, "completion_tokens": 2, "total_tokens": 5}},
    ]
    assert reason(*events) == Completion("Hello", "stop", Usage(3, 2, 5))


def test_keep_alive_comments_are_ignored() -> None:
    stream = (
        b": ping - 2024-01-01T00:00:00.000000+00:00\n\n"
        + body(
            b": ping\n\n", chunk({"content": "Hi"}), b": ping\n\n", chunk({}, "stop"), b": ping\n\n"
        )
        + b": ping\n\n"
    )
    assert run([stream])[1] == Completion("Hi", "stop")


def test_usage_in_the_finish_chunk_and_no_usage_at_all() -> None:
    finish = chunk({}, "stop")
    finish["usage"] = {"prompt_tokens": 1, "completion_tokens": 1}
    assert reason(chunk({"content": "a"}), finish) == Completion("a", "stop", Usage(1, 1, 2))
    assert reason(chunk({"content": "a"}), chunk({}, "stop")) == Completion("a", "stop", None)


def test_done_without_finish_is_incomplete() -> None:
    # a stream cut short by the server (another request preempted it)
    assert reason(chunk({"content": "half an ans"})) == "incomplete_stream"


def test_an_empty_body_is_incomplete() -> None:
    assert run([b""])[1] == "incomplete_stream"
    assert run([])[1] == "incomplete_stream"


def test_finish_reasons_are_reported_for_the_session_to_judge() -> None:
    assert reason(chunk({"content": "a"}), chunk({}, "length")) == Completion("a", "length")
    assert reason(chunk({}, "stop")) == Completion("", "stop")  # the session: "empty"


FAILURES: dict[str, tuple[list[Any], str]] = {
    "tool_call": ([chunk({"tool_calls": [{"index": 0, "function": {"name": "f"}}]})], "protocol"),
    "function_call": ([chunk({"function_call": {"name": "f", "arguments": ""}})], "protocol"),
    "second_choice": (
        [{"choices": [{"index": 0, "delta": {"content": "a"}}, {"index": 1, "delta": {}}]}],
        "protocol",
    ),
    "index_1": ([{"choices": [{"index": 1, "delta": {"content": "a"}}]}], "protocol"),
    "user_role": ([chunk({"role": "user", "content": "a"})], "protocol"),
    "text_after_finish": ([chunk({}, "stop"), chunk({"content": "more"})], "protocol"),
    "finish_changes": ([chunk({}, "stop"), chunk({}, "length")], "protocol"),
    "error_object": ([{"error": {"message": "boom", "type": "server_error"}}], "provider_error"),
    "error_event_type": ([b"event: error\ndata: {}\n\n"], "provider_error"),
    "other_event_type": ([b"event: ping\ndata: {}\n\n"], "protocol"),
    "not_an_object": ([b"data: [1,2]\n\n"], "malformed"),
    "no_choices_no_usage": ([{"id": "x"}], "malformed"),
    "content_not_string": ([chunk({"content": 5})], "malformed"),
    "choices_not_list": ([{"choices": {"index": 0}}], "malformed"),
    "delta_not_object": ([{"choices": [{"index": 0, "delta": "a"}]}], "malformed"),
    "index_not_int": ([{"choices": [{"index": "0", "delta": {}}]}], "malformed"),
    "finish_not_string": (
        [{"choices": [{"index": 0, "delta": {}, "finish_reason": 1}]}],
        "malformed",
    ),
    "usage_not_int": ([{"choices": [], "usage": {"prompt_tokens": "3"}}], "malformed"),
    "usage_bool": ([{"choices": [], "usage": {"prompt_tokens": True}}], "malformed"),
    "not_json": ([b"data: {\n\n"], "malformed"),
}


@pytest.mark.parametrize("name", FAILURES)
def test_failures(name: str) -> None:
    events, expected = FAILURES[name]
    assert reason(*events, chunk({}, "stop")) == expected


def test_an_event_after_done_is_a_protocol_error() -> None:
    stream = body(chunk({"content": "a"}), chunk({}, "stop")) + ev(chunk({"content": ""}))
    assert run([stream])[1] == "protocol"
    assert run([body(chunk({}, "stop")) + b"data: [DONE]\n\n"])[1] == "protocol"


def test_error_details_quote_only_safe_tokens() -> None:
    d = OpenAIChunkValidator()
    with pytest.raises(ProviderError) as info:
        d.feed(
            ServerSentEvent(
                json.dumps(
                    {
                        "error": {
                            "message": "/srv/secret/path.py failed",
                            "type": "server_error",
                            "code": "bad code with spaces",
                        }
                    }
                )
            )
        )
    assert info.value.reason == "provider_error"
    assert str(info.value) == (
        "the server sent an error (type=server_error, code=unknown code (20 chars))"
    )


def test_limits() -> None:
    small = StreamLimits(
        max_output_chars=5,
        max_events=3,
        max_line_chars=100,
        max_event_chars=100,
        max_input_bytes=400,
    )
    assert reason(chunk({"content": "abc"}), chunk({"content": "def"}), limits=small) == "limit"
    assert reason(*[chunk({"content": ""})] * 3, limits=small) == "limit"
    assert reason(chunk({"content": "x" * 200}), limits=small) == "limit"
    big = b": " + b"p" * 500 + b"\n"
    assert run([big], small)[1] == "limit"


def test_the_input_limit_counts_bytes_exactly() -> None:
    stream = body(chunk({"content": "a"}), chunk({}, "stop"))
    exact = StreamLimits(max_input_bytes=len(stream))
    assert isinstance(run([stream], exact)[1], Completion)
    assert run([stream], StreamLimits(max_input_bytes=len(stream) - 1))[1] == "limit"


# -- every split point, identical results ------------------------------------------

SEED_BODIES = {
    c.name: b"".join(p for p in c.reply.body if isinstance(p, bytes))
    for c in CASES
    if c.reply.media_type == "text/event-stream"
}


@pytest.mark.parametrize("name", sorted(SEED_BODIES))
def test_seed_bodies_give_identical_results_at_every_split(name: str) -> None:
    data = SEED_BODIES[name]
    limits = StreamLimits.seed()
    whole = run([data], limits)
    reads = (
        every_split(data)
        if len(data) < 600
        else iter([[data[i : i + 1] for i in range(len(data))]])
    )
    for r in reads:
        assert run(r, limits) == whole
    for r in random_splits(data, random.Random(name), 10):
        assert run(r, limits) == whole


def test_preview_before_a_fault_is_delivered_whatever_the_split() -> None:
    data = body(
        chunk({"content": "ab"}),
        chunk({"content": "cd"}),
        chunk({}, "stop"),
        chunk({"content": "late"}),
    )
    for r in every_split(data):
        assert run(r) == ("abcd", "protocol")


# -- non-streamed responses ----------------------------------------------------------


def test_a_non_streamed_completion() -> None:
    text = json.dumps(
        {
            "id": "x",
            "object": "chat.completion",
            "choices": [
                {
                    "index": 0,
                    "message": {"role": "assistant", "content": "Hi"},
                    "finish_reason": "stop",
                    "logprobs": None,
                }
            ],
            "usage": {"prompt_tokens": 1, "completion_tokens": 2, "total_tokens": 3},
        }
    )
    assert parse_openai_completion(text) == Completion("Hi", "stop", Usage(1, 2, 3))
    d = OpenAIResponseDecoder()
    for r in every_split(text.encode()):
        d = OpenAIResponseDecoder()
        for piece in r:
            assert d.feed(piece) == []
        assert d.finish() == Completion("Hi", "stop", Usage(1, 2, 3))


@pytest.mark.parametrize(
    ("obj", "expected"),
    [
        ({"error": {"message": "x"}}, ProviderError),
        ({"choices": []}, StreamProtocolError),
        (
            {
                "choices": [
                    {
                        "index": 0,
                        "message": {
                            "role": "assistant",
                            "content": None,
                            "tool_calls": [{"id": "c"}],
                        },
                    }
                ]
            },
            StreamProtocolError,
        ),
        ({"choices": [{"index": 0}]}, DecodeError),
        ({"choices": [{"index": 0, "message": {"content": 3}}]}, DecodeError),
        ({"choices": [{"index": 0, "message": {"content": "x" * 10}}]}, LimitExceeded),
    ],
)
def test_non_streamed_failures(obj: Any, expected: type[Exception]) -> None:
    with pytest.raises(expected):
        parse_openai_completion(json.dumps(obj), StreamLimits(max_output_chars=5))


# -- fuzzing -----------------------------------------------------------------------

PIECES = st.sampled_from(
    [
        b"data: ",
        b"\n",
        b"\r\n",
        b"\n\n",
        b": ping\n",
        b"[DONE]",
        b"event: error\n",
        content("hi"),
        ev(chunk({}, "stop")),
        ev(chunk({"role": "assistant"})),
        b'{"choices":[',
        b'{"index":0,"delta":{"content":"x"}}',
        b"]}",
        b"\xe4\xbd",
        b"\xa0",
        b"\xff",
        b'"a":1,"a":2',
    ]
)


@given(st.lists(PIECES, max_size=12).map(b"".join), st.randoms(use_true_random=False))
def test_fuzzed_streams_end_typed_and_split_independent(data: bytes, rnd: random.Random) -> None:
    whole = run([data])
    if len(data) > 1:
        for r in random_splits(data, rnd, 3):
            assert run(r) == whole


@given(st.binary(max_size=120))
def test_arbitrary_bytes_end_typed(data: bytes) -> None:
    run([data])
    run([data[i : i + 1] for i in range(len(data))])
