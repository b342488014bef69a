"""The bulk replay's fold (StateDecoder + fold_items) against the reference
fold (codec + replay): the same state, or the same error, for every history.

The fast fold applies the common turn to local variables and builds no
events for it; these tests are what would fail if that shortcut ever
disagreed with ``evolve``.
"""

from __future__ import annotations

import json
import random
from typing import Any

import attrs
import pytest
from hypothesis import given as hgiven
from hypothesis import settings
from hypothesis import strategies as st

from turnledger import CodecError, ReplayError
from turnledger.adapters.stores._payloads import dumps_payload
from turnledger.events import (
    DEFAULT_CODEC,
    Event,
    EventCodec,
    PayloadNotJSON,
    RequestId,
    SessionStarted,
    StreamStarted,
    TurnCommitted,
    TurnSubmitted,
    Usage,
    Window,
)
from turnledger.sessions import Budget, Message, Start, is_in_flight, replay
from turnledger.sessions import Committed as Committed_
from turnledger.sessions._history import Ending, Turn
from turnledger.sessions._replay import (
    StateDecoder,
    _committed_ending,
    _committed_turn,
    fold_items,
)

from ._given import Session
from .test_properties import CUR, IDS, NEW, budgets, scripts, starts

Row = tuple[int, str, int, bytes]


def _rows(log: list[Event]) -> list[Row]:
    out = []
    for seq, ev in enumerate(log, 1):
        tag, version, payload = DEFAULT_CODEC.to_payload(ev)
        out.append((seq, tag, version, json.dumps(payload, ensure_ascii=False).encode()))
    return out


def _outcome(fn: Any) -> Any:
    try:
        return fn()
    except (ReplayError, CodecError, PayloadNotJSON) as exc:
        return (type(exc), str(exc))


def reference(rows: list[Row], codec: EventCodec = DEFAULT_CODEC) -> Any:
    return _outcome(lambda: replay(codec.decode_rows("s", rows)))


def fast(rows: list[Row], codec: EventCodec = DEFAULT_CODEC) -> Any:
    return _outcome(lambda: fold_items(StateDecoder(codec).decode_rows("s", rows)))


def fast_envelopes(rows: list[Row]) -> Any:
    decoder = StateDecoder()

    def run() -> Any:
        envelopes = [
            DEFAULT_CODEC.encode(
                DEFAULT_CODEC.decode_rows("s", [row])[0], session_id="s", seq=row[0], recorded_at=0
            )
            for row in rows
        ]
        return fold_items([decoder.decode(e) for e in envelopes])

    return _outcome(run)


def _play(start: Start, budget: int | None, script: list[Message]) -> list[Event]:
    s = Session(budget=Budget(budget))
    s.when(start)
    fresh = 0
    for msg in script:
        rid = getattr(msg, "request_id", None)
        if rid == CUR:
            current = s.state.request.request_id if is_in_flight(s.state) else IDS[0]  # type: ignore[union-attr]
            msg = attrs.evolve(msg, request_id=current)  # type: ignore[misc]
        elif rid == NEW:
            fresh += 1
            msg = attrs.evolve(msg, request_id=RequestId(f"n{fresh}"))  # type: ignore[misc]
        s.when(msg)
    return s.log


@settings(max_examples=300, deadline=None)
@hgiven(start=starts, budget=budgets, script=scripts)
def test_the_fast_fold_is_replay_on_every_prefix_of_random_histories(
    start: Start, budget: int | None, script: list[Message]
) -> None:
    log = _play(start, budget, script)
    rows = _rows(log)
    for n in range(len(rows) + 1):  # every prefix: states in flight too
        want = replay(log[:n])
        assert fast(rows[:n]) == want
        assert fast_envelopes(rows[:n]) == want


