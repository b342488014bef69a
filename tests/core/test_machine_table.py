"""Every (state, message) pair against the transition tables."""

from __future__ import annotations

import json

import attrs
import pytest

from turnledger import (
    InvalidCommand,
    ReplayError,
    SessionBusy,
    UnknownBranch,
    UnknownPin,
    UnknownTurn,
)
from turnledger.events import (
    BranchId,
    BranchStarted,
    BranchSwitched,
    CompletionIgnored,
    SessionStarted,
    StreamStarted,
    ToolCall,
    ToolSpec,
    TurnCommitted,
    TurnDiscarded,
    TurnRejected,
    TurnSubmitted,
    Usage,
)
from turnledger.sessions import (
    EVENT_TRANSITIONS,
    TRANSITIONS,
    AwaitingTools,
    Cancel,
    Committed,
    Completed,
    Discarded,
    Edit,
    Failed,
    Failure,
    Idle,
    Interrupt,
    Message,
    Pending,
    Pin,
    RecordSummary,
    Regenerate,
    ResponseStarted,
    SessionState,
    Start,
    Streaming,
    Submit,
    Switch,
    Timeout,
    ToolDone,
    Unpin,
    branches_of,
    decide,
    ending_of,
    evolve,
    initial_state,
)

from ._given import Session, given, rid

CURRENT = rid("cur")
STALE = rid("old")
TOOLS = Start("be brief", "test-model", tools=(ToolSpec("clock"), ToolSpec("calc")))
CALLS = (ToolCall("c1", "clock", "{}"), ToolCall("c2", "calc", '{"x":1}'))


def _states() -> dict[str, Session]:
    """One session in every phase; the in-flight request is CURRENT, and
    STALE is a request the session already finished. Every session has tools;
    the ``round1`` ones are in their turn's second round."""
    done = given(Submit(STALE, "first?"), Completed(STALE, "first!", "stop"), start=TOOLS)
    pending = given(
        Submit(STALE, "first?"),
        Completed(STALE, "first!", "stop"),
        Submit(CURRENT, "second?"),
        start=TOOLS,
    )
    streaming = given(
        Submit(STALE, "first?"),
        Completed(STALE, "first!", "stop"),
        Submit(CURRENT, "second?"),
        ResponseStarted(CURRENT),
        start=TOOLS,
    )
    awaiting = given(
        Submit(CURRENT, "q"),
        Completed(CURRENT, "", "tool_calls", tool_calls=CALLS),
        start=TOOLS,
    )
    half = given(
        Submit(CURRENT, "q"),
        Completed(CURRENT, "", "tool_calls", tool_calls=CALLS),
        ToolDone(CURRENT, "c2", "2"),
        start=TOOLS,
    )
    round1 = given(
        Submit(CURRENT, "q"),
        Completed(CURRENT, "", "tool_calls", tool_calls=CALLS),
        ToolDone(CURRENT, "c1", "12:00"),
        ToolDone(CURRENT, "c2", "2", is_error=True),
        start=TOOLS,
    )
    discarded = given(Submit(STALE, "first?"), Cancel(), start=TOOLS)
    # on branch b1 (an edit of turn 0), its turn in flight; main holds STALE
    branched = given(
        Submit(STALE, "first?"),
        Completed(STALE, "first!", "stop"),
        Edit(CURRENT, 0, "first, again?"),
        start=TOOLS,
    )
    superseding = Start("be brief", "test-model", on_busy="supersede")
    return {
        "unstarted": Session(),
        "idle": given(start=TOOLS),
        "pending": pending,
        "streaming": streaming,
        "awaiting": awaiting,
        "awaiting-half": half,
        "pending-round1": round1,
        "streaming-round1": given_more(round1, ResponseStarted(CURRENT, 1)),
        "committed": done,
        "discarded": discarded,
        "branched-pending": branched,
        "branched-committed": given_more(branched, Completed(CURRENT, "again!", "stop")),
        "branched-switched": given_more(
            branched, Completed(CURRENT, "again!", "stop"), Switch(BranchId("main"))
        ),
        # a pinned item and a summary of turn 0, at rest and with a turn in flight
        "pinned-summarized": given(
            Submit(STALE, "first?"),
            Completed(STALE, "first!", "stop"),
            Pin("p1", "the user's name is Ada", "memory"),
            RecordSummary(rid("sum"), BranchId("main"), 0, 1, "asked first", "function", "f"),
            start=TOOLS,
        ),
        "supersede-pending": given(
            Submit(STALE, "first?"),
            Completed(STALE, "first!", "stop"),
            Submit(CURRENT, "second?"),
            start=superseding,
        ),
    }


