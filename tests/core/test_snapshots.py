"""Snapshots of the pure state: over random histories (tool turns, retries,
discards, old events upcast), the state loaded from a snapshot taken after
any event, folded with the events after it, equals the full replay; and a
damaged or outdated snapshot is refused, never half-used."""

from __future__ import annotations

import contextlib
from typing import Any

import attrs
import pytest
from hypothesis import given as hgiven
from hypothesis import settings
from hypothesis import strategies as st

from turnledger import InvalidCommand
from turnledger.events import DEFAULT_CODEC, Event, RequestId, ToolCall, ToolSpec
from turnledger.sessions import (
    Completed,
    Failed,
    Failure,
    Message,
    ResponseStarted,
    Start,
    Submit,
    ToolDone,
    is_in_flight,
    replay,
)
from turnledger.sessions._snapshot import (
    NEWEST,
    SNAPSHOT_SCHEMA,
    SnapshotInvalid,
    load_snapshot,
    take_snapshot,
)

from ._given import Session
from .test_properties import CUR, NEW, answers, messages, starts, texts, whole_turn

TOOLS = (ToolSpec("calc", "adds"), ToolSpec("clock"))
results = st.sampled_from(["42", "", "错误：“除以零”", "r" * 90])


def _tool_turn(q: str, calls: int, res: list[str], a: str, error: bool) -> list[Message]:
    ids = [f"c{i}" for i in range(calls)]
    out: list[Message] = [
        Submit(NEW, q),
        ResponseStarted(CUR),
        Completed(
            CUR,
            "",
            "tool_calls",
            round=0,
            tool_calls=tuple(ToolCall(c, "calc", '{"a":1}') for c in ids),
        ),
    ]
    out += [ToolDone(CUR, c, r, is_error=error) for c, r in zip(ids, res, strict=False)]
    out += [ResponseStarted(CUR), Completed(CUR, a, "stop", round=1)]
    return out


tool_turn = st.builds(
    _tool_turn, texts, st.integers(1, 3), st.lists(results, min_size=1, max_size=3), answers,
    st.booleans(),
)  # fmt: skip
overflow = st.just([Failed(CUR, Failure("context_overflow"))])
chunks = st.one_of(messages.map(lambda m: [m]), whole_turn, tool_turn, overflow)
scripts = st.lists(chunks, min_size=2, max_size=14).map(lambda cs: [m for c in cs for m in c])
tool_starts = st.builds(lambda s, tools: attrs.evolve(s, tools=TOOLS if tools else ()),
                        starts, st.booleans())  # fmt: skip


def drive(start: Start, script: list[Message]) -> list[Event]:
    s = Session()
    s.when(start)
    fresh = 0
    for msg in script:
        rid = getattr(msg, "request_id", None)
        if rid == CUR:
            current = s.state.request.request_id if is_in_flight(s.state) else RequestId("r0")  # type: ignore[union-attr]
            msg = attrs.evolve(msg, request_id=current)  # type: ignore[misc]
        elif rid == NEW:
            fresh += 1
            msg = attrs.evolve(msg, request_id=RequestId(f"n{fresh}"))  # type: ignore[misc]
        with contextlib.suppress(InvalidCommand):
            s.when(msg)
    return s.log


def _downgrade(tag: str, payload: dict[str, Any], version: int) -> tuple[int, dict[str, Any]]:
    """The payload as an older release wrote it (its upcasters bring it back)."""
    p = dict(payload)
    if tag == "turn_submitted":
        p.pop("estimated_prompt_tokens")
        return 1, p
    if tag == "turn_discarded":
        p.pop("preview_chars")
        return 1, p
    if tag == "completion_ignored":
        p.pop("usage")
        return 1, p
    if tag == "session_started" and not p["tools"] and p["context_window"] is None:
        for k in ("tools", "tool_choice", "max_tool_rounds", "on_tool_error",
                  "context_window", "output_reserve", "window_source"):  # fmt: skip
            p.pop(k)
        policy = p.pop("policy")
        p["max_turns"] = policy.get("max_turns")
        p.pop("on_busy")
        return 1, p
    return version, p


def upcast(events: list[Event], old: list[bool]) -> list[Event]:
    out = []
    for ev, make_old in zip(events, old + [False] * len(events), strict=False):
        tag, version, payload = DEFAULT_CODEC.to_payload(ev)
        if make_old:
            version, payload = _downgrade(tag, payload, version)
        out.append(DEFAULT_CODEC.from_payload(tag, version, payload))
    return out


@settings(max_examples=200, deadline=None)
@hgiven(
    start=tool_starts,
    script=scripts,
    old=st.lists(st.booleans(), max_size=80),
    newest=st.sampled_from([0, 1, 2, 3, NEWEST]),
)
def test_replay_from_a_snapshot_at_any_point_equals_full_replay(
    start: Start, script: list[Message], old: list[bool], newest: int
) -> None:
    """From a snapshot taken after any event, with any split between the
    head and the older part (read inline, or through the store's loader),
    folding the events after it gives the full replay: with the older part
    still unread while folding, and loaded."""
    events = upcast(drive(start, script), old)
    full = replay(events)
    for k in range(len(events) + 1):
        before = replay(events[:k])
        snap = take_snapshot("s", before, "tag", 1.0, newest=newest)
        lazy = attrs.evolve(snap, older=b"", load_older=lambda s=snap: s.older)
        assert replay(events[k:], load_snapshot(lazy)) == full  # folded before any load
        loaded = load_snapshot(snap)
        assert loaded == before
        assert type(loaded) is type(before)
        assert replay(events[k:], loaded) == full


