"""Tool-call turns in the pure core: rounds, fencing, atomic commit, projection."""

from __future__ import annotations

import json

import pytest
from hypothesis import event as hyp_event
from hypothesis import given as hyp_given
from hypothesis import settings
from hypothesis import strategies as st

from turnledger import InvalidCommand
from turnledger.events import (
    DEFAULT_CODEC,
    CompletionIgnored,
    SessionStarted,
    ToolCall,
    ToolResultRecorded,
    ToolRoundSubmitted,
    ToolSpec,
    TurnCommitted,
    TurnDiscarded,
    TurnRetried,
    Window,
)
from turnledger.sessions import (
    AwaitingTools,
    Budget,
    Cancel,
    ChatMessage,
    Committed,
    Completed,
    Discarded,
    Failed,
    Failure,
    Interrupt,
    JsonChatEncoder,
    Pending,
    ResponseStarted,
    Start,
    Submit,
    Timeout,
    ToolDone,
    build_messages,
    is_in_flight,
    plan,
    replay,
    request_messages,
)
from turnledger.sessions._machine import MAX_TOOL_RESULT_BYTES

from ._given import Session, given, rid
from ._reference import meaning

R = rid("r")
TOOLS = (
    ToolSpec("clock", "the time", '{"type":"object","properties":{}}'),
    ToolSpec("calc", "arithmetic", '{"type":"object","properties":{"expr":{"type":"string"}}}'),
)


def start(**kw: object) -> Start:
    return Start("be brief", "m", tools=TOOLS, **kw)  # type: ignore[arg-type]


def calls(round_: int, n: int = 1) -> tuple[ToolCall, ...]:
    return tuple(ToolCall(f"r{round_}c{i}", "calc", f'{{"expr":"{i}+{i}"}}') for i in range(n))


def assert_paired(messages: list[ChatMessage]) -> None:
    """Every tool call is answered right after its assistant message, and
    every tool message answers a call of that message."""
    i = 0
    while i < len(messages):
        m = messages[i]
        assert m.role != "tool", "a tool result without its call"
        if m.tool_calls:
            ids = [c.call_id for c in m.tool_calls]
            results = messages[i + 1 : i + 1 + len(ids)]
            assert [r.role for r in results] == ["tool"] * len(ids), "a call without its result"
            assert [r.tool_call_id for r in results] == ids
            i += len(ids)
        i += 1


def three_rounds(s: Session) -> None:
    s.when(Submit(R, "what is 1+1, 2+2 and the time?"))
    for rnd in range(3):
        s.when(ResponseStarted(R, rnd))
        s.when(Completed(R, "", "tool_calls", round=rnd, tool_calls=calls(rnd, rnd + 1)))
        for c in calls(rnd, rnd + 1):
            s.when(ToolDone(R, c.call_id, f"result of {c.call_id}", duration_ms=3))
        assert isinstance(s.state, Pending) and s.state.request.round == rnd + 1
        assert_paired(request_messages(s.state))
    s.when(ResponseStarted(R, 3))
    s.when(Completed(R, "2, 4 and noon", "stop", round=3))


def test_a_three_round_turn_commits_as_one_unit() -> None:
    s = given(start=start())
    three_rounds(s)
    assert isinstance(s.state, Committed)
    (turn,) = s.state.turns
    assert turn.answer == "2, 4 and noon"
    assert [len(r.calls) for r in turn.rounds] == [1, 2, 3]
    # nothing of the turn was history before the commit: one TurnCommitted
    commits = [e for e in s.log if isinstance(e, TurnCommitted)]
    assert len(commits) == 1 and commits[0] is s.log[-1]
    kinds = [type(e).__name__ for e in s.log]
    assert kinds.count("ToolCallsRequested") == 3 and kinds.count("ToolRoundSubmitted") == 3
    s.then_replay_matches()
    # the next request carries the whole turn, every call paired with its result
    s.when(Submit(rid("next"), "thanks"))
    assert isinstance(s.state, Pending)
    msgs = request_messages(s.state)
    assert_paired(msgs)
    assert [m.role for m in msgs] == [
        "system",
        "user",
        *(["assistant", "tool"] + ["assistant", "tool", "tool"] + ["assistant"] + ["tool"] * 3),
        "assistant",
        "user",
    ]