def given_more(session: Session, *messages: Message) -> Session:
    out = Session(state=session.state, log=list(session.log), budget=session.budget)
    for m in messages:
        out.when(m)
    return out


def _messages(request_id: str) -> list[Message]:
    r = rid(request_id)
    return [
        Start("s", "m"),
        ToolDone(r, "c1", "a result"),
        ToolDone(r, "c2", "an error", is_error=True),
        ToolDone(r, "c9", "no such call"),
        ResponseStarted(r, 1),
        Completed(r, "", "tool_calls", tool_calls=CALLS),
        Completed(r, "", "tool_calls", round=1, tool_calls=CALLS),
        Completed(r, "", "tool_calls", tool_calls=(ToolCall("c1", "nope", "{}"),)),
        Completed(r, "", "tool_calls", tool_calls=(ToolCall("c1", "clock", "[1]"),)),
        Completed(r, "", "tool_calls", tool_calls=(CALLS[0], CALLS[0])),
        Completed(r, "round one's answer", "stop", round=1),
        Failed(r, Failure("transport", "reset"), round=1),
        Submit(rid("new"), "a new question"),
        Submit(r, "a repeated request id"),
        Cancel(),
        Cancel(r),
        Timeout(r, "deadline"),
        Interrupt(),
        ResponseStarted(r),
        Completed(r, "an answer", "stop", Usage(1, 2, 3)),
        Completed(r, "an answer", "length"),
        Completed(r, "  \n", "stop"),
        Failed(r, Failure("http_status", "HTTP 429")),
        Edit(rid("edit-" + request_id), 0, "asked differently"),
        Edit(r, 0, "an edit under a known id"),
        Edit(rid("edit2-" + request_id), 5, "no such turn"),
        Edit(rid("edit3-" + request_id), 0, "  "),
        Regenerate(rid("regen-" + request_id)),
        Switch(BranchId("main")),
        Switch(BranchId("b1")),
        Switch(BranchId("b9")),
        RecordSummary(rid("sum-" + request_id), BranchId("main"), 0, 1, "a summary", "model", "p"),
        RecordSummary(
            rid("sum2-" + request_id), BranchId("main"), 0, 9, "no such turns", "model", "p"
        ),
        RecordSummary(
            rid("sum3-" + request_id), BranchId("b9"), 0, 1, "no such branch", "model", "p"
        ),
        RecordSummary(rid("sum4-" + request_id), BranchId("main"), 0, 1, " ", "function", "f"),
        Pin("p1", "pinned text", "memory"),
        Pin("p-" + request_id, "pinned text", "retrieval:doc-7"),
        Pin("bad id!", "pinned text", "memory"),
        Unpin("p1"),
        Unpin("p9"),
    ]


CASES = [
    pytest.param(name, msg, id=f"{name}-{type(msg).__name__}-{i}")
    for name in _states()
    for i, msg in enumerate(_messages("cur") + _messages("old") + _messages("never"))
]


