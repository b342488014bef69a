"""Property tests of the pure core over random message sequences."""

from __future__ import annotations

from typing import Any

import attrs
from hypothesis import event as hevent
from hypothesis import given as hgiven
from hypothesis import settings
from hypothesis import strategies as st

from turnledger.events import (
    DEFAULT_CODEC,
    Ledger,
    RequestId,
    TurnCommitted,
    TurnDiscarded,
    TurnRejected,
    TurnRetried,
    TurnSubmitted,
    Window,
)
from turnledger.sessions import (
    Budget,
    Cancel,
    Completed,
    Failed,
    Failure,
    Interrupt,
    Message,
    ResponseStarted,
    Start,
    Submit,
    Timeout,
    is_in_flight,
    prompt_token_cap,
    replay,
)
from turnledger.sessions._projection import naive_plan

from ._given import Session
from ._reference import meaning, observed

IDS = [RequestId(f"r{i}") for i in range(6)]
# Sentinels resolved when the message is delivered, so that random scripts
# talk about the request in flight (and fresh ones) often enough to commit.
CUR = RequestId("<current>")
NEW = RequestId("<new>")
ids = st.sampled_from([*IDS[:3], CUR, CUR, CUR])
submit_ids = st.sampled_from([*IDS[:3], NEW, NEW, NEW])
texts = st.sampled_from(
    ["", "  ", "short", "another", "长一点的问题，带“引号”和\n换行 🌱", "x" * 120]
)
finish = st.sampled_from(["stop"] * 6 + ["length", None, "content_filter"])
reasons = st.sampled_from(
    ["http_status", "transport", "timeout", "protocol", "malformed", "limit", "context_overflow"]
)

answers = st.sampled_from(["", " ", "ok", "fine", "答案：“是的”🌱\n第二行", "y" * 150, "z\t\x01"])
_KINDS: dict[str, st.SearchStrategy[Message]] = {
    "submit": st.builds(Submit, submit_ids, texts),
    "cancel": st.builds(Cancel, st.none() | ids),
    "timeout": st.builds(Timeout, ids, st.sampled_from(["deadline", "idle"])),
    "interrupt": st.builds(Interrupt),
    "started": st.builds(ResponseStarted, ids),
    "completed": st.builds(Completed, ids, answers, finish),
    "failed": st.builds(Failed, ids, st.builds(Failure, reasons)),
}
# Weighted: submissions and completions are what make histories interesting.
_WEIGHTS = (
    ["submit"] * 4
    + ["completed"] * 4
    + ["started"] * 2
    + [
        "cancel",
        "timeout",
        "interrupt",
        "failed",
    ]
)
messages: st.SearchStrategy[Message] = st.sampled_from(_WEIGHTS).flatmap(_KINDS.__getitem__)
# A whole well-behaved turn, so that scripts build up real histories.
whole_turn = st.builds(
    lambda q, a: [Submit(NEW, q), ResponseStarted(CUR), Completed(CUR, a, "stop")], texts, answers
)
scripts = st.lists(st.one_of(messages.map(lambda m: [m]), whole_turn), min_size=3, max_size=25).map(
    lambda chunks: [m for chunk in chunks for m in chunk]
)
starts = st.builds(
    Start,
    st.sampled_from(["", "system prompt", "系统"]),
    st.just("m"),
    st.one_of(st.just(Ledger()), st.builds(Window, st.integers(1, 4))),
    st.sampled_from(["reject", "supersede"]),
)
budgets = st.one_of(st.none(), st.integers(60, 900), st.integers(300, 2000))


@attrs.define
class Oracle:
    """An independent, naive model of what committed history must be."""

    in_flight: RequestId | None = None
    question: str = ""
    seen: set[RequestId] = attrs.field(factory=set)
    history: list[tuple[str, str]] = attrs.field(factory=list)


def _check_log_invariants(log: list[Any]) -> None:
    outcomes: dict[str, int] = {}
    submitted: list[str] = []
    for ev in log:
        if isinstance(ev, TurnSubmitted):
            assert ev.request_id not in outcomes and ev.request_id not in submitted
            submitted.append(ev.request_id)
            outcomes[ev.request_id] = 0
        elif isinstance(ev, (TurnCommitted, TurnDiscarded)):
            # an outcome only ever follows its own submission
            assert ev.request_id in outcomes
            outcomes[ev.request_id] += 1
    # (2) at most one outcome each; exactly one for all but the last when in flight
    assert all(n <= 1 for n in outcomes.values())
    unfinished = [r for r, n in outcomes.items() if n == 0]
    assert unfinished in ([], submitted[-1:])


