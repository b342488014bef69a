"""Layer 2: text -> SSE events, by the WHATWG rules."""

from __future__ import annotations

import random

import pytest
from hypothesis import given
from hypothesis import strategies as st

import turnledger.sse
from turnledger import DecodeError, LimitExceeded
from turnledger.adapters.providers import NDJSONDecoder, ServerSentEvent, SSEDecoder, StreamLimits

from ._helpers import every_split, random_splits

E = ServerSentEvent


def reference(text: str) -> list[E]:
    """A literal, character-at-a-time reading of the HTML standard's
    "event stream interpretation", to compare the decoder with."""
    if text.startswith("\ufeff"):
        text = text[1:]
    lines: list[str] = []
    buf = ""
    i = 0
    while i < len(text):
        c = text[i]
        if c == "\r":
            lines.append(buf)
            buf = ""
            if i + 1 < len(text) and text[i + 1] == "\n":
                i += 1
        elif c == "\n":
            lines.append(buf)
            buf = ""
        else:
            buf += c
        i += 1
    # (buf: an unterminated last line, discarded at the end of the stream)
    events = []
    data, etype, last_id, retry = "", "", "", None
    for line in lines:
        if line == "":
            if data == "":
                etype, retry = "", None
                continue
            if data.endswith("\n"):
                data = data[:-1]
            events.append(E(data, etype or "message", last_id, retry))
            data, etype, retry = "", "", None
            continue
        if line.startswith(":"):
            continue
        if ":" in line:
            name, value = line.split(":", 1)
            if value.startswith(" "):
                value = value[1:]
        else:
            name, value = line, ""
        if name == "event":
            etype = value
        elif name == "data":
            data += value + "\n"
        elif name == "id":
            if "\0" not in value:
                last_id = value
        elif name == "retry" and value and all(ch in "0123456789" for ch in value):
            retry = int(value)
    return events


def decode(reads: list[bytes] | list[str], limits: StreamLimits | None = None) -> list[E]:
    d = SSEDecoder(limits)
    out = []
    for r in reads:
        out.extend(d.decode(r))
    out.extend(d.flush())
    return out


def result(reads: list[bytes], limits: StreamLimits | None = None) -> tuple[list[E], str]:
    d = SSEDecoder(limits)
    out: list[E] = []
    try:
        for r in reads:
            out.extend(d.decode(r))
        out.extend(d.flush())
    except (DecodeError, LimitExceeded) as exc:
        return out, type(exc).__name__
    return out, ""


STREAM = (
    "\ufeff: comment\n"
    "data: first\n\n"
    "event: update\r\nid: 7\r\ndata:no space\r\ndata:  two spaces\r\n\r\n"
    "data: cr\rdata: lines\r\r"
    "retry: 1500\ndata\n\n"
    "id: has\0nul\ndata: id kept\n\n"
    "retry: 12a\nretry: \ndata: x\n\n"
    "unknown: field\nevent\ndata: 你好 🌱\n\n"
    "data: empty data buffer below\n\n"
    "event: ignored\n\n"
    "data: unterminated at the end\n"
)
EXPECTED = [
    E("first"),
    E("no space\n two spaces", "update", "7"),
    E("cr\nlines", "message", "7"),
    E("", "message", "7", 1500),
    E("id kept", "message", "7"),
    E("x", "message", "7"),
    E("你好 🌱", "message", "7"),
    E("empty data buffer below", "message", "7"),
]


def test_the_rules() -> None:
    assert decode([STREAM.encode()]) == EXPECTED
    assert reference(STREAM) == EXPECTED


def test_every_split_point_of_bytes_gives_the_same_events() -> None:
    data = STREAM.encode()
    for reads in every_split(data):
        assert decode(reads) == EXPECTED


def test_random_splits_of_text_give_the_same_events() -> None:
    for reads in random_splits(STREAM.encode(), random.Random(3), 50):
        text_reads = [r.decode("utf-8", "ignore") for r in reads]
        # (only splits on character boundaries are valid text reads)
        if "".join(text_reads) == STREAM:
            assert decode(text_reads) == EXPECTED


def test_cr_at_the_end_of_one_read_and_lf_at_the_start_of_the_next_are_one_line_end() -> None:
    assert decode([b"data: a\r", b"\ndata: b\r", b"\n\r", b"\n"]) == [E("a\nb")]
    # ... but CR, CR is two line ends (a blank line: dispatch)
    assert decode([b"data: a\r", b"\r"]) == [E("a")]


def test_the_bom_is_stripped_once() -> None:
    assert decode([b"\xef\xbb\xbf\xef\xbb\xbfdata: x\n\n"]) == []  # 2nd BOM: unknown field
    assert decode([b"\xef\xbb", b"\xbfdata: x\n\n"]) == [E("x")]
    assert decode([b"data: \xef\xbb\xbfx\n\n"]) == [E("\ufeffx")]


def test_only_one_leading_space_is_removed() -> None:
    assert decode([b"data:   x  \n\n"]) == [E("  x  ")]


def test_an_unterminated_event_is_dropped_and_reported() -> None:
    d = SSEDecoder()
    assert d.decode(b"data: [DONE]\n") == []
    assert d.flush() == []
    assert d.dropped
    d = SSEDecoder()
    d.decode(b"data: [DONE]")
    assert d.flush() == [] and d.dropped


