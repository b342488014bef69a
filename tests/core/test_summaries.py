"""Summaries and pinned items in the pure core: the projection against the
naive loop, what a request carries, budgets, bad input and replay."""

from __future__ import annotations

import pytest
from hypothesis import given as hgiven
from hypothesis import settings
from hypothesis import strategies as st

from turnledger import InvalidCommand, SessionBusy, UnknownBranch, UnknownPin, UnknownTurn
from turnledger.events import (
    BranchId,
    PinAdded,
    PinRemoved,
    RequestId,
    SummaryRecorded,
    SummarySent,
    TurnRejected,
    TurnSubmitted,
    Usage,
)
from turnledger.sessions import (
    Budget,
    CharTokenEstimator,
    ChatMessage,
    Completed,
    Edit,
    History,
    JsonChatEncoder,
    Pending,
    Pin,
    RecordSummary,
    Submit,
    Turn,
    Unpin,
    build_messages,
    plan,
    replay,
    request_messages,
)
from turnledger.sessions._projection import naive_plan, pin_messages

from ._given import Session, given, rid

MAIN = BranchId("main")


def _summary(i: int, start: int, end: int, turns: History, text: str) -> SummaryRecorded:
    return SummaryRecorded(
        f"s{i}",
        MAIN,
        start,
        end,
        turns[start].request_id,
        turns[end - 1].request_id,
        text,
        "function",
        "f",
        RequestId(f"sum{i}"),
        None,
        len(text.encode()),
        0,
    )


@settings(max_examples=400, deadline=None)
@hgiven(
    pairs=st.lists(st.tuples(st.text(max_size=30), st.text(max_size=30)), min_size=1, max_size=10),
    spans=st.lists(st.tuples(st.integers(0, 2), st.integers(1, 10), st.text(max_size=60))),
    pins=st.lists(st.text(max_size=40), max_size=3),
    context_start=st.integers(0, 3),
    budget=st.one_of(st.none(), st.integers(0, 900)),
    max_tokens=st.one_of(st.none(), st.integers(0, 200)),
    summary_cap=st.one_of(st.none(), st.integers(0, 20)),
)
def test_projection_with_pins_and_summaries_chooses_what_the_naive_loop_chooses(
    pairs: list[tuple[str, str]],
    spans: list[tuple[int, int, str]],
    pins: list[str],
    context_start: int,
    budget: int | None,
    max_tokens: int | None,
    summary_cap: int | None,
) -> None:
    turns = History([Turn(RequestId(f"r{i}"), q, a) for i, (q, a) in enumerate(pairs)])
    n = len(turns)
    context_start = min(context_start, n)
    summaries = [
        _summary(i, start, min(end, n), turns, text)
        for i, (start, end, text) in enumerate(spans, 1)
        if start < min(end, n)
    ]
    pinned = pin_messages([PinAdded(f"p{i}", t, "memory") for i, t in enumerate(pins)])
    b = Budget(
        budget,
        JsonChatEncoder(),
        max_tokens,
        CharTokenEstimator(2.0),
        max_summary_tokens=summary_cap,
    )
    fast = plan("m", "sys", turns, context_start, "q?", b, pins=pinned, summaries=summaries)
    slow = naive_plan("m", "sys", turns, context_start, "q?", b, pins=pinned, summaries=summaries)
    assert fast == slow
    if not fast.fits:
        return
    carried = list(pinned)
    if fast.summary_id is not None:
        (s,) = [x for x in summaries if x.summary_id == fast.summary_id]
        # it covers every dropped turn and none that is sent
        assert s.start <= context_start and s.end == n - fast.turns_sent
        assert fast.turns_dropped > 0
        carried.append(ChatMessage("user", s.text))
    messages = build_messages("sys", turns, fast.turns_sent, "q?", (), carried)
    assert len(b.encoder.encode("m", messages)) == fast.request_bytes
    assert budget is None or fast.request_bytes <= budget
    assert fast.turns_sent + fast.turns_dropped == n - context_start


def _walk(budget: Budget, turns: int = 6) -> Session:
    s = given(budget=budget)
    for i in range(turns):
        s.when(Submit(rid(f"r{i}"), f"question {i}"))
        s.when(Completed(rid(f"r{i}"), f"answer {i}", "stop"))
    return s


