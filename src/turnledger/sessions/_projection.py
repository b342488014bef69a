"""Projecting committed history into a request that fits a byte budget.

A request is: the system prompt (never dropped) + the newest contiguous run of
whole turns that fits + the current question (never cut). The budget is the
exact UTF-8 size of the body the adapter sends, measured with the adapter's own
:class:`RequestEncoder`. Older turns are never packed in place of a newer turn
that does not fit.

Accounting is linear: each message is encoded once (when its turn is first
projected), the running sums are kept with the history, and choosing how many
turns fit is a binary search over them.
"""

from __future__ import annotations

import math
from bisect import bisect_left
from collections.abc import Callable, Sequence
from typing import Final, Protocol

import attrs

from ..events import PinAdded, SummaryRecorded, ToolSpec
from ._history import History, ToolRound, Turn
from ._request import ChatMessage, JsonChatEncoder, RequestEncoder, tool_definitions

__all__ = [
    "Budget",
    "CharTokenEstimator",
    "Plan",
    "TokenEstimator",
    "build_messages",
    "covers_dropped",
    "naive_plan",
    "pin_messages",
    "plan",
    "round_messages",
    "summary_message",
    "turn_messages",
]


class TokenEstimator(Protocol):
    """Estimates the prompt tokens of a request, message by message.

    An estimate, not a tokenizer: the byte budget stays the exact limit; this
    one keeps requests inside a model's context window with a margin.
    """

    @property
    def cache_key(self) -> object:
        """Equal for estimators that give every message the same estimate."""
        ...

    @property
    def request_tokens(self) -> int:
        """Tokens every request costs besides its messages."""
        ...

    def message_tokens(self, message: ChatMessage) -> int:
        """Estimated tokens of one message, its role markers included."""
        ...


@attrs.frozen
class CharTokenEstimator:
    """About ``chars_per_token`` characters a token, plus ``per_message``
    tokens of role markers and ``per_request`` of priming (OpenAI's rule of
    thumb for English; use fewer characters a token for CJK text)."""

    chars_per_token: float = attrs.field(default=4.0, validator=attrs.validators.gt(0))
    per_message: int = attrs.field(default=4, validator=attrs.validators.ge(0))
    per_request: int = attrs.field(default=3, validator=attrs.validators.ge(0))

    @property
    def cache_key(self) -> object:
        return (CharTokenEstimator, self.chars_per_token, self.per_message)

    @property
    def request_tokens(self) -> int:
        return self.per_request

    def message_tokens(self, message: ChatMessage) -> int:
        chars = len(message.content)
        for c in message.tool_calls:
            chars += len(c.call_id) + len(c.name) + len(c.arguments)
        return self.per_message + math.ceil(chars / self.chars_per_token)


@attrs.frozen
class Budget:
    """What a request may cost, and how it is measured.

    Args:
        max_request_bytes: cap on the encoded request body; ``None`` for none.
        encoder: the adapter's request encoder (measures and serializes).
        max_prompt_tokens: optional second cap, on the *estimated* prompt
            tokens; ``None`` for none. A request must fit both caps.
        estimator: how prompt tokens are estimated.
    """

    max_request_bytes: int | None = None
    encoder: RequestEncoder = attrs.field(factory=JsonChatEncoder)
    max_prompt_tokens: int | None = None
    estimator: TokenEstimator = attrs.field(factory=CharTokenEstimator)
    #: Cap on the pinned items' estimated tokens, all together (``None``:
    #: only the request's caps). Pins over it reject the turn.
    max_pinned_tokens: int | None = None
    #: Cap on a summary's estimated tokens: a larger one is never sent.
    max_summary_tokens: int | None = None


@attrs.frozen
class Plan:
    """The outcome of a projection: how many whole turns go with the question."""

    #: Newest turns included, counted from the end of the context.
    turns_sent: int
    #: Turns of the context that did not fit.
    turns_dropped: int
    #: Exact size of the encoded request body.
    request_bytes: int
    #: Size of the system prompt plus the question alone.
    mandatory_bytes: int
    #: Estimated prompt tokens of the system prompt plus the question alone.
    mandatory_tokens: int = 0
    #: Estimated prompt tokens of the whole request (``-1`` if it does not fit).
    prompt_tokens: int = 0
    #: The summary sent in place of the turns dropped (``None``: none).
    summary_id: str | None = None

    @property
    def fits(self) -> bool:
        return self.request_bytes >= 0


