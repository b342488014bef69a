"""The phases of a session and what each holds (pure).

A session at rest is ``Idle`` (no turn yet), ``Committed`` or ``Discarded``
(the last turn's outcome); in flight it is ``Pending``, ``Streaming`` or
``AwaitingTools``, holding the request it waits on (:class:`InFlight`). Every
phase carries the same ledger: the settings, the committed turns, how every
request id ended, and what the token caps need. Which phase follows which,
and why, is the machine's business (``_machine``, its tables and its
theory of operation); this module only says what a phase is.
"""

from __future__ import annotations

from typing import Final, TypeAlias

import attrs

from ..events import (
    MAIN_BRANCH,
    BranchId,
    PinAdded,
    RequestId,
    SessionForked,
    SessionStarted,
    SummaryRecorded,
)
from ._branches import Branch, BranchInfo, branch_records, find_branch, infos
from ._history import Ending, Endings, History, ToolRound, Turn

__all__ = [
    "IN_FLIGHT",
    "AwaitingTools",
    "Committed",
    "Discarded",
    "Idle",
    "InFlight",
    "Pending",
    "SessionState",
    "Streaming",
    "branch_turns",
    "branches_of",
    "current_request",
    "ending_of",
    "initial_state",
    "is_in_flight",
]


@attrs.frozen
class InFlight:
    """The request a session is waiting on."""

    request_id: RequestId
    question: str
    turns_sent: int
    turns_dropped: int
    request_bytes: int
    #: The round in flight (0: the turn's first request).
    round: int = 0
    #: The tool rounds so far; the last one may still wait for results.
    rounds: tuple[ToolRound, ...] = ()
    #: The request's estimated prompt tokens (``None`` in old logs).
    estimated_prompt_tokens: int | None = None
    #: 1, or 2 once it went out again after a context overflow.
    attempt: int = 1
    #: The summary sent in place of the turns dropped (``None``: none).
    summary_id: str | None = None


@attrs.frozen(kw_only=True)
class _State:
    #: The session's settings; ``None`` until SessionStarted.
    config: SessionStarted | None = None
    #: The committed turns of the active branch's path, oldest first.
    turns: History = attrs.field(factory=History)
    #: Index of the first turn that may still be sent (Window evicts by moving it).
    context_start: int = 0
    #: How every request id seen ended.
    endings: Endings = attrs.field(factory=Endings)
    #: Number of events folded so far (the ``seq`` of the last one).
    version: int = 0
    #: Request id of the current or most recent turn.
    last_request_id: RequestId | None = None
    #: The largest ratio of reported to estimated prompt tokens seen, as
    #: ``(reported, estimated)``; ``None`` before any usage was reported.
    calibration: tuple[int, int] | None = None
    #: The largest estimated prompt tokens of a request that committed.
    largest_ok: int = 0
    #: After a context overflow: the estimated prompt tokens a request may
    #: have at most, below the size that failed.
    overflow_cap: int | None = None
    #: The branch whose path ``turns`` is.
    active_branch: BranchId = MAIN_BRANCH
    #: Every branch's record (the active one's as it was when it was last
    #: left); ``()`` until the first branch starts (see ``_branches``).
    branches: tuple[Branch, ...] = ()
    #: A fork: where its first turns come from (``None``: not a fork). The
    #: shared turns themselves are in ``turns``, resolved from the source's
    #: events when the fork was read (see ``_forks``).
    fork: SessionForked | None = None
    #: The items pinned now, in the order they were pinned.
    pins: tuple[PinAdded, ...] = ()
    #: Every summary recorded, in the order they were (of any branch).
    summaries: tuple[SummaryRecorded, ...] = ()

    @property
    def context(self) -> tuple[Turn, ...]:
        """The turns a request may draw from."""
        return tuple(self.turns[self.context_start :])


@attrs.frozen(kw_only=True)
class Idle(_State):
    """No turn yet."""


@attrs.frozen(kw_only=True)
class Pending(_State):
    """A request was logged and is going out; no response yet."""

    request: InFlight


@attrs.frozen(kw_only=True)
class Streaming(_State):
    """The provider accepted the request; deltas are arriving."""

    request: InFlight


@attrs.frozen(kw_only=True)
class AwaitingTools(_State):
    """The model asked for tool calls; their results are being recorded."""

    request: InFlight


@attrs.frozen(kw_only=True)
class Committed(_State):
    """The last turn committed."""


@attrs.frozen(kw_only=True)
class Discarded(_State):
    """The last turn was discarded."""

    reason: str


SessionState: TypeAlias = Idle | Pending | Streaming | AwaitingTools | Committed | Discarded
#: The phases in flight, for ``isinstance``.
IN_FLIGHT: Final = (Pending, Streaming, AwaitingTools)


def initial_state() -> Idle:
    """The state of a session with no events."""
    return Idle()


def is_in_flight(state: SessionState) -> bool:
    """True in Pending, Streaming and AwaitingTools."""
    return isinstance(state, IN_FLIGHT)


def current_request(state: SessionState) -> RequestId | None:
    """The request id of the turn in flight, or ``None`` at rest."""
    return state.request.request_id if isinstance(state, IN_FLIGHT) else None


def branches_of(state: SessionState) -> tuple[BranchInfo, ...]:
    """Every branch of the session, in the order they started (``main``
    first), with its length, its newest turn and whether it is active."""
    records = branch_records(state.branches, state.active_branch, state.turns, state.context_start)
    return infos(records, state.active_branch)


def branch_turns(state: SessionState, branch: str) -> History:
    """The committed turns on ``branch``'s path (the active one: ``state.turns``).

    Raises:
        UnknownBranch: the session has no such branch.
    """
    records = branch_records(state.branches, state.active_branch, state.turns, state.context_start)
    return find_branch(records, branch).turns


def ending_of(state: SessionState, request_id: RequestId) -> Ending | None:
    """How ``request_id`` ended, ``Ending("in_flight")`` if it is the one in
    flight, or ``None`` if the session never saw it."""
    if current_request(state) == request_id:
        return Ending("in_flight")
    return state.endings.get(request_id)
