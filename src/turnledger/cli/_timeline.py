"""Reading a stored log back: the event timeline and a session's summary.

What ``turnledger log`` and ``turnledger sessions`` show; pure functions
over stored envelopes.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Iterable, Sequence
from typing import Any

import attrs

from ..events import (
    DEFAULT_CODEC,
    CompletionIgnored,
    Event,
    SessionStarted,
    StoredEvent,
    ToolCallsRequested,
    ToolResultRecorded,
    ToolRoundSubmitted,
    TurnCommitted,
    TurnDiscarded,
    TurnRejected,
    TurnRetried,
    TurnSubmitted,
    Usage,
)
from ..sessions import Budget, SessionState, evolve, initial_state, prompt_token_cap

__all__ = ["TimelineRow", "iso_time", "phase_name", "replay_stored", "session_summary", "timeline"]


def phase_name(state: SessionState) -> str:
    return type(state).__name__.lower()


def replay_stored(stored: Iterable[StoredEvent]) -> SessionState:
    """Fold stored events, decoding each."""
    state: SessionState = initial_state()
    for env in stored:
        state = evolve(state, DEFAULT_CODEC.decode(env))
    return state


@attrs.frozen
class TimelineRow:
    """One line of ``turnledger log``."""

    session_id: str
    seq: int
    recorded_at: float
    request_id: str | None
    event: str
    phase_from: str
    phase_to: str
    reason: str
    detail: str
    #: For an ignored late completion: seconds after its turn had ended.
    late_by: float | None
    #: The question (of a ``turn_submitted``) or the answer (of a
    #: ``turn_committed``); empty for other events.
    text: str = ""
    #: The request's estimated prompt tokens (submitted, retried; and the
    #: estimate of the request a commit or a late answer belongs to).
    estimated_prompt_tokens: int | None = None
    #: The session's prompt token budget when the request was projected.
    token_budget: int | None = None
    #: Usage the server reported (committed, ignored).
    prompt_tokens: int | None = None
    completion_tokens: int | None = None
    #: The session's window and output reserve (session_started).
    context_window: int | None = None
    output_reserve: int | None = None

    def as_json(self, *, text: bool = False) -> dict[str, Any]:
        """The row as ``log --json`` prints it: the keys of the runtime's
        structlog ``transition`` lines (``tag``, ``from``, ``to``, an ISO
        ``timestamp``), and with ``text`` the question or answer."""
        row: dict[str, Any] = {
            "session_id": self.session_id,
            "seq": self.seq,
            "timestamp": iso_time(self.recorded_at),
            "request_id": self.request_id,
            "tag": self.event,
            "from": self.phase_from,
            "to": self.phase_to,
            "reason": self.reason,
            "detail": self.detail,
            "late_by": self.late_by,
        }
        # Token fields, under the names of the transition lines, where known.
        for key in _TOKEN_KEYS:
            value = getattr(self, key)
            if value is not None:
                row[key] = value
        if text:
            row["text"] = self.text
        return row


_TOKEN_KEYS = (
    "estimated_prompt_tokens",
    "token_budget",
    "prompt_tokens",
    "completion_tokens",
    "context_window",
    "output_reserve",
)


def iso_time(ts: float) -> str:
    """A store timestamp as structlog's ISO form (UTC, microseconds)."""
    return dt.datetime.fromtimestamp(ts, dt.UTC).isoformat().replace("+00:00", "Z")


def _tokens(estimated: int | None, budget: int | None) -> str:
    if estimated is None:
        return ""
    return f", ~{estimated} tokens" + (f" of {budget}" if budget is not None else "")


def _usage(estimated: int | None, usage: Usage | None) -> str:
    if usage is None or usage.prompt_tokens is None:
        if estimated is None:
            return ""
        return f"~{estimated} prompt tokens estimated, none reported"
    shown = f"~{estimated} → " if estimated is not None else ""
    out = f"{shown}{usage.prompt_tokens} prompt tokens"
    if usage.completion_tokens is not None:
        out += f", {usage.completion_tokens} completion"
    return out


def _projection(sent: int, dropped: int, size: int) -> str:
    return f"{sent} turns sent, {dropped} dropped, {size} bytes"


def _reason(event: Event, estimated: int | None, budget: int | None) -> tuple[str, str]:
    if isinstance(event, TurnDiscarded | TurnRejected):
        return event.reason, event.detail
    if isinstance(event, TurnCommitted):
        return event.finish_reason, _usage(estimated, event.usage)
    if isinstance(event, CompletionIgnored):
        return event.outcome, _usage(None, event.usage) if event.usage else ""
    if isinstance(event, TurnSubmitted):
        size = _projection(event.turns_sent, event.turns_dropped, event.request_bytes)
        return "", size + _tokens(event.estimated_prompt_tokens, budget)
    if isinstance(event, TurnRetried):
        size = _projection(event.turns_sent, event.turns_dropped, event.request_bytes)
        again = size + _tokens(event.estimated_prompt_tokens, budget)
        return event.reason, f"{event.detail}; sent again: {again}"
    if isinstance(event, SessionStarted) and event.context_window is not None:
        return "", (
            f"context window {event.context_window} tokens ({event.window_source}), "
            f"{event.output_reserve} kept for the answer"
        )
    return _tool_reason(event)


def _size(text: str) -> int:
    return len(text.encode("utf-8", "replace"))


