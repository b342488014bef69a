"""The session runtime's log vocabulary: event names and field names.

These names are a stable interface (``grep``/``jq`` scripts depend on them);
docs/logging.md documents each one. Adding a field is compatible; renaming or
removing one is not. The library never configures structlog: it asks for a
logger and binds ``session_id`` (per actor) and ``request_id`` (per turn).
"""

from __future__ import annotations

from contextvars import ContextVar
from typing import Any, Final

import structlog

from .._logging import library_logger
from ..events import (
    WIRE_TAGS,
    BranchStarted,
    BranchSwitched,
    CompletionIgnored,
    Event,
    PinAdded,
    PinRemoved,
    SessionForked,
    SessionStarted,
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
from ..sessions._machine import SessionState, current_request, ending_of
from ..sessions._messages import (
    Cancel,
    Completed,
    Edit,
    Failed,
    Interrupt,
    Message,
    Pin,
    RecordSummary,
    Regenerate,
    Start,
    Submit,
    Switch,
    Timeout,
    Unpin,
    safe_finish_reason,
)

__all__ = [
    "EVENTS",
    "FIELDS",
    "LOGGER_NAME",
    "bind_request_id",
    "get_logger",
    "is_enabled",
    "message_fields",
    "transition_fields",
]

#: The logger's name (structlog's, or the standard ``logging`` logger's).
LOGGER_NAME: Final = "turnledger.sessions"

#: Every log event name the session runtime emits, with its level.
EVENTS: Final[dict[str, str]] = {
    "actor_started": "debug",
    "actor_stopped": "debug",
    "actor_failed": "error",
    "message_received": "debug",
    "transition": "info",
    "late_completion": "info",
    "append_conflict": "warning",
    "store_error": "error",
    "request_error": "error",
    "context_window": "info",
    "context_window_fallback": "warning",
    "session_erased": "info",
    "session_trimmed": "info",
    "session_forked": "info",
    "summary_started": "info",
    "summary_recorded": "info",
    "summary_failed": "warning",
    "summary_cancelled": "info",
}

#: Every key that may appear in those lines (besides structlog's own
#: ``event`` and whatever the application's processors add).
FIELDS: Final[frozenset[str]] = frozenset(
    {
        "session_id",
        "node_id",
        "request_id",
        "msg_type",
        "stale",
        "in_flight",
        "question_chars",
        "answer_chars",
        "finish_reason",
        "detail",
        "from",
        "to",
        "tag",
        "seq",
        "reason",
        "preview_chars",
        "turns_sent",
        "turns_dropped",
        "request_bytes",
        "outcome",
        "delay_s",
        "version",
        "phase",
        "why",
        "error",
        "expected_version",
        "actual_version",
        "attempt",
        "model",
        "context_window",
        "output_reserve",
        "window_source",
        "estimated_prompt_tokens",
        "prompt_tokens",
        "completion_tokens",
        "events",
        "kept",
        "turns",
        "session_hash",
        "source",
        "source_seq",
        "branch",
        "parent",
        "at_turn",
        "kind",
        "start",
        "end",
        "summary_id",
        "tokens",
        "pin_id",
        "pin_chars",
        "origin",
        "summary_bytes",
        "summary_chars",
        "estimated_tokens",
    }
)


def get_logger() -> Any:
    """The runtime's logger: the application's structlog if it configured
    structlog, else standard ``logging`` (see :mod:`turnledger._logging`)."""
    return library_logger(LOGGER_NAME)


#: structlog's context variable for ``request_id``, found on first use.
_request_id: ContextVar[Any] | None = None


def bind_request_id(request_id: str) -> None:
    """``structlog.contextvars.bind_contextvars(request_id=...)`` for the
    current task (one of a turn's), at the cost of one ``ContextVar.set``.

    structlog keeps one context variable per key for the life of the process;
    the token of the first binding names it (``Token.var``). Binding through
    it then skips the keyword dict, the key's name built anew and the dict of
    tokens of every call: this runs for every request.
    """
    global _request_id
    var = _request_id
    if var is None:
        token = structlog.contextvars.bind_contextvars(request_id=request_id)["request_id"]
        _request_id = token.var
    else:
        var.set(request_id)


def is_enabled(log: Any, level: int) -> bool:
    """Whether ``log`` passes ``level`` (a :mod:`logging` level number).

    True unless the logger can tell (structlog's filtering loggers can), so a
    logger of another kind still gets every line.
    """
    check = getattr(log, "is_enabled_for", None)
    return True if check is None else bool(check(level))


def message_fields(msg: Message, state: SessionState) -> dict[str, Any]:
    """The fields of a ``message_received`` line: ``msg`` arriving in ``state``."""
    current = current_request(state)
    out: dict[str, Any] = {"msg_type": type(msg).__name__, "in_flight": current}
    # ``request_id`` is always the request the message is about (or the one
    # in flight, for Cancel() and Interrupt), so one jq filter on it shows
    # every line of a request's story, including stale ones.
    if isinstance(msg, (Submit, Edit, Regenerate)):
        out["request_id"] = msg.request_id
        # A request id seen before (a retry) changes nothing.
        out["stale"] = ending_of(state, msg.request_id) is not None
        if not isinstance(msg, Regenerate):
            out["question_chars"] = len(msg.question)
        if isinstance(msg, Edit):
            out["turn_index"] = msg.turn_index
    elif isinstance(msg, Switch):
        out["request_id"] = current
        out["stale"] = msg.branch == state.active_branch
        out["branch"] = msg.branch
    elif isinstance(msg, Cancel):
        out["request_id"] = current if msg.request_id is None else msg.request_id
        out["stale"] = current is None or (msg.request_id not in (None, current))
    elif isinstance(msg, Interrupt):
        out["request_id"] = current
        out["stale"] = current is None
        out["detail"] = msg.detail
    elif isinstance(msg, Start):
        out["request_id"] = None
        out["stale"] = False
    elif isinstance(msg, (Pin, Unpin)):
        out["request_id"] = current
        out["stale"] = False
        out["pin_id"] = msg.pin_id
    elif isinstance(msg, RecordSummary):
        # The summarizing request's id (never the text).
        out["request_id"] = msg.request_id
        out["stale"] = any(x.request_id == msg.request_id for x in state.summaries)
        out["summary_chars"] = len(msg.text)
    else:
        out["request_id"] = msg.request_id
        out["stale"] = msg.request_id != current
        if isinstance(msg, Timeout):
            out["detail"] = msg.detail
        elif isinstance(msg, Completed):
            out["answer_chars"] = len(msg.answer)
            out["finish_reason"] = safe_finish_reason(msg.finish_reason)
        elif isinstance(msg, Failed):
            out["reason"] = msg.failure.reason
    return out


def transition_fields(event: Event) -> dict[str, Any]:
    """The event's own fields of a ``transition`` line (never message text)."""
    out: dict[str, Any] = {"tag": WIRE_TAGS[type(event)]}
    if isinstance(event, SessionStarted):
        out["request_id"] = None
        out["context_window"] = event.context_window
        out["output_reserve"] = event.output_reserve
        out["window_source"] = event.window_source
        return out
    if isinstance(event, BranchSwitched):
        out["request_id"] = None
        out["branch"] = event.branch
        return out
    if isinstance(event, SessionForked):
        out["request_id"] = None
        out["source"] = event.source
        out["source_seq"] = event.source_seq
        out["branch"] = event.branch
        out["at_turn"] = event.at_turn
        return out
    if isinstance(event, (PinAdded, PinRemoved)):
        # Its id and size, never its text.
        out["request_id"] = None
        out["pin_id"] = event.pin_id
        if isinstance(event, PinAdded):
            out["pin_chars"] = len(event.text)
        return out
    out["request_id"] = event.request_id
    if isinstance(event, BranchStarted):
        out["branch"] = event.branch
        out["parent"] = event.parent
        out["at_turn"] = event.at_turn
        out["kind"] = event.kind
    if isinstance(event, TurnSubmitted):
        out["question_chars"] = len(event.question)
        out["turns_sent"] = event.turns_sent
        out["turns_dropped"] = event.turns_dropped
        out["request_bytes"] = event.request_bytes
        out["estimated_prompt_tokens"] = event.estimated_prompt_tokens
    elif isinstance(event, TurnRetried):
        out["attempt"] = 2
        out["reason"] = event.reason
        out["detail"] = event.detail
        out["turns_sent"] = event.turns_sent
        out["turns_dropped"] = event.turns_dropped
        out["request_bytes"] = event.request_bytes
        out["estimated_prompt_tokens"] = event.estimated_prompt_tokens
    elif isinstance(event, TurnCommitted):
        out["answer_chars"] = len(event.answer)
        out["finish_reason"] = event.finish_reason
        _usage_fields(out, event.usage)
    elif isinstance(event, TurnDiscarded):
        out["reason"] = event.reason
        out["detail"] = event.detail
        out["preview_chars"] = event.preview_chars
    elif isinstance(event, TurnRejected):
        out["reason"] = event.reason
        out["detail"] = event.detail
    elif isinstance(event, CompletionIgnored):
        out["outcome"] = event.outcome
        _usage_fields(out, event.usage)
    elif isinstance(event, ToolCallsRequested):
        out["round"] = event.round
        out["tools"] = [c.name for c in event.calls]
        out["call_ids"] = [c.call_id for c in event.calls]
    elif isinstance(event, ToolResultRecorded):
        out["call_id"] = event.call_id
        out["is_error"] = event.is_error
        out["result_chars"] = len(event.content)
        out["duration_ms"] = event.duration_ms
    elif isinstance(event, ToolRoundSubmitted):
        out["round"] = event.round
        out["request_bytes"] = event.request_bytes
    elif isinstance(event, SummaryRecorded):
        out["summary_id"] = event.summary_id
        out["branch"] = event.branch
        out["start"] = event.start
        out["end"] = event.end
        out["origin"] = event.origin
        out["summary_bytes"] = event.size_bytes
        out["estimated_tokens"] = event.estimated_tokens
        _usage_fields(out, event.usage)
    elif isinstance(event, SummarySent):
        out["summary_id"] = event.summary_id
    return out


def _usage_fields(out: dict[str, Any], usage: Usage | None) -> None:
    out["prompt_tokens"] = None if usage is None else usage.prompt_tokens
    out["completion_tokens"] = None if usage is None else usage.completion_tokens
