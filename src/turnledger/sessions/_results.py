"""How a turn ended, as the hub reports it to the caller.

These are caller-facing values, distinct from the session *states*
:class:`~turnledger.sessions.Committed` and
:class:`~turnledger.sessions.Discarded` (which describe a whole session).
Match on the class or read ``kind``::

    match await turn.outcome():
        case CommittedResult(answer=answer): ...
        case DiscardedResult(reason=reason): ...
        case RejectedResult(reason=reason): ...
"""

from __future__ import annotations

from typing import ClassVar, Literal, TypeAlias

import attrs

from ..events import RequestId, Usage
from ._history import Ending

__all__ = ["CommittedResult", "DiscardedResult", "RejectedResult", "TurnResult", "result_of"]


@attrs.frozen
class CommittedResult:
    """The answer was accepted: the pair is in history, and in the store."""

    kind: ClassVar[Literal["committed"]] = "committed"

    request_id: RequestId
    answer: str
    finish_reason: str = "stop"
    #: As the provider reported it; ``None`` when absent or when ``repeated``.
    usage: Usage | None = None
    #: True when this is the recorded outcome of an earlier Submit with the
    #: same request id (a client retry), looked up rather than produced now.
    repeated: bool = False


@attrs.frozen
class DiscardedResult:
    """The turn was sent but ended without an accepted answer; history is unchanged."""

    kind: ClassVar[Literal["discarded"]] = "discarded"

    request_id: RequestId
    #: One of :data:`turnledger.events.DISCARD_REASONS`.
    reason: str
    detail: str = ""
    #: Preview characters delivered before the discard (0 when ``repeated``).
    preview_chars: int = 0
    repeated: bool = False


@attrs.frozen
class RejectedResult:
    """The question was refused before any network call."""

    kind: ClassVar[Literal["rejected"]] = "rejected"

    request_id: RequestId
    #: One of :data:`turnledger.events.REJECT_REASONS`.
    reason: str
    detail: str = ""
    repeated: bool = False


TurnResult: TypeAlias = CommittedResult | DiscardedResult | RejectedResult


def result_of(request_id: RequestId, ending: Ending) -> TurnResult:
    """The result of a request the session already finished (``repeated=True``)."""
    if ending.kind == "committed":
        assert ending.answer is not None
        return CommittedResult(request_id, ending.answer, repeated=True)
    if ending.kind == "discarded":
        return DiscardedResult(request_id, ending.reason, ending.detail, repeated=True)
    if ending.kind == "rejected":
        return RejectedResult(request_id, ending.reason, ending.detail, repeated=True)
    raise ValueError(f"request {request_id!r} has not finished ({ending.kind})")