def _mandatory(system: str, question: str, pins: Sequence[ChatMessage]) -> list[ChatMessage]:
    out = [ChatMessage("system", system)] if system else []
    out.extend(pins)
    out.append(ChatMessage("user", question))
    return out


def pin_messages(pins: Sequence[PinAdded]) -> tuple[ChatMessage, ...]:
    """The pinned items as messages, in the order they were pinned.

    They are ``user`` messages: every wire protocol takes those right after
    the system prompt (Anthropic's takes one system prompt, no more)."""
    return tuple(ChatMessage("user", p.text) for p in pins)


def summary_message(summary: SummaryRecorded) -> ChatMessage:
    """A summary as the message a request sends (its text, as recorded)."""
    return ChatMessage("user", summary.text)


def covers_dropped(
    summary: SummaryRecorded, turns: History, context_start: int, first_sent: int
) -> bool:
    """Whether ``summary`` may stand for the turns ``context_start`` to
    ``first_sent`` of ``turns``: it covers all of them, it is on this path
    (its last turn is this path's turn at its place), and it covers no turn
    from ``first_sent`` on (those are sent)."""
    end = summary.end
    return (
        summary.start <= context_start
        and end == first_sent
        and end <= len(turns)
        and turns[end - 1].request_id == summary.last_request_id
    )


def round_messages(rounds: tuple[ToolRound, ...]) -> list[ChatMessage]:
    """The messages of complete tool rounds: each assistant message with its
    calls, then every call's result, in the order of the calls."""
    out: list[ChatMessage] = []
    for r in rounds:
        out.append(ChatMessage("assistant", r.content, r.calls))
        names = {c.call_id: c.name for c in r.calls}
        by_id = {res.call_id: res for res in r.results}
        for c in r.calls:
            res = by_id[c.call_id]  # a round is only sent once complete
            out.append(
                ChatMessage("tool", res.content, tool_call_id=c.call_id, name=names[c.call_id])
            )
    return out


def turn_messages(t: Turn) -> list[ChatMessage]:
    """A committed turn as messages: question, tool rounds, answer."""
    if not t.rounds:
        return [ChatMessage("user", t.question), ChatMessage("assistant", t.answer)]
    return [
        ChatMessage("user", t.question),
        *round_messages(t.rounds),
        ChatMessage("assistant", t.answer),
    ]


#: The key of each history's cached messages per turn.
_MESSAGES: Final = "turn_messages"


def _frozen_turn_messages(t: Turn) -> tuple[ChatMessage, ...]:
    return tuple(turn_messages(t))


def build_messages(
    system: str,
    turns: History,
    turns_sent: int,
    question: str,
    rounds: tuple[ToolRound, ...] = (),
    carried: Sequence[ChatMessage] = (),
) -> list[ChatMessage]:
    """The messages of a request that sends the ``carried`` messages (pinned
    items, a summary) after the system prompt, the newest ``turns_sent``
    turns, then the question and the complete ``rounds`` of the turn in
    flight."""
    out = [ChatMessage("system", system)] if system else []
    out.extend(carried)
    if turns_sent:
        # Each turn's messages are built once and shared by later requests
        # (and later states): a request only builds its question's.
        by_turn = turns.per_turn(_MESSAGES, _frozen_turn_messages)
        n = len(turns)
        for i in range(n - turns_sent + 1, n + 1):
            out.extend(by_turn[i])
    out.append(ChatMessage("user", question))
    out.extend(round_messages(rounds))
    return out


def tools_tokens(estimator: TokenEstimator, tools: Sequence[ToolSpec]) -> int:
    """Estimated prompt tokens of the tool definitions (0 for none)."""
    if not tools:
        return 0
    # A session sends the same tools with every request: estimated once.
    key = (estimator.cache_key, tuple(tools))
    tokens = _TOOLS_TOKENS.get(key)
    if tokens is None:
        if len(_TOOLS_TOKENS) >= 64:
            _TOOLS_TOKENS.clear()
        tokens = _TOOLS_TOKENS[key] = estimator.message_tokens(
            ChatMessage("system", tool_definitions(tools))
        )
    return tokens


