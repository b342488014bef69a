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

from bisect import bisect_left

import attrs

from ._history import History, Turn
from ._request import ChatMessage, JsonChatEncoder, RequestEncoder

__all__ = ["Budget", "Plan", "build_messages", "naive_plan", "plan"]


@attrs.frozen
class Budget:
    """What a request may cost, and how it is measured.

    Args:
        max_request_bytes: cap on the encoded request body; ``None`` for none.
        encoder: the adapter's request encoder (measures and serializes).
    """

    max_request_bytes: int | None = None
    encoder: RequestEncoder = attrs.field(factory=JsonChatEncoder)


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

    @property
    def fits(self) -> bool:
        return self.request_bytes >= 0


def _mandatory(system: str, question: str) -> list[ChatMessage]:
    out = [ChatMessage("system", system)] if system else []
    out.append(ChatMessage("user", question))
    return out


def build_messages(
    system: str, turns: History, turns_sent: int, question: str
) -> list[ChatMessage]:
    """The messages of a request that sends the newest ``turns_sent`` turns."""
    out = [ChatMessage("system", system)] if system else []
    n = len(turns)
    for i in range(n - turns_sent, n):
        t = turns[i]
        out.append(ChatMessage("user", t.question))
        out.append(ChatMessage("assistant", t.answer))
    out.append(ChatMessage("user", question))
    return out


def plan(
    model: str,
    system: str,
    turns: History,
    context_start: int,
    question: str,
    budget: Budget,
) -> Plan:
    """Choose the newest contiguous run of turns from ``turns[context_start:]``
    that fits ``budget`` together with the system prompt and the question.

    Returns a :class:`Plan`; if the mandatory part alone does not fit, the plan
    has ``turns_sent == 0`` and ``request_bytes == -1``.
    """
    enc = budget.encoder
    mandatory = _mandatory(system, question)
    sep = enc.separator_size
    mandatory_bytes = enc.frame_size(model, len(mandatory)) + sum(
        enc.message_size(m) for m in mandatory
    )
    n = len(turns)
    available = n - context_start

    def turn_cost(t: Turn) -> int:
        return (
            enc.message_size(ChatMessage("user", t.question))
            + enc.message_size(ChatMessage("assistant", t.answer))
            + 2 * sep
        )

    prefix = turns.prefix(enc.cache_key, turn_cost)
    limit = budget.max_request_bytes
    if limit is not None and mandatory_bytes > limit:
        return Plan(0, available, -1, mandatory_bytes)
    if limit is None:
        start = context_start
    else:
        # Sending turns[j:n] costs mandatory + prefix[n] - prefix[j]; find the
        # smallest j >= context_start for which that fits.
        threshold = mandatory_bytes + prefix[n] - limit
        start = max(bisect_left(prefix, threshold, 0, n + 1), context_start)
    sent = n - start
    return Plan(
        sent, available - sent, mandatory_bytes + prefix[n] - prefix[start], mandatory_bytes
    )


def naive_plan(
    model: str,
    system: str,
    turns: History,
    context_start: int,
    question: str,
    budget: Budget,
) -> Plan:
    """The reference: drop the oldest whole turn and re-serialize until it fits.

    Quadratic; kept for tests and benchmarks only.
    """
    enc = budget.encoder
    n = len(turns)
    mandatory_bytes = len(enc.encode(model, _mandatory(system, question)))
    limit = budget.max_request_bytes
    for start in range(context_start, n + 1):
        size = len(enc.encode(model, build_messages(system, turns, n - start, question)))
        if limit is None or size <= limit:
            return Plan(n - start, start - context_start, size, mandatory_bytes)
    return Plan(0, n - context_start, -1, mandatory_bytes)