def test_each_round_request_is_measured_exactly() -> None:
    s = given(start=start())
    s.when(Submit(R, "q"))
    s.when(Completed(R, "let me see", "tool_calls", tool_calls=calls(0, 2)))
    events = s.when(ToolDone(R, "r0c0", "0")) + s.when(ToolDone(R, "r0c1", "2"))
    submitted = events[-1]
    assert isinstance(submitted, ToolRoundSubmitted) and submitted.round == 1
    assert isinstance(s.state, Pending)
    body = JsonChatEncoder().encode("m", request_messages(s.state), TOOLS)
    assert len(body) == submitted.request_bytes
    wire = json.loads(body)
    assert wire["tools"][1]["function"]["name"] == "calc" and wire["tool_choice"] == "auto"
    assert wire["messages"][2]["tool_calls"][1] == {
        "id": "r0c1",
        "type": "function",
        "function": {"name": "calc", "arguments": '{"expr":"1+1"}'},
    }
    assert wire["messages"][4] == {"role": "tool", "content": "2", "tool_call_id": "r0c1"}


def test_results_keep_the_order_of_the_calls_whatever_order_they_finish_in() -> None:
    s = given(start=start())
    s.when(Submit(R, "q"))
    s.when(Completed(R, "", "tool_calls", tool_calls=calls(0, 3)))
    for cid in ("r0c2", "r0c0", "r0c1"):
        s.when(ToolDone(R, cid, cid))
    assert isinstance(s.state, Pending)
    tools = [m.tool_call_id for m in request_messages(s.state) if m.role == "tool"]
    assert tools == ["r0c0", "r0c1", "r0c2"]


@pytest.mark.parametrize(
    "end",
    [Cancel(), Cancel(R), Timeout(R, "deadline"), Interrupt("shutdown")],
    ids=["cancel", "cancel-id", "timeout", "interrupt"],
)
@pytest.mark.parametrize("where", ["awaiting", "half", "between", "second-stream"])
def test_ending_a_tool_turn_anywhere_leaves_history_as_before(end: object, where: str) -> None:
    s = given(Submit(rid("a"), "first"), Completed(rid("a"), "one", "stop"), start=start())
    before = s.state.turns
    s.when(Submit(R, "q"))
    s.when(Completed(R, "", "tool_calls", tool_calls=calls(0, 2)))
    if where in ("half", "between", "second-stream"):
        s.when(ToolDone(R, "r0c0", "x"))
    if where in ("between", "second-stream"):
        s.when(ToolDone(R, "r0c1", "y"))
    if where == "second-stream":
        s.when(ResponseStarted(R, 1))
    s.when(end)  # type: ignore[arg-type]
    assert isinstance(s.state, Discarded)
    assert s.state.turns == before
    # a tool finishing after the end is on the record as ignored, nothing else
    assert s.when(ToolDone(R, "r0c1", "late")) == (CompletionIgnored(R, "tool_result"),)
    assert s.state.turns == before
    s.when(Submit(rid("next"), "again"))
    assert isinstance(s.state, Pending)
    assert_paired(request_messages(s.state))
    assert len(request_messages(s.state)) == 4
    s.then_replay_matches()


def test_a_late_completion_of_an_earlier_round_changes_nothing() -> None:
    s = given(start=start())
    s.when(Submit(R, "q"))
    s.when(Completed(R, "", "tool_calls", tool_calls=calls(0)))
    assert s.when(Completed(R, "late", "stop")) == (CompletionIgnored(R, "completed"),)
    s.when(ToolDone(R, "r0c0", "0"))
    before = s.state
    assert s.when(ResponseStarted(R, 0)) == ()
    assert s.when(Completed(R, "late again", "stop", round=0)) == (
        CompletionIgnored(R, "completed"),
    )
    assert s.when(Failed(R, Failure("transport"), round=0)) == (
        CompletionIgnored(R, "failed:transport"),
    )
    assert isinstance(s.state, Pending) and s.state.request == before.request  # type: ignore[attr-defined]
    s.when(Completed(R, "done", "stop", round=1))
    assert isinstance(s.state, Committed)
    s.then_replay_matches()


@pytest.mark.parametrize(
    ("bad", "detail"),
    [
        ((ToolCall("c", "shell", "{}"),), "not registered"),
        ((ToolCall("c", "calc", "[1, 2]"),), "not a JSON object"),
        ((ToolCall("c", "calc", '{"a":'),), "not a JSON object"),
        ((ToolCall("c", "calc", "{}"), ToolCall("c", "clock", "{}")), "unique"),
        ((ToolCall("", "calc", "{}"),), "unique"),
    ],
)
def test_bad_tool_calls_discard_the_turn_as_protocol(
    bad: tuple[ToolCall, ...], detail: str
) -> None:
    s = given(start=start())
    s.when(Submit(R, "q"))
    (ev,) = s.when(Completed(R, "", "tool_calls", tool_calls=bad))
    assert isinstance(ev, TurnDiscarded) and ev.reason == "protocol" and detail in ev.detail
    assert "shell" not in ev.detail  # never quotes what the model sent
    assert len(s.state.turns) == 0


