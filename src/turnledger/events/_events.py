"""The event vocabulary: what happened to a session, as frozen facts.

Events are pure data. They never carry behaviour, and they are never
subclassed: the codec dispatches on the exact type.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable
from typing import Final, Literal, NewType, TypeAlias, get_args

import attrs

__all__ = [
    "BRANCH_KINDS",
    "DISCARD_REASONS",
    "MAIN_BRANCH",
    "REJECT_REASONS",
    "SUMMARY_ORIGINS",
    "WINDOW_SOURCES",
    "BranchId",
    "BranchKind",
    "BranchStarted",
    "BranchSwitched",
    "CompletionIgnored",
    "DiscardReason",
    "Event",
    "HistoryPolicy",
    "Ledger",
    "OnBusy",
    "PinAdded",
    "PinRemoved",
    "RejectReason",
    "RequestId",
    "SessionForked",
    "SessionId",
    "SessionStarted",
    "StreamStarted",
    "SummaryOrigin",
    "SummaryRecorded",
    "SummarySent",
    "ToolCall",
    "ToolCallsRequested",
    "ToolErrorPolicy",
    "ToolResultRecorded",
    "ToolRoundSubmitted",
    "ToolSpec",
    "TurnCommitted",
    "TurnDiscarded",
    "TurnRejected",
    "TurnRetried",
    "TurnSubmitted",
    "Usage",
    "Window",
    "WindowSource",
]

SessionId = NewType("SessionId", str)
RequestId = NewType("RequestId", str)
#: A branch of a session's tree of turns: ``main`` (the root, every session
#: has it), then ``b1``, ``b2``... in the order they were started.
BranchId = NewType("BranchId", str)
MAIN_BRANCH: Final = BranchId("main")

#: Why a branch was started: an earlier question asked differently
#: (``edit``), or the last question asked again (``regenerate``).
BranchKind: TypeAlias = Literal["edit", "regenerate"]
BRANCH_KINDS: Final[frozenset[str]] = frozenset(get_args(BranchKind))

DiscardReason: TypeAlias = Literal[
    "cancelled",
    "timeout",
    "superseded",
    "interrupted",
    "http_status",
    "transport",
    "protocol",
    "malformed",
    "empty",
    "incomplete_finish",
    "incomplete_stream",
    "provider_error",
    "limit",
    "conflict",
    "tool_error",
    "context_overflow",
    "store_error",
    "erased",
]
#: The closed set of reasons a turn can be discarded for.
DISCARD_REASONS: Final[frozenset[str]] = frozenset(get_args(DiscardReason))

#: ``store_error``: the store refused the Submit's events (a full disk, an
#: I/O error); only a caller's result says so, since nothing was written.
#: ``limit``: the store's size cap refused the Submit and nothing could make
#: room (the session cannot fit); nothing was written either.
RejectReason: TypeAlias = Literal[
    "empty_question", "invalid_question", "over_budget", "busy", "store_error", "limit"
]
#: The closed set of reasons a Submit can be refused before any transport.
REJECT_REASONS: Final[frozenset[str]] = frozenset(get_args(RejectReason))

OnBusy: TypeAlias = Literal["reject", "supersede"]

#: Where a session's context window came from: given by the user, discovered
#: from the server, a fallback (a known model family or the default), or
#: ``none`` (a session started before windows were recorded: no token cap).
WindowSource: TypeAlias = Literal["user", "discovered", "fallback", "none"]
WINDOW_SOURCES: Final[frozenset[str]] = frozenset(get_args(WindowSource))


@attrs.frozen
class Ledger:
    """History policy: keep every turn; each request sends the newest suffix that fits."""


@attrs.frozen
class Window:
    """History policy: after a commit the context is the turns sent plus the new one,
    capped at ``max_turns``; evicted turns never come back."""

    max_turns: int = attrs.field(validator=attrs.validators.ge(1))


HistoryPolicy: TypeAlias = Ledger | Window


@attrs.frozen
class Usage:
    """Token usage as the provider reported it (any field may be missing)."""

    prompt_tokens: int | None = None
    completion_tokens: int | None = None
    total_tokens: int | None = None


_TOOL_NAME: Final = re.compile(r"[A-Za-z0-9_-]{1,64}")


def _specs(value: Iterable[ToolSpec]) -> tuple[ToolSpec, ...]:
    return tuple(value)


@attrs.frozen
class ToolSpec:
    """A tool the model may call: its name, what it does, and its arguments'
    JSON Schema (as compact JSON text, sent as it is)."""

    name: str = attrs.field()
    description: str = ""
    parameters: str = attrs.field(default='{"type":"object","properties":{}}')

    @name.validator
    def _check_name(self, _attr: object, value: str) -> None:
        if not _TOOL_NAME.fullmatch(value):
            raise ValueError("a tool name is 1-64 letters, digits, '_' or '-'")

    @parameters.validator
    def _check_parameters(self, _attr: object, value: str) -> None:
        try:
            schema = json.loads(value)
        except ValueError:
            schema = None
        if not isinstance(schema, dict):
            raise ValueError("a tool's parameters are a JSON Schema object, as JSON text")


#: What a tool that raised does to its turn: ``report`` sends the error to the
#: model as the call's result; ``stop`` discards the turn as ``tool_error``.
ToolErrorPolicy: TypeAlias = Literal["report", "stop"]


@attrs.frozen
class SessionStarted:
    """First event of every session: fixes its system prompt, model and policies."""

    system: str
    model: str
    policy: HistoryPolicy = attrs.field(factory=Ledger)
    #: What a Submit does while a turn is in flight.
    on_busy: OnBusy = "reject"
    #: Tools sent with every request (none: a plain chat session).
    tools: tuple[ToolSpec, ...] = attrs.field(default=(), converter=_specs)
    #: ``auto``, ``required``, ``none`` (sent to servers that take it).
    tool_choice: str = "auto"
    #: Tool-call rounds a turn may take before it is discarded as ``limit``.
    max_tool_rounds: int = attrs.field(default=8, validator=attrs.validators.ge(1))
    on_tool_error: ToolErrorPolicy = "report"
    #: The model's context window in tokens (prompt + answer); ``None``: unknown.
    context_window: int | None = None
    #: Tokens of the window kept for the answer; the prompt budget is
    #: ``context_window - output_reserve``.
    output_reserve: int | None = None
    #: Where the window and the reserve came from.
    window_source: WindowSource = "none"
    #: Whom the session belongs to (the end user, a tenant's user id): what
    #: an erasure of every session of one person looks up. ``None``: nobody
    #: named (and every session written before subjects were recorded).
    subject: str | None = None
    #: The session's own retention: erased this many seconds after its last
    #: event (``None``: only the hub's or the command's policy applies).
    retain_seconds: int | None = None
    #: ... and trimmed to its newest this many committed turns.
    retain_turns: int | None = None


@attrs.frozen
class TurnSubmitted:
    """A question was accepted and its request projected; the request goes out next."""

    request_id: RequestId
    question: str
    #: Whole turns of history included in the request.
    turns_sent: int
    #: Turns of the current context left out to fit the budget.
    turns_dropped: int
    #: Exact UTF-8 size of the request body the adapter sends.
    request_bytes: int
    #: The request's prompt tokens by the session's estimator (uncalibrated);
    #: ``None`` in logs written before estimates were recorded.
    estimated_prompt_tokens: int | None = None


@attrs.frozen
class TurnRetried:
    """The request in flight failed before anything reached the caller
    (``reason``: ``context_overflow``) and goes out again, once, under the
    same request id, with the smaller projection recorded here."""

    request_id: RequestId
    reason: DiscardReason
    detail: str
    turns_sent: int
    turns_dropped: int
    request_bytes: int
    estimated_prompt_tokens: int


@attrs.frozen
class TurnRejected:
    """A Submit was refused before any network call."""

    request_id: RequestId
    reason: RejectReason
    detail: str = ""


@attrs.frozen
class StreamStarted:
    """The provider answered 2xx with the right media type; deltas follow."""

    request_id: RequestId


@attrs.frozen
class TurnCommitted:
    """A complete, accepted answer arrived: the pair enters history."""

    request_id: RequestId
    answer: str
    finish_reason: str
    usage: Usage | None = None


@attrs.frozen
class TurnDiscarded:
    """The in-flight turn ended without an accepted answer; history is unchanged."""

    request_id: RequestId
    reason: DiscardReason
    detail: str = ""
    #: Characters of preview the caller may have seen before the discard.
    preview_chars: int = 0


@attrs.frozen
class ToolCall:
    """One call the model asked for: arguments are a JSON object, as compact text."""

    call_id: str
    name: str
    arguments: str


def _calls(value: Iterable[ToolCall]) -> tuple[ToolCall, ...]:
    return tuple(value)


@attrs.frozen
class ToolCallsRequested:
    """A round of the turn in flight ended in tool calls (not history yet)."""

    request_id: RequestId
    #: The round, from 0 (the first request of the turn).
    round: int
    calls: tuple[ToolCall, ...] = attrs.field(converter=_calls)
    #: Text the model sent along with its calls (often empty).
    content: str = ""
    usage: Usage | None = None


@attrs.frozen
class ToolResultRecorded:
    """A tool call of the turn in flight got its result (or its error, as text
    the model sees)."""

    request_id: RequestId
    call_id: str
    content: str
    is_error: bool = False
    duration_ms: int = 0


@attrs.frozen
class ToolRoundSubmitted:
    """Every call of a round has its result: the next round's request goes out."""

    request_id: RequestId
    round: int
    #: Exact UTF-8 size of that request's body.
    request_bytes: int


