"""Layer 4 for Ollama's /api/chat: NDJSON lines -> a plain-text turn."""

from __future__ import annotations

import json
import random
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from turnledger.adapters.providers import (
    OllamaResponseDecoder,
    OllamaStreamDecoder,
    StreamLimits,
)
from turnledger.events import Usage
from turnledger.sessions import Completion
from turnledger.testing import ollama_ndjson_lines

from ._helpers import decode_reads, every_split, random_splits


def run(reads: list[bytes], limits: StreamLimits | None = None) -> tuple[str, Completion | str]:
    """(preview delivered, completion or the failure's reason)"""
    return decode_reads(OllamaStreamDecoder, reads, limits)


def line(obj: Any) -> bytes:
    return (json.dumps(obj, ensure_ascii=False) + "\n").encode()


def msg(content: str | None, **extra: Any) -> dict[str, Any]:
    m: dict[str, Any] = {"role": "assistant"}
    if content is not None:
        m["content"] = content
    return {
        "model": "m",
        "created_at": "2024-01-01T00:00:00Z",
        "message": m,
        "done": False,
        **extra,
    }


def done(reason: str | None = "stop", **extra: Any) -> dict[str, Any]:
    d: dict[str, Any] = {
        "model": "m",
        "created_at": "2024-01-01T00:00:00Z",
        "message": {"role": "assistant", "content": ""},
        "done": True,
        "prompt_eval_count": 7,
        "eval_count": 3,
        **extra,
    }
    if reason is not None:
        d["done_reason"] = reason
    return d


def test_a_streamed_answer_at_every_split() -> None:
    data = b"".join(ollama_ndjson_lines("你好，Java 🌱", chunk_size=2))
    for reads in every_split(data):
        preview, completion = run(reads)
        assert preview == "你好，Java 🌱"
        assert completion == Completion("你好，Java 🌱", "stop", Usage(10, 5, 15))


def test_done_reason_is_the_finish_reason() -> None:
    assert run([line(msg("a")) + line(done("length"))])[1] == Completion(
        "a", "length", Usage(7, 3, 10)
    )
    assert run([line(msg("a")) + line(done(None))])[1] == Completion("a", None, Usage(7, 3, 10))


def test_thinking_is_not_the_answer() -> None:
    assert run([line(msg("a", thinking="hmm")) + line(done())])[1].answer == "a"  # type: ignore[union-attr]


FAILURES = {
    "no_done_line": ([msg("a")], "incomplete_stream"),
    "error_line": ([msg("a"), {"error": "model crashed at /srv/x"}], "provider_error"),
    "after_done": ([msg("a"), done(), msg("b")], "protocol"),
    "tool_calls": (
        [
            {
                "message": {"role": "assistant", "content": "", "tool_calls": [{"function": {}}]},
                "done": False,
            },
            done(),
        ],
        "protocol",
    ),
    "user_role": ([{"message": {"role": "user", "content": "a"}, "done": False}], "protocol"),
    "no_done_field": ([{"message": {"role": "assistant", "content": "a"}}], "malformed"),
    "done_not_bool": ([{"message": {"content": "a"}, "done": "true"}], "malformed"),
    "content_not_str": ([{"message": {"content": 1}, "done": False}], "malformed"),
    "usage_not_int": ([msg("a"), done(prompt_eval_count="7")], "malformed"),
}


@pytest.mark.parametrize("name", FAILURES)
def test_failures(name: str) -> None:
    objs, expected = FAILURES[name]
    assert run([b"".join(line(o) for o in objs)])[1] == expected


def test_an_unterminated_done_line_is_incomplete() -> None:
    data = line(msg("a")) + line(done()).rstrip(b"\n")
    assert run([data])[1] == "incomplete_stream"


def test_not_json_and_duplicates_are_malformed() -> None:
    assert run([b'{"done":false,"done":true}\n'])[1] == "malformed"
    assert run([b"{nope}\n"])[1] == "malformed"
    assert run([b"\xff\n"])[1] == "malformed"


def test_limits() -> None:
    small = StreamLimits(max_output_chars=3)
    assert run([line(msg("abcd")) + line(done())], small)[1] == "limit"
    assert run([line(msg("a")) * 3 + line(done())], StreamLimits(max_events=3))[1] == "limit"


def test_a_non_streamed_response() -> None:
    body = json.dumps(done() | {"message": {"role": "assistant", "content": "Hello"}}).encode()
    for reads in every_split(body):
        d = OllamaResponseDecoder()
        for r in reads:
            d.feed(r)
        assert d.finish() == Completion("Hello", "stop", Usage(7, 3, 10))


@given(st.binary(max_size=100), st.randoms(use_true_random=False))
def test_arbitrary_bytes_end_typed_and_split_independent(data: bytes, rnd: random.Random) -> None:
    whole = run([data])
    if len(data) > 1:
        for r in random_splits(data, rnd, 3):
            assert run(r) == whole