def test_last_event_id_and_retry_are_kept() -> None:
    d = SSEDecoder()
    d.decode("id: 1\nretry: 10\ndata: a\n\ndata: b\n\n")
    assert d.last_event_id == "1"
    assert d.retry == 10
    assert d.events_dispatched == 2


def test_a_huge_retry_value_is_ignored_not_an_error() -> None:
    assert decode(["retry: " + "9" * 5000 + "\ndata: x\n\n"]) == [E("x")]


def test_bytes_and_text_cannot_be_mixed() -> None:
    d = SSEDecoder()
    d.decode(b"data: x")
    with pytest.raises(TypeError):
        d.decode("\n\n")


def test_invalid_utf8_is_a_decode_error_after_the_events_before_it() -> None:
    d = SSEDecoder()
    assert d.decode(b"data: a\n\ndata: \xff\n\n") == [E("a")]
    with pytest.raises(DecodeError):
        d.decode(b"")
    with pytest.raises(DecodeError):
        decode([b"data: \xe4\xbd"])  # cut inside a character at the end


LIMITS = StreamLimits(max_line_chars=10, max_event_chars=12, max_events=2)


@pytest.mark.parametrize(
    "stream",
    [
        b"data: 12345\n",  # a line of 11
        b": a long comment\n",
        b"data: 123456",  # an unterminated line already too long
        b"data: 1234\ndata: 1234\ndata: 1234\n\n",  # event data 14 > 12
        b"data: 1\n\ndata: 2\n\ndata: 3\n\n",  # a third event
    ],
)
def test_limits_fail_closed_at_every_split(stream: bytes) -> None:
    results = {(tuple(ev), err) for ev, err in (result(r, LIMITS) for r in every_split(stream))}
    assert len(results) == 1
    assert results.pop()[1] == "LimitExceeded"


def test_events_before_a_limit_are_delivered_first() -> None:
    events, err = result([b"data: 1\n\ndata: 12345678901\n"], LIMITS)
    assert events == [E("1")] and err == "LimitExceeded"


def test_one_event_per_read_takes_the_fast_path_with_the_same_result() -> None:
    reads = [
        "\ufeffdata: first\n\n",
        "data: two\n\n",
        "event: x\n",
        "data: typed\n\n",
        "data: three\n\n",
        "data: a\r",
        "\ndata: b\n\n",
        "data: 12345678\n\n",
        "data: four\n\n",
    ]
    expected = reference("".join(reads))
    assert decode(reads) == expected
    assert decode([r.encode() for r in reads]) == expected
    # limits hold on the fast path too
    limits = StreamLimits(max_line_chars=13, max_events=100)
    events, err = result([r.encode() for r in reads], limits)
    assert err == "LimitExceeded" and len(events) == 5
    events, err = result([b"data: x\n\n"] * 3, StreamLimits(max_events=2))
    assert err == "LimitExceeded" and len(events) == 2


def test_after_an_error_the_fast_path_raises_too() -> None:
    d = SSEDecoder(StreamLimits(max_line_chars=8))
    with pytest.raises(LimitExceeded):
        d.decode(b"data: too long\n")
    with pytest.raises(LimitExceeded):
        d.decode(b"data: x\n\n")


def test_public_module() -> None:
    assert turnledger.sse.SSEDecoder is SSEDecoder
    assert turnledger.sse.ServerSentEvent is ServerSentEvent


# A small alphabet makes the fuzzer hit the interesting characters often.
SSE_TEXT = st.lists(
    st.sampled_from(
        ["\n", "\r", ":", " ", "data", "event", "id", "retry", "\0", "1", "x", "\ufeff", "é", "🌱"]
    ),
    max_size=40,
).map("".join)


@given(SSE_TEXT, st.randoms(use_true_random=False))
def test_matches_the_reference_at_any_split(text: str, rnd: random.Random) -> None:
    data = text.encode()
    expected = reference(text)
    assert decode([data]) == expected
    if len(data) > 1:
        for reads in random_splits(data, rnd, 3):
            assert decode(reads) == expected
    assert decode([data[i : i + 1] for i in range(len(data))]) == expected


@given(st.binary(max_size=80), st.randoms(use_true_random=False))
def test_arbitrary_bytes_raise_only_typed_errors_the_same_way_at_any_split(
    data: bytes, rnd: random.Random
) -> None:
    small = StreamLimits(max_line_chars=16, max_event_chars=20, max_events=3)
    whole = result([data], small)
    assert whole[1] in ("", "DecodeError", "LimitExceeded")
    if len(data) > 1:
        for reads in random_splits(data, rnd, 3):
            assert result(reads, small) == whole


def test_check_raises_the_error_left_pending_after_the_events_returned() -> None:
    d = SSEDecoder(StreamLimits(max_line_chars=10))
    d.check()  # nothing pending
    events = d.decode("data: a\n\n" + "x" * 11 + "\n")
    assert events == [E("a")]
    with pytest.raises(LimitExceeded, match="an SSE line is longer than 10"):
        d.check()
    with pytest.raises(LimitExceeded):
        d.decode("data: b\n\n")


def test_a_cr_then_an_lf_in_the_next_read_is_one_line_end_for_sse_only() -> None:
    sse = SSEDecoder()
    assert sse.decode("data: a\r") == []
    assert sse.decode("\n") == []  # the CR's LF, not a blank line
    assert sse.decode("\r\n") == [E("a")]
    nd = NDJSONDecoder()
    assert nd.decode_text('{"a":1}\r') == []  # a CR alone ends no NDJSON line
    assert nd.decode_text("\n") == ['{"a":1}\r']