@attrs.frozen
class CompletionIgnored:
    """A result arrived for a request the session had already left."""

    request_id: RequestId
    #: ``completed`` or ``failed:<reason>``.
    outcome: str
    #: Usage the server reported for it: a late answer is still paid for.
    usage: Usage | None = None


@attrs.frozen
class BranchStarted:
    """A new branch starts from the active one: it keeps the active branch's
    first ``at_turn`` turns and becomes the active branch. The
    ``TurnSubmitted`` of ``request_id`` follows at once: the branch's first
    question (the edited one, or the last one asked again).

    Nothing of the branch it starts from changes: its turns stay in the
    ledger and a switch back finds them as they were.
    """

    branch: BranchId
    parent: BranchId
    at_turn: int = attrs.field(validator=attrs.validators.ge(0))
    kind: BranchKind
    request_id: RequestId


@attrs.frozen
class BranchSwitched:
    """The active branch changed: history is now ``branch``'s path."""

    branch: BranchId


@attrs.frozen
class SessionForked:
    """The session is a fork: its history starts with the first ``at_turn``
    turns of ``branch`` of session ``source`` as that session stood at its
    event ``source_seq``. Those turns are shared by reference: nothing of
    them is copied here, and the source's events are never changed. It
    follows the fork's ``SessionStarted`` at once (the source's settings).
    """

    source: SessionId
    #: The source's version (its last event's ``seq``) when it was forked.
    source_seq: int = attrs.field(validator=attrs.validators.ge(1))
    #: The source's branch the prefix is on (its active one at the time).
    branch: BranchId
    #: Turns of that branch's path the fork starts with.
    at_turn: int = attrs.field(validator=attrs.validators.ge(0))


