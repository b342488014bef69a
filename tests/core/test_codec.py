"""The event codec: stable tags, strict decoding, upcasting."""

from __future__ import annotations

import json
from types import UnionType
from typing import Any, Union, get_args, get_origin, get_type_hints

import attrs
import pytest
from hypothesis import given as hgiven
from hypothesis import settings
from hypothesis import strategies as st

from turnledger import CodecError, UnknownEventTag
from turnledger.events import (
    DEFAULT_CODEC,
    SCHEMA_VERSIONS,
    WIRE_TAGS,
    EventCodec,
    Ledger,
    PayloadNotJSON,
    RequestId,
    SessionStarted,
    StoredEvent,
    StreamStarted,
    ToolCallsRequested,
    ToolSpec,
    TurnDiscarded,
    TurnSubmitted,
    Window,
)
from turnledger.events._envelope import envelope
from turnledger.events._structurers import structurer, structurers, unstructurer
from turnledger.events.codec import UPCASTERS
from turnledger.testing import sample_events


def test_wire_tags_are_an_explicit_frozen_table() -> None:
    # Renaming a class must never change what is on disk: the table is the contract.
    assert {cls.__name__: tag for cls, tag in WIRE_TAGS.items()} == {
        "SessionStarted": "session_started",
        "TurnSubmitted": "turn_submitted",
        "TurnRejected": "turn_rejected",
        "StreamStarted": "stream_started",
        "TurnCommitted": "turn_committed",
        "TurnDiscarded": "turn_discarded",
        "CompletionIgnored": "completion_ignored",
        "ToolCallsRequested": "tool_calls_requested",
        "ToolResultRecorded": "tool_result_recorded",
        "ToolRoundSubmitted": "tool_round_submitted",
        "TurnRetried": "turn_retried",
        "BranchStarted": "branch_started",
        "BranchSwitched": "branch_switched",
        "SessionForked": "session_forked",
        "SummaryRecorded": "summary_recorded",
        "SummarySent": "summary_sent",
        "PinAdded": "pin_added",
        "PinRemoved": "pin_removed",
    }
    assert set(SCHEMA_VERSIONS) == set(WIRE_TAGS.values())


@pytest.mark.parametrize("event", sample_events(), ids=lambda e: type(e).__name__)
def test_every_event_round_trips_through_json(event: Any) -> None:
    tag, version, payload = DEFAULT_CODEC.to_payload(event)
    assert tag == WIRE_TAGS[type(event)]
    assert version == SCHEMA_VERSIONS[tag]
    wire = json.loads(json.dumps(payload, ensure_ascii=False))
    assert DEFAULT_CODEC.from_payload(tag, version, wire) == event


def test_envelope_round_trip() -> None:
    event = sample_events()[1]
    stored = DEFAULT_CODEC.encode(event, session_id="s", seq=7, recorded_at=12.5)
    assert (stored.session_id, stored.seq, stored.tag, stored.schema_version) == (
        "s",
        7,
        "turn_submitted",
        2,
    )
    assert stored.recorded_at == 12.5
    assert DEFAULT_CODEC.decode(stored) == event


def test_unknown_tag_is_typed() -> None:
    with pytest.raises(UnknownEventTag, match="turn_exploded"):
        DEFAULT_CODEC.from_payload("turn_exploded", 1, {})


@pytest.mark.parametrize("version", [0, 3, 99, "1", True])
def test_unknown_version_is_typed(version: Any) -> None:
    with pytest.raises(UnknownEventTag):
        DEFAULT_CODEC.from_payload(
            "turn_discarded", version, {"request_id": "r", "reason": "empty"}
        )


GOOD_COMMIT = {"request_id": "r", "answer": "a", "finish_reason": "stop", "usage": None}