@settings(max_examples=500)
@hgiven(start=starts, budget=budgets, script=scripts)
def test_random_sequences_keep_the_invariants(
    start: Start, budget: int | None, script: list[Message]
) -> None:
    s = Session(budget=Budget(budget))
    s.when(start)
    oracle = Oracle()
    fresh = 0
    for msg in script:
        rid = getattr(msg, "request_id", None)
        if rid == CUR:
            current = s.state.request.request_id if is_in_flight(s.state) else IDS[0]  # type: ignore[union-attr]
            msg = attrs.evolve(msg, request_id=current)  # type: ignore[misc]
        elif rid == NEW:
            fresh += 1
            msg = attrs.evolve(msg, request_id=RequestId(f"n{fresh}"))  # type: ignore[misc]
        before = s.state
        events = s.when(msg)
        after = s.state

        # (3) replay equals the live state at every step, and that state
        # says what the log means by the independent reference fold
        assert replay(s.log) == after
        assert observed(after) == meaning(s.log)
        _check_log_invariants(s.log)

        # the oracle: only a well-formed Completed for the request in flight commits
        if isinstance(msg, Completed) and msg.request_id == oracle.in_flight:
            if msg.answer.strip() and msg.finish_reason == "stop":
                oracle.history.append((oracle.question, msg.answer))
            oracle.in_flight = None
        elif any(isinstance(e, TurnRetried) for e in events):
            # a context overflow before anything was shown: the same turn goes out again
            assert isinstance(msg, Failed) and msg.request_id == oracle.in_flight
        elif (
            (isinstance(msg, Failed | Timeout) and msg.request_id == oracle.in_flight)
            or isinstance(msg, Interrupt)
            or (isinstance(msg, Cancel) and msg.request_id in (None, oracle.in_flight))
        ):
            oracle.in_flight = None
        elif isinstance(msg, Submit) and msg.request_id not in oracle.seen:
            oracle.seen.add(msg.request_id)
            accepted = any(isinstance(e, TurnSubmitted) for e in events)
            if accepted:
                oracle.in_flight, oracle.question = msg.request_id, msg.question
        # (1) history holds only accepted whole pairs, in order
        assert [(t.question, t.answer) for t in after.turns] == oracle.history
        assert all(t.answer.strip() for t in after.turns)
        assert (after.request.request_id if is_in_flight(after) else None) == oracle.in_flight  # type: ignore[union-attr]

        # (4) nothing but a commit changes history or its window, whatever was trimmed
        if not any(isinstance(e, TurnCommitted) for e in events):
            assert after.turns == before.turns
            assert after.context_start == before.context_start
        # messages for a request other than the one in flight change nothing
        stale_id = getattr(msg, "request_id", None)
        current = before.request.request_id if is_in_flight(before) else None  # type: ignore[union-attr]
        if not isinstance(msg, Submit) and stale_id is not None and stale_id != current:
            assert attrs.evolve(after, version=before.version) == before

        # every TurnSubmitted's bookkeeping is exactly what a naive projection gives
        for ev in events:
            if isinstance(ev, TurnSubmitted):
                assert start.system is not None
                ref = naive_plan(
                    "m",
                    start.system,
                    before.turns,
                    before.context_start,
                    ev.question,
                    Budget(budget, max_prompt_tokens=prompt_token_cap(before, Budget(budget))),
                )
                assert (ev.turns_sent, ev.turns_dropped, ev.request_bytes) == (
                    ref.turns_sent,
                    ref.turns_dropped,
                    ref.request_bytes,
                )
            if isinstance(ev, TurnRejected) and ev.reason == "over_budget":
                assert budget is not None or before.overflow_cap is not None
        # every event survives the codec
        for ev in events:
            assert DEFAULT_CODEC.from_payload(*DEFAULT_CODEC.to_payload(ev)) == ev

    for kind in sorted({type(e).__name__ for e in s.log}):
        hevent(kind)
    # (2) once the session is at rest every submitted turn has exactly one outcome
    s.when(Interrupt("end of test"))
    _check_log_invariants(s.log)
    assert not is_in_flight(s.state)


@settings(max_examples=500)
@hgiven(
    start=starts,
    budget=st.integers(60, 400),
    answers=st.lists(texts.filter(lambda t: bool(t.strip())), min_size=1, max_size=8),
    failure=st.sampled_from(
        [Timeout(IDS[5]), Cancel(), Interrupt(), Failed(IDS[5], Failure("http_status"))]
    ),
)
def test_a_failure_after_a_trim_leaves_history_as_it_was(
    start: Start, budget: int, answers: list[str], failure: Message
) -> None:
    # Seed 000's "trim, then time out": commit long answers without a budget,
    # then submit under a budget that forces a trim, and fail the request.
    s = Session(budget=Budget(None))
    s.when(start)
    for i, answer in enumerate(answers):
        s.when(Submit(RequestId(f"a{i}"), f"q{i}"))
        s.when(Completed(RequestId(f"a{i}"), answer, "stop"))
    before = s.state
    s.budget = Budget(budget)
    events = s.when(Submit(IDS[5], "and now?"))
    if not any(isinstance(e, TurnSubmitted) for e in events):
        return  # rejected before transport: also nothing changed
    s.when(failure)
    assert not is_in_flight(s.state)
    assert s.state.turns == before.turns
    assert s.state.context == before.context
    s.then_replay_matches()
