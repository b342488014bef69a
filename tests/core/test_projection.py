"""The request budget: exact byte accounting and whole-turn projection."""

from __future__ import annotations

import json

import pytest
from hypothesis import given as hgiven
from hypothesis import settings
from hypothesis import strategies as st

from turnledger.events import RequestId, ToolCall, ToolSpec, TurnRejected, TurnSubmitted, Window
from turnledger.sessions import (
    Budget,
    CharTokenEstimator,
    ChatMessage,
    Completed,
    History,
    JsonChatEncoder,
    Start,
    Submit,
    ToolResult,
    ToolRound,
    Turn,
    build_messages,
    plan,
    request_messages,
)
from turnledger.sessions._projection import naive_plan

from ._given import Session, given, rid

# Awkward text: CJK, emoji (4-byte UTF-8), quotes, backslashes, newlines and
# control characters (escaped as \uXXXX by JSON), lone surrogates excluded
# (they cannot be sent as UTF-8 at all).
awkward = st.text(
    alphabet=st.one_of(
        st.sampled_from('你好世界，“”‘’"\\\n\r\t\x00\x01\x1f\x7f\u2028\u2029 🌱🚀é'),
        st.characters(exclude_categories=("Cs",)),
    ),
    max_size=40,
)
extras = st.dictionaries(
    st.sampled_from(["temperature", "max_tokens", "stream_options", "stop", "user"]),
    st.one_of(
        st.integers(0, 4096),
        st.floats(0, 2, allow_nan=False),
        st.just({"include_usage": True}),
        st.lists(awkward, max_size=2),
        awkward,
    ),
    max_size=3,
)


@settings(max_examples=500)
@hgiven(
    model=awkward,
    msgs=st.lists(
        st.builds(ChatMessage, st.sampled_from(["system", "user", "assistant"]), awkward),
        max_size=8,
    ),
    stream=st.booleans(),
    extra=extras,
)
def test_linear_size_equals_the_real_body_byte_for_byte(
    model: str, msgs: list[ChatMessage], stream: bool, extra: dict[str, object]
) -> None:
    enc = JsonChatEncoder(stream=stream, extra=extra)
    body = enc.encode(model, msgs)
    assert enc.frame_size(model, len(msgs)) + sum(map(enc.message_size, msgs)) == len(body)
    # and the body is what we claim it is: compact UTF-8 JSON, not ASCII-escaped
    decoded = json.loads(body)
    assert decoded["messages"] == [{"role": m.role, "content": m.content} for m in msgs]
    assert decoded["model"] == model and decoded["stream"] is stream
    # byte for byte what the standard library writes for the same document
    # (the encoder escapes strings without going through json.dumps)
    document = {
        "model": model,
        "messages": [{"role": m.role, "content": m.content} for m in msgs],
        "stream": stream,
        **extra,
    }
    plain = json.dumps(document, ensure_ascii=False, separators=(",", ":"), allow_nan=False)
    assert body == plain.encode()


@settings(max_examples=500)
@hgiven(
    system=awkward,
    pairs=st.lists(st.tuples(awkward, awkward), max_size=12),
    question=awkward,
    context_start=st.integers(0, 12),
    budget=st.one_of(st.none(), st.integers(0, 1500)),
    extra=extras,
    max_tokens=st.one_of(st.none(), st.integers(0, 200)),
    chars_per_token=st.sampled_from([1.0, 2.5, 4.0]),
)
def test_projection_chooses_what_the_naive_loop_chooses(
    system: str,
    pairs: list[tuple[str, str]],
    question: str,
    context_start: int,
    budget: int | None,
    extra: dict[str, object],
    max_tokens: int | None,
    chars_per_token: float,
) -> None:
    turns = History([Turn(RequestId(f"r{i}"), q, a) for i, (q, a) in enumerate(pairs)])
    context_start = min(context_start, len(turns))
    estimator = CharTokenEstimator(chars_per_token)
    b = Budget(budget, JsonChatEncoder(extra=extra), max_tokens, estimator)
    fast = plan("m", system, turns, context_start, question, b)
    slow = naive_plan("m", system, turns, context_start, question, b)
    assert fast == slow
    if fast.fits:
        body = b.encoder.encode("m", build_messages(system, turns, fast.turns_sent, question))
        assert len(body) == fast.request_bytes
        assert budget is None or len(body) <= budget
        assert fast.turns_sent + fast.turns_dropped == len(turns) - context_start
        sent = build_messages(system, turns, fast.turns_sent, question)
        tokens = estimator.request_tokens + sum(map(estimator.message_tokens, sent))
        assert max_tokens is None or tokens <= max_tokens