@pytest.mark.parametrize(
    ("payload", "fragment"),
    [
        ({**GOOD_COMMIT, "answer": 1}, "answer"),
        ({**GOOD_COMMIT, "answer": None}, "answer"),
        ({**GOOD_COMMIT, "extra": 1}, "extra"),
        ({k: v for k, v in GOOD_COMMIT.items() if k != "answer"}, "answer"),
        ({**GOOD_COMMIT, "usage": {"prompt_tokens": "10"}}, "prompt_tokens"),
        ({**GOOD_COMMIT, "usage": {"prompt_tokens": True}}, "prompt_tokens"),
        ({**GOOD_COMMIT, "usage": [1, 2]}, "usage"),
    ],
)
def test_bad_payloads_raise_codec_error_naming_the_field(payload: Any, fragment: str) -> None:
    with pytest.raises(CodecError, match=fragment):
        DEFAULT_CODEC.from_payload("turn_committed", 1, payload)


@pytest.mark.parametrize(
    "payload",
    [
        {"request_id": "r", "reason": "bored", "detail": "", "preview_chars": 0},
        {"request_id": "r", "reason": "timeout", "detail": "", "preview_chars": 1.5},
        ["not", "an", "object"],
    ],
)
def test_bad_discards_are_refused(payload: Any) -> None:
    with pytest.raises(CodecError):
        DEFAULT_CODEC.from_payload("turn_discarded", 2, payload)


def test_bad_policy_is_refused() -> None:
    base = {"system": "", "model": "m", "on_busy": "reject"}
    for policy in ({"kind": "sliding"}, {"kind": "window", "max_turns": 0}, {"max_turns": 3}):
        with pytest.raises(CodecError):
            DEFAULT_CODEC.from_payload("session_started", 2, {**base, "policy": policy})


def test_decode_names_the_stored_place() -> None:
    stored = StoredEvent("sess-9", 4, "turn_committed", 1, {"request_id": 1}, 0.0)
    with pytest.raises(CodecError, match=r"sess-9.*seq 4"):
        DEFAULT_CODEC.decode(stored)


# --- upcasting ------------------------------------------------------------


def test_session_started_v1_is_upcast() -> None:
    # v1 kept the window as a bare max_turns (null = keep everything).
    v1_window = {"system": "be brief", "model": "m", "max_turns": 4}
    v1_ledger = {"system": "be brief", "model": "m", "max_turns": None}
    assert DEFAULT_CODEC.from_payload("session_started", 1, v1_window) == SessionStarted(
        "be brief", "m", Window(4), "reject"
    )
    assert DEFAULT_CODEC.from_payload("session_started", 1, v1_ledger) == SessionStarted(
        "be brief", "m", Ledger(), "reject"
    )


def test_turn_discarded_v1_is_upcast() -> None:
    v1 = {"request_id": "r", "reason": "timeout", "detail": "deadline"}
    expected = TurnDiscarded(RequestId("r"), "timeout", "deadline", 0)
    assert DEFAULT_CODEC.from_payload("turn_discarded", 1, v1) == expected


def test_upcasters_chain_one_version_at_a_time() -> None:
    # A codec whose turn_discarded is at v3: v1 -> v2 (built in) -> v3 (ours).
    calls: list[int] = []

    def v2_to_v3(p: dict[str, Any]) -> dict[str, Any]:
        calls.append(p["preview_chars"])
        return {**p, "detail": p["detail"].upper()}

    # v3 is "the same schema, detail upper-cased": structuring still uses the class.
    codec = EventCodec(
        upcasters={**UPCASTERS, ("turn_discarded", 2): v2_to_v3},
        versions={**SCHEMA_VERSIONS, "turn_discarded": 3},
    )
    got = codec.from_payload(
        "turn_discarded", 1, {"request_id": "r", "reason": "limit", "detail": "x"}
    )
    assert got == TurnDiscarded("r", "limit", "X", 0)  # type: ignore[arg-type]
    assert calls == [0]
    # a version without a path forward is an error, not a guess
    missing = EventCodec(upcasters={}, versions=SCHEMA_VERSIONS)
    with pytest.raises(UnknownEventTag, match="no upcaster"):
        missing.from_payload("turn_discarded", 1, {"request_id": "r", "reason": "limit"})


def test_encoding_a_non_event_is_refused() -> None:
    with pytest.raises(CodecError):
        DEFAULT_CODEC.to_payload(object())  # type: ignore[arg-type]


# --- the generated fast path agrees with cattrs ----------------------------