_TOOLS_TOKENS: dict[object, int] = {}


def plan(
    model: str,
    system: str,
    turns: History,
    context_start: int,
    question: str,
    budget: Budget,
    tools: Sequence[ToolSpec] = (),
    tool_choice: str = "auto",
    *,
    token_cap: int | None = None,
    pins: Sequence[ChatMessage] = (),
    summaries: Sequence[SummaryRecorded] = (),
) -> Plan:
    """Choose the newest contiguous run of turns from ``turns[context_start:]``
    that fits ``budget`` together with the system prompt, the pinned items
    (``pins``) and the question.

    ``token_cap`` is a further cap on the estimated prompt tokens, besides
    the budget's own: a session's (:func:`prompt_token_cap`), passed as it
    is instead of a new ``Budget`` for each cap.

    When turns are dropped, the newest of ``summaries`` (oldest first) that
    covers every dropped turn and no sent one (:func:`covers_dropped`), is
    within ``budget.max_summary_tokens`` and fits with the turns after it
    goes in their place (``Plan.summary_id``); the turns it covers are
    then all dropped.

    Returns a :class:`Plan`; if the mandatory part alone does not fit, the plan
    has ``turns_sent == 0`` and ``request_bytes == -1``.
    """
    enc = budget.encoder
    mandatory = _mandatory(system, question, pins)
    sep = enc.separator_size
    mandatory_bytes = (
        enc.frame_size(model, len(mandatory))
        + sum(map(enc.message_size, mandatory))
        + enc.tools_size(tools, tool_choice)
    )
    n = len(turns)
    available = n - context_start
    # Each turn's messages are built once (and shared with build_messages),
    # then measured once per encoder and per estimator.
    by_turn = turns.per_turn(_MESSAGES, _frozen_turn_messages)
    size = enc.message_size

    def turn_cost(messages: tuple[ChatMessage, ...]) -> int:
        return sum(map(size, messages)) + sep * len(messages)

    prefix = turns.prefix(enc.cache_key, by_turn, turn_cost)
    est = budget.estimator
    max_tokens = budget.max_prompt_tokens
    if token_cap is not None and (max_tokens is None or token_cap < max_tokens):
        max_tokens = token_cap
    mandatory_tokens = (
        est.request_tokens + sum(map(est.message_tokens, mandatory)) + tools_tokens(est, tools)
    )
    limit = budget.max_request_bytes
    if (limit is not None and mandatory_bytes > limit) or (
        max_tokens is not None and mandatory_tokens > max_tokens
    ):
        return Plan(0, available, -1, mandatory_bytes, mandatory_tokens, -1)
    # The estimate is recorded with every request, capped or not (computed
    # once per turn and estimator, like the sizes).
    tokens = turns.prefix(("tokens", est.cache_key), by_turn, _turn_tokens(est))
    # Sending turns[j:n] costs mandatory + prefix[n] - prefix[j]; the
    # smallest j >= context_start for which each cap holds is a binary
    # search, and a request must meet both caps.
    start = context_start
    if limit is not None:
        threshold = mandatory_bytes + prefix[n] - limit
        start = max(start, bisect_left(prefix, threshold, 0, n + 1))
    if max_tokens is not None:
        start = max(start, bisect_left(tokens, mandatory_tokens + tokens[n] - max_tokens, 0, n + 1))
    if start > context_start and summaries:
        for s in reversed(summaries):
            b = s.end
            if not (b >= start and covers_dropped(s, turns, context_start, b)):
                continue
            message = summary_message(s)
            s_tokens = est.message_tokens(message)
            if budget.max_summary_tokens is not None and s_tokens > budget.max_summary_tokens:
                continue
            s_bytes = mandatory_bytes + size(message) + sep + prefix[n] - prefix[b]
            s_tokens += mandatory_tokens + tokens[n] - tokens[b]
            if (limit is None or s_bytes <= limit) and (
                max_tokens is None or s_tokens <= max_tokens
            ):
                return Plan(
                    n - b,
                    b - context_start,
                    s_bytes,
                    mandatory_bytes,
                    mandatory_tokens,
                    s_tokens,
                    s.summary_id,
                )
    sent = n - start
    return Plan(
        sent,
        available - sent,
        mandatory_bytes + prefix[n] - prefix[start],
        mandatory_bytes,
        mandatory_tokens,
        mandatory_tokens + tokens[n] - tokens[start],
    )