@pytest.mark.parametrize(("name", "message"), CASES)
def test_every_pair_matches_the_table(name: str, message: Message) -> None:
    session = _states()[name]
    before = session.state
    allowed = TRANSITIONS.get(type(before), {}).get(type(message))
    if allowed is None or (isinstance(message, Start) != (before.config is None)):
        with pytest.raises(InvalidCommand):
            session.when(message)
        assert session.state is before
        return
    try:
        session.when(message)
    except (UnknownTurn, UnknownBranch, SessionBusy, UnknownPin):
        # bad branch input (or a switch while busy): a typed error, nothing changed
        assert isinstance(message, (Edit, Regenerate, Switch, RecordSummary, Pin, Unpin))
        assert session.state is before
        return
    except InvalidCommand:
        # a summary or a pin that cannot be recorded (empty text, bad or taken id)
        assert isinstance(message, (RecordSummary, Pin))
        assert session.state is before
        return
    assert type(session.state) in allowed
    session.then_replay_matches()
    # a message never loses committed history: a branch keeps a prefix of
    # the active path, and every branch keeps its own
    if session.state.active_branch == before.active_branch:
        assert list(session.state.turns[: len(before.turns)]) == list(before.turns)
    else:
        kept = [b.length for b in branches_of(session.state) if b.branch_id == before.active_branch]
        assert kept == [len(before.turns)]


def test_table_covers_every_state_and_message() -> None:
    states = {Idle, Pending, Streaming, AwaitingTools, Committed, Discarded}
    messages = {
        Start,
        Submit,
        Cancel,
        Timeout,
        Interrupt,
        ResponseStarted,
        Completed,
        Failed,
        ToolDone,
        Edit,
        Regenerate,
        Switch,
        RecordSummary,
        Pin,
        Unpin,
    }
    assert set(TRANSITIONS) == states
    assert set(EVENT_TRANSITIONS) == states
    for state in states - {Idle}:
        assert set(TRANSITIONS[state]) == messages - {Start}
    assert set(TRANSITIONS[Idle]) == messages


@pytest.mark.parametrize("name", [n for n in _states() if n != "unstarted"])
@pytest.mark.parametrize("request_id", ["old", "never"])
def test_stale_messages_change_nothing(name: str, request_id: str) -> None:
    stale: list[Message] = [
        Cancel(rid(request_id)),
        Timeout(rid(request_id)),
        ResponseStarted(rid(request_id)),
        Completed(rid(request_id), "late answer", "stop"),
        Failed(rid(request_id), Failure("timeout")),
    ]
    for message in stale:
        session = _states()[name]
        before = session.state
        events = session.when(message)
        if isinstance(message, (Completed, Failed)):
            # recorded for the audit trail, nothing else
            assert len(events) == 1 and isinstance(events[0], CompletionIgnored)
            assert attrs.evolve(session.state, version=before.version) == before
        else:
            assert events == ()
            assert session.state is before


def test_commit_needs_stop_and_text() -> None:
    s = given(Submit(CURRENT, "q"))
    assert s.when(Completed(CURRENT, "  ", "stop")) == (
        TurnDiscarded(CURRENT, "empty", "the answer is empty", 0),
    )
    for finish in ("length", None, "content_filter", "tool_calls", "STOP"):
        s = given(Submit(CURRENT, "q"))
        (ev,) = s.when(Completed(CURRENT, "visible text", finish), preview_chars=12)
        assert isinstance(ev, TurnDiscarded) and ev.reason == "incomplete_finish"
        assert ev.preview_chars == 12
        assert len(s.state.turns) == 0
    s = given(Submit(CURRENT, "q"), ResponseStarted(CURRENT))
    (ev,) = s.when(Completed(CURRENT, "done", "stop", Usage(3, 4, 7)))
    assert ev == TurnCommitted(CURRENT, "done", "stop", Usage(3, 4, 7))
    assert [(t.question, t.answer) for t in s.state.turns] == [("q", "done")]


def test_busy_submit_is_rejected_by_default() -> None:
    s = given(Submit(CURRENT, "q"))
    assert s.when(Submit(rid("second"), "q2")) == (
        TurnRejected(rid("second"), "busy", "request cur is in flight"),
    )
    assert isinstance(s.state, Pending) and s.state.request.request_id == CURRENT
    assert ending_of(s.state, rid("second")) is not None