#: Who wrote a summary: a function of the user's (``function``), or the
#: session's own model with a named prompt (``model``).
SummaryOrigin: TypeAlias = Literal["function", "model"]
SUMMARY_ORIGINS: Final[frozenset[str]] = frozenset(get_args(SummaryOrigin))


@attrs.frozen
class SummaryRecorded:
    """A summary of a contiguous run of committed turns, ``start`` to ``end``
    (from 0, ``end`` excluded) on ``branch``'s path, from the turn of
    ``first_request_id`` to the turn of ``last_request_id``.

    It changes no turn: history stays what the turns are. A request may send
    it in place of the turns it covers once they no longer fit
    (:class:`SummarySent` says which request did).
    """

    summary_id: str
    branch: BranchId
    start: int = attrs.field(validator=attrs.validators.ge(0))
    end: int = attrs.field(validator=attrs.validators.ge(1))
    first_request_id: RequestId
    last_request_id: RequestId
    text: str
    origin: SummaryOrigin
    #: The function's name, or the name of the model's prompt.
    origin_name: str
    #: The summarizing request's id (a function's call gets one too).
    request_id: RequestId
    #: What the summarizing request cost, as the server reported it.
    usage: Usage | None
    #: UTF-8 size of the text, and its estimated tokens as a message.
    size_bytes: int
    estimated_tokens: int


@attrs.frozen
class SummarySent:
    """The request just submitted (``request_id``) sends summary
    ``summary_id`` in place of the turns it covers, right before the turns
    it sends."""

    request_id: RequestId
    summary_id: str


@attrs.frozen
class PinAdded:
    """An item pinned to the session's context: sent with every request,
    right after the system prompt, until it is unpinned."""

    pin_id: str
    text: str
    #: Where it comes from (``memory``, ``retrieval:doc-7``, ``policy``...).
    origin: str


@attrs.frozen
class PinRemoved:
    """A pinned item is no longer sent."""

    pin_id: str


Event: TypeAlias = (
    SessionStarted
    | TurnSubmitted
    | TurnRetried
    | TurnRejected
    | StreamStarted
    | TurnCommitted
    | TurnDiscarded
    | CompletionIgnored
    | ToolCallsRequested
    | ToolResultRecorded
    | ToolRoundSubmitted
    | BranchStarted
    | BranchSwitched
    | SessionForked
    | SummaryRecorded
    | SummarySent
    | PinAdded
    | PinRemoved
)
