"""Context windows in the pure core: the token budget, calibration, overflow."""

from __future__ import annotations

import attrs
import pytest
from hypothesis import given as hgiven
from hypothesis import settings
from hypothesis import strategies as st

from turnledger import InvalidCommand
from turnledger.events import (
    DEFAULT_CODEC,
    CompletionIgnored,
    Ledger,
    RequestId,
    SessionStarted,
    TurnCommitted,
    TurnDiscarded,
    TurnRejected,
    TurnRetried,
    TurnSubmitted,
    Usage,
    Window,
)
from turnledger.sessions import (
    Budget,
    CharTokenEstimator,
    Completed,
    Failed,
    Failure,
    Pending,
    ResponseStarted,
    Start,
    Submit,
    prompt_token_cap,
    replay,
    request_messages,
)
from turnledger.sessions._projection import naive_plan

from ._given import Session, given, rid

EST = CharTokenEstimator()


def _expected_tokens(system: str, sent: list[tuple[str, str]], question: str) -> int:
    """The default estimate of a request, computed by hand from its texts:
    3 tokens a request, and for each message 4 plus a token for every 4
    characters begun (the rule CharTokenEstimator documents)."""
    texts = [system] if system else []  # no system message for an empty prompt
    texts += [text for pair in sent for text in pair] + [question]
    return 3 + sum(4 + -(-len(text) // 4) for text in texts)


def _tokens(state: Pending) -> int:
    """The expected estimate of the request in flight (no tool rounds): from
    the turns it sent and its question, not from the messages the machine
    built."""
    assert state.config is not None and not state.request.rounds
    context = state.context
    sent = [(t.question, t.answer) for t in context[len(context) - state.request.turns_sent :]]
    return _expected_tokens(state.config.system, sent, state.request.question)


def _windowed(window: int = 400, reserve: int = 100) -> Session:
    return given(
        start=Start(
            "sys",
            "m",
            Ledger(),
            "reject",
            context_window=window,
            output_reserve=reserve,
            window_source="user",
        )
    )


def _turn(s: Session, name: str, question: str, answer: str, usage: Usage | None = None) -> None:
    s.when(Submit(rid(name), question))
    s.when(Completed(rid(name), answer, "stop", usage))


def test_session_started_records_window_reserve_and_source() -> None:
    s = _windowed(2048, 512)
    assert s.log[0] == SessionStarted(
        "sys",
        "m",
        Ledger(),
        "reject",
        context_window=2048,
        output_reserve=512,
        window_source="user",
    )
    assert prompt_token_cap(s.state, Budget()) == 2048 - 512


@pytest.mark.parametrize(
    ("window", "reserve", "source"),
    [
        (0, 0, "user"),
        (100, 100, "user"),
        (100, -1, "user"),
        (100, None, "user"),
        (None, 10, "none"),
        (None, None, "user"),
        (100, 10, "none"),
    ],
)
def test_a_bad_window_is_refused(window: int | None, reserve: int | None, source: str) -> None:
    s = Session()
    with pytest.raises(InvalidCommand):
        s.when(
            Start(
                "",
                "m",
                Ledger(),
                "reject",
                context_window=window,
                output_reserve=reserve,
                window_source=source,
            )
        )  # type: ignore[arg-type]
    assert s.log == []


def test_submitted_records_the_estimate_of_the_request_sent() -> None:
    s = _windowed()
    _turn(s, "a", "hello there", "hi")
    (ev,) = s.when(Submit(rid("b"), "and again?"))
    assert isinstance(ev, TurnSubmitted) and isinstance(s.state, Pending)
    assert ev.estimated_prompt_tokens == _tokens(s.state)


def test_old_turns_drop_whole_to_fit_the_window() -> None:
    s = _windowed(window=200, reserve=50)
    for i in range(10):
        _turn(s, f"t{i}", f"question {i} " + "q" * 100, "answer " + "a" * 100)
    (ev,) = s.when(Submit(rid("x"), "last?"))
    assert isinstance(ev, TurnSubmitted) and ev.estimated_prompt_tokens is not None
    assert 0 < ev.turns_sent < 10 and ev.turns_sent + ev.turns_dropped == 10
    assert ev.estimated_prompt_tokens <= 150
    assert len(s.state.turns) == 10


def test_calibration_takes_the_conservative_side() -> None:
    s = _windowed(window=1000, reserve=200)
    _turn(s, "a", "x" * 400, "ok")  # no usage reported: no calibration
    assert s.state.calibration is None
    assert prompt_token_cap(s.state, Budget()) == 800
    # the server counted twice the estimate (a tokenizer of 2 bytes a token)
    s.when(Submit(rid("b"), "y"))
    assert isinstance(s.state, Pending)
    s.when(Completed(rid("b"), "ok", "stop", Usage(2 * _tokens(s.state), 1, None)))
    assert prompt_token_cap(s.state, Budget()) == 400
    # a later, smaller ratio does not loosen it
    s.when(Submit(rid("c"), "z"))
    assert isinstance(s.state, Pending)
    s.when(Completed(rid("c"), "ok", "stop", Usage(_tokens(s.state), 1, None)))
    assert prompt_token_cap(s.state, Budget()) == 400
    # and the hub's own cap still applies when it is smaller
    assert prompt_token_cap(s.state, Budget(max_prompt_tokens=300)) == 300
    s.then_replay_matches()


def test_absurd_usage_is_bounded() -> None:
    s = _windowed(window=1000, reserve=200)
    _turn(s, "a", "q", "ok", Usage(10**12, 1, None))
    assert prompt_token_cap(s.state, Budget()) == 800 // 4
    _turn(s, "b", "q", "ok", Usage(0, 1, None))  # zero: ignored, not a division
    assert prompt_token_cap(s.state, Budget()) == 800 // 4


def test_overflow_before_any_byte_retries_once_with_a_smaller_projection() -> None:
    s = _windowed(window=4000, reserve=100)
    for i in range(6):
        _turn(s, f"t{i}", "question " + "q" * 200, "answer " + "a" * 200)
    s.when(Submit(rid("x"), "next?"))
    first = s.state
    assert isinstance(first, Pending)
    largest = first.largest_ok  # the largest request that committed
    assert 0 < largest < (first.request.estimated_prompt_tokens or 0)
    (retry,) = s.when(Failed(rid("x"), Failure("context_overflow", "HTTP 400")))
    assert isinstance(retry, TurnRetried) and retry.request_id == "x"
    # below the size that failed: the largest that committed, being smaller
    assert s.state.overflow_cap == largest
    assert retry.estimated_prompt_tokens <= largest
    assert retry.turns_sent < first.request.turns_sent
    assert retry.estimated_prompt_tokens < (first.request.estimated_prompt_tokens or 0)
    assert isinstance(s.state, Pending) and s.state.request.attempt == 2
    assert s.state.request.turns_sent == retry.turns_sent
    # a second overflow of the same turn ends it
    (ev,) = s.when(Failed(rid("x"), Failure("context_overflow", "HTTP 400")))
    assert isinstance(ev, TurnDiscarded) and ev.reason == "context_overflow"
    assert len(s.state.turns) == 6
    s.then_replay_matches()


def test_no_retry_once_something_was_shown() -> None:
    s = _windowed(window=4000, reserve=100)
    _turn(s, "a", "q" * 300, "a" * 300)
    s.when(Submit(rid("x"), "next?"))
    s.when(ResponseStarted(rid("x")))
    (ev,) = s.when(Failed(rid("x"), Failure("context_overflow", "")), preview_chars=3)
    assert ev == TurnDiscarded(rid("x"), "context_overflow", "", 3)
    # the budget still shrank below the request that failed
    cap = prompt_token_cap(s.state, Budget())
    assert cap is not None and cap < _tokens_of(s, "x")


def _tokens_of(s: Session, request_id: str) -> int:
    for ev in s.log:
        if isinstance(ev, TurnSubmitted) and ev.request_id == request_id:
            assert ev.estimated_prompt_tokens is not None
            return ev.estimated_prompt_tokens
    raise AssertionError(request_id)


def test_a_silent_failure_of_a_larger_request_is_an_overflow() -> None:
    s = _windowed(window=100_000, reserve=100)
    _turn(s, "a", "q" * 300, "a" * 300)
    s.when(Submit(rid("x"), "next?"))
    s.when(ResponseStarted(rid("x")))
    (ev,) = s.when(Failed(rid("x"), Failure("incomplete_stream", "no [DONE]")))
    assert isinstance(ev, TurnRetried) and ev.reason == "context_overflow"
    assert "larger than any that committed" in ev.detail
    assert ev.turns_sent == 0
    # the retried request fits what committed before
    s.when(Completed(rid("x"), "fine", "stop"))
    assert [t.request_id for t in s.state.turns] == ["a", "x"]
    s.then_replay_matches()


def test_a_silent_failure_of_a_request_no_larger_stays_what_it_was() -> None:
    s = _windowed(window=100_000, reserve=100)
    _turn(s, "a", "q" * 300, "a" * 300)
    s.when(Submit(rid("x"), "tiny"))  # one turn + a short question: larger
    (retry,) = s.when(Failed(rid("x"), Failure("transport", "read error")))
    assert isinstance(retry, TurnRetried)
    s.when(Completed(rid("x"), "ok", "stop"))
    # the cap now is the largest request that committed: no request is larger
    s.when(Submit(rid("y"), "tiny"))
    assert _tokens_of(s, "y") <= _tokens_of(s, "a")
    (ev,) = s.when(Failed(rid("y"), Failure("transport", "read error")))
    assert ev == TurnDiscarded(rid("y"), "transport", "read error", 0)


def test_after_an_overflow_the_next_submit_fits_below_the_failed_size() -> None:
    s = _windowed(window=10_000, reserve=100)
    for i in range(4):
        _turn(s, f"t{i}", "q" * 200, "a" * 200)
    s.when(Submit(rid("x"), "big?"))
    s.when(ResponseStarted(rid("x")))
    s.when(Failed(rid("x"), Failure("context_overflow", "")), preview_chars=5)
    failed = _tokens_of(s, "x")
    (ev,) = s.when(Submit(rid("y"), "big?"))
    assert isinstance(ev, TurnSubmitted) and ev.estimated_prompt_tokens is not None
    assert ev.estimated_prompt_tokens < failed


def test_old_session_started_payload_has_no_window() -> None:
    payload = {"system": "s", "model": "m", "policy": {"kind": "ledger"}, "on_busy": "reject"}
    ev = DEFAULT_CODEC.from_payload("session_started", 2, payload)
    assert ev == SessionStarted(
        "s", "m", Ledger(), "reject", context_window=None, output_reserve=None, window_source="none"
    )
    sub = DEFAULT_CODEC.from_payload(
        "turn_submitted",
        1,
        {"request_id": "r", "question": "q", "turns_sent": 0, "turns_dropped": 0}
        | {"request_bytes": 9},
    )
    assert sub == TurnSubmitted(rid("r"), "q", 0, 0, 9, None)
    ign = DEFAULT_CODEC.from_payload("completion_ignored", 1, {"request_id": "r", "outcome": "x"})
    assert ign.usage is None  # type: ignore[union-attr]
    state = replay([ev, sub])
    assert prompt_token_cap(state, Budget()) is None


# --- the property --------------------------------------------------------

texts = st.text(alphabet="ab 你🌱\n", min_size=1, max_size=300).filter(lambda t: bool(t.strip()))


@settings(max_examples=300, deadline=None)
@hgiven(
    window=st.integers(60, 3000),
    reserve_share=st.floats(0.0, 0.9),
    ratios=st.lists(st.fractions(min_value="1/8", max_value=8), min_size=0, max_size=4),
    turns=st.lists(st.tuples(texts, texts), min_size=0, max_size=12),
    question=texts,
    policy=st.one_of(st.just(Ledger()), st.builds(Window, st.integers(1, 6))),
    byte_cap=st.one_of(st.none(), st.integers(100, 5000)),
)
def test_the_calibrated_estimate_never_exceeds_the_room(
    window: int,
    reserve_share: float,
    ratios: list,  # type: ignore[type-arg]
    turns: list[tuple[str, str]],
    question: str,
    policy: Ledger | Window,
    byte_cap: int | None,
) -> None:
    reserve = min(int(window * reserve_share), window - 1)
    s = given(
        start=Start(
            "sys",
            "m",
            policy,
            "reject",
            context_window=window,
            output_reserve=reserve,
            window_source="fallback",
        )
    )
    s.budget = Budget(byte_cap)
    committed: list[tuple[str, str]] = []
    for i, (q, a) in enumerate(turns):
        events = s.when(Submit(rid(f"t{i}"), q))
        if not any(isinstance(e, TurnSubmitted) for e in events):
            continue
        # the server reports the estimate times some ratio
        state = s.state
        assert isinstance(state, Pending)
        ratio = ratios[i % len(ratios)] if ratios else None
        reported = None if ratio is None else int(_tokens(state) * ratio)
        s.when(Completed(rid(f"t{i}"), a, "stop", Usage(reported, 1, None)))
        committed.append((q, a))
    before = s.state
    events = s.when(Submit(rid("q"), question))
    # history never loses a committed turn, whatever was projected
    assert [(t.question, t.answer) for t in s.state.turns] == committed
    sub = [e for e in events if isinstance(e, TurnSubmitted)]
    if not sub:
        return
    (ev,) = sub
    assert ev.estimated_prompt_tokens is not None
    reported, estimated = before.calibration or (1, 1)
    # the calibrated estimate fits the window minus the reserve
    assert ev.estimated_prompt_tokens * reported <= (window - reserve) * estimated
    state = s.state
    assert isinstance(state, Pending)
    messages = request_messages(state)
    # seeds 000 / 003: the system prompt is never dropped, the question never
    # cut, turns go whole and are the newest contiguous run of the context
    assert messages[0].content == "sys" and messages[-1].content == question
    assert (len(messages) - 2) % 2 == 0 and (len(messages) - 2) // 2 == ev.turns_sent
    context = before.context
    sent = [(messages[k].content, messages[k + 1].content) for k in range(1, len(messages) - 1, 2)]
    assert sent == [(t.question, t.answer) for t in context[len(context) - ev.turns_sent :]]
    assert ev.turns_sent + ev.turns_dropped == len(context)
    assert ev.estimated_prompt_tokens == _tokens(state)
    # exactly what the naive reference gives under the same caps
    ref = naive_plan(
        "m",
        "sys",
        before.turns,
        before.context_start,
        question,
        attrs.evolve(s.budget, max_prompt_tokens=prompt_token_cap(before, s.budget)),
    )
    assert (ref.turns_sent, ref.request_bytes) == (ev.turns_sent, ev.request_bytes)
    if byte_cap is not None:
        assert ev.request_bytes <= byte_cap
    s.then_replay_matches()
    for e in s.log:
        assert DEFAULT_CODEC.from_payload(*DEFAULT_CODEC.to_payload(e)) == e


def test_committed_usage_is_recorded() -> None:
    s = _windowed()
    _turn(s, "a", "q", "ok", Usage(12, 3, 15))
    assert s.log[-1] == TurnCommitted(rid("a"), "ok", "stop", Usage(12, 3, 15))
    # a late answer is still paid for
    (ev,) = s.when(Completed(rid("a"), "again", "stop", Usage(20, 4, 24)))
    assert ev == CompletionIgnored(RequestId("a"), "completed", Usage(20, 4, 24))


def test_an_overflow_with_nothing_smaller_to_send_caps_at_three_quarters() -> None:
    # The first turn overflows: no turn committed, nothing to drop, so no
    # retry; the next request may have at most 3/4 of the estimate that failed.
    s = _windowed(window=4000, reserve=100)
    (sub,) = s.when(Submit(rid("x"), "q" * 400))
    assert isinstance(sub, TurnSubmitted) and sub.estimated_prompt_tokens is not None
    failed = sub.estimated_prompt_tokens
    (ev,) = s.when(Failed(rid("x"), Failure("context_overflow", "HTTP 400")))
    assert isinstance(ev, TurnDiscarded) and ev.reason == "context_overflow"
    assert s.state.overflow_cap == failed * 3 // 4
    assert prompt_token_cap(s.state, Budget()) == failed * 3 // 4
    # the same question no longer fits; a question of 3/4 the size does
    (again,) = s.when(Submit(rid("y"), "q" * 400))
    assert isinstance(again, TurnRejected) and again.reason == "over_budget"
    assert again.detail.endswith(f"the budget is {failed * 3 // 4}")
    # the longest question that fits: 3 + (4 + 1) for "sys" + 4 + len/4 tokens
    longest = "q" * ((failed * 3 // 4 - 12) * 4)
    assert _expected_tokens("sys", [], longest) == failed * 3 // 4
    (fits,) = s.when(Submit(rid("z"), longest))
    assert isinstance(fits, TurnSubmitted), fits
    assert fits.estimated_prompt_tokens == failed * 3 // 4
    s.then_replay_matches()


def test_an_overflow_retries_below_three_quarters_of_the_failed_request() -> None:
    # Window(1): the next request sends only the last turn, so it is smaller
    # than the largest that committed; the cap after its overflow is then
    # 3/4 of its own estimate, and the retry fits below it by dropping that turn.
    s = given(
        start=Start(
            "sys", "m", Window(1), "reject",
            context_window=100_000, output_reserve=100, window_source="user",
        )
    )  # fmt: skip
    _turn(s, "a", "big " * 500, "ok")
    _turn(s, "b", "small", "ok")  # sent with "a": the largest request that committed
    largest = s.state.largest_ok
    (sub,) = s.when(Submit(rid("x"), "and now?"))  # sends only "b"
    assert isinstance(sub, TurnSubmitted) and sub.turns_sent == 1
    failed = sub.estimated_prompt_tokens
    assert failed is not None and failed < largest
    (retry,) = s.when(Failed(rid("x"), Failure("context_overflow", "HTTP 400")))
    assert isinstance(retry, TurnRetried) and retry.turns_sent == 0
    assert s.state.overflow_cap == failed * 3 // 4
    assert retry.estimated_prompt_tokens <= failed * 3 // 4
    assert retry.estimated_prompt_tokens == _expected_tokens("sys", [], "and now?")
    s.when(Completed(rid("x"), "fine", "stop"))
    assert [t.request_id for t in s.state.turns] == ["a", "b", "x"]
    s.then_replay_matches()
