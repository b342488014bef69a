"""The actor's effects table against every event type the machine can emit.

``turnledger.runtime._actor.EFFECTS`` says what the actor does once an event
is recorded, keyed by the event's type, as ``EVENT_TRANSITIONS`` says where it
leads. An event type without an entry would stop the session the first time
it is recorded, so the table is checked three ways: against the ``Event``
union, against the machine's own event table, and against the event types
``decide`` actually emits, walking every message from every state it reaches.
"""

from __future__ import annotations

import typing
from collections.abc import Iterable, Mapping

import pytest
import trio

import turnledger.runtime._actor as actor_module
from turnledger import InvalidCommand, SessionClosed
from turnledger.events import (
    BranchId,
    Event,
    RequestId,
    SessionForked,
    SessionStarted,
    ToolCall,
    ToolSpec,
    TurnCommitted,
    TurnRetried,
)
from turnledger.runtime._actor import EFFECTS
from turnledger.sessions import (
    EVENT_TRANSITIONS,
    Budget,
    Cancel,
    Completed,
    Edit,
    Failed,
    Failure,
    Interrupt,
    Message,
    Pin,
    RecordSummary,
    ResponseStarted,
    SessionState,
    Start,
    Submit,
    Switch,
    Timeout,
    ToolDone,
    Unpin,
    decide,
    evolve,
    initial_state,
    open_hub,
)
from turnledger.testing import Finish, MemoryStore, ScriptedProvider

CALLS = (ToolCall("c1", "clock", "{}"), ToolCall("c2", "calc", '{"x":1}'))
#: Depth of the walk: every event type is reached by depth 4.
DEPTH = 5


def uncovered(table: Mapping[type, object], emitted: Iterable[type]) -> set[type]:
    """The event types in ``emitted`` that ``table`` has no entry for."""
    return set(emitted) - set(table)


def _messages() -> list[Message]:
    out: list[Message] = [Cancel(), Interrupt()]
    for r in (RequestId("r1"), RequestId("r2")):
        out += [
            Submit(r, f"a question ({r})"),
            Submit(r, "  "),
            Cancel(r),
            Timeout(r, "deadline"),
            ResponseStarted(r),
            ResponseStarted(r, 1),
            Completed(r, "an answer", "stop"),
            Completed(r, "an answer", "length"),
            Completed(r, "", "tool_calls", tool_calls=CALLS),
            Completed(r, "round one's answer", "stop", round=1),
            Failed(r, Failure("context_overflow", "HTTP 400")),
            Failed(r, Failure("http_status", "HTTP 500")),
            ToolDone(r, "c1", "12:00"),
            ToolDone(r, "c2", "2", is_error=True),
        ]
    # a branch needs a committed turn: an edit of turn 0, then back to main
    out += [Edit(RequestId("r3"), 0, "asked again"), Switch(BranchId("main"))]
    # a summary of turn 0, a pin and an unpin
    out += [
        RecordSummary(RequestId("sum"), BranchId("main"), 0, 1, "a summary", "function", "f"),
        Pin("p1", "pinned", "memory"),
        Unpin("p1"),
    ]
    return out


def _summary_sent() -> set[type]:
    # A summary is sent only when a budget drops turns (the walk above has
    # no budget): two turns, a summary of the first, a question that drops it.
    state: SessionState = initial_state()
    emitted: set[type] = set()
    budget = Budget(max_request_bytes=240)
    r1, r2, r3 = RequestId("q1"), RequestId("q2"), RequestId("q3")
    for message in [
        Start("s", "m"),
        Submit(r1, "one"),
        Completed(r1, "an answer of some length", "stop"),
        Submit(r2, "two"),
        Completed(r2, "an answer of some length", "stop"),
        RecordSummary(RequestId("sum"), BranchId("main"), 0, 1, "first", "model", "concise"),
        Submit(r3, "three"),
    ]:
        for ev in decide(state, message, budget=budget):
            emitted.add(type(ev))
            state = evolve(state, ev)
    return emitted