def _turn_tokens(est: TokenEstimator) -> Callable[[tuple[ChatMessage, ...]], int]:
    def turn_tokens(messages: tuple[ChatMessage, ...]) -> int:
        return sum(map(est.message_tokens, messages))

    return turn_tokens


def naive_plan(
    model: str,
    system: str,
    turns: History,
    context_start: int,
    question: str,
    budget: Budget,
    tools: Sequence[ToolSpec] = (),
    tool_choice: str = "auto",
    *,
    pins: Sequence[ChatMessage] = (),
    summaries: Sequence[SummaryRecorded] = (),
) -> Plan:
    """The reference: drop the oldest whole turn and re-serialize until it
    fits; then, if turns were dropped, try each summary, newest first, with
    the turns after it.

    Quadratic; kept for tests and benchmarks only. It shares nothing with
    :func:`plan` but the encoder and the estimator it is given: the messages
    are built here from the plain turns (not by ``build_messages``, not from
    the history's caches), every request is serialized whole and its bytes
    counted, and its tokens are the estimator's for each message of it.
    """
    enc = budget.encoder
    est = budget.estimator
    plain = list(turns)
    n = len(plain)
    limit = budget.max_request_bytes
    max_tokens = budget.max_prompt_tokens
    tool_tokens = est.message_tokens(ChatMessage("system", tool_definitions(tools))) if tools else 0

    def measure(sent: list[Turn], carried: list[ChatMessage]) -> tuple[int, int]:
        messages = _naive_messages(system, [*pins, *carried], sent, question)
        size = len(enc.encode(model, messages, tools, tool_choice))
        tokens = est.request_tokens + tool_tokens + sum(est.message_tokens(m) for m in messages)
        return size, tokens

    def fits(size: int, tokens: int) -> bool:
        return (limit is None or size <= limit) and (max_tokens is None or tokens <= max_tokens)

    mandatory_bytes, mandatory_tokens = measure([], [])
    for start in range(context_start, n + 1):
        size, tokens = measure(plain[start:], [])
        if not fits(size, tokens):
            continue
        if start > context_start:
            for s in reversed(summaries):
                # Covers every dropped turn, and from the end of it every turn is sent.
                if not (
                    s.start <= context_start
                    and start <= s.end <= n
                    and plain[s.end - 1].request_id == s.last_request_id
                ):
                    continue
                message = ChatMessage("user", s.text)
                cap = budget.max_summary_tokens
                if cap is not None and est.message_tokens(message) > cap:
                    continue
                s_size, s_tokens = measure(plain[s.end :], [message])
                if fits(s_size, s_tokens):
                    return Plan(
                        n - s.end,
                        s.end - context_start,
                        s_size,
                        mandatory_bytes,
                        mandatory_tokens,
                        s_tokens,
                        s.summary_id,
                    )
        return Plan(
            n - start, start - context_start, size, mandatory_bytes, mandatory_tokens, tokens
        )
    return Plan(0, n - context_start, -1, mandatory_bytes, mandatory_tokens, -1)


def _naive_messages(
    system: str, carried: list[ChatMessage], sent: list[Turn], question: str
) -> list[ChatMessage]:
    """The messages of a request, written out for :func:`naive_plan`: the
    system prompt if any; the pinned items and summary; each turn's
    question, its rounds (the assistant's calls, then each call's result in
    the order of the calls) and answer; the question."""
    out = [ChatMessage("system", system)] if system else []
    out += carried
    for t in sent:
        out.append(ChatMessage("user", t.question))
        for r in t.rounds:
            out.append(ChatMessage("assistant", r.content, r.calls))
            for call in r.calls:
                (result,) = [x for x in r.results if x.call_id == call.call_id]
                out.append(
                    ChatMessage("tool", result.content, tool_call_id=call.call_id, name=call.name)
                )
        out.append(ChatMessage("assistant", t.answer))
    out.append(ChatMessage("user", question))
    return out