def test_the_histories_are_interesting() -> None:
    """The generator reaches tool turns, retries, discards and old events."""
    from hypothesis import find

    def has(tag: str) -> Any:
        return lambda a: any(DEFAULT_CODEC.to_payload(e)[0] == tag for e in drive(a[0], a[1]))

    pair = st.tuples(tool_starts, scripts)
    for tag in ("tool_result_recorded", "turn_retried", "turn_discarded", "turn_committed"):
        find(pair, has(tag), settings=settings(max_examples=2000, database=None))


def _sample_state() -> Any:
    start = Start("系统", "m", tools=TOOLS)
    return replay(drive(start, [*_tool_turn("q", 2, ["1", "2"], "done", False), Submit(NEW, "x")]))


def test_a_damaged_snapshot_is_refused() -> None:
    state = _sample_state()
    snap = take_snapshot("s", state, "turn_submitted", 1.0)
    assert load_snapshot(snap) == state
    flipped = bytearray(snap.body)
    flipped[len(flipped) // 2] ^= 0x01
    with pytest.raises(SnapshotInvalid, match="checksum"):
        load_snapshot(attrs.evolve(snap, body=bytes(flipped)))
    with pytest.raises(SnapshotInvalid, match="outdated"):
        load_snapshot(attrs.evolve(snap, schema=SNAPSHOT_SCHEMA + 1))
    with pytest.raises(SnapshotInvalid, match="inconsistent"):
        load_snapshot(attrs.evolve(snap, version=snap.version + 1))
    # a body with the right checksum but the wrong layout
    import hashlib

    bad = b'{"phase": "Idle"}'
    with pytest.raises(SnapshotInvalid, match="damaged"):
        load_snapshot(attrs.evolve(snap, body=bad, checksum=hashlib.sha256(bad).hexdigest()))


def _long_state(turns: int) -> Any:
    script: list[Message] = []
    for n in range(turns):
        script += [Submit(NEW, f"q{n}"), ResponseStarted(CUR), Completed(CUR, f"a{n}", "stop")]
    return replay(drive(Start("s", "m"), script))


def test_a_long_session_reopens_with_its_older_turns_unread() -> None:
    """The head holds the newest turns; the older part is read once, when
    an older turn is first needed, and never for the newest or the length."""
    state = _long_state(NEWEST + 20)
    snap = take_snapshot("s", state, "turn_committed", 1.0)
    assert snap.older
    reads: list[int] = []

    def load() -> bytes | None:
        reads.append(1)
        return snap.older

    loaded = load_snapshot(attrs.evolve(snap, older=b"", load_older=load))
    assert len(loaded.turns) == NEWEST + 20 and len(loaded.endings) == NEWEST + 20
    assert loaded.turns[-1] == state.turns[-1] and loaded.turns[20] == state.turns[20]
    assert loaded.endings.get(RequestId("never")) is None and not reads
    assert loaded.turns[0] == state.turns[0] and reads == [1]
    assert loaded == state and reads == [1]


def test_a_damaged_older_part_is_found_when_needed_and_reported() -> None:
    """An older part that is gone, flipped or not the head's raises
    SnapshotInvalid where it is needed, after calling on_damage; the newest
    turns stay readable without it."""
    state = _long_state(NEWEST + 5)
    snap = take_snapshot("s", state, "turn_committed", 1.0)
    flipped = bytearray(snap.older)
    flipped[len(flipped) // 2] ^= 0x01
    other = take_snapshot("s", _long_state(NEWEST + 6), "turn_committed", 1.0).older
    for older, why in ((None, "gone"), (bytes(flipped), "checksum"), (other, "checksum")):
        seen: list[SnapshotInvalid] = []
        loaded = load_snapshot(
            attrs.evolve(snap, older=b"", load_older=lambda o=older: o), seen.append
        )
        assert loaded.turns[-1] == state.turns[-1]
        with pytest.raises(SnapshotInvalid, match=why):
            loaded.turns[0]
        assert len(seen) == 1 and why in str(seen[0])
        with pytest.raises(SnapshotInvalid):
            list(loaded.endings)


def test_text_json_cannot_carry_as_utf8_survives_a_snapshot() -> None:
    # (The machine refuses lone surrogates in what it is given; a state
    # built by hand still round-trips, through JSON's escapes.)
    from turnledger.sessions import History, Turn

    state = attrs.evolve(
        _sample_state(), turns=History([Turn(RequestId("x"), "q \ud800", "a \udfff \x00")])
    )
    assert load_snapshot(take_snapshot("s", state, "turn_committed", 1.0)) == state