def test_tool_calls_with_a_cut_finish_are_incomplete() -> None:
    s = given(start=start())
    s.when(Submit(R, "q"))
    (ev,) = s.when(Completed(R, "", "length", tool_calls=calls(0)))
    assert isinstance(ev, TurnDiscarded) and ev.reason == "incomplete_finish"


def test_a_tool_error_is_a_result_the_model_sees_or_stops_the_turn() -> None:
    s = given(start=start())
    s.when(Submit(R, "q"))
    s.when(Completed(R, "", "tool_calls", tool_calls=calls(0)))
    s.when(ToolDone(R, "r0c0", "division by zero", is_error=True))
    assert isinstance(s.state, Pending)
    assert request_messages(s.state)[-1].content == "division by zero"
    s = given(start=start(on_tool_error="stop"))
    s.when(Submit(R, "q"))
    s.when(Completed(R, "", "tool_calls", tool_calls=calls(0)))
    (ev,) = s.when(ToolDone(R, "r0c0", "secret detail", is_error=True))
    assert ev == TurnDiscarded(R, "tool_error", "a tool failed", 0)
    assert isinstance(s.state, Discarded) and len(s.state.turns) == 0


def test_past_the_maximum_number_of_rounds_the_turn_is_discarded_as_limit() -> None:
    s = given(start=start(max_tool_rounds=2))
    s.when(Submit(R, "q"))
    for rnd in range(2):
        s.when(Completed(R, "", "tool_calls", round=rnd, tool_calls=calls(rnd)))
        s.when(ToolDone(R, f"r{rnd}c0", "x"))
    (ev,) = s.when(Completed(R, "", "tool_calls", round=2, tool_calls=calls(2)))
    assert isinstance(ev, TurnDiscarded) and ev.reason == "limit"


def test_a_round_that_outgrows_the_byte_budget_is_discarded_as_limit() -> None:
    enc = JsonChatEncoder()
    s = given(start=start(), budget=Budget(max_request_bytes=900, encoder=enc))
    s.when(Submit(R, "q"))
    s.when(Completed(R, "", "tool_calls", tool_calls=calls(0)))
    (_, ev) = s.when(ToolDone(R, "r0c0", "x" * 1000))
    assert isinstance(ev, TurnDiscarded) and ev.reason == "limit"
    assert "900" in ev.detail


def test_an_oversized_or_invalid_result_reaches_the_model_as_an_error() -> None:
    s = given(start=start())
    s.when(Submit(R, "q"))
    s.when(Completed(R, "", "tool_calls", tool_calls=calls(0, 2)))
    (ev,) = s.when(ToolDone(R, "r0c0", "x" * (MAX_TOOL_RESULT_BYTES + 1)))
    assert isinstance(ev, ToolResultRecorded) and ev.is_error and len(ev.content) < 100
    (ev, _) = s.when(ToolDone(R, "r0c1", json.loads('"\\ud800"')))
    assert isinstance(ev, ToolResultRecorded) and ev.is_error


def test_a_result_twice_or_for_an_unknown_call_is_ignored() -> None:
    s = given(start=start())
    s.when(Submit(R, "q"))
    s.when(Completed(R, "", "tool_calls", tool_calls=calls(0, 2)))
    s.when(ToolDone(R, "r0c0", "once"))
    assert s.when(ToolDone(R, "r0c0", "twice")) == (CompletionIgnored(R, "tool_result"),)
    assert s.when(ToolDone(R, "zzz", "?")) == (CompletionIgnored(R, "tool_result"),)
    assert isinstance(s.state, AwaitingTools)


def test_tool_settings_are_checked_at_start() -> None:
    with pytest.raises(InvalidCommand):
        Session().when(Start("", "m", tools=(ToolSpec("a"), ToolSpec("a"))))
    with pytest.raises(InvalidCommand):
        Session().when(Start("", "m", max_tool_rounds=0))
    with pytest.raises(ValueError):
        ToolSpec("has space")
    with pytest.raises(ValueError):
        ToolSpec("ok", "", "[]")