_values = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-3, 2**70),
    st.floats(allow_nan=False),
    st.text(max_size=5),
    st.sampled_from(["stop", "timeout", "busy", "r-1", "ledger"]),
    st.lists(st.integers(), max_size=2),
    st.fixed_dictionaries({"prompt_tokens": st.integers(0, 9)}),
)


@settings(max_examples=500)
@hgiven(
    index=st.integers(0, 6),
    drop=st.lists(st.text(min_size=1, max_size=15), max_size=2),
    put=st.dictionaries(
        st.sampled_from(
            ["request_id", "answer", "reason", "detail", "usage", "preview_chars", "outcome",
             "turns_sent", "finish_reason", "question", "extra", "total_tokens"]
        ),
        _values,
        max_size=3,
    ),
)  # fmt: skip
def test_fast_path_agrees_with_cattrs(index: int, drop: list[str], put: dict[str, Any]) -> None:
    event = sample_events()[index]
    tag, version, payload = DEFAULT_CODEC.to_payload(event)
    mutated = {k: v for k, v in payload.items() if k not in drop}
    mutated.update(put)
    slow = EventCodec()
    slow._current = {}  # cattrs only
    try:
        expected: Any = slow.from_payload(tag, version, mutated)
    except CodecError as exc:
        expected = type(exc)
    try:
        got: Any = DEFAULT_CODEC.from_payload(tag, version, mutated)
    except CodecError as exc:
        got = type(exc)
    assert got == expected
    if not isinstance(got, type):
        assert type(got) is type(event)


@pytest.mark.parametrize("event", sample_events(), ids=lambda e: type(e).__name__)
def test_fast_structurers_build_the_same_event_as_the_constructor(event: Any) -> None:
    # The generated structurer of a current-version payload gives an event
    # indistinguishable from the one encoded (equal, same hash, same repr).
    tag, _version, payload = DEFAULT_CODEC.to_payload(event)
    entry = DEFAULT_CODEC._current.get(tag)
    if entry is None:
        # the tagged policy union, a tuple of tool calls: cattrs
        assert type(event) in (SessionStarted, ToolCallsRequested)
        return
    built = entry[1](payload)
    assert type(built) is type(event)
    assert attrs.asdict(built) == attrs.asdict(event)
    assert (built == event, hash(built), repr(built)) == (True, hash(event), repr(event))
    with pytest.raises(attrs.exceptions.FrozenInstanceError):
        built.request_id = "other"  # type: ignore[misc]


def test_structurers_build_through_the_constructor() -> None:
    @attrs.frozen
    class Checked:
        n: int = attrs.field(validator=attrs.validators.ge(0))

    with pytest.raises(ValueError, match="must be >= 0"):
        structurer(Checked)({"n": -1})  # the codec's cattrs path then explains

    # fields that are not positional arguments of __init__ are left to cattrs
    @attrs.frozen
    class Derived:
        name: str
        n: int = attrs.field(init=False, default=7)

    @attrs.frozen
    class KeywordOnly:
        name: str = attrs.field(kw_only=True)

    for cls, field in ((Derived, "n"), (KeywordOnly, "name")):
        with pytest.raises(TypeError, match=f"^{field}$"):
            structurer(cls)
    assert structurers({"d": Derived, "c": Checked, "k": KeywordOnly}).keys() == {"c"}


# --- encoding: generated unstructurers -------------------------------------


def _ordered(value: Any) -> Any:
    """``value`` with the order of every dict's keys, and every type, visible."""
    if isinstance(value, dict):
        return (type(value), [(k, _ordered(v)) for k, v in value.items()])
    if isinstance(value, list | tuple):
        return (type(value), [_ordered(v) for v in value])
    return (type(value), value)


def _of(tp: Any) -> st.SearchStrategy[Any]:
    """Values of ``tp``; attrs classes built field by field from their hints."""
    if tp is ToolSpec:  # (its validators want a name and a JSON Schema)
        return st.builds(
            ToolSpec,
            st.from_regex(r"[a-z_-]{1,8}", fullmatch=True),
            st.text(),
            st.sampled_from(['{"type":"object"}', '{"type":"object","properties":{}}']),
        )
    if attrs.has(tp):
        hints = get_type_hints(tp)
        return st.builds(tp, **{f.name: _of(hints[f.name]) for f in attrs.fields(tp)})
    args = get_args(tp)
    if get_origin(tp) is tuple:
        return st.lists(_of(args[0]), max_size=3).map(tuple)
    if get_origin(tp) in (Union, UnionType):
        return st.one_of(*map(_of, args))
    if tp is int:  # (counts, sizes, limits: the validators want them >= 1)
        return st.integers(1, 2**70)
    return st.from_type(tp)


