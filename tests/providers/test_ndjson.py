"""Layer 2 for Ollama: text -> NDJSON lines."""

from __future__ import annotations

import random

import pytest
from hypothesis import given
from hypothesis import strategies as st

from turnledger import DecodeError, LimitExceeded
from turnledger.adapters.providers import NDJSONDecoder, StreamLimits

from ._helpers import every_split, random_splits


def lines(reads: list[bytes], limits: StreamLimits | None = None) -> tuple[list[str], str, bool]:
    d = NDJSONDecoder(limits)
    out: list[str] = []
    try:
        for r in reads:
            out.extend(d.decode(r))
        out.extend(d.flush())
    except (DecodeError, LimitExceeded) as exc:
        return out, type(exc).__name__, d.dropped
    return out, "", d.dropped


STREAM = '{"a":1}\n\n  \n{"b":"你好 🌱"}\r\n{"c":"\\n"}\n{"unterminated":'.encode()


def test_lines_at_every_split() -> None:
    expected = (['{"a":1}', '{"b":"你好 🌱"}\r', '{"c":"\\n"}'], "", True)
    for reads in every_split(STREAM):
        assert lines(reads) == expected


def test_a_bare_cr_is_not_a_line_end() -> None:
    assert lines([b'{"a":1}\r{"b":2}\n'])[0] == ['{"a":1}\r{"b":2}']


def test_a_terminated_stream_drops_nothing() -> None:
    assert lines([b'{"a":1}\n'])[2] is False


@pytest.mark.parametrize("stream", [b"0123456789A\n", b"0123456789AB", b"1\n2\n3\n", b"\xff\n"])
def test_limits_and_utf8_fail_the_same_way_at_every_split(stream: bytes) -> None:
    limits = StreamLimits(max_line_chars=10, max_events=2)
    results = {(tuple(r[0]), r[1]) for r in (lines(x, limits) for x in every_split(stream))}
    assert len(results) == 1
    assert results.pop()[1] in ("LimitExceeded", "DecodeError")


@given(st.binary(max_size=60), st.randoms(use_true_random=False))
def test_arbitrary_bytes(data: bytes, rnd: random.Random) -> None:
    limits = StreamLimits(max_line_chars=12, max_events=3)
    whole = lines([data], limits)
    assert whole[1] in ("", "DecodeError", "LimitExceeded")
    if len(data) > 1:
        for reads in random_splits(data, rnd, 3):
            assert lines(reads, limits)[:2] == whole[:2]


def test_check_raises_the_error_left_pending_after_the_lines_returned() -> None:
    d = NDJSONDecoder(StreamLimits(max_line_chars=10))
    d.check()  # nothing pending
    assert d.decode(b'{"a":1}\n' + b"x" * 11) == ['{"a":1}']
    with pytest.raises(LimitExceeded, match="an NDJSON line is longer than 10"):
        d.check()