def test_a_session_without_tools_refuses_every_call() -> None:
    s = given()
    s.when(Submit(R, "q"))
    (ev,) = s.when(Completed(R, "", "tool_calls", tool_calls=calls(0)))
    assert isinstance(ev, TurnDiscarded) and ev.reason == "protocol"


def test_old_session_started_payloads_upcast_to_no_tools() -> None:
    v2 = {"system": "s", "model": "m", "policy": {"kind": "ledger"}, "on_busy": "reject"}
    ev = DEFAULT_CODEC.from_payload("session_started", 2, v2)
    assert ev == SessionStarted("s", "m")
    assert ev.tools == () and ev.max_tool_rounds == 8  # type: ignore[union-attr]


def test_projection_counts_tool_messages_and_definitions() -> None:
    s = given(start=start())
    three_rounds(s)
    state = s.state
    enc = JsonChatEncoder()
    budget = Budget(encoder=enc)
    p = plan("m", "be brief", state.turns, 0, "next?", budget, TOOLS)
    body = enc.encode("m", build_messages("be brief", state.turns, 1, "next?"), TOOLS)
    assert p.turns_sent == 1 and p.request_bytes == len(body)
    # one byte short: the whole tool turn goes, never a part of it
    tight = plan("m", "be brief", state.turns, 0, "next?", Budget(len(body) - 1, enc), TOOLS)
    assert tight.turns_sent == 0
    # the tool definitions count toward both caps
    bare = plan("m", "be brief", state.turns, 0, "next?", budget)
    assert p.mandatory_bytes - bare.mandatory_bytes == enc.tools_size(TOOLS) > 0
    assert p.mandatory_tokens > bare.mandatory_tokens
    # a tool turn costs more tokens than its question and answer alone
    ask = Budget(encoder=enc, max_prompt_tokens=p.mandatory_tokens + 20)
    assert plan("m", "be brief", state.turns, 0, "next?", ask, TOOLS).turns_sent == 0


def test_ollama_format_spells_tool_messages_its_own_way() -> None:
    s = given(start=start())
    s.when(Submit(R, "q"))
    s.when(Completed(R, "", "tool_calls", tool_calls=calls(0)))
    s.when(ToolDone(R, "r0c0", "0"))
    assert isinstance(s.state, Pending)
    enc = JsonChatEncoder(tool_format="ollama")
    msgs = request_messages(s.state)
    body = enc.encode("m", msgs, TOOLS)
    wire = json.loads(body)
    assert "tool_choice" not in wire
    assert wire["messages"][2]["tool_calls"] == [
        {"function": {"name": "calc", "arguments": {"expr": "0+0"}}}
    ]
    assert wire["messages"][3] == {"role": "tool", "content": "0", "tool_name": "calc"}
    frame = enc.frame_size("m", len(msgs)) + enc.tools_size(TOOLS)
    assert frame + sum(enc.message_size(m) for m in msgs) == len(body)


def test_window_evicts_tool_turns_whole() -> None:
    s = given(start=Start("", "m", Window(2), tools=TOOLS))
    for i in range(4):
        r = rid(f"t{i}")
        s.when(Submit(r, f"q{i}"))
        s.when(Completed(r, "", "tool_calls", tool_calls=calls(0)))
        s.when(ToolDone(r, "r0c0", "x"))
        s.when(Completed(r, f"a{i}", "stop", round=1))
    s.when(Submit(R, "last"))
    assert isinstance(s.state, Pending)
    msgs = request_messages(s.state)
    assert_paired(msgs)
    assert [m.content for m in msgs if m.role == "user"] == ["q2", "q3", "last"]
    s.then_replay_matches()


# --- property: random tool-turn schedules ------------------------------------

_STEPS = st.lists(
    st.tuples(
        st.sampled_from(
            [
                "submit",
                "started",
                "calls",
                "answer",
                "tool",
                "tool_error",
                "late",
                "late_tool",
                "cancel",
                "timeout",
                "fail",
            ]
        ),
        st.integers(0, 3),
    ),
    max_size=40,
)


