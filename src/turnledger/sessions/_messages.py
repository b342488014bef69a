"""Messages into a session: commands from callers, notifications from I/O.

Every message about a request carries its request id; the state machine
ignores a message whose id is not the request in flight.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from typing import Final, TypeAlias

import attrs

from ..events import (
    BranchId,
    DiscardReason,
    HistoryPolicy,
    Ledger,
    OnBusy,
    RequestId,
    SummaryOrigin,
    ToolCall,
    ToolErrorPolicy,
    ToolSpec,
    Usage,
    WindowSource,
)

__all__ = [
    "Cancel",
    "Completed",
    "Edit",
    "Failed",
    "Failure",
    "Interrupt",
    "Message",
    "Pin",
    "RecordSummary",
    "Regenerate",
    "ResponseStarted",
    "Start",
    "Submit",
    "Switch",
    "Timeout",
    "ToolDone",
    "Unpin",
    "safe_finish_reason",
]


_FINISH_TOKEN: Final = re.compile(r"[A-Za-z0-9_-]{1,32}")


def safe_finish_reason(value: str | None) -> str:
    """A server's ``finish_reason`` as it may be recorded or logged.

    Real values are short identifiers (``stop``, ``length``,
    ``content_filter``...); anything else comes from the server and could
    carry a message or a path, so it is recorded as ``other``.
    """
    if value is None:
        return "none"
    return value if _FINISH_TOKEN.fullmatch(value) else "other"


def _specs(value: Iterable[ToolSpec]) -> tuple[ToolSpec, ...]:
    return tuple(value)


def _calls(value: Iterable[ToolCall]) -> tuple[ToolCall, ...]:
    return tuple(value)


@attrs.frozen
class Start:
    """Create the session: fixes its system prompt, model and policies."""

    system: str
    model: str
    policy: HistoryPolicy = attrs.field(factory=Ledger)
    on_busy: OnBusy = "reject"
    tools: tuple[ToolSpec, ...] = attrs.field(default=(), converter=_specs)
    tool_choice: str = "auto"
    max_tool_rounds: int = 8
    on_tool_error: ToolErrorPolicy = "report"
    #: The model's context window (tokens) and the part of it kept for the
    #: answer; ``None``: no window (only the hub's caps apply).
    context_window: int | None = None
    output_reserve: int | None = None
    window_source: WindowSource = "none"
    #: Whom the session belongs to (see ``SessionStarted.subject``).
    subject: str | None = None
    #: The session's own retention (see ``SessionStarted.retain_seconds``).
    retain_seconds: int | None = None
    retain_turns: int | None = None


@attrs.frozen
class Submit:
    """Ask a question under a caller-chosen request id."""

    request_id: RequestId
    question: str


@attrs.frozen
class Edit:
    """Ask ``question`` instead of the active branch's turn ``turn_index``
    (from 0): a new branch keeps the turns before it and submits the
    question under ``request_id``."""

    request_id: RequestId
    turn_index: int
    question: str


@attrs.frozen
class Regenerate:
    """Ask the active branch's last question again, on a new branch that
    keeps the turns before it, under ``request_id``."""

    request_id: RequestId


@attrs.frozen
class Switch:
    """Make ``branch`` the active branch: history becomes its path."""

    branch: BranchId


@attrs.frozen
class RecordSummary:
    """Record ``text`` as the summary of turns ``start`` to ``end`` (from 0,
    ``end`` excluded) of ``branch``'s path, written by the summarizing
    request ``request_id``."""

    request_id: RequestId
    branch: BranchId
    start: int
    end: int
    text: str
    origin: SummaryOrigin
    origin_name: str
    usage: Usage | None = None


@attrs.frozen
class Pin:
    """Pin ``text`` (from ``origin``) to the session's context as ``pin_id``."""

    pin_id: str
    text: str
    origin: str


@attrs.frozen
class Unpin:
    """Stop sending the pinned item ``pin_id``."""

    pin_id: str


@attrs.frozen
class Cancel:
    """Cancel the turn in flight (only ``request_id``'s turn, when given)."""

    request_id: RequestId | None = None


@attrs.frozen
class Timeout:
    """A deadline of ``request_id`` passed (``detail``: which deadline)."""

    request_id: RequestId
    detail: str = "deadline"


@attrs.frozen
class Interrupt:
    """Close a turn that can no longer finish: found in flight at recovery,
    or still running when the hub shut down."""

    detail: str = "recovered in flight"


@attrs.frozen
class ResponseStarted:
    """The provider accepted the request and the stream began."""

    request_id: RequestId
    #: The round of the turn the request belongs to.
    round: int = 0


@attrs.frozen
class Completed:
    """The provider's stream finished well formed."""

    request_id: RequestId
    answer: str
    finish_reason: str | None
    usage: Usage | None = None
    round: int = 0
    #: Tool calls the model asked for (the round then continues with tools).
    tool_calls: tuple[ToolCall, ...] = attrs.field(default=(), converter=_calls)


@attrs.frozen
class Failure:
    """Why a request failed, as one of the closed set of discard reasons."""

    reason: DiscardReason
    detail: str = ""


@attrs.frozen
class Failed:
    """The request failed before a well-formed completion."""

    request_id: RequestId
    failure: Failure
    round: int = 0


@attrs.frozen
class ToolDone:
    """A tool call of ``request_id`` finished: its result, or (``is_error``)
    the error text the model is to see."""

    request_id: RequestId
    call_id: str
    content: str
    is_error: bool = False
    duration_ms: int = 0


Message: TypeAlias = (
    Start
    | Submit
    | Cancel
    | Timeout
    | Interrupt
    | ResponseStarted
    | Completed
    | Failed
    | ToolDone
    | Edit
    | Regenerate
    | Switch
    | RecordSummary
    | Pin
    | Unpin
)