def test_cached_sizes_are_shared_and_survive_branching() -> None:
    h = History()
    enc = JsonChatEncoder()
    b = Budget(None, enc)
    for i in range(5):
        h = h.append(Turn(RequestId(f"r{i}"), f"q{i}", "答" * i))
        assert plan("m", "", h, 0, "?", b) == naive_plan("m", "", h, 0, "?", b)
    older = h
    branch = History(list(h)[:3]).append(Turn(RequestId("x"), "other", "branch"))
    newer = h.append(Turn(RequestId("r5"), "q5", "long " * 50))
    # appending to an old view must not disturb the newer one, and vice versa
    alt = older.append(Turn(RequestId("r5b"), "q5b", "short"))
    for view in (older, branch, newer, alt):
        assert plan("m", "", view, 0, "?", Budget(300, enc)) == naive_plan(
            "m", "", view, 0, "?", Budget(300, enc)
        )
    assert [t.request_id for t in newer][-1] == "r5"
    assert [t.request_id for t in alt][-1] == "r5b"
    assert len(older) == 5


def test_cached_messages_are_shared_and_survive_branching() -> None:
    def fresh(view: History, sent: int, question: str) -> list[ChatMessage]:
        out = [ChatMessage("system", "s")]
        for t in list(view)[len(view) - sent :]:
            out += [ChatMessage("user", t.question), ChatMessage("assistant", t.answer)]
        return [*out, ChatMessage("user", question)]

    h = History()
    for i in range(5):
        h = h.append(Turn(RequestId(f"r{i}"), f"q{i}", f"a{i}"))
        assert build_messages("s", h, len(h), "?") == fresh(h, len(h), "?")
    older = h
    newer = h.append(Turn(RequestId("r5"), "q5", "a5"))
    assert build_messages("s", newer, 6, "?") == fresh(newer, 6, "?")
    # a branch from the older view must not see the newer turn, nor change it
    alt = older.append(Turn(RequestId("r5b"), "q5b", "a5b"))
    for view in (older, newer, alt, History(list(h)[:2])):
        for sent in range(len(view) + 1):
            assert build_messages("s", view, sent, "?") == fresh(view, sent, "?")
    assert build_messages("s", alt, 1, "?")[2].content == "a5b"
    assert build_messages("s", newer, 1, "?")[2].content == "a5"


# --- seed 003: the boundary table, with our own fixture -----------------------

SYSTEM = "你是一个简洁的助手。"
QUESTION = "代号是什么？"
FIXTURE = [
    ("项目代号是 ORCHID-17，记住它。", "好的，记住了：“ORCHID-17”。"),
    ("I prefer Java 8.\nKeep answers short.", 'Noted 🌱 — Java 8, short "answers".'),
]


def _ledger_session(budget: int | None) -> Session:
    s = given(start=Start(SYSTEM, "gpt-4o-mini"), budget=Budget(None))
    for i, (q, a) in enumerate(FIXTURE):
        s.when(Submit(rid(f"t{i}"), q))
        s.when(Completed(rid(f"t{i}"), a, "stop"))
    s.budget = Budget(budget)
    return s


@pytest.mark.parametrize(
    ("budget", "retained", "dropped", "actual"),
    [
        (158, 0, 2, 158),  # exactly the mandatory part
        (298, 0, 2, 158),  # one byte short of the newest turn
        (299, 1, 1, 299),
        (440, 1, 1, 299),  # one byte short of both
        (441, 2, 0, 441),
        (600, 2, 0, 441),
        (None, 2, 0, 441),
    ],
)
def test_seed_003_boundary_table(
    budget: int | None, retained: int, dropped: int, actual: int
) -> None:
    s = _ledger_session(budget)
    (ev,) = s.when(Submit(rid("q"), QUESTION))
    messages = request_messages(s.state)  # type: ignore[arg-type]
    est = CharTokenEstimator()
    tokens = est.request_tokens + sum(est.message_tokens(m) for m in messages)
    assert ev == TurnSubmitted(rid("q"), QUESTION, retained, dropped, actual, tokens)
    # the recorded size is the size of the body the adapter will really send
    body = JsonChatEncoder().encode("gpt-4o-mini", messages)
    assert len(body) == actual
    sent = json.loads(body)["messages"]
    assert sent[0] == {"role": "system", "content": SYSTEM}
    assert sent[-1] == {"role": "user", "content": QUESTION}
    assert len(sent) == 2 + 2 * retained
    if retained == 1:  # the newest turn, whole, never half of one
        assert [m["role"] for m in sent] == ["system", "user", "assistant", "user"]
        assert sent[1]["content"] == FIXTURE[1][0]