@settings(max_examples=300, deadline=None)
@hyp_given(_STEPS, st.sampled_from(["report", "stop"]))
def test_every_request_pairs_calls_with_results_and_replay_matches(
    steps: list[tuple[str, int]], on_error: str
) -> None:
    s = given(start=start(on_tool_error=on_error, max_tool_rounds=3))
    n = 0
    for kind, k in steps:
        state = s.state
        req = state.request if is_in_flight(state) else None  # type: ignore[union-attr]
        r = req.request_id if req is not None else rid(f"t{n}")
        rnd = req.round if req is not None else 0
        if kind == "submit":
            n += 1
            s.when(Submit(rid(f"t{n}"), f"question {n}"))
        elif kind == "started":
            s.when(ResponseStarted(r, rnd))
        elif kind == "calls":
            s.when(Completed(r, "", "tool_calls", round=rnd, tool_calls=calls(rnd, k + 1)))
        elif kind == "answer":
            s.when(Completed(r, f"answer {k}", "stop", round=rnd))
        elif kind in ("tool", "tool_error"):
            pending = state.request.rounds[-1].pending() if isinstance(state, AwaitingTools) else ()
            cid = pending[k % len(pending)] if pending else f"r{rnd}c{k}"
            s.when(ToolDone(r, cid, f"result {k}", is_error=kind == "tool_error"))
        elif kind == "late":
            s.when(Completed(r, "late", "stop", round=max(rnd - 1, 0) if rnd else 7))
        elif kind == "late_tool":
            s.when(ToolDone(rid(f"t{max(n - 1, 0)}"), "r0c0", "late"))
        elif kind == "cancel":
            s.when(Cancel())
        elif kind == "timeout":
            s.when(Timeout(r))
        else:
            s.when(Failed(r, Failure("transport"), round=rnd))
        if isinstance(s.state, Pending):
            assert_paired(request_messages(s.state))
        for t in s.state.turns:
            assert all(rd.complete for rd in t.rounds)
    hyp_event(f"tool turns committed: {sum(bool(t.rounds) for t in s.state.turns) > 0}")
    s.then_replay_matches()
    # and through the codec, as a store would give it back
    again = [DEFAULT_CODEC.from_payload(*DEFAULT_CODEC.to_payload(e)) for e in s.log]
    assert replay(again) == s.state
    assert meaning(again) == meaning(s.log)
    assert isinstance(s.log[0], SessionStarted)


def _windowed_tools(window: int) -> Session:
    return given(
        start=start(context_window=window, output_reserve=100, window_source="user"),
        budget=Budget(None),
    )


def test_an_overflow_of_a_tool_turns_first_round_is_retried_in_round_zero() -> None:
    s = _windowed_tools(100_000)
    for i in range(3):
        s.when(Submit(rid(f"t{i}"), "q" * 300))
        s.when(Completed(rid(f"t{i}"), "a" * 300, "stop"))
    s.when(Submit(R, "what is 1+1?"))
    (retry,) = s.when(Failed(R, Failure("context_overflow", "HTTP 400")))
    assert isinstance(retry, TurnRetried)
    assert isinstance(s.state, Pending) and s.state.request.round == 0
    # the retried request's rounds are fenced as before: round 1 is stale
    (ev,) = s.when(Completed(R, "", "tool_calls", round=1, tool_calls=calls(1)))
    assert isinstance(ev, CompletionIgnored)
    s.when(Completed(R, "", "tool_calls", round=0, tool_calls=calls(0)))
    s.when(ToolDone(R, "r0c0", "0"))
    s.when(Completed(R, "0", "stop", round=1))
    assert [t.request_id for t in s.state.turns][-1] == R
    s.then_replay_matches()


def test_an_overflow_of_a_later_round_discards_the_turn() -> None:
    s = _windowed_tools(100_000)
    for i in range(3):
        s.when(Submit(rid(f"t{i}"), "q" * 300))
        s.when(Completed(rid(f"t{i}"), "a" * 300, "stop"))
    s.when(Submit(R, "what is 1+1?"))
    s.when(Completed(R, "", "tool_calls", round=0, tool_calls=calls(0)))
    s.when(ToolDone(R, "r0c0", "0"))
    (ev,) = s.when(Failed(R, Failure("context_overflow", "HTTP 400"), round=1))
    assert isinstance(ev, TurnDiscarded) and ev.reason == "context_overflow"
    s.then_replay_matches()


def test_a_tool_round_respects_the_sessions_window() -> None:
    s = _windowed_tools(400)
    s.when(Submit(R, "what is 1+1?"))
    s.when(Completed(R, "", "tool_calls", round=0, tool_calls=calls(0)))
    events = s.when(ToolDone(R, "r0c0", "x" * 2000))
    assert isinstance(events[-1], TurnDiscarded) and events[-1].reason == "limit"
    assert "tokens" in events[-1].detail