@settings(max_examples=300, deadline=None)
@hgiven(start=starts, budget=budgets, script=scripts, seed=st.integers(0, 2**32 - 1))
def test_a_damaged_history_fails_the_same_way(
    start: Start, budget: int | None, script: list[Message], seed: int
) -> None:
    # Events dropped, repeated or swapped: the fast fold refuses what replay
    # refuses, with the same error, and agrees on what it accepts.
    rows = _rows(_play(start, budget, script))
    rng = random.Random(seed)
    for _ in range(3):
        damaged = list(rows)
        i = rng.randrange(len(damaged))
        how = rng.choice(["drop", "repeat", "swap"])
        if how == "drop":
            del damaged[i]
        elif how == "repeat":
            damaged.insert(i, damaged[i])
        elif i + 1 < len(damaged):
            damaged[i], damaged[i + 1] = damaged[i + 1], damaged[i]
        assert fast(damaged) == reference(damaged)


def _turn(rid: str, q: str = "q", a: str = "a", est: int | None = 50) -> list[Event]:
    r = RequestId(rid)
    return [
        TurnSubmitted(r, q, 0, 0, 10, estimated_prompt_tokens=est),
        StreamStarted(r),
        TurnCommitted(r, a, "stop", Usage(80, 3, 83)),
    ]


def _started(policy: Any = None) -> SessionStarted:
    return SessionStarted("sys", "m", policy) if policy else SessionStarted("sys", "m")


def test_windows_calibration_and_largest_request_follow_replay() -> None:
    log: list[Event] = [_started(Window(2))]
    for i, est in enumerate([50, None, 10, 200, 0]):
        log += _turn(f"r{i}", est=est)
    rows = _rows(log)
    state = fast(rows)
    assert state == replay(log)
    assert state.context_start == 4 and state.calibration == (4, 1)
    assert state.largest_ok == 200 and len(state.turns) == 5


def _payload_rows(tag: str, version: int, payload: Any) -> list[Row]:
    head = _rows([_started(), *_turn("r0")])
    submitted = _rows(_turn("r1"))[0]
    body = payload if isinstance(payload, bytes) else json.dumps(payload).encode()
    rows = [*head, (5, *submitted[1:])]
    if tag != "turn_submitted":
        rows.append((6, "stream_started", 1, b'{"request_id":"r1"}'))
        rows.append((7, tag, version, body))
    else:
        rows[-1] = (5, tag, version, body)
    return rows


@pytest.mark.parametrize(
    ("tag", "version", "payload"),
    [
        # what the tuples decline, the codec decides: the same event or error
        ("turn_committed", 1, {"request_id": "r1", "answer": "x", "finish_reason": "stop"}),
        (
            "turn_committed",
            1,
            {"request_id": "r1", "answer": "x", "finish_reason": "stop", "usage": {}},
        ),
        (
            "turn_committed",
            1,
            {
                "request_id": "r1",
                "answer": "x",
                "finish_reason": "stop",
                "usage": {"prompt_tokens": 1.5, "completion_tokens": 1, "total_tokens": 2},
            },
        ),
        (
            "turn_committed",
            1,
            {
                "request_id": "r1",
                "answer": "x",
                "finish_reason": "stop",
                "usage": {"prompt_tokens": True, "completion_tokens": 1, "total_tokens": 2},
            },
        ),
        (
            "turn_committed",
            1,
            {"request_id": "r1", "answer": 3, "finish_reason": "stop", "usage": None},
        ),
        (
            "turn_committed",
            1,
            {"request_id": "r1", "answer": "x", "finish_reason": "stop", "usage": None, "x": 1},
        ),
        ("turn_committed", 1, b'{"request_id":"r1","answer":"\\ud800","finish_reason":"stop"}'),
        ("turn_committed", 1, b'{"request_id":"r1","answer":'),
        ("turn_committed", 1, b"[1, 2]"),
        ("turn_committed", 2, {"request_id": "r1", "answer": "x", "finish_reason": "stop"}),
        (
            "turn_submitted",
            2,
            {
                "request_id": "r1",
                "question": "q",
                "turns_sent": 1,
                "turns_dropped": 0,
                "request_bytes": 2**70,
                "estimated_prompt_tokens": None,
            },
        ),
        (
            "turn_submitted",
            2,
            {
                "request_id": "r1",
                "question": "q",
                "turns_sent": 1,
                "turns_dropped": 0,
                "request_bytes": 9,
            },
        ),
        # an old version: upcast by the codec, then folded
        (
            "turn_submitted",
            1,
            {
                "request_id": "r1",
                "question": "q",
                "turns_sent": 1,
                "turns_dropped": 0,
                "request_bytes": 9,
            },
        ),
        ("turn_submitted", 2, {"request_id": "r1", "question": None}),
        ("stream_started", 1, {"request_id": "r1", "extra": 1}),
        ("stream_started", 1, {"request_id": 1}),
    ],
)
def test_payloads_the_tuples_decline_are_the_codecs(tag: str, version: int, payload: Any) -> None:
    rows = _payload_rows(tag, version, payload)
    assert fast(rows) == reference(rows)