def _tool_reason(event: Event) -> tuple[str, str]:
    # Tool names, call ids, sizes and durations; never arguments or results.
    if isinstance(event, ToolCallsRequested):
        calls = ", ".join(f"{c.name} {c.call_id} {_size(c.arguments)} B" for c in event.calls)
        return "", f"round {event.round}: {calls}"
    if isinstance(event, ToolResultRecorded):
        outcome = "error" if event.is_error else "ok"
        return outcome, f"{event.call_id} {_size(event.content)} B, {event.duration_ms} ms"
    if isinstance(event, ToolRoundSubmitted):
        return "", f"round {event.round}, {event.request_bytes} bytes"
    return "", ""


def _text(event: Event) -> str:
    if isinstance(event, TurnSubmitted):
        return event.question
    if isinstance(event, TurnCommitted):
        return event.answer
    if isinstance(event, ToolCallsRequested):
        return "; ".join(f"{c.name}({c.arguments})" for c in event.calls)
    if isinstance(event, ToolResultRecorded):
        return event.content
    return ""


_NO_CAPS = Budget()


def timeline(stored: Sequence[StoredEvent]) -> list[TimelineRow]:
    """The timeline of one session's stored events, in order."""
    rows: list[TimelineRow] = []
    state: SessionState = initial_state()
    ended_at: dict[str, float] = {}
    estimates: dict[str, int | None] = {}
    for env in stored:
        event = DEFAULT_CODEC.decode(env)
        before = phase_name(state)
        budget: int | None = None
        if isinstance(event, TurnSubmitted | TurnRetried):
            # The session's own budget (its window, calibration, overflows);
            # a hub's max_prompt_tokens is not on the record.
            probe = state
            if isinstance(event, TurnRetried):
                probe = evolve(state, event)
            budget = prompt_token_cap(probe, _NO_CAPS)
            estimates[event.request_id] = event.estimated_prompt_tokens
        state = evolve(state, event)
        rid = getattr(event, "request_id", None)
        if isinstance(event, TurnCommitted | TurnDiscarded | TurnRejected):
            ended_at[event.request_id] = env.recorded_at
        late_by = None
        if isinstance(event, CompletionIgnored) and event.request_id in ended_at:
            late_by = max(0.0, env.recorded_at - ended_at[event.request_id])
        estimated = estimates.get(rid) if rid is not None else None
        reason, detail = _reason(event, estimated, budget)
        usage = getattr(event, "usage", None)
        rows.append(
            TimelineRow(
                session_id=env.session_id,
                seq=env.seq,
                recorded_at=env.recorded_at,
                request_id=rid,
                event=env.tag,
                phase_from=before,
                phase_to=phase_name(state),
                reason=reason,
                detail=detail,
                late_by=late_by,
                text=_text(event),
                estimated_prompt_tokens=estimated,
                token_budget=budget,
                prompt_tokens=usage.prompt_tokens if usage is not None else None,
                completion_tokens=usage.completion_tokens if usage is not None else None,
                context_window=getattr(event, "context_window", None),
                output_reserve=getattr(event, "output_reserve", None),
            )
        )
    return rows


def session_summary(session_id: str, stored: Sequence[StoredEvent]) -> dict[str, Any]:
    """Turn counts, token totals and the last outcome of one session.

    ``prompt_tokens`` and ``completion_tokens`` add up what the server
    reported (answers committed or ignored: both were paid for);
    ``estimated_prompt_tokens`` adds up the estimates of every request sent;
    ``turns_dropped`` is how many turns the last request left out.
    """
    state = replay_stored(stored)
    last = None
    counts = {"committed": 0, "discarded": 0, "rejected": 0, "ignored": 0}
    tokens = {"prompt_tokens": 0, "completion_tokens": 0, "estimated_prompt_tokens": 0}
    dropped = 0
    overflows = 0
    for env in stored:
        payload = env.payload
        if env.tag == "turn_committed":
            counts["committed"] += 1
            last = "committed"
        elif env.tag == "turn_discarded":
            counts["discarded"] += 1
            last = f"discarded ({payload.get('reason')})"
            overflows += payload.get("reason") == "context_overflow"
        elif env.tag == "turn_rejected":
            counts["rejected"] += 1
            last = f"rejected ({payload.get('reason')})"
        elif env.tag == "completion_ignored":
            counts["ignored"] += 1
        elif env.tag in ("turn_submitted", "turn_retried"):
            dropped = _count(payload.get("turns_dropped"))
            tokens["estimated_prompt_tokens"] += _count(payload.get("estimated_prompt_tokens"))
            overflows += env.tag == "turn_retried"
        if env.tag in ("turn_committed", "completion_ignored"):
            usage = payload.get("usage")
            if isinstance(usage, dict):
                tokens["prompt_tokens"] += _count(usage.get("prompt_tokens"))
                tokens["completion_tokens"] += _count(usage.get("completion_tokens"))
    config = state.config
    return {
        "session_id": session_id,
        "events": len(stored),
        "turns": len(state.turns),
        **counts,
        "phase": phase_name(state),
        "last_outcome": last,
        "last_recorded_at": stored[-1].recorded_at if stored else None,
        "context_window": None if config is None else config.context_window,
        "window_source": None if config is None else config.window_source,
        **tokens,
        "turns_dropped": dropped,
        "context_overflows": overflows,
    }


def _count(value: object) -> int:
    return value if type(value) is int and value > 0 else 0