_any_event = st.one_of(
    *map(_of, WIRE_TAGS),  # every field drawn from its type
    st.sampled_from(sample_events()),
)


@settings(max_examples=300)
@hgiven(_any_event)
def test_generated_unstructurers_give_what_cattrs_gives(event: Any) -> None:
    # The same keys in the same order and the same values of the same types:
    # the JSON text a store writes does not change.
    tag, version, payload = DEFAULT_CODEC.to_payload(event)
    assert (tag, version) == (WIRE_TAGS[type(event)], SCHEMA_VERSIONS[tag])
    assert _ordered(payload) == _ordered(DEFAULT_CODEC._converter.unstructure(event))
    stored = DEFAULT_CODEC.encode(event, session_id="s", seq=3, recorded_at=1.5)
    assert _ordered(stored.payload) == _ordered(payload)
    assert DEFAULT_CODEC.decode(stored) == event


@attrs.frozen
class _Inner:
    a: int
    b: str | None = None


@attrs.frozen
class _Outer:
    inner: _Inner
    maybe: _Inner | None
    many: tuple[_Inner, ...]
    policy: Ledger | Window


def test_unstructurers_leave_odd_fields_to_the_converter() -> None:
    # Nested classes, optional ones, tuples of them into lists, and a field of
    # any other kind (here a tagged union) through the converter's own hook.
    seen: list[Any] = []

    def fallback(tp: Any) -> Any:
        seen.append(tp)
        return DEFAULT_CODEC._converter.get_unstructure_hook(tp)

    unstructure = unstructurer(_Outer, fallback)
    assert seen == [Ledger | Window]
    value = _Outer(_Inner(1), None, (_Inner(2, "x"), _Inner(3)), Window(4))
    assert _ordered(unstructure(value)) == _ordered(DEFAULT_CODEC._converter.unstructure(value))
    assert unstructure(value)["many"] == [{"a": 2, "b": "x"}, {"a": 3, "b": None}]


def test_encoding_needs_the_tags_version() -> None:
    codec = EventCodec(versions={"stream_started": 1})
    assert codec.to_payload(StreamStarted(RequestId("r")))[1] == 1
    with pytest.raises(KeyError, match="turn_submitted"):
        codec.to_payload(TurnSubmitted(RequestId("r"), "q", 0, 0, 10))


def test_the_envelope_built_through_its_slots_is_the_constructors() -> None:
    # envelope() skips StoredEvent.__init__: only sound while that does
    # nothing but store its arguments.
    for field in attrs.fields(StoredEvent):
        assert field.validator is None and field.converter is None, field.name
    assert not hasattr(StoredEvent, "__attrs_post_init__")
    assert not hasattr(StoredEvent, "__attrs_pre_init__")
    payload = {"a": 1}
    for args in (("s", 1, "t", 2, payload, 3.5), ("s", 1, "t", 2, payload, 3.5, 9)):
        built, made = envelope(*args), StoredEvent(*args)
        assert type(built) is StoredEvent
        assert attrs.astuple(built, recurse=False) == attrs.astuple(made, recurse=False)
        assert (built == made, repr(built)) == (True, repr(made))
        with pytest.raises(attrs.exceptions.FrozenInstanceError):
            built.seq = 2  # type: ignore[misc]


# --- decoding straight from JSON text (the stores' replay path) ------------


def _rows(events: list[Any]) -> list[tuple[int, str, int, bytes]]:
    rows = []
    for seq, event in enumerate(events, start=1):
        tag, version, payload = DEFAULT_CODEC.to_payload(event)
        rows.append((seq, tag, version, json.dumps(payload).encode()))
    return rows