def _compact_rows(log: list[Event]) -> list[Row]:
    """Rows as the durable stores write them (compact JSON, UTF-8)."""
    out = []
    for seq, ev in enumerate(log, 1):
        tag, version, payload = DEFAULT_CODEC.to_payload(ev)
        out.append((seq, tag, version, dumps_payload(payload).encode()))
    return out


@settings(max_examples=200, deadline=None)
@hgiven(start=starts, budget=budgets, script=scripts)
def test_the_fast_fold_is_replay_over_the_stores_compact_rows(
    start: Start, budget: int | None, script: list[Message]
) -> None:
    log = _play(start, budget, script)
    rows = _compact_rows(log)
    for n in range(len(rows) + 1):
        assert fast(rows[:n]) == replay(log[:n])


@pytest.mark.parametrize(
    "text",
    [
        b'{"request_id":"r1"}',
        b'{"request_id":"r2"}',  # for another request: refused
        b'{"request_id":"R1"}',
        b'{"request_id":"r\\u0031"}',  # an escape: parsed
        b'{"request_id":"r1" }',
        b'{ "request_id":"r1"}',
        b'{"request_id":"r1","x":1}',
        b'{"request_id":"r1"}{"request_id":"r1"}',
        b'{"request_id":""}',
        b'{"request_id":"r-1"}',
        b'{"request_id":"r1\\""}',
        b'{"request_id":"\xc3\xa9"}',
        b'{"request_id":"r1\x00"}',
        b'{"request_id":"\xff"}',
        b'{"request_id":"r1"}\n',
        b'{"request_id":1}',
    ],
)
def test_a_started_row_is_read_as_the_codec_reads_it(text: bytes) -> None:
    rows = [*_compact_rows([_started(), *_turn("r0"), _ev("sub", "r1")])]
    rows.append((len(rows) + 1, "stream_started", 1, text))
    rows += [(len(rows) + 1 + i, *row[1:]) for i, row in enumerate(_compact_rows([_ev("x", "r1")]))]
    assert fast(rows) == reference(rows)
    assert fast(rows[:-1]) == reference(rows[:-1])


def test_turns_and_endings_built_through_their_slots_are_their_classes_own() -> None:
    # The fold builds Turn and Ending through their slots: right only while
    # their __init__ does nothing more than store the fields.
    for cls in (Turn, Ending):
        for field in attrs.fields(cls):
            assert field.validator is None and field.converter is None, field.name
            assert field.on_setattr in (None, attrs.setters.NO_OP), field.name
        assert not hasattr(cls, "__attrs_post_init__")
        assert not hasattr(cls, "__attrs_pre_init__")
    turn = _committed_turn(RequestId("r"), "q", "a", ())
    assert turn == Turn(RequestId("r"), "q", "a") and hash(turn) == hash(
        Turn(RequestId("r"), "q", "a")
    )
    assert repr(turn) == repr(Turn(RequestId("r"), "q", "a"))
    ending = _committed_ending("a")
    assert ending == Ending("committed", "", "", "a")
    assert [f.name for f in attrs.fields(Turn)] == ["request_id", "question", "answer", "rounds"]
    assert [f.name for f in attrs.fields(Ending)] == ["kind", "reason", "detail", "answer"]


