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
    StoredEvent,
    ToolCallsRequested,
    ToolResultRecorded,
    ToolRoundSubmitted,
    TurnCommitted,
    TurnDiscarded,
    TurnRejected,
    TurnSubmitted,
)
from ..sessions import SessionState, evolve, initial_state

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
        if text:
            row["text"] = self.text
        return row


def iso_time(ts: float) -> str:
    """A store timestamp as structlog's ISO form (UTC, microseconds)."""
    return dt.datetime.fromtimestamp(ts, dt.UTC).isoformat().replace("+00:00", "Z")


def _reason(event: Event) -> tuple[str, str]:
    if isinstance(event, TurnDiscarded | TurnRejected):
        return event.reason, event.detail
    if isinstance(event, TurnCommitted):
        return event.finish_reason, ""
    if isinstance(event, CompletionIgnored):
        return event.outcome, ""
    if isinstance(event, TurnSubmitted):
        return "", (
            f"{event.turns_sent} turns sent, {event.turns_dropped} dropped, "
            f"{event.request_bytes} bytes"
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


def timeline(stored: Sequence[StoredEvent]) -> list[TimelineRow]:
    """The timeline of one session's stored events, in order."""
    rows: list[TimelineRow] = []
    state: SessionState = initial_state()
    ended_at: dict[str, float] = {}
    for env in stored:
        event = DEFAULT_CODEC.decode(env)
        before = phase_name(state)
        state = evolve(state, event)
        rid = getattr(event, "request_id", None)
        if isinstance(event, TurnCommitted | TurnDiscarded | TurnRejected):
            ended_at[event.request_id] = env.recorded_at
        late_by = None
        if isinstance(event, CompletionIgnored) and event.request_id in ended_at:
            late_by = max(0.0, env.recorded_at - ended_at[event.request_id])
        reason, detail = _reason(event)
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
            )
        )
    return rows


def session_summary(session_id: str, stored: Sequence[StoredEvent]) -> dict[str, Any]:
    """Turn counts and the last outcome of one session."""
    state = replay_stored(stored)
    last = None
    counts = {"committed": 0, "discarded": 0, "rejected": 0, "ignored": 0}
    for env in stored:
        if env.tag == "turn_committed":
            counts["committed"] += 1
            last = "committed"
        elif env.tag == "turn_discarded":
            counts["discarded"] += 1
            last = f"discarded ({env.payload.get('reason')})"
        elif env.tag == "turn_rejected":
            counts["rejected"] += 1
            last = f"rejected ({env.payload.get('reason')})"
        elif env.tag == "completion_ignored":
            counts["ignored"] += 1
    return {
        "session_id": session_id,
        "events": len(stored),
        "turns": len(state.turns),
        **counts,
        "phase": phase_name(state),
        "last_outcome": last,
        "last_recorded_at": stored[-1].recorded_at if stored else None,
    }
