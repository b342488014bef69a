"""Messages into a session: commands from callers, notifications from I/O.

Every message about a request carries its request id; the state machine
ignores a message whose id is not the request in flight.
"""

from __future__ import annotations

from typing import TypeAlias

import attrs

from ..events import DiscardReason, HistoryPolicy, Ledger, OnBusy, RequestId, Usage

__all__ = [
    "Cancel",
    "Completed",
    "Failed",
    "Failure",
    "Interrupt",
    "Message",
    "ResponseStarted",
    "Start",
    "Submit",
    "Timeout",
]


@attrs.frozen
class Start:
    """Create the session: fixes its system prompt, model and policies."""

    system: str
    model: str
    policy: HistoryPolicy = attrs.field(factory=Ledger)
    on_busy: OnBusy = "reject"


@attrs.frozen
class Submit:
    """Ask a question under a caller-chosen request id."""

    request_id: RequestId
    question: str


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


@attrs.frozen
class Completed:
    """The provider's stream finished well formed."""

    request_id: RequestId
    answer: str
    finish_reason: str | None
    usage: Usage | None = None


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


Message: TypeAlias = (
    Start | Submit | Cancel | Timeout | Interrupt | ResponseStarted | Completed | Failed
)