def test_old_session_started_is_upcast_and_folded() -> None:
    v1 = (1, "session_started", 1, b'{"system":"s","model":"m","max_turns":2}')
    rows = [v1, *[(seq + 1, *rest) for seq, *rest in _rows(_turn("r0") + _turn("r1"))]]
    state = fast(rows)  # type: ignore[arg-type]
    assert state == reference(rows)  # type: ignore[arg-type]
    assert isinstance(state.config.policy, Window) and len(state.turns) == 2


def test_a_codec_of_other_versions_decodes_those_tags_itself() -> None:
    # A codec whose turn_committed is at version 2 (with an upcaster from 1):
    # the tuples written for version 1 must not take a version-1 row as current.
    seen: list[Any] = []

    def v1_to_v2(p: dict[str, Any]) -> dict[str, Any]:
        seen.append(p)
        return {**p, "answer": p["answer"].upper()}

    codec = EventCodec(
        upcasters={**DEFAULT_CODEC.upcasters, ("turn_committed", 1): v1_to_v2},
        versions={**DEFAULT_CODEC.versions, "turn_committed": 2},
    )
    rows = _rows([_started(), *_turn("r0", a="low")])
    state = fast(rows, codec)
    assert state == reference(rows, codec)
    assert seen and state.turns[0].answer == "LOW"


def _ev(kind: str, rid: str) -> Event:
    r = RequestId(rid)
    if kind == "sub":
        return TurnSubmitted(r, "q", 0, 0, 10)
    if kind == "start":
        return StreamStarted(r)
    return TurnCommitted(r, "a", "stop")


@pytest.mark.parametrize(
    "script",
    [
        "sub:r1 start:r2",  # started for another request
        "sub:r1 commit:r2",  # committed for another request
        "sub:r1 start:r1 commit:r2",
        "sub:r1 start:r1 start:r1",  # started twice
        "sub:r1 sub:r2",  # submitted while in flight
        "sub:r1 start:r1 commit:r1 sub:r1",  # an id submitted twice
        "sub:r1 start:r1 commit:r1 commit:r1",  # committed at rest
        "start:r1",  # started at rest
        "commit:r1",
        "sub:r1 commit:r1 start:r1",  # committed without a start is allowed; then started at rest
    ],
)
def test_every_fast_transition_refuses_what_evolve_refuses(script: str) -> None:
    log: list[Event] = [_started()]
    log += [_ev(*step.split(":")) for step in script.split()]
    rows = _rows(log)
    want = reference(rows)
    assert fast(rows) == want
    assert fast_envelopes(rows) == want
    if script.startswith("sub:r1 commit:r1"):
        assert isinstance(fast(rows[:3]), Committed_)
    else:
        assert isinstance(want, tuple) and want[0] is ReplayError


def test_without_session_started_nothing_is_folded() -> None:
    rows = _rows([_ev("sub", "r1"), _ev("start", "r1")])
    assert fast(rows) == reference(rows)
    assert fast(rows)[0] is ReplayError


def test_history_extend_and_record_all_are_repeated_append_and_record() -> None:
    from turnledger.sessions._history import Ending, Endings, History, Turn

    turns = [Turn(RequestId(f"r{i}"), "q", "a") for i in range(5)]
    base = History(turns[:2])
    branch = base.append(turns[4])  # base is no longer the newest view
    one_by_one = base
    for t in turns[2:]:
        one_by_one = one_by_one.append(t)
    assert base.extend(turns[2:]) == one_by_one and len(base) == 2 and len(branch) == 3
    assert list(branch) == [*turns[:2], turns[4]]

    pairs = [(RequestId(f"r{i}"), Ending("committed", answer=str(i))) for i in range(4)]
    e = Endings().record(*pairs[0])
    older = e.record(RequestId("x"), Ending("rejected"))
    recorded = e
    for p in pairs[1:]:
        recorded = recorded.record(*p)
    assert e.record_all(pairs[1:]) == recorded
    assert older.get(RequestId("x")) is not None and e.get(RequestId("x")) is None
    assert e.record_all(pairs[1:]).get(RequestId("r3")) == pairs[3][1]
    with pytest.raises(ValueError, match="already ended"):
        e.record_all(pairs[:2])
    with pytest.raises(ValueError, match="repeats"):
        e.record_all([pairs[1], pairs[1]])