def test_busy_submit_supersedes_when_the_policy_says_so() -> None:
    s = given(
        Submit(CURRENT, "q"), ResponseStarted(CURRENT), start=Start("", "m", on_busy="supersede")
    )
    events = s.when(Submit(rid("second"), "q2"), preview_chars=5)
    assert [type(e) for e in events] == [TurnDiscarded, TurnSubmitted]
    assert events[0] == TurnDiscarded(CURRENT, "superseded", "by second", 5)
    assert isinstance(s.state, Pending) and s.state.request.request_id == "second"
    # the superseded request's late answer is ignored
    assert s.when(Completed(CURRENT, "late", "stop")) == (CompletionIgnored(CURRENT, "completed"),)
    assert len(s.state.turns) == 0
    s.then_replay_matches()


def test_repeated_request_id_is_idempotent() -> None:
    s = given(Submit(CURRENT, "q"), Completed(CURRENT, "a", "stop"))
    version = s.state.version
    assert s.when(Submit(CURRENT, "q")) == ()
    assert s.when(Submit(CURRENT, "a different question, same id")) == ()
    assert s.state.version == version
    outcome = ending_of(s.state, CURRENT)
    assert outcome is not None and (outcome.kind, outcome.answer) == ("committed", "a")
    # also while the request is still in flight
    s = given(Submit(CURRENT, "q"))
    assert s.when(Submit(CURRENT, "q")) == ()
    assert ending_of(s.state, CURRENT) is not None
    assert ending_of(s.state, CURRENT).kind == "in_flight"  # type: ignore[union-attr]


def test_empty_questions_are_rejected_before_transport() -> None:
    for q in ("", " ", "\n\t \r\n", "\u3000"):
        s = given()
        (ev,) = s.when(Submit(CURRENT, q))
        assert isinstance(ev, TurnRejected) and ev.reason == "empty_question"
        assert isinstance(s.state, Idle)


def test_recovery_closes_a_turn_left_in_flight() -> None:
    for tail in ([], [StreamStarted(CURRENT)]):
        log = [
            SessionStarted("", "m"),
            TurnSubmitted(CURRENT, "q", 0, 0, 50),
            *tail,
        ]
        s = Session(state=initial_state(), log=list(log))
        for ev in log:
            s.state = evolve(s.state, ev)
        assert s.when(Interrupt("recovered in flight")) == (
            TurnDiscarded(CURRENT, "interrupted", "recovered in flight", 0),
        )
        assert isinstance(s.state, Discarded)
        # and nothing to close the second time
        assert s.when(Interrupt()) == ()


def test_cancel_targets_only_its_own_request() -> None:
    s = given(Submit(CURRENT, "q"))
    assert s.when(Cancel(STALE)) == ()
    assert s.when(Cancel(CURRENT)) == (TurnDiscarded(CURRENT, "cancelled", "", 0),)


@pytest.mark.parametrize(
    ("state_name", "event"),
    [
        ("idle", StreamStarted(CURRENT)),
        ("idle", TurnCommitted(CURRENT, "a", "stop")),
        ("committed", TurnDiscarded(CURRENT, "timeout")),
        ("pending", TurnSubmitted(rid("x"), "q", 0, 0, 1)),
        ("pending", TurnCommitted(rid("other"), "a", "stop")),
        ("streaming", StreamStarted(CURRENT)),
        ("idle", SessionStarted("", "m")),
        ("unstarted", TurnSubmitted(rid("x"), "q", 0, 0, 1)),
        ("committed", TurnSubmitted(STALE, "q again", 0, 0, 1)),
        ("committed", TurnRejected(STALE, "busy")),
        ("streaming", TurnRejected(CURRENT, "busy")),
        ("unstarted", CompletionIgnored(STALE, "completed")),
        ("discarded", StreamStarted(STALE)),
        ("idle", BranchSwitched(BranchId("main"))),
        ("committed", BranchSwitched(BranchId("main"))),
        ("committed", BranchSwitched(BranchId("b1"))),
        ("committed", BranchStarted(BranchId("b1"), BranchId("main"), 1, "edit", rid("x"))),
        ("committed", BranchStarted(BranchId("b1"), BranchId("b7"), 0, "edit", rid("x"))),
        ("branched-committed", BranchStarted(BranchId("b1"), BranchId("b1"), 0, "edit", rid("x"))),
        ("pending", BranchStarted(BranchId("b1"), BranchId("main"), 0, "edit", rid("x"))),
        ("branched-pending", BranchSwitched(BranchId("main"))),
    ],
)
def test_impossible_logs_do_not_fold(state_name: str, event: object) -> None:
    state = _states()[state_name].state
    with pytest.raises(ReplayError):
        evolve(state, event)  # type: ignore[arg-type]


