"""The rows of a timeline and the summary of a session (see the package)."""

from __future__ import annotations

import datetime as dt
from collections.abc import Sequence
from typing import Any, Final, Literal, TypeAlias

import attrs

from ..events import (
    DEFAULT_CODEC,
    MAIN_BRANCH,
    BranchStarted,
    BranchSwitched,
    CompletionIgnored,
    Event,
    PinAdded,
    PinRemoved,
    SessionForked,
    SessionStarted,
    StoredEvent,
    StreamStarted,
    SummaryRecorded,
    SummarySent,
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

# From the pure modules themselves: the package's own __init__ can reach the
# trio runtime (lazily), which a pure module may not even name.
from ..sessions._branches import branch_records, infos
from ..sessions._budgets import prompt_token_cap
from ..sessions._machine import evolve
from ..sessions._phases import SessionState, initial_state, is_in_flight
from ..sessions._projection import Budget
from ..sessions._retention import subject_of

__all__ = [
    "BranchEntry",
    "BranchStart",
    "BranchSwitch",
    "End",
    "LateCompletion",
    "RetryEntry",
    "Row",
    "Step",
    "Timeline",
    "ToolCallEntry",
    "ToolRoundEntry",
    "explain",
    "iso_time",
    "phase_name",
    "session_summary",
    "timeline",
]

#: How a request ended; ``in_flight`` while it has not.
End: TypeAlias = Literal["committed", "discarded", "rejected", "in_flight"]


def phase_name(state: SessionState) -> str:
    """``idle``, ``pending``, ``streaming``, ``awaitingtools``, ``committed``
    or ``discarded``."""
    return type(state).__name__.lower()


def iso_time(ts: float) -> str:
    """A store timestamp as structlog's ISO form (UTC, microseconds)."""
    return dt.datetime.fromtimestamp(ts, dt.UTC).isoformat().replace("+00:00", "Z")


# --- the parts of a row -------------------------------------------------------


@attrs.frozen
class Step:
    """One stored event, as ``turnledger log`` prints it: the phase it moved
    the session through, why, and the token figures known at that point."""

    session_id: str
    seq: int
    recorded_at: float
    #: ``None`` for an event of the session itself (``session_started``).
    request_id: str | None
    #: The event's wire tag.
    event: str
    phase_from: str
    phase_to: str
    reason: str
    detail: str
    #: For an ignored late completion: seconds after its turn had ended.
    late_by: float | None = None
    #: The question (``turn_submitted``), the answer (``turn_committed``),
    #: the calls (``tool_calls_requested``) or a tool's result; else empty.
    text: str = ""
    #: The request's estimated prompt tokens (submitted, retried; and the
    #: estimate of the request a later event belongs to).
    estimated_prompt_tokens: int | None = None
    #: The session's prompt token budget when the request was projected.
    token_budget: int | None = None
    #: Usage the server reported (committed, ignored, tool calls).
    prompt_tokens: int | None = None
    completion_tokens: int | None = None
    #: The session's window and output reserve (``session_started``).
    context_window: int | None = None
    output_reserve: int | None = None

    def as_json(self, *, text: bool = False) -> dict[str, Any]:
        """The step as ``log --json`` prints it: the keys of the runtime's
        structlog ``transition`` lines (``tag``, ``from``, ``to``, an ISO
        ``timestamp``), the token figures where known, and with ``text`` the
        question, answer or tool text."""
        out: dict[str, Any] = {
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
        for key in _TOKEN_KEYS:
            value = getattr(self, key)
            if value is not None:
                out[key] = value
        if text:
            out["text"] = self.text
        return out


_TOKEN_KEYS: Final = (
    "estimated_prompt_tokens",
    "token_budget",
    "prompt_tokens",
    "completion_tokens",
    "context_window",
    "output_reserve",
)


@attrs.frozen
class RetryEntry:
    """The request sent again, smaller, after the server refused it (a
    context overflow): why, and the size of what was sent the second time."""

    seq: int
    at: float
    reason: str
    detail: str
    turns_sent: int
    turns_dropped: int
    request_bytes: int
    estimated_prompt_tokens: int
    #: The budget after the overflow (what the smaller request was cut to).
    token_budget: int | None


@attrs.frozen
class ToolCallEntry:
    """One call of a tool round: its name, id and sizes in UTF-8 bytes, and
    once recorded, how its result went (never the arguments or result)."""

    call_id: str
    name: str
    argument_bytes: int
    result_bytes: int | None = None
    duration_ms: int | None = None
    is_error: bool | None = None
    result_at: float | None = None


@attrs.frozen
class ToolRoundEntry:
    """One round of tool calls: requested by the model, run, and (unless the
    turn ended first) sent back as a new request."""

    round: int
    requested_at: float
    calls: tuple[ToolCallEntry, ...]
    usage: Usage | None = None
    submitted_at: float | None = None
    #: The size of the request that carried the results back.
    request_bytes: int | None = None


@attrs.frozen
class LateCompletion:
    """An answer (or failure) that arrived after its turn had ended, and was
    ignored: recorded because it was paid for."""

    outcome: str
    at: float
    #: Seconds after the turn ended (``None`` if the log holds no end).
    delay_s: float | None
    usage: Usage | None = None


@attrs.frozen
class BranchStart:
    """The branch a request started: its id, the branch it started from,
    how many of that branch's turns it keeps, and why (edit, regenerate)."""

    branch: str
    parent: str
    at_turn: int
    kind: str


@attrs.frozen
class BranchEntry:
    """One branch of the session at the end of the log."""

    branch_id: str
    parent: str | None
    at_turn: int
    kind: str | None
    #: Committed turns on its path (the prefix it shares included).
    length: int
    head: str | None
    active: bool
    #: Request ids of the committed turns the branch added itself, oldest
    #: first: its path after the ``at_turn`` turns it keeps (all of
    #: ``main``'s). Every committed turn of the session is on exactly one.
    turns: tuple[str, ...] = ()


@attrs.frozen
class BranchSwitch:
    """The active branch changed (a ``branch_switched`` event)."""

    seq: int
    at: float
    branch: str


@attrs.frozen
class Row:
    """One request id of a session: what happened to it, from its first
    event to its last."""

    request_id: str
    #: The question (empty when the log holds no ``turn_submitted``).
    question: str
    #: The seq and time of the request's first event.
    seq: int
    submitted_at: float
    end: End
    reason: str
    detail: str
    stream_started_at: float | None
    ended_at: float | None
    #: The seq of the event that ended it.
    ended_seq: int | None
    #: Characters shown as a preview of an answer that was then discarded.
    preview_chars: int
    answer_chars: int
    usage: Usage | None
    #: The first request's size: earlier turns sent and left out, bytes,
    #: estimated prompt tokens and the session's budget at the time.
    turns_sent: int
    turns_dropped: int
    request_bytes: int
    estimated_prompt_tokens: int | None
    token_budget: int | None
    retries: tuple[RetryEntry, ...]
    tool_rounds: tuple[ToolRoundEntry, ...]
    late: tuple[LateCompletion, ...]
    #: The newer request that replaced this one (``on_busy="supersede"``).
    superseded_by: str | None
    #: The requests this one replaced.
    supersedes: tuple[str, ...]
    #: For a ``busy`` rejection: the request that was in flight.
    busy_with: str | None
    #: The branch the question was asked on (``main`` in a log with none).
    branch: str
    #: The branch this request started (an edit or a regenerate), if any.
    starts_branch: BranchStart | None
    #: Every event of the request, in order.
    steps: tuple[Step, ...]
    #: Why the turn is (or is not) in history, in one sentence.
    explanation: str
    #: The summary the request sent in place of the turns it dropped.
    summary_sent: str | None = None

    def as_json(self) -> dict[str, Any]:
        """The row as the serve routes and the page's data carry it."""
        return {
            "request_id": self.request_id,
            "question": self.question,
            "seq": self.seq,
            "submitted_at": self.submitted_at,
            "stream_started_at": self.stream_started_at,
            "ended_at": self.ended_at,
            "ended_seq": self.ended_seq,
            "end": self.end,
            "reason": self.reason,
            "detail": self.detail,
            "preview_chars": self.preview_chars,
            "answer_chars": self.answer_chars,
            "usage": _usage_json(self.usage),
            "turns_sent": self.turns_sent,
            "turns_dropped": self.turns_dropped,
            "request_bytes": self.request_bytes,
            "estimated_prompt_tokens": self.estimated_prompt_tokens,
            "token_budget": self.token_budget,
            "retries": [attrs.asdict(r) for r in self.retries],
            "tool_rounds": [_round_json(r) for r in self.tool_rounds],
            "late": [
                {
                    "outcome": x.outcome,
                    "at": x.at,
                    "delay_s": x.delay_s,
                    "usage": _usage_json(x.usage),
                }
                for x in self.late
            ],
            "superseded_by": self.superseded_by,
            "supersedes": list(self.supersedes),
            "busy_with": self.busy_with,
            "branch": self.branch,
            "starts_branch": None
            if self.starts_branch is None
            else attrs.asdict(self.starts_branch),
            "summary_sent": self.summary_sent,
            "phases": [
                {
                    "seq": s.seq,
                    "at": s.recorded_at,
                    "event": s.event,
                    "from": s.phase_from,
                    "to": s.phase_to,
                }
                for s in self.steps
            ],
            "explanation": self.explanation,
        }


def _usage_json(usage: Usage | None) -> dict[str, int | None] | None:
    if usage is None:
        return None
    return {
        "prompt_tokens": usage.prompt_tokens,
        "completion_tokens": usage.completion_tokens,
        "total_tokens": usage.total_tokens,
    }


def _round_json(entry: ToolRoundEntry) -> dict[str, Any]:
    return {
        "round": entry.round,
        "requested_at": entry.requested_at,
        "calls": [attrs.asdict(c) for c in entry.calls],
        "usage": _usage_json(entry.usage),
        "submitted_at": entry.submitted_at,
        "request_bytes": entry.request_bytes,
    }


@attrs.frozen
class Timeline:
    """One session: its rows, its own events, where it stands, and the
    history a replay gives."""

    session_id: str
    #: The seq of the last event (the state's version).
    version: int
    phase: str
    #: The request in flight at the end of the log, if any.
    in_flight: str | None
    #: The times of the first and last events.
    t0: float | None
    t1: float | None
    #: The session's context window, where it came from, and the tokens
    #: kept for the answer (``None`` without a window).
    context_window: int | None
    window_source: str | None
    output_reserve: int | None
    rows: tuple[Row, ...]
    #: The events of no request (``session_started``).
    session_steps: tuple[Step, ...]
    #: The committed turns, as ``(request_id, question, answer)``.
    history: tuple[tuple[str, str, str], ...]
    #: How many events the log holds.
    events: int
    #: The branch whose path ``history`` is.
    active_branch: str = MAIN_BRANCH
    #: Every branch, ``main`` first (one, ``main``, in a log with none).
    branches: tuple[BranchEntry, ...] = ()
    #: Every switch of the active branch, in log order.
    switches: tuple[BranchSwitch, ...] = ()
    #: Every summary recorded (of any branch), in log order, with the turns
    #: it covers.
    summaries: tuple[SummaryRecorded, ...] = ()
    #: The items pinned at the end of the log, in the order they are sent.
    pins: tuple[PinAdded, ...] = ()

    def steps(self) -> list[Step]:
        """Every event, in log order: what ``turnledger log`` prints."""
        return sorted(
            [*self.session_steps, *(s for r in self.rows for s in r.steps)], key=lambda s: s.seq
        )

    def as_json(self) -> dict[str, Any]:
        """The model the page draws and ``GET .../timeline`` returns."""
        return {
            "session_id": self.session_id,
            "version": self.version,
            "phase": self.phase,
            "in_flight": self.in_flight,
            "t0": self.t0,
            "t1": self.t1,
            "context_window": self.context_window,
            "window_source": self.window_source,
            "output_reserve": self.output_reserve,
            "turns": [r.as_json() for r in self.rows],
            "history": [
                {"request_id": rid, "question": q, "answer": a} for rid, q, a in self.history
            ],
            "active_branch": self.active_branch,
            "branches": [{**attrs.asdict(b), "turns": list(b.turns)} for b in self.branches],
            "switches": [attrs.asdict(w) for w in self.switches],
            "summaries": [attrs.asdict(x) for x in self.summaries],
            "pins": [attrs.asdict(p) for p in self.pins],
        }


# --- why a turn is (or is not) in history ------------------------------------

_DISCARD_WHY: Final = {
    "cancelled": "the turn was cancelled by an explicit Stop",
    "superseded": "a newer question replaced it before its answer was complete",
    "interrupted": "the service stopped or crashed while it was in flight",
    "http_status": "the model server answered with an HTTP error",
    "transport": "the connection to the model server failed",
    "protocol": "the model server broke the chat protocol",
    "malformed": "the model server sent malformed data",
    "empty": "the answer was empty",
    "incomplete_finish": "the answer did not finish with 'stop' (cut off)",
    "incomplete_stream": "the stream ended before it was complete",
    "provider_error": "the model server reported an error mid-stream",
    "limit": "the stream crossed a safety limit",
    "conflict": "the log moved under the session",
    "store_error": "the event store could not record its end (a full disk, an I/O error)",
    "context_overflow": "the request did not fit the model's context window",
    "tool_error": "a tool failed and the session ends the turn on tool errors",
    "tool_rounds": "the model asked for more tool rounds than the session allows",
}
_TIMEOUT_WHY: Final = {
    "deadline": "no complete answer arrived within the turn deadline",
    "idle": "the stream went silent for longer than the idle timeout",
}
_REJECT_WHY: Final = {
    "busy": "another turn of this session was still in flight",
    "over_budget": "the system prompt and question alone exceed the request budget",
    "empty_question": "the question was empty",
    "invalid_question": "the question was not valid Unicode text",
}


def explain(row: Row) -> str:
    """One sentence telling why a turn is (or is not) in history."""
    return _why(row)


def _why(row: Row | _Draft) -> str:
    if row.end == "committed":
        return "In history: a complete answer was accepted."
    if row.end == "in_flight":
        return "In flight: not in history unless a complete answer arrives."
    if row.end == "rejected":
        why = _REJECT_WHY.get(row.reason, row.reason)
        if row.busy_with is not None:
            why = f"another turn of this session ({row.busy_with}) was still in flight"
        return f"Refused before any request was sent: {why}."
    if row.reason == "timeout":
        why = _TIMEOUT_WHY.get(row.detail, "it timed out")
    else:
        why = _DISCARD_WHY.get(row.reason, row.reason)
    if row.reason == "superseded" and row.superseded_by:
        why = f"a newer question ({row.superseded_by}) replaced it"
    text = f"Not in history: {why}."
    if row.preview_chars:
        text += f" The {row.preview_chars} characters shown were only a preview."
    return text


# --- the reason and detail of one step ---------------------------------------


def _tokens(estimated: int | None, budget: int | None) -> str:
    if estimated is None:
        return ""
    return f", ~{estimated} tokens" + (f" of {budget}" if budget is not None else "")


def _usage_text(estimated: int | None, usage: Usage | None) -> str:
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


def _size(text: str) -> int:
    return len(text.encode("utf-8", "replace"))


def _reason(event: Event, estimated: int | None, budget: int | None) -> tuple[str, str]:
    if isinstance(event, TurnDiscarded | TurnRejected):
        return event.reason, event.detail
    if isinstance(event, TurnCommitted):
        return event.finish_reason, _usage_text(estimated, event.usage)
    if isinstance(event, CompletionIgnored):
        return event.outcome, _usage_text(None, event.usage) if event.usage else ""
    if isinstance(event, TurnSubmitted):
        size = _projection(event.turns_sent, event.turns_dropped, event.request_bytes)
        return "", size + _tokens(event.estimated_prompt_tokens, budget)
    if isinstance(event, TurnRetried):
        size = _projection(event.turns_sent, event.turns_dropped, event.request_bytes)
        again = size + _tokens(event.estimated_prompt_tokens, budget)
        return event.reason, f"{event.detail}; sent again: {again}"
    if isinstance(event, BranchStarted):
        what = "asked differently" if event.kind == "edit" else "asked again"
        return event.kind, (
            f"branch {event.branch} from {event.parent}: keeps {event.at_turn} turns, "
            f"question {event.at_turn + 1} {what}"
        )
    if isinstance(event, BranchSwitched):
        return "switch", f"active branch: {event.branch}"
    if isinstance(event, SessionForked):
        return "fork", (
            f"fork of {event.source}: shares its first {event.at_turn} turns of branch "
            f"{event.branch} (as of its event {event.source_seq})"
        )
    if isinstance(event, SummaryRecorded | SummarySent | PinAdded | PinRemoved):
        return _carried_reason(event)
    if isinstance(event, SessionStarted) and event.context_window is not None:
        return "", (
            f"context window {event.context_window} tokens ({event.window_source}), "
            f"{event.output_reserve} kept for the answer"
        )
    return _tool_reason(event)


def _carried_reason(
    event: SummaryRecorded | SummarySent | PinAdded | PinRemoved,
) -> tuple[str, str]:
    # Ids, ranges, origins and sizes; the texts are the steps' own text.
    if isinstance(event, SummaryRecorded):
        return event.origin, (
            f"summary {event.summary_id} of {event.branch} turns {event.start}-{event.end - 1} "
            f"({event.first_request_id} to {event.last_request_id}) by {event.origin_name}, "
            f"{event.size_bytes} bytes, ~{event.estimated_tokens} tokens"
        )
    if isinstance(event, SummarySent):
        return "summary", f"summary {event.summary_id} sent in place of the turns dropped"
    if isinstance(event, PinAdded):
        return "pin", f"pinned {event.pin_id} ({event.origin}), {_size(event.text)} bytes"
    return "unpin", f"unpinned {event.pin_id}"


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
    if isinstance(event, SummaryRecorded | PinAdded):
        return event.text
    return ""


# --- building the rows --------------------------------------------------------


@attrs.define
class _Draft:
    """A row while the log is read (made a frozen :class:`Row` at the end)."""

    request_id: str
    seq: int
    submitted_at: float
    question: str = ""
    end: End = "in_flight"
    reason: str = ""
    detail: str = ""
    stream_started_at: float | None = None
    ended_at: float | None = None
    ended_seq: int | None = None
    preview_chars: int = 0
    answer_chars: int = 0
    usage: Usage | None = None
    turns_sent: int = 0
    turns_dropped: int = 0
    request_bytes: int = 0
    estimated_prompt_tokens: int | None = None
    token_budget: int | None = None
    retries: list[RetryEntry] = attrs.Factory(list)
    tool_rounds: list[ToolRoundEntry] = attrs.Factory(list)
    late: list[LateCompletion] = attrs.Factory(list)
    superseded_by: str | None = None
    supersedes: list[str] = attrs.Factory(list)
    busy_with: str | None = None
    branch: str = MAIN_BRANCH
    starts_branch: BranchStart | None = None
    steps: list[Step] = attrs.Factory(list)
    summary_sent: str | None = None

    def freeze(self) -> Row:
        # Field by field: attrs.asdict and evolve cost a third of a summary.
        return Row(
            request_id=self.request_id,
            question=self.question,
            seq=self.seq,
            submitted_at=self.submitted_at,
            end=self.end,
            reason=self.reason,
            detail=self.detail,
            stream_started_at=self.stream_started_at,
            ended_at=self.ended_at,
            ended_seq=self.ended_seq,
            preview_chars=self.preview_chars,
            answer_chars=self.answer_chars,
            usage=self.usage,
            turns_sent=self.turns_sent,
            turns_dropped=self.turns_dropped,
            request_bytes=self.request_bytes,
            estimated_prompt_tokens=self.estimated_prompt_tokens,
            token_budget=self.token_budget,
            retries=tuple(self.retries),
            tool_rounds=tuple(self.tool_rounds),
            late=tuple(self.late),
            superseded_by=self.superseded_by,
            supersedes=tuple(self.supersedes),
            busy_with=self.busy_with,
            branch=self.branch,
            starts_branch=self.starts_branch,
            steps=tuple(self.steps),
            explanation=_why(self),
            summary_sent=self.summary_sent,
        )


def _on_tool_result(draft: _Draft, event: ToolResultRecorded, at: float) -> None:
    if not draft.tool_rounds:
        return
    last = draft.tool_rounds[-1]
    calls = tuple(
        attrs.evolve(
            c,
            result_bytes=_size(event.content),
            duration_ms=event.duration_ms,
            is_error=event.is_error,
            result_at=at,
        )
        if c.call_id == event.call_id
        else c
        for c in last.calls
    )
    draft.tool_rounds[-1] = attrs.evolve(last, calls=calls)


def _ended(draft: _Draft, end: End, env: StoredEvent, reason: str, detail: str = "") -> None:
    draft.end, draft.reason, draft.detail = end, reason, detail
    draft.ended_at, draft.ended_seq = env.recorded_at, env.seq


def _apply(draft: _Draft, event: Event, env: StoredEvent, budget: int | None) -> None:
    """What one event of a request changes in its row."""
    at = env.recorded_at
    if isinstance(event, BranchStarted):
        draft.starts_branch = BranchStart(event.branch, event.parent, event.at_turn, event.kind)
    elif isinstance(event, TurnSubmitted):
        draft.question = event.question
        draft.turns_sent, draft.turns_dropped = event.turns_sent, event.turns_dropped
        draft.request_bytes = event.request_bytes
        draft.estimated_prompt_tokens, draft.token_budget = event.estimated_prompt_tokens, budget
    elif isinstance(event, TurnRejected):
        _ended(draft, "rejected", env, event.reason, event.detail)
    elif isinstance(event, StreamStarted):
        draft.stream_started_at = at
    elif isinstance(event, SummarySent):
        draft.summary_sent = event.summary_id
    elif isinstance(event, TurnRetried):
        draft.summary_sent = None  # a SummarySent follows if the retry sends one
        draft.retries.append(
            RetryEntry(
                seq=env.seq, at=at, reason=event.reason, detail=event.detail,
                turns_sent=event.turns_sent, turns_dropped=event.turns_dropped,
                request_bytes=event.request_bytes,
                estimated_prompt_tokens=event.estimated_prompt_tokens, token_budget=budget,
            )
        )  # fmt: skip
    elif isinstance(event, TurnCommitted):
        _ended(draft, "committed", env, event.finish_reason)
        draft.answer_chars, draft.usage = len(event.answer), event.usage
    elif isinstance(event, TurnDiscarded):
        _ended(draft, "discarded", env, event.reason, event.detail)
        draft.preview_chars = event.preview_chars
    elif isinstance(event, CompletionIgnored):
        delay = None if draft.ended_at is None else max(0.0, at - draft.ended_at)
        draft.late.append(LateCompletion(event.outcome, at, delay, event.usage))
    elif isinstance(event, ToolCallsRequested):
        calls = tuple(ToolCallEntry(c.call_id, c.name, _size(c.arguments)) for c in event.calls)
        draft.tool_rounds.append(ToolRoundEntry(event.round, at, calls, event.usage))
    elif isinstance(event, ToolResultRecorded):
        _on_tool_result(draft, event, at)
    elif isinstance(event, ToolRoundSubmitted) and draft.tool_rounds:
        last = draft.tool_rounds[-1]
        draft.tool_rounds[-1] = attrs.evolve(
            last, submitted_at=at, request_bytes=event.request_bytes
        )


_NO_CAPS: Final = Budget()


def _budget(state: SessionState, event: Event) -> int | None:
    # The session's own budget (its window, calibration, overflows) when a
    # request was projected; a hub's max_prompt_tokens is not on the record.
    if isinstance(event, TurnSubmitted):
        return prompt_token_cap(state, _NO_CAPS)
    if isinstance(event, TurnRetried):
        return prompt_token_cap(evolve(state, event), _NO_CAPS)
    return None


def _in_flight(state: SessionState) -> str | None:
    request = getattr(state, "request", None)
    return str(request.request_id) if is_in_flight(state) and request is not None else None


def timeline(
    session_id: str, stored: Sequence[StoredEvent], *, seed: SessionState | None = None
) -> Timeline:
    """The timeline of one session's stored events (in log order).

    ``seed``: for a fork, the state its events fold from (its shared turns,
    from :func:`turnledger.sessions._forks.seed_of`); the rows are the
    fork's own requests, its history includes the shared turns.

    Raises what decoding and replay raise on a damaged log
    (:class:`~turnledger.DecodeError`, :class:`~turnledger.ReplayError`).
    """
    return _build(session_id, stored, steps=True, seed=seed)


def _build(
    session_id: str,
    stored: Sequence[StoredEvent],
    *,
    steps: bool,
    seed: SessionState | None = None,
) -> Timeline:
    # Without steps (what a summary needs) no line of text is written and
    # no budget is projected: the rows only, at about the cost of a replay.
    drafts: dict[str, _Draft] = {}
    session_steps: list[Step] = []
    state: SessionState = initial_state() if seed is None else seed
    superseded: _Draft | None = None
    switches: list[BranchSwitch] = []
    for env in stored:
        event = DEFAULT_CODEC.decode(env)
        before = phase_name(state)
        # (asked only where it is needed: a busy rejection names the request)
        busy = isinstance(event, TurnRejected) and event.reason == "busy"
        was_in_flight = _in_flight(state) if busy else None
        budget = _budget(state, event) if steps else None
        state = evolve(state, event)
        # (a summary's request id is the summarizing request's: not a turn)
        rid = None if isinstance(event, SummaryRecorded) else getattr(event, "request_id", None)
        draft = None
        if rid is not None:
            rid = str(rid)
            draft = drafts.get(rid)
            if draft is None:
                draft = drafts[rid] = _Draft(rid, env.seq, env.recorded_at)
            if isinstance(event, TurnSubmitted) and superseded is not None:
                superseded.superseded_by = rid
                draft.supersedes.append(superseded.request_id)
            if busy:
                draft.busy_with = was_in_flight
            if isinstance(event, TurnSubmitted):
                draft.branch = state.active_branch
            _apply(draft, event, env, budget)
        elif isinstance(event, BranchSwitched):
            switches.append(BranchSwitch(env.seq, env.recorded_at, event.branch))
        if isinstance(event, TurnDiscarded) and event.reason == "superseded":
            superseded = draft
        elif not isinstance(event, BranchStarted):
            # (an edit that supersedes: its branch starts, then its question)
            superseded = None
        if steps:
            step = _step(session_id, env, event, rid, draft, before, phase_name(state), budget)
            (draft.steps if draft is not None else session_steps).append(step)
    config = state.config
    times = [e.recorded_at for e in stored]
    return Timeline(
        session_id=session_id,
        version=state.version,
        phase=phase_name(state),
        in_flight=_in_flight(state),
        t0=min(times) if times else None,
        t1=max(times) if times else None,
        context_window=None if config is None else config.context_window,
        window_source=None if config is None else config.window_source,
        output_reserve=None if config is None else config.output_reserve,
        rows=tuple(d.freeze() for d in drafts.values()),
        session_steps=tuple(session_steps),
        history=tuple((str(t.request_id), t.question, t.answer) for t in state.turns),
        events=len(stored),
        active_branch=state.active_branch,
        branches=_branches(state, own_turns=steps),
        switches=tuple(switches),
        summaries=state.summaries,
        pins=state.pins,
    )


def _branches(state: SessionState, *, own_turns: bool) -> tuple[BranchEntry, ...]:
    # (a summary needs no turns of its own: it counts the history only)
    records = branch_records(state.branches, state.active_branch, state.turns, state.context_start)
    out = []
    for b, r in zip(infos(records, state.active_branch), records, strict=True):
        turns = tuple(str(t.request_id) for t in r.turns[r.at_turn :]) if own_turns else ()
        out.append(
            BranchEntry(b.branch_id, b.parent, b.at_turn, b.kind, b.length, b.head, b.active, turns)
        )
    return tuple(out)


def _step(
    session_id: str,
    env: StoredEvent,
    event: Event,
    rid: str | None,
    draft: _Draft | None,
    before: str,
    after: str,
    budget: int | None,
) -> Step:
    estimated = None
    if draft is not None:
        estimated = (
            draft.retries[-1].estimated_prompt_tokens
            if draft.retries
            else (draft.estimated_prompt_tokens)
        )
    late_by = draft.late[-1].delay_s if isinstance(event, CompletionIgnored) and draft else None
    reason, detail = _reason(event, estimated, budget)
    usage: Usage | None = getattr(event, "usage", None)
    return Step(
        session_id=session_id,
        seq=env.seq,
        recorded_at=env.recorded_at,
        request_id=rid,
        event=env.tag,
        phase_from=before,
        phase_to=after,
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


# --- the summary --------------------------------------------------------------


def session_summary(
    session_id: str, stored: Sequence[StoredEvent], *, seed: SessionState | None = None
) -> dict[str, Any]:
    """One session in a list: ``turnledger sessions --json`` and
    ``GET /v1/sessions`` print these keys.

    - ``session_id``, ``subject`` (whom the session belongs to, or
      ``None``), ``events`` (in the log), ``turns`` (in history),
      ``requests`` (request ids seen), ``phase``;
    - ``committed``, ``discarded``, ``rejected``, ``ignored`` (late
      completions), ``retried`` (requests sent again), ``tool_calls``;
    - ``last_outcome``: ``committed``, ``discarded (REASON)`` or ``rejected
      (REASON)`` of the last turn that ended, in log order; ``last_recorded_at``;
    - ``context_window`` and ``window_source`` of the session;
    - ``prompt_tokens`` and ``completion_tokens``: what the server reported
      for answers committed or ignored (both were paid for);
      ``estimated_prompt_tokens``: the estimates of every request sent;
    - ``turns_dropped``: how many turns the last request left out;
      ``context_overflows``: requests the server refused as too long.
    """
    tl = _build(session_id, stored, steps=False, seed=seed)
    counts = {"committed": 0, "discarded": 0, "rejected": 0, "ignored": 0}
    tokens = {"prompt_tokens": 0, "completion_tokens": 0, "estimated_prompt_tokens": 0}
    last: tuple[int, str] | None = None
    sent: tuple[int, int] | None = None  # (seq, turns_dropped) of the last request sent
    retried = tool_calls = overflows = 0
    for row in tl.rows:
        if row.end != "in_flight":
            counts[row.end] += 1
            outcome = row.end if row.end == "committed" else f"{row.end} ({row.reason})"
            last = max(last or (-1, ""), (row.ended_seq or row.seq, outcome))
        counts["ignored"] += len(row.late)
        for usage in [row.usage, *(x.usage for x in row.late)]:
            if usage is not None:
                tokens["prompt_tokens"] += _count(usage.prompt_tokens)
                tokens["completion_tokens"] += _count(usage.completion_tokens)
        if row.end != "rejected":
            tokens["estimated_prompt_tokens"] += _count(row.estimated_prompt_tokens)
            sent = max(sent or (-1, 0), (row.seq, row.turns_dropped))
        for retry in row.retries:
            tokens["estimated_prompt_tokens"] += _count(retry.estimated_prompt_tokens)
            sent = max(sent or (-1, 0), (retry.seq, retry.turns_dropped))
        retried += len(row.retries)
        overflows += len(row.retries) + (
            row.end == "discarded" and row.reason == "context_overflow"
        )
        tool_calls += sum(len(r.calls) for r in row.tool_rounds)
    return {
        "session_id": session_id,
        "subject": subject_of(stored),
        "events": tl.events,
        "turns": len(tl.history),
        "requests": len(tl.rows),
        **counts,
        "retried": retried,
        "tool_calls": tool_calls,
        "phase": tl.phase,
        "last_outcome": None if last is None else last[1],
        "last_recorded_at": tl.t1,
        "context_window": tl.context_window,
        "window_source": tl.window_source,
        **tokens,
        "turns_dropped": 0 if sent is None else sent[1],
        "context_overflows": overflows,
    }


def _count(value: int | None) -> int:
    return value if value is not None and value > 0 else 0
