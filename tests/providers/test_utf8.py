"""Layer 1: bytes -> text. Strict, incremental UTF-8."""

from __future__ import annotations

import random

import pytest
from hypothesis import given
from hypothesis import strategies as st

from turnledger import DecodeError
from turnledger.adapters.providers import Utf8Decoder

from ._helpers import every_split, random_splits

TEXT = "你好，Java 🌱 — ünïcödé, ASCII, 𝄞 and \u0800\uffff\U0010ffff"


def decode_all(reads: list[bytes]) -> str:
    d = Utf8Decoder()
    out = "".join(d.decode(r) for r in reads)
    return out + d.flush()


def outcome(reads: list[bytes]) -> tuple[str, str]:
    """(text delivered before any error, error type or "")"""
    d = Utf8Decoder()
    out = []
    try:
        for r in reads:
            out.append(d.decode(r))
        d.flush()
    except DecodeError:
        return "".join(out), "DecodeError"
    return "".join(out), ""


def test_every_split_point_gives_the_same_text() -> None:
    data = TEXT.encode()
    for reads in every_split(data):
        assert decode_all(reads) == TEXT


def test_random_splits_give_the_same_text() -> None:
    data = (TEXT * 5).encode()
    for reads in random_splits(data, random.Random(2)):
        assert decode_all(reads) == TEXT * 5


def test_a_character_cut_across_reads_is_held_back() -> None:
    d = Utf8Decoder()
    assert d.decode(b"a\xe4\xbd") == "a"
    assert d.bytes_pending == 2
    assert d.decode(b"\xa0b") == "你b"
    assert d.bytes_pending == 0


INVALID = {
    "overlong_2byte_nul": b"\xc0\x80",
    "overlong_slash": b"\xc0\xaf",
    "overlong_3byte": b"\xe0\x80\xaf",
    "overlong_4byte": b"\xf0\x80\x80\xaf",
    "lone_continuation": b"\x80",
    "continuation_run": b"\xbf\xbf",
    "encoded_high_surrogate": b"\xed\xa0\x80",
    "encoded_low_surrogate": b"\xed\xbf\xbf",
    "above_u10ffff": b"\xf4\x90\x80\x80",
    "f5_lead": b"\xf5\x80\x80\x80",
    "five_byte_form": b"\xf8\x88\x80\x80\x80",
    "ff": b"\xff",
    "fe": b"\xfe",
    "lead_then_ascii": b"\xe4a",
    "truncated_at_eof_2": b"\xe4\xbd",
    "truncated_at_eof_1": b"\xf0",
    "truncated_emoji": "🌱".encode()[:3],
}


@pytest.mark.parametrize("bad", INVALID.values(), ids=INVALID.keys())
def test_invalid_utf8_is_an_error_at_every_split(bad: bytes) -> None:
    data = b"ok " + bad
    results = {outcome(reads) for reads in every_split(data)}
    assert results == {("ok ", "DecodeError")}


@pytest.mark.parametrize("bad", INVALID.values(), ids=INVALID.keys())
def test_invalid_utf8_never_becomes_a_replacement_character(bad: bytes) -> None:
    with pytest.raises(DecodeError):
        decode_all([b"x", bad, b"y"] if not bad.startswith(b"\xe4\xbd") else [b"x", bad])


def test_the_error_names_the_byte_offset_and_not_the_content() -> None:
    d = Utf8Decoder()
    d.decode(b"hello ")
    assert d.decode(b"w\xff secret") == "w"  # valid text first
    with pytest.raises(DecodeError, match="byte 7") as info:
        d.decode(b"more")
    assert "secret" not in str(info.value)
    assert info.value.reason == "malformed"
    with pytest.raises(DecodeError):  # fails fast afterwards
        d.flush()


def test_a_bom_is_text_at_this_layer() -> None:
    assert decode_all([b"\xef\xbb", b"\xbfx"]) == "\ufeffx"


@given(st.binary(max_size=64), st.randoms(use_true_random=False))
def test_arbitrary_bytes_decode_like_python_or_raise_decode_error(
    data: bytes, rnd: random.Random
) -> None:
    try:
        expected: tuple[str, str] = (data.decode("utf-8"), "")
    except UnicodeDecodeError as exc:
        expected = (data[: exc.start].decode("utf-8"), "DecodeError")
    reads = [data] if len(data) < 2 else next(random_splits(data, rnd, 1))
    assert outcome(reads) == expected
    assert outcome([data[i : i + 1] for i in range(len(data))]) == expected


@given(st.text(max_size=40), st.randoms(use_true_random=False))
def test_any_text_survives_any_split(text: str, rnd: random.Random) -> None:
    data = text.encode()
    reads = [data] if len(data) < 2 else next(random_splits(data, rnd, 1))
    assert decode_all(reads) == text