def test_a_pinned_item_goes_right_after_the_system_prompt_and_is_measured() -> None:
    s = _walk(Budget(), 2)
    assert s.when(Pin("p1", "The user's name is Ada.", "memory")) == (
        PinAdded("p1", "The user's name is Ada.", "memory"),
    )
    (sub,) = s.when(Submit(rid("q"), "What is my name?"))
    assert isinstance(sub, TurnSubmitted) and isinstance(s.state, Pending)
    messages = request_messages(s.state)
    assert [(m.role, m.content) for m in messages[:2]] == [
        ("system", "be brief"),
        ("user", "The user's name is Ada."),
    ]
    body = JsonChatEncoder().encode("test-model", messages)
    assert len(body) == sub.request_bytes
    s.when(Completed(rid("q"), "Ada.", "stop"))
    assert s.when(Unpin("p1")) == (PinRemoved("p1"),)
    s.when(Submit(rid("q2"), "And now?"))
    assert isinstance(s.state, Pending)
    assert "The user's name is Ada." not in [m.content for m in request_messages(s.state)]
    s.then_replay_matches()


def test_pins_over_their_own_budget_reject_the_turn_before_transport() -> None:
    s = _walk(Budget(max_pinned_tokens=10), 1)
    s.when(Pin("p1", "x" * 200, "retrieval:doc-7"))
    version = s.state.version
    (ev,) = s.when(Submit(rid("q"), "hello?"))
    assert isinstance(ev, TurnRejected) and ev.reason == "over_budget"
    assert "pinned items need about" in ev.detail and "their budget is 10" in ev.detail
    assert len(s.state.turns) == 1 and s.state.version == version + 1
    # pins count in the request's own cap too: with the system prompt and the
    # question they are mandatory
    s = _walk(Budget(max_request_bytes=300), 1)
    s.when(Pin("p1", "y" * 300, "policy"))
    (ev,) = s.when(Submit(rid("q"), "hello?"))
    assert isinstance(ev, TurnRejected) and ev.reason == "over_budget"
    assert ev.detail.startswith("system prompt, pinned items and question need")
    s.then_replay_matches()


def test_the_newest_covering_summary_is_sent_and_counted_once() -> None:
    s = _walk(Budget(max_request_bytes=420))
    recorded = []
    for i, end in enumerate((4, 4, 2)):
        msg = RecordSummary(rid(f"sum{i}"), MAIN, 0, end, f"summary {i}", "model", "concise")
        (ev,) = s.when(msg)
        assert isinstance(ev, SummaryRecorded) and ev.summary_id == f"s{i + 1}"
        assert ev.first_request_id == "r0" and ev.last_request_id == f"r{end - 1}"
        assert ev.size_bytes == len(f"summary {i}") and ev.estimated_tokens > 0
        recorded.append(ev)
    # recording it again (the same summarizing request) records nothing
    assert s.when(RecordSummary(rid("sum0"), MAIN, 0, 4, "again", "model", "concise")) == ()
    events = s.when(Submit(rid("q"), "go on"))
    assert [type(e) for e in events] == [TurnSubmitted, SummarySent]
    sub = events[0]
    assert isinstance(sub, TurnSubmitted) and (sub.turns_sent, sub.turns_dropped) == (2, 4)
    # s2 is the newest that fits: s3 (turns 0-1) would leave turn 2 out, unsent
    assert events[1] == SummarySent(rid("q"), "s2")
    assert isinstance(s.state, Pending)
    contents = [m.content for m in request_messages(s.state)]
    assert contents == [
        "be brief",
        "summary 1",
        "question 4",
        "answer 4",
        "question 5",
        "answer 5",
        "go on",
    ]
    body = JsonChatEncoder().encode("test-model", request_messages(s.state))
    assert len(body) == sub.request_bytes
    s.then_replay_matches()
    # replay that ignores the summaries: the same history, no summary sent
    plain = replay([e for e in s.log if not isinstance(e, (SummaryRecorded, SummarySent))])
    assert list(plain.turns) == list(s.state.turns)
    assert isinstance(plain, Pending) and plain.request.summary_id is None


def test_no_summary_when_nothing_is_dropped_or_over_its_budget() -> None:
    s = _walk(Budget(), 3)
    s.when(RecordSummary(rid("sum"), MAIN, 0, 2, "summary", "function", "f"))
    assert [type(e) for e in s.when(Submit(rid("q"), "go on"))] == [TurnSubmitted]
    s = _walk(Budget(max_request_bytes=420, max_summary_tokens=3))
    s.when(RecordSummary(rid("sum"), MAIN, 0, 4, "a summary of many words", "function", "f"))
    assert [type(e) for e in s.when(Submit(rid("q"), "go on"))] == [TurnSubmitted]