def emitted_types(start: Start) -> set[type]:
    """Every event type ``decide`` emits from the sessions ``start`` leads
    to, walking each message from each state reached, ``DEPTH`` deep."""
    state: SessionState = initial_state()
    emitted: set[type] = set()
    for ev in decide(state, start):
        emitted.add(type(ev))
        state = evolve(state, ev)
    seen = {repr(state)}
    frontier: list[SessionState] = [state]
    messages = _messages()
    for _ in range(DEPTH):
        reached: list[SessionState] = []
        for before in frontier:
            for message in messages:
                try:
                    events = decide(before, message)
                except InvalidCommand:
                    continue
                after = before
                for ev in events:
                    emitted.add(type(ev))
                    after = evolve(after, ev)
                if repr(after) not in seen:
                    seen.add(repr(after))
                    reached.append(after)
        frontier = reached
    return emitted


TOOLS = (ToolSpec("clock"), ToolSpec("calc"))


@pytest.fixture(scope="module")
def emitted() -> set[type]:
    return (
        emitted_types(Start("s", "m", tools=TOOLS))
        | emitted_types(Start("s", "m", tools=TOOLS, on_busy="supersede"))
        | _summary_sent()
    )


def test_the_walk_reaches_every_event_type(emitted: set[type]) -> None:
    # SessionForked is written by the hub's fork, with a new session's
    # SessionStarted, before any actor runs: no decision emits it.
    assert emitted == set(typing.get_args(Event)) - {SessionForked}


def test_every_event_the_machine_emits_has_an_effect(emitted: set[type]) -> None:
    assert uncovered(EFFECTS, emitted) == set()
    # and nothing else: the table names event types only
    assert set(EFFECTS) == set(typing.get_args(Event))
    folded = {ev for row in EVENT_TRANSITIONS.values() for ev in row}
    assert uncovered(EFFECTS, folded) == set()


@pytest.mark.parametrize("missing", [TurnRetried, SessionStarted, TurnCommitted])
def test_a_missing_entry_is_detected(emitted: set[type], missing: type) -> None:
    table = {k: v for k, v in EFFECTS.items() if k is not missing}
    assert uncovered(table, emitted) == {missing}


async def test_a_session_meeting_an_event_without_an_entry_stops_loudly(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # The check above is what keeps this from happening: the caller is told
    # which event had no entry, and nothing hangs.
    table = {k: v for k, v in EFFECTS.items() if k is not TurnCommitted}
    monkeypatch.setattr(actor_module, "EFFECTS", table)
    provider = ScriptedProvider(lambda request: [Finish("an answer")])
    with trio.fail_after(10):
        async with open_hub(MemoryStore(), provider, model="m") as hub:
            turn = await hub.submit("s", "q?")
            with pytest.raises(SessionClosed, match="TurnCommitted"):
                await turn.outcome()


async def test_every_entry_acts(monkeypatch: pytest.MonkeyPatch) -> None:
    # The table is the one the actor uses: a turn through the hub calls the
    # entries of the events it records, in order.
    called: list[str] = []

    def spy(effect: typing.Any) -> typing.Any:
        def call(actor: typing.Any, msg: typing.Any, ev: typing.Any, *rest: typing.Any) -> None:
            called.append(type(ev).__name__)
            effect(actor, msg, ev, *rest)

        return call

    table = {k: None if v is None else spy(v) for k, v in EFFECTS.items()}
    monkeypatch.setattr(actor_module, "EFFECTS", table)
    provider = ScriptedProvider(lambda request: [Finish("an answer")])
    with trio.fail_after(10):
        async with open_hub(MemoryStore(), provider, model="m") as hub:
            result = await (await hub.submit("s", "q?")).outcome()
    assert result.answer == "an answer"  # type: ignore[union-attr]
    assert called == ["TurnSubmitted", "TurnCommitted"]