def test_events_lead_where_the_event_table_says() -> None:
    for name, session in _states().items():
        for message in _messages("cur") + _messages("new"):
            try:
                events = decide(session.state, message)
            except InvalidCommand:
                continue
            state: SessionState = session.state
            for ev in events:
                before = type(state)
                # None in the table: the event leaves the phase as it was
                expected = EVENT_TRANSITIONS[before][type(ev)] or before
                state = evolve(state, ev)
                assert type(state) is expected, (name, message, ev)


def test_state_diagram_is_drawn_from_the_table() -> None:
    from turnledger.sessions._diagram import state_diagram

    dot = state_diagram()
    for a, row in EVENT_TRANSITIONS.items():
        for ev, b in row.items():
            if b is not None and b is not a:
                assert f'"{a.__name__}" -> "{b.__name__}" [label="{ev.__name__}"]' in dot


def test_pairs_are_exhaustive() -> None:
    # 15 sessions (every phase, tool rounds, branches, pins and summaries
    # included) x 120 messages (40 for each of the current, a finished and an
    # unknown request id): the parametrized test above walks all of them.
    states = _states()
    assert len(states) == 15 and len(_messages("x")) == 40
    assert len(CASES) == 1800
    assert len({case.id for case in CASES}) == 1800
    # every pair of a phase and a kind of message the table knows is tried
    walked = {(type(states[name].state), type(msg)) for name, msg in (c.values for c in CASES)}
    table = {(phase, kind) for phase, row in TRANSITIONS.items() for kind in row}
    assert table <= walked, table - walked
    phases = {type(s.state) for s in states.values()}
    assert phases == set(TRANSITIONS) | {Idle}


def test_text_that_cannot_be_utf8_never_enters_a_session() -> None:
    # A lone surrogate (json.loads('"\\ud800"') gives one) has no UTF-8 form:
    # it could not be sent, measured or stored as text.
    lone = json.loads('"caf\\ud800e"')
    s = given()
    (ev,) = s.when(Submit(rid("q"), lone))
    assert isinstance(ev, TurnRejected) and ev.reason == "invalid_question"
    assert isinstance(s.state, Idle)
    s = given(Submit(CURRENT, "q"))
    (ev,) = s.when(Completed(CURRENT, lone, "stop"))
    assert isinstance(ev, TurnDiscarded) and ev.reason == "malformed"
    assert len(s.state.turns) == 0
    with pytest.raises(InvalidCommand):
        Session().when(Start(lone, "m"))
    s.then_replay_matches()


def test_a_server_finish_reason_is_recorded_only_as_a_short_token() -> None:
    leak = "BODYSECRET Traceback at /srv/app.py token=abc"
    s = given(Submit(CURRENT, "q"))
    (ev,) = s.when(Completed(CURRENT, "text", leak))
    assert isinstance(ev, TurnDiscarded) and ev.detail == "finish_reason=other"
    s = given(Submit(CURRENT, "q"))
    (ev,) = s.when(Completed(CURRENT, "text", "content_filter"))
    assert isinstance(ev, TurnDiscarded) and ev.detail == "finish_reason=content_filter"