def test_decode_rows_gives_what_decode_gives() -> None:
    events = sample_events()
    rows = _rows(events)
    assert DEFAULT_CODEC.decode_rows("s", rows) == events
    assert [DEFAULT_CODEC.decode_json("s", *row) for row in rows] == events
    # str text as well as UTF-8 bytes
    assert DEFAULT_CODEC.decode_rows("s", [(s, t, v, p.decode()) for s, t, v, p in rows]) == events


def test_decode_json_is_exact_where_a_fast_parser_is_not() -> None:
    # orjson turns integers beyond 64 bits into floats and refuses the escape
    # of a lone surrogate; decode_json must give json.loads' answer anyway.
    text = json.dumps(
        {"request_id": "r", "question": "\ud800", "turns_sent": 2**64,
         "turns_dropped": -(2**63) - 1, "request_bytes": 10**30}
    )  # fmt: skip
    assert "\\ud800" in text
    event = DEFAULT_CODEC.decode_json("s", 1, "turn_submitted", 1, text)
    assert event == DEFAULT_CODEC.from_payload("turn_submitted", 1, json.loads(text))
    assert isinstance(event, TurnSubmitted)
    assert event.turns_sent == 2**64 and type(event.request_bytes) is int


_GOOD = b'{"request_id":"r"}'


@pytest.mark.parametrize(
    "text",
    [
        b'{"request_id":',
        b"[1, 2]",
        b'"text"',
        b"",
        b"\xff\xfe\xfa",
        b"nul\x00",
        b"\xef\xbb\xbf" + _GOOD,  # json.loads would skip a BOM in bytes
        _GOOD.decode().encode("utf-16-le"),  # and guess UTF-16
        b'{"request_id":"\xed\xa0\x80"}',  # and take an encoded surrogate
        "\ufeff" + _GOOD.decode(),
    ],
)
def test_text_that_is_not_a_json_object_in_utf8_is_refused(text: bytes | str) -> None:
    with pytest.raises(PayloadNotJSON):
        DEFAULT_CODEC.decode_json("s", 1, "stream_started", 1, text)
    with pytest.raises(PayloadNotJSON):
        DEFAULT_CODEC.decode_rows("s", [(1, "stream_started", 1, text)])
    assert issubclass(PayloadNotJSON, ValueError)


def test_decode_json_errors_name_the_stored_place() -> None:
    with pytest.raises(UnknownEventTag, match=r"session 's' seq 3: .*'nope'"):
        DEFAULT_CODEC.decode_rows("s", [(3, "nope", 1, b"{}")])
    with pytest.raises(CodecError, match=r"session 's' seq 2: stream_started v1"):
        DEFAULT_CODEC.decode_rows("s", [(1, "stream_started", 1, b'{"request_id":"r"}'),
                                        (2, "stream_started", 1, b'{"request_id":7}')])  # fmt: skip


def test_decode_json_upcasts_old_versions() -> None:
    v1 = b'{"request_id":"r","reason":"timeout","detail":"deadline"}'
    expected = TurnDiscarded(RequestId("r"), "timeout", "deadline", 0)
    assert DEFAULT_CODEC.decode_json("s", 1, "turn_discarded", 1, v1) == expected


@settings(max_examples=300)
@hgiven(
    index=st.integers(0, 6),
    put=st.dictionaries(
        st.sampled_from(
            ["request_id", "answer", "reason", "usage", "preview_chars", "turns_sent",
             "question", "extra", "total_tokens"]
        ),
        _values,
        max_size=3,
    ),
)  # fmt: skip
def test_decode_json_agrees_with_an_exact_parse_and_cattrs(index: int, put: dict[str, Any]) -> None:
    event = sample_events()[index]
    tag, version, payload = DEFAULT_CODEC.to_payload(event)
    text = json.dumps({**payload, **put}).encode()
    slow = EventCodec()
    slow._current = {}  # cattrs only, on json.loads' result
    try:
        expected: Any = slow.from_payload(tag, version, json.loads(text))
    except CodecError as exc:
        expected = type(exc)
    try:
        got: Any = DEFAULT_CODEC.decode_rows("s", [(1, tag, version, text)])[0]
    except CodecError as exc:
        got = type(exc)
    assert got == expected
    if not isinstance(got, type):
        assert all(type(getattr(got, k)) is type(getattr(expected, k)) for k in payload)