def test_mandatory_overflow_one_byte_under_is_rejected_and_changes_nothing() -> None:
    s = _ledger_session(157)
    before = s.state
    (ev,) = s.when(Submit(rid("q"), QUESTION))
    assert isinstance(ev, TurnRejected) and ev.reason == "over_budget"
    assert "158" in ev.detail and "157" in ev.detail
    assert s.state.turns == before.turns and type(s.state) is type(before)
    # a wider budget afterwards works, with everything still there
    s.budget = Budget(441)
    (ev,) = s.when(Submit(rid("q2"), QUESTION))
    assert isinstance(ev, TurnSubmitted) and ev.turns_sent == 2


def test_never_skip_a_large_recent_turn_to_pack_an_older_small_one() -> None:
    s = given(start=Start("", "m"))
    s.when(Submit(rid("small"), "old"))
    s.when(Completed(rid("small"), "tiny", "stop"))
    s.when(Submit(rid("big"), "new"))
    s.when(Completed(rid("big"), "huge " * 100, "stop"))
    s.budget = Budget(200)  # fits the small turn, not the big one
    (ev,) = s.when(Submit(rid("q"), "?"))
    assert isinstance(ev, TurnSubmitted) and (ev.turns_sent, ev.turns_dropped) == (0, 2)


def test_ledger_narrows_then_widens_again() -> None:
    # seed 003's sequence: narrow (the old fact is absent), commit, widen (it is back)
    s = _ledger_session(299)
    s.when(Submit(rid("narrow"), "Java 8 again?"))
    narrow = request_messages(s.state)  # type: ignore[arg-type]
    assert not any("ORCHID-17" in m.content for m in narrow)
    s.when(Completed(rid("narrow"), "Yes, Java 8.", "stop"))
    assert len(s.state.turns) == 3  # the ledger keeps everything
    s.budget = Budget(None)
    s.when(Submit(rid("wide"), QUESTION))
    wide = request_messages(s.state)  # type: ignore[arg-type]
    assert any("ORCHID-17" in m.content for m in wide)
    assert len(wide) == 2 + 2 * 3
    s.then_replay_matches()


# --- seed 000: the window ------------------------------------------------------


def test_window_keeps_four_pairs_and_evicts_the_oldest_whole() -> None:
    s = given(start=Start("sys", "m", Window(4)))
    for i in range(1, 6):
        s.when(Submit(rid(f"r{i}"), f"user{i}"))
        sent = request_messages(s.state)  # type: ignore[arg-type]
        # the request carries at most the four kept pairs plus the question
        assert len(sent) == 2 + 2 * min(i - 1, 4)
        s.when(Completed(rid(f"r{i}"), f"assistant{i}", "stop"))
    assert [t.question for t in s.state.context] == ["user2", "user3", "user4", "user5"]
    s.when(Submit(rid("r6"), "user6"))
    sent = request_messages(s.state)  # type: ignore[arg-type]
    # no orphan assistant message at the head: system, then user2
    assert [m.role for m in sent[:3]] == ["system", "user", "assistant"]
    assert sent[1].content == "user2"
    assert [m.content for m in sent[1:]] == [
        "user2", "assistant2", "user3", "assistant3", "user4", "assistant4",
        "user5", "assistant5", "user6",
    ]  # fmt: skip
    # the ledger of committed turns still holds all five (for audit and replay)
    assert len(s.state.turns) == 5
    s.then_replay_matches()