def test_a_summary_may_arrive_while_a_turn_is_in_flight_and_changes_nothing_of_it() -> None:
    s = _walk(Budget(max_request_bytes=420))
    s.when(Submit(rid("q"), "go on"))
    assert isinstance(s.state, Pending)
    before = request_messages(s.state)
    (ev,) = s.when(RecordSummary(rid("sum"), MAIN, 0, 4, "late summary", "model", "p"))
    assert isinstance(ev, SummaryRecorded)
    assert isinstance(s.state, Pending) and request_messages(s.state) == before
    s.when(Completed(rid("q"), "done", "stop"))
    assert [t.answer for t in s.state.turns][-1] == "done"
    s.then_replay_matches()


def test_bad_input_is_a_typed_error_and_changes_nothing() -> None:
    s = _walk(Budget(), 2)
    before = s.state
    cases: list[tuple[object, type[Exception]]] = [
        (RecordSummary(rid("x"), MAIN, 0, 3, "t", "model", "p"), UnknownTurn),
        (RecordSummary(rid("x"), MAIN, 2, 2, "t", "model", "p"), UnknownTurn),
        (RecordSummary(rid("x"), MAIN, -1, 1, "t", "model", "p"), UnknownTurn),
        (RecordSummary(rid("x"), BranchId("b4"), 0, 1, "t", "model", "p"), UnknownBranch),
        (RecordSummary(rid("x"), MAIN, 0, 1, "  ", "model", "p"), InvalidCommand),
        (RecordSummary(rid("x"), MAIN, 0, 1, "t", "oracle", "p"), InvalidCommand),  # type: ignore[arg-type]
        (RecordSummary(rid("x"), MAIN, 0, 1, "t", "model", ""), InvalidCommand),
        (Unpin("p9"), UnknownPin),
        (Pin("", "t", "memory"), InvalidCommand),
        (Pin("p1", "", "memory"), InvalidCommand),
        (Pin("p1", "t", " "), InvalidCommand),
    ]
    for msg, error in cases:
        with pytest.raises(error):
            s.when(msg)  # type: ignore[arg-type]
        assert s.state is before and len(s.log) == len(s.log)
    s.when(Pin("p1", "t", "memory"))
    with pytest.raises(InvalidCommand, match="already has"):
        s.when(Pin("p1", "other", "memory"))
    # while a turn is in flight a pin waits (SessionBusy); the request keeps its pins
    s.when(Submit(rid("q"), "?"))
    busy = s.state
    for msg in (Pin("p2", "t", "memory"), Unpin("p1")):
        with pytest.raises(SessionBusy):
            s.when(msg)
        assert s.state is busy
    s.then_replay_matches()


def test_summary_usage_and_origin_are_recorded() -> None:
    s = _walk(Budget(), 2)
    msg = RecordSummary(rid("sum"), MAIN, 0, 2, "two turns", "model", "concise", Usage(40, 8, 48))
    (ev,) = s.when(msg)
    assert isinstance(ev, SummaryRecorded)
    assert (ev.origin, ev.origin_name, ev.request_id, ev.usage) == (
        "model",
        "concise",
        "sum",
        Usage(40, 8, 48),
    )
    s.then_replay_matches()


def test_a_summary_of_another_branchs_turns_is_never_sent() -> None:
    s = _walk(Budget(max_request_bytes=420))
    s.when(RecordSummary(rid("sum-main"), MAIN, 0, 4, "turns 0-3 of main", "function", "f"))
    # b1 keeps turns 0 and 1 of main, then goes on with turns of its own
    s.when(Edit(rid("e"), 2, "question 2, asked differently"))
    s.when(Completed(rid("e"), "answer 2 on b1", "stop"))
    for i in range(3, 6):
        s.when(Submit(rid(f"b{i}"), f"question {i} on b1"))
        s.when(Completed(rid(f"b{i}"), f"answer {i} on b1", "stop"))
    events = s.when(Submit(rid("q"), "go on"))
    (sub,) = events
    # turns are dropped, and the summary's place on b1 would fit (end 4 is
    # past the first sent turn): but b1's turn 3 is not main's, so never
    assert isinstance(sub, TurnSubmitted) and sub.turns_dropped >= 1
    assert len(s.state.turns) - sub.turns_sent <= 4
    assert s.state.active_branch == "b1"
    assert "turns 0-3 of main" not in [m.content for m in request_messages(s.state)]  # type: ignore[arg-type]
    # a summary of b1's own turns 0-4 is sent
    s.when(Completed(rid("q"), "done", "stop"))
    s.when(RecordSummary(rid("sum-b1"), BranchId("b1"), 0, 5, "turns 0-4 of b1", "model", "p"))
    events = s.when(Submit(rid("q2"), "and then?"))
    assert [type(e) for e in events] == [TurnSubmitted, SummarySent]
    assert events[1] == SummarySent(rid("q2"), "s2")
    s.then_replay_matches()