def test_window_trim_then_commit_never_brings_evicted_turns_back() -> None:
    s = given(start=Start("", "m", Window(4)))
    for i in range(3):
        s.when(Submit(rid(f"r{i}"), f"q{i}"))
        s.when(Completed(rid(f"r{i}"), "a" * 100, "stop"))
    s.budget = Budget(330)  # room for one old turn only
    (ev,) = s.when(Submit(rid("narrow"), "q3"))
    assert isinstance(ev, TurnSubmitted) and ev.turns_sent == 1
    s.when(Completed(rid("narrow"), "a3", "stop"))
    # after a commit the context is exactly what was sent plus the new turn
    assert [t.question for t in s.state.context] == ["q2", "q3"]
    s.budget = Budget(None)
    s.when(Submit(rid("wide"), "q4"))
    assert [m.content for m in request_messages(s.state)][::2] == ["q2", "q3", "q4"]  # type: ignore[arg-type]


def test_window_trim_then_timeout_leaves_the_window_alone() -> None:
    from turnledger.sessions import Timeout

    s = given(start=Start("", "m", Window(4)))
    for i in range(3):
        s.when(Submit(rid(f"r{i}"), f"q{i}"))
        s.when(Completed(rid(f"r{i}"), "a" * 100, "stop"))
    before = s.state
    s.budget = Budget(330)
    s.when(Submit(rid("narrow"), "q3"))
    s.when(Timeout(rid("narrow")))
    assert s.state.context == before.context and s.state.turns == before.turns


def test_a_token_budget_trims_by_whole_turns_and_rejects_what_cannot_fit() -> None:
    est = CharTokenEstimator(chars_per_token=1.0, per_message=0, per_request=0)
    s = given(start=Start("", "m"))
    for i in range(3):
        s.when(Submit(rid(f"r{i}"), "q" * 10))
        s.when(Completed(rid(f"r{i}"), "a" * 10, "stop"))
    # each turn is 20 "tokens", the question 10: room for one old turn
    s.budget = Budget(None, max_prompt_tokens=35, estimator=est)
    (ev,) = s.when(Submit(rid("x"), "z" * 10))
    assert isinstance(ev, TurnSubmitted) and (ev.turns_sent, ev.turns_dropped) == (1, 2)
    s.when(Completed(rid("x"), "ok", "stop"))
    s.budget = Budget(None, max_prompt_tokens=9, estimator=est)
    (ev,) = s.when(Submit(rid("y"), "z" * 10))
    assert isinstance(ev, TurnRejected) and ev.reason == "over_budget"
    assert "about 10 tokens" in ev.detail and "9" in ev.detail


def _round(content: str, calls: list[tuple[str, str]], done_in: list[int]) -> ToolRound:
    """A complete round: ``calls`` (name, arguments), their results finishing
    in the order ``done_in`` gives."""
    tool_calls = tuple(ToolCall(f"c{i}", name, args) for i, (name, args) in enumerate(calls))
    order = sorted(range(len(calls)), key=lambda i: done_in[i % len(done_in)] if done_in else i)
    results = tuple(ToolResult(f"c{i}", f"result {i} of {calls[i][0]}", i % 2 == 1) for i in order)
    return ToolRound(tool_calls, content, results)


rounds = st.lists(
    st.builds(
        _round,
        awkward,
        st.lists(st.tuples(st.sampled_from(["clock", "calc"]), awkward), min_size=1, max_size=3),
        st.lists(st.integers(0, 9), max_size=3),
    ),
    max_size=2,
)


@settings(max_examples=200)
@hgiven(
    system=awkward,
    turns=st.lists(st.tuples(awkward, awkward, rounds), max_size=8),
    question=awkward,
    budget=st.one_of(st.none(), st.integers(0, 2500)),
    max_tokens=st.one_of(st.none(), st.integers(0, 400)),
    tools=st.booleans(),
)
def test_projection_of_tool_turns_chooses_what_the_naive_loop_chooses(
    system: str,
    turns: list[tuple[str, str, list[ToolRound]]],
    question: str,
    budget: int | None,
    max_tokens: int | None,
    tools: bool,
) -> None:
    # Turns with tool rounds: the reference writes their messages out on its
    # own (calls, then results in the order of the calls, whatever order they
    # finished in), so a fault in the shared message building shows here.
    history = History(
        [Turn(RequestId(f"r{i}"), q, a, tuple(rs)) for i, (q, a, rs) in enumerate(turns)]
    )
    specs = (ToolSpec("clock", "the time"), ToolSpec("calc", "arithmetic")) if tools else ()
    b = Budget(budget, JsonChatEncoder(), max_tokens)
    fast = plan("m", system, history, 0, question, b, specs)
    assert fast == naive_plan("m", system, history, 0, question, b, specs)
