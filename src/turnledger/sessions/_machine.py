"""The session state machine: ``decide`` what a message means, ``evolve`` by facts.

Theory of operation
===================

A session is a conversation: committed turns plus, at most, one request in
flight. Its life is a fold over its events::

    state = replay(events) = fold(evolve, initial_state(), events)

and every message that arrives is first turned into events by a pure decision::

    events = decide(state, message, budget=..., preview_chars=...)

``decide`` never changes anything; it returns the facts that the message
causes (often none). The runtime writes those facts to the log, and only then
folds them into its state with ``evolve``. ``evolve`` makes no decisions: it
applies facts, and a fact that cannot follow the current state means the log
is corrupt (:class:`~turnledger.ReplayError`). So what the live actor holds
and what a replay of its log rebuilds are the same by construction; tests
check it anyway.

Phases. ``Idle`` (no turn yet) → ``Pending`` (request logged, going out) →
``Streaming`` (the provider accepted it) → ``Committed`` or ``Discarded`` (the
last turn's outcome). ``Idle``, ``Committed`` and ``Discarded`` are at rest
and accept the next Submit; none is terminal: a session lives as long as its
log. ``Pending`` and ``Streaming`` are *in flight*. What each phase holds is
in ``_phases``; the token caps a Submit is planned under (window, calibration,
overflow) are computed in ``_budgets``; which phase follows which, and why,
is here.

Tool rounds. A turn may take several rounds: a ``Completed`` with tool
calls records them (``ToolCallsRequested``) and the turn waits in
``AwaitingTools``; each ``ToolDone`` records a result; the last one submits
the next round's request (``ToolRoundSubmitted``, back to ``Pending``). The
rounds are part of the turn in flight, never history: ``TurnCommitted``
makes the question, every round and the answer history at once, and
``TurnDiscarded`` drops them all. A round's messages carry its number: a
late completion of an earlier round is ignored like any stale completion.

Request identity. Every message about a request carries its request id. A
message for any id other than the one in flight changes nothing: a late
``Completed`` or ``Failed`` becomes :class:`CompletionIgnored` (so the race
is on the record), a stale ``Timeout``, ``Cancel`` or ``ResponseStarted`` is
dropped. A Submit whose id the session has already seen is idempotent: no
events; :func:`ending_of` tells the caller how that request ended.

What may commit. Only ``Completed`` for the request in flight, with an
answer that is non-empty after stripping whitespace and ``finish_reason ==
"stop"``. Everything else that ends a turn is a ``TurnDiscarded`` with one
reason of a closed set, and never touches committed history. Rejections
(empty question, mandatory request over budget, busy) happen before any
transport and leave the phase as it was.

The tables below are the whole of the rules' shape: ``TRANSITIONS`` says,
for each phase and message type, which phases may follow (an absent pair is
an :class:`~turnledger.InvalidCommand`); ``EVENT_TRANSITIONS`` says which
phase each event leads to (an absent pair is a :class:`~turnledger.ReplayError`).
Handlers only choose among the listed outcomes; tests walk every pair. Keep
every rule here: a rule coded elsewhere is invisible to the tables, the tests
and the generated diagram.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Iterable, Mapping
from typing import Any, Final, TypeAlias

import attrs

from .._errors import (
    InvalidCommand,
    ReplayError,
    SessionBusy,
    UnknownBranch,
    UnknownPin,
    UnknownTurn,
)
from ..events import (
    SUMMARY_ORIGINS,
    BranchKind,
    BranchStarted,
    BranchSwitched,
    CompletionIgnored,
    Event,
    PinAdded,
    PinRemoved,
    RequestId,
    SessionForked,
    SessionStarted,
    StreamStarted,
    SummaryRecorded,
    SummarySent,
    ToolCall,
    ToolCallsRequested,
    ToolResultRecorded,
    ToolRoundSubmitted,
    TurnCommitted,
    TurnDiscarded,
    TurnRejected,
    TurnRetried,
    TurnSubmitted,
    Window,
)
from ._branches import Branch, branch_records, find_branch, next_branch_id
from ._budgets import calibrated, cap_after_overflow, looks_like_overflow, prompt_token_cap
from ._history import Ending, History, ToolResult, ToolRound, Turn
from ._messages import (
    Cancel,
    Completed,
    Edit,
    Failed,
    Interrupt,
    Message,
    Pin,
    RecordSummary,
    Regenerate,
    ResponseStarted,
    Start,
    Submit,
    Switch,
    Timeout,
    ToolDone,
    Unpin,
    safe_finish_reason,
)
from ._phases import (
    IN_FLIGHT,
    AwaitingTools,
    Committed,
    Discarded,
    Idle,
    InFlight,
    Pending,
    SessionState,
    Streaming,
    branch_turns,
    branches_of,
    current_request,
    ending_of,
    initial_state,
    is_in_flight,
)
from ._projection import (
    Budget,
    build_messages,
    covers_dropped,
    pin_messages,
    plan,
    summary_message,
    tools_tokens,
)
from ._request import ChatMessage

# The phases, their queries and the session's token cap are named here too,
# for the code that takes them from the machine (the runtime, the package).
__all__ = [
    "EVENT_TRANSITIONS",
    "MAX_TOOL_RESULT_BYTES",
    "TRANSITIONS",
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
    "decide",
    "ending_of",
    "evolve",
    "initial_state",
    "is_in_flight",
    "prompt_token_cap",
    "replay",
    "request_messages",
    "summary_of",
]

_DEFAULT_BUDGET: Final = Budget()
#: A tool result larger than this (UTF-8) reaches the model as an error.
MAX_TOOL_RESULT_BYTES: Final = 64 * 1024

_MessageTable: TypeAlias = Mapping[
    type[SessionState], Mapping[type[Message], frozenset[type[SessionState]]]
]
_EventTable: TypeAlias = Mapping[
    type[SessionState], Mapping[type[Event], type[SessionState] | None]
]

# (phase, message type) -> phases that may follow. Absent: InvalidCommand.
TRANSITIONS: Final[_MessageTable] = {
    Idle: {
        Start: frozenset({Idle}),
        Submit: frozenset({Idle, Pending}),
        Cancel: frozenset({Idle}),
        Timeout: frozenset({Idle}),
        Interrupt: frozenset({Idle}),
        ResponseStarted: frozenset({Idle}),
        Completed: frozenset({Idle}),
        Failed: frozenset({Idle}),
        ToolDone: frozenset({Idle}),
        # Idle has no turn: an edit or a regenerate is an UnknownTurn, and
        # ``main`` is its only branch.
        Edit: frozenset({Idle}),
        Regenerate: frozenset({Idle}),
        Switch: frozenset({Idle}),
        # Idle has no turn to summarize: an UnknownTurn.
        RecordSummary: frozenset({Idle}),
        Pin: frozenset({Idle}),
        Unpin: frozenset({Idle}),
    },
    **{
        rest: {
            Submit: frozenset({rest, Pending}),
            Cancel: frozenset({rest}),
            Timeout: frozenset({rest}),
            Interrupt: frozenset({rest}),
            ResponseStarted: frozenset({rest}),
            Completed: frozenset({rest}),
            Failed: frozenset({rest}),
            ToolDone: frozenset({rest}),
            Edit: frozenset({rest, Pending}),  # rest: rejected
            Regenerate: frozenset({rest, Pending}),
            Switch: frozenset({rest}),
            RecordSummary: frozenset({rest}),
            Pin: frozenset({rest}),
            Unpin: frozenset({rest}),
        }
        for rest in (Committed, Discarded)
    },
    Pending: {
        Submit: frozenset({Pending}),  # busy/seen: stays; supersede: a new Pending
        Cancel: frozenset({Pending, Discarded}),
        Timeout: frozenset({Pending, Discarded}),
        Interrupt: frozenset({Discarded}),
        ResponseStarted: frozenset({Pending, Streaming}),
        Completed: frozenset({Pending, Committed, Discarded, AwaitingTools}),
        Failed: frozenset({Pending, Discarded}),  # Pending: the same turn, retried
        ToolDone: frozenset({Pending}),
        # In flight, an edit or a regenerate is a Submit (busy: rejected;
        # supersede: the turn is discarded and a new one goes out); a switch
        # is refused (SessionBusy) or, under supersede, discards the turn.
        Edit: frozenset({Pending}),
        Regenerate: frozenset({Pending}),
        Switch: frozenset({Pending, Discarded}),
        # A summary is recorded whenever it is ready (a request in flight
        # keeps the one it was sent with); a pin or an unpin waits for rest
        # (SessionBusy), so a request's pinned items never change under it.
        RecordSummary: frozenset({Pending}),
        Pin: frozenset({Pending}),
        Unpin: frozenset({Pending}),
    },
    Streaming: {
        Submit: frozenset({Streaming, Pending}),
        Cancel: frozenset({Streaming, Discarded}),
        Timeout: frozenset({Streaming, Discarded}),
        Interrupt: frozenset({Discarded}),
        ResponseStarted: frozenset({Streaming}),
        Completed: frozenset({Streaming, Committed, Discarded, AwaitingTools, Pending}),
        Failed: frozenset({Streaming, Discarded, Pending}),
        ToolDone: frozenset({Streaming}),
        Edit: frozenset({Streaming, Pending}),
        Regenerate: frozenset({Streaming, Pending}),
        Switch: frozenset({Streaming, Discarded}),
        # A summary is recorded whenever it is ready (a request in flight
        # keeps the one it was sent with); a pin or an unpin waits for rest
        # (SessionBusy), so a request's pinned items never change under it.
        RecordSummary: frozenset({Streaming}),
        Pin: frozenset({Streaming}),
        Unpin: frozenset({Streaming}),
    },
    AwaitingTools: {
        Submit: frozenset({AwaitingTools, Pending}),
        Cancel: frozenset({AwaitingTools, Discarded}),
        Timeout: frozenset({AwaitingTools, Discarded}),
        Interrupt: frozenset({Discarded}),
        ResponseStarted: frozenset({AwaitingTools}),
        Completed: frozenset({AwaitingTools}),
        Failed: frozenset({AwaitingTools}),
        ToolDone: frozenset({AwaitingTools, Pending, Discarded}),
        Edit: frozenset({AwaitingTools, Pending}),
        Regenerate: frozenset({AwaitingTools, Pending}),
        Switch: frozenset({AwaitingTools, Discarded}),
        # A summary is recorded whenever it is ready (a request in flight
        # keeps the one it was sent with); a pin or an unpin waits for rest
        # (SessionBusy), so a request's pinned items never change under it.
        RecordSummary: frozenset({AwaitingTools}),
        Pin: frozenset({AwaitingTools}),
        Unpin: frozenset({AwaitingTools}),
    },
}

# (phase, event type) -> the phase it leads to (None: the phase is kept).
# Absent: the log cannot be folded (ReplayError).
EVENT_TRANSITIONS: Final[_EventTable] = {
    Idle: {
        SessionStarted: Idle,
        # A fork's second event, right after its SessionStarted: at rest
        # with the turns it shares, as after their last commit.
        SessionForked: Committed,
        TurnSubmitted: Pending,
        TurnRejected: None,
        CompletionIgnored: None,
        SummaryRecorded: None,
        PinAdded: None,
        PinRemoved: None,
    },
    **{
        rest: {
            TurnSubmitted: Pending,
            TurnRejected: None,
            CompletionIgnored: None,
            # A branch starts, or another one becomes active, only at rest.
            BranchStarted: None,
            BranchSwitched: None,
            SummaryRecorded: None,
            # Pins change only at rest.
            PinAdded: None,
            PinRemoved: None,
        }
        for rest in (Committed, Discarded)
    },
    Pending: {
        StreamStarted: Streaming,
        TurnRetried: Pending,
        # Right after the TurnSubmitted (or TurnRetried) whose request sends it.
        SummarySent: None,
        SummaryRecorded: None,
        TurnCommitted: Committed,
        TurnDiscarded: Discarded,
        TurnRejected: None,
        CompletionIgnored: None,
        ToolCallsRequested: AwaitingTools,
    },
    Streaming: {
        TurnRetried: Pending,
        SummaryRecorded: None,
        TurnCommitted: Committed,
        TurnDiscarded: Discarded,
        TurnRejected: None,
        CompletionIgnored: None,
        ToolCallsRequested: AwaitingTools,
    },
    AwaitingTools: {
        ToolResultRecorded: None,
        SummaryRecorded: None,
        ToolRoundSubmitted: Pending,
        TurnDiscarded: Discarded,
        TurnRejected: None,
        CompletionIgnored: None,
    },
}


# --- decide -----------------------------------------------------------------

_Handler: TypeAlias = Callable[[SessionState, Message, Budget, int], tuple[Event, ...]]


def _is_text(value: str) -> bool:
    # A lone surrogate (easy to get from json.loads('"\\ud800"')) has no
    # UTF-8 form: it could never be sent, stored as UTF-8, or measured.
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def _start(state: SessionState, msg: Message, budget: Budget, preview: int) -> tuple[Event, ...]:
    assert isinstance(msg, Start)
    if state.config is not None:
        raise InvalidCommand("the session has already started")
    if not (_is_text(msg.system) and _is_text(msg.model)):
        raise InvalidCommand("the system prompt and the model must be valid Unicode text")
    window, reserve = msg.context_window, msg.output_reserve
    if window is None:
        if reserve is not None or msg.window_source != "none":
            raise InvalidCommand("an output reserve or a window source needs a context window")
    elif window < 1 or reserve is None or not 0 <= reserve < window:
        raise InvalidCommand(
            f"the context window must be positive and the output reserve below it "
            f"(window {window}, reserve {reserve})"
        )
    elif msg.window_source == "none":
        raise InvalidCommand("a context window needs its source")
    if msg.subject is not None and (
        not isinstance(msg.subject, str) or not msg.subject or not _is_text(msg.subject)
    ):
        raise InvalidCommand("a subject must be non-empty, valid Unicode text")
    for name in ("retain_seconds", "retain_turns"):
        value = getattr(msg, name)
        if value is not None and (type(value) is not int or value < 1):
            raise InvalidCommand(f"{name} must be a positive integer or None")
    try:
        started = SessionStarted(
            msg.system,
            msg.model,
            msg.policy,
            msg.on_busy,
            msg.tools,
            msg.tool_choice,
            msg.max_tool_rounds,
            msg.on_tool_error,
            window,
            reserve,
            msg.window_source,
            msg.subject,
            msg.retain_seconds,
            msg.retain_turns,
        )
    except (TypeError, ValueError) as exc:
        raise InvalidCommand(f"invalid session settings: {exc}") from None
    names = [t.name for t in msg.tools]
    if len(set(names)) != len(names):
        raise InvalidCommand("two tools have the same name")
    return (started,)


def _overflowed(
    state: SessionState, detail: str, budget: Budget, preview: int
) -> tuple[Event, ...]:
    # Retry once, with the smaller projection, when nothing reached the caller.
    assert isinstance(state, IN_FLIGHT) and state.config is not None
    req = state.request
    rid = req.request_id
    # Only a turn's first round is planned again: a later round's request
    # carries the turn's tool rounds, which a plan does not measure.
    if (
        preview == 0
        and req.attempt == 1
        and req.round == 0
        and req.estimated_prompt_tokens is not None
    ):
        shrunk = attrs.evolve(state, overflow_cap=cap_after_overflow(state))
        p = plan(
            state.config.model,
            state.config.system,
            state.turns,
            state.context_start,
            req.question,
            budget,
            state.config.tools,
            state.config.tool_choice,
            token_cap=prompt_token_cap(shrunk, budget),
            pins=pin_messages(state.pins),
            summaries=state.summaries,
        )
        if p.fits and p.prompt_tokens < req.estimated_prompt_tokens:
            retried = TurnRetried(
                rid,
                "context_overflow",
                detail,
                p.turns_sent,
                p.turns_dropped,
                p.request_bytes,
                p.prompt_tokens,
            )
            if p.summary_id is None:
                return (retried,)
            return (retried, SummarySent(rid, p.summary_id))
    return (TurnDiscarded(rid, "context_overflow", detail, preview),)


def _submit(state: SessionState, msg: Message, budget: Budget, preview: int) -> tuple[Event, ...]:
    assert isinstance(msg, Submit)
    if ending_of(state, msg.request_id) is not None:
        return ()  # a retry of a request already seen: idempotent
    return _ask(state, msg.request_id, msg.question, budget, preview)


def _ask(
    state: SessionState,
    rid: RequestId,
    question: str,
    budget: Budget,
    preview: int,
    branch: BranchStarted | None = None,
) -> tuple[Event, ...]:
    # A question asked on the active branch, or (``branch``) on a new one
    # that keeps the active branch's first ``branch.at_turn`` turns: the
    # request is planned on the history it will be sent with.
    config = state.config
    assert config is not None
    if not question.strip():
        return (TurnRejected(rid, "empty_question", "the question is empty"),)
    if not _is_text(question):
        return (TurnRejected(rid, "invalid_question", "the question has a lone surrogate"),)
    current = current_request(state)
    superseding = current is not None and config.on_busy == "supersede"
    if current is not None and not superseding:
        return (TurnRejected(rid, "busy", f"request {current} is in flight"),)
    turns, context_start = state.turns, state.context_start
    if branch is not None:
        turns, context_start = _branch_base(turns, context_start, branch.at_turn)
    pins = pin_messages(state.pins)
    pin_cap = budget.max_pinned_tokens
    if pins and pin_cap is not None:
        pinned = sum(map(budget.estimator.message_tokens, pins))
        if pinned > pin_cap:
            detail = f"the pinned items need about {pinned} tokens; their budget is {pin_cap}"
            return (TurnRejected(rid, "over_budget", detail),)
    cap = prompt_token_cap(state, budget)
    p = plan(
        config.model,
        config.system,
        turns,
        context_start,
        question,
        budget,
        config.tools,
        config.tool_choice,
        token_cap=cap,
        pins=pins,
        summaries=state.summaries,
    )
    if not p.fits:
        what = "system prompt, pinned items and question" if pins else "system prompt and question"
        limit = budget.max_request_bytes
        if limit is not None and p.mandatory_bytes > limit:
            detail = f"{what} need {p.mandatory_bytes} bytes; the budget is {limit}"
        else:
            detail = f"{what} need about {p.mandatory_tokens} tokens; the budget is {cap}"
        return (TurnRejected(rid, "over_budget", detail),)
    submitted = TurnSubmitted(
        rid, question, p.turns_sent, p.turns_dropped, p.request_bytes, p.prompt_tokens
    )
    asked: tuple[Event, ...] = (submitted,) if branch is None else (branch, submitted)
    if p.summary_id is not None:
        asked = (*asked, SummarySent(rid, p.summary_id))
    if superseding:
        assert current is not None
        return (TurnDiscarded(current, "superseded", f"by {rid}", preview), *asked)
    return asked


def _branch_base(turns: History, context_start: int, at_turn: int) -> tuple[History, int]:
    """The history a branch started before turn ``at_turn`` begins with, and
    the first of its turns a request may draw from."""
    return turns.upto(at_turn), min(context_start, at_turn)


def _edit(state: SessionState, msg: Message, budget: Budget, preview: int) -> tuple[Event, ...]:
    # Edit and Regenerate: a Submit on a new branch.
    assert isinstance(msg, (Edit, Regenerate))
    if ending_of(state, msg.request_id) is not None:
        return ()  # a retry of a request already seen: idempotent
    n = len(state.turns)
    kind: BranchKind
    if isinstance(msg, Edit):
        index, question, kind = msg.turn_index, msg.question, "edit"
        if type(index) is not int or not 0 <= index < n:
            raise UnknownTurn(
                f"no turn {index!r} to edit: branch {state.active_branch} has {n} turns "
                f"(0 to {n - 1})"
                if n
                else f"no turn {index!r} to edit: branch {state.active_branch} has no turn"
            )
    else:
        if n == 0:
            raise UnknownTurn(f"branch {state.active_branch} has no question to ask again")
        index, question, kind = n - 1, state.turns[n - 1].question, "regenerate"
    records = branch_records(state.branches, state.active_branch, state.turns, state.context_start)
    branch = BranchStarted(
        next_branch_id(records), state.active_branch, index, kind, msg.request_id
    )
    return _ask(state, msg.request_id, question, budget, preview, branch)


def _switch(state: SessionState, msg: Message, budget: Budget, preview: int) -> tuple[Event, ...]:
    assert isinstance(msg, Switch)
    records = branch_records(state.branches, state.active_branch, state.turns, state.context_start)
    find_branch(records, msg.branch)
    if msg.branch == state.active_branch:
        return ()
    switched = BranchSwitched(msg.branch)
    current = current_request(state)
    if current is None:
        return (switched,)
    assert state.config is not None
    if state.config.on_busy != "supersede":
        raise SessionBusy(f"request {current} is in flight; cancel it or wait for its end")
    return (TurnDiscarded(current, "superseded", f"by a switch to {msg.branch}", preview), switched)


def _record_summary(
    state: SessionState, msg: Message, budget: Budget, preview: int
) -> tuple[Event, ...]:
    assert isinstance(msg, RecordSummary)
    if any(x.request_id == msg.request_id for x in state.summaries):
        return ()  # the same summarizing request, recorded again: idempotent
    records = branch_records(state.branches, state.active_branch, state.turns, state.context_start)
    turns = find_branch(records, msg.branch).turns
    n, start, end = len(turns), msg.start, msg.end
    if type(start) is not int or type(end) is not int or not 0 <= start < end <= n:
        raise UnknownTurn(
            f"no turns {start!r} to {end!r} (end excluded) to summarize: "
            f"branch {msg.branch} has {n} turns"
        )
    if not isinstance(msg.text, str) or not msg.text.strip() or not _is_text(msg.text):
        raise InvalidCommand("a summary's text must be non-empty, valid Unicode text")
    if msg.origin not in SUMMARY_ORIGINS:
        raise InvalidCommand(f"a summary's origin is 'function' or 'model', not {msg.origin!r}")
    if not _is_label(msg.origin_name):
        raise InvalidCommand("a summary's origin name must be non-empty, valid Unicode text")
    summary_id = f"s{len(state.summaries) + 1}"
    tokens = budget.estimator.message_tokens(ChatMessage("user", msg.text))
    return (
        SummaryRecorded(
            summary_id,
            msg.branch,
            start,
            end,
            turns[start].request_id,
            turns[end - 1].request_id,
            msg.text,
            msg.origin,
            msg.origin_name,
            msg.request_id,
            msg.usage,
            len(msg.text.encode()),
            tokens,
        ),
    )


def _is_label(value: object) -> bool:
    return isinstance(value, str) and bool(value.strip()) and _is_text(value)


def _pin(state: SessionState, msg: Message, budget: Budget, preview: int) -> tuple[Event, ...]:
    assert isinstance(msg, (Pin, Unpin))
    current = current_request(state)
    if current is not None:
        raise SessionBusy(f"request {current} is in flight; pins change between turns")
    known = {p.pin_id for p in state.pins}
    if isinstance(msg, Unpin):
        if msg.pin_id not in known:
            names = ", ".join(sorted(known)) or "none"
            raise UnknownPin(f"no pinned item {msg.pin_id!r}; the session has {names}")
        return (PinRemoved(msg.pin_id),)
    if not _is_label(msg.pin_id) or not _PIN_ID.fullmatch(msg.pin_id):
        raise InvalidCommand("a pin id is 1-64 letters, digits, '_', '-', '.' or ':'")
    if msg.pin_id in known:
        raise InvalidCommand(f"the session already has a pinned item {msg.pin_id!r}")
    if not _is_label(msg.text):
        raise InvalidCommand("a pinned item's text must be non-empty, valid Unicode text")
    if not _is_label(msg.origin):
        raise InvalidCommand("a pinned item's origin must be non-empty, valid Unicode text")
    return (PinAdded(msg.pin_id, msg.text, msg.origin),)


_PIN_ID: Final = re.compile(r"[A-Za-z0-9_.:-]{1,64}")


def summary_of(state: SessionState, summary_id: str) -> SummaryRecorded | None:
    """The summary recorded as ``summary_id``, or ``None``."""
    for x in state.summaries:
        if x.summary_id == summary_id:
            return x
    return None


def _end_in_flight(
    state: SessionState, msg: Message, budget: Budget, preview: int
) -> tuple[Event, ...]:
    # Cancel, Timeout and Interrupt end the turn in flight, if it is theirs.
    current = current_request(state)
    if current is None:
        return ()
    if isinstance(msg, Cancel):
        if msg.request_id is not None and msg.request_id != current:
            return ()
        return (TurnDiscarded(current, "cancelled", "", preview),)
    if isinstance(msg, Timeout):
        if msg.request_id != current:
            return ()
        return (TurnDiscarded(current, "timeout", msg.detail, preview),)
    assert isinstance(msg, Interrupt)
    return (TurnDiscarded(current, "interrupted", msg.detail, preview),)


def _response_started(
    state: SessionState, msg: Message, budget: Budget, preview: int
) -> tuple[Event, ...]:
    assert isinstance(msg, ResponseStarted)
    if (
        isinstance(state, Pending)
        and state.request.request_id == msg.request_id
        and state.request.round == msg.round
    ):
        return (StreamStarted(msg.request_id),)
    return ()


def _is_current_round(state: SessionState, request_id: RequestId, round_: int) -> bool:
    # The round in flight is waiting on the provider (not on tools).
    return isinstance(state, (Pending, Streaming)) and (
        state.request.request_id == request_id and state.request.round == round_
    )


def _calls_problem(config: SessionStarted, calls: tuple[ToolCall, ...]) -> str | None:
    """Why a round's tool calls cannot be run, or ``None``. Never quotes them."""
    names = {t.name for t in config.tools}
    seen: set[str] = set()
    for c in calls:
        if c.name not in names:
            return "the model called a tool that is not registered"
        if not c.call_id or not _is_text(c.call_id) or c.call_id in seen:
            return "tool call ids must be non-empty and unique in a round"
        seen.add(c.call_id)
        try:
            args = json.loads(c.arguments)
        except ValueError:
            args = None
        if not isinstance(args, dict) or not _is_text(c.arguments):
            return "tool call arguments are not a JSON object"
    return None


def _tool_calls(state: SessionState, msg: Completed, preview: int) -> tuple[Event, ...]:
    assert isinstance(state, (Pending, Streaming)) and state.config is not None
    config = state.config
    rid = msg.request_id
    if msg.finish_reason not in ("tool_calls", "stop"):
        detail = f"finish_reason={safe_finish_reason(msg.finish_reason)} with tool calls"
        return (TurnDiscarded(rid, "incomplete_finish", detail, preview),)
    problem = _calls_problem(config, msg.tool_calls)
    if problem is not None or not _is_text(msg.answer):
        detail = problem or "the text with the tool calls has a lone surrogate"
        return (TurnDiscarded(rid, "protocol", detail, preview),)
    if msg.round >= config.max_tool_rounds:
        detail = f"more than {config.max_tool_rounds} tool rounds"
        return (TurnDiscarded(rid, "limit", detail, preview),)
    return (ToolCallsRequested(rid, msg.round, msg.tool_calls, msg.answer, msg.usage),)


def _completed(
    state: SessionState, msg: Message, budget: Budget, preview: int
) -> tuple[Event, ...]:
    assert isinstance(msg, Completed)
    rid = msg.request_id
    if not _is_current_round(state, rid, msg.round):
        return (CompletionIgnored(rid, "completed", msg.usage),)
    if msg.tool_calls:
        return _tool_calls(state, msg, preview)
    if not msg.answer.strip():
        return (TurnDiscarded(rid, "empty", "the answer is empty", preview),)
    if not _is_text(msg.answer):
        return (TurnDiscarded(rid, "malformed", "the answer has a lone surrogate", preview),)
    if msg.finish_reason != "stop":
        detail = f"finish_reason={safe_finish_reason(msg.finish_reason)}"
        return (TurnDiscarded(rid, "incomplete_finish", detail, preview),)
    return (TurnCommitted(rid, msg.answer, msg.finish_reason, msg.usage),)


def _failed(state: SessionState, msg: Message, budget: Budget, preview: int) -> tuple[Event, ...]:
    assert isinstance(msg, Failed)
    rid = msg.request_id
    if not _is_current_round(state, rid, msg.round):
        return (CompletionIgnored(rid, f"failed:{msg.failure.reason}"),)
    reason, detail = msg.failure.reason, msg.failure.detail
    if reason == "context_overflow":
        return _overflowed(state, detail, budget, preview)
    if looks_like_overflow(state, reason, preview):
        return _overflowed(state, _SILENT_DETAIL.format(f"{reason} ({detail})"), budget, preview)
    return (TurnDiscarded(rid, reason, detail, preview),)


_SILENT_DETAIL: Final = "{} for a request larger than any that committed"


def _tool_done(
    state: SessionState, msg: Message, budget: Budget, preview: int
) -> tuple[Event, ...]:
    assert isinstance(msg, ToolDone)
    rid = msg.request_id
    if (
        not isinstance(state, AwaitingTools)
        or state.request.request_id != rid
        or msg.call_id not in state.request.rounds[-1].pending()
    ):
        return (CompletionIgnored(rid, "tool_result"),)
    config = state.config
    assert config is not None
    content, is_error = msg.content, msg.is_error
    if not _is_text(content):
        content, is_error = "the tool's result is not valid Unicode text", True
    elif len(content.encode()) > MAX_TOOL_RESULT_BYTES:
        content, is_error = f"the tool's result is over {MAX_TOOL_RESULT_BYTES} bytes", True
    if is_error and config.on_tool_error == "stop":
        return (TurnDiscarded(rid, "tool_error", "a tool failed", preview),)
    recorded = ToolResultRecorded(rid, msg.call_id, content, is_error, max(msg.duration_ms, 0))
    after = evolve(state, recorded)
    assert isinstance(after, AwaitingTools)
    if not after.request.rounds[-1].complete:
        return (recorded,)
    return (recorded, _next_round(after, budget, preview))


def _next_round(state: AwaitingTools, budget: Budget, preview: int) -> Event:
    config = state.config
    assert config is not None
    req = state.request
    messages = build_messages(
        config.system, state.turns, req.turns_sent, req.question, req.rounds, _carried(state)
    )
    size = len(budget.encoder.encode(config.model, messages, config.tools, config.tool_choice))
    limit = budget.max_request_bytes
    if limit is not None and size > limit:
        detail = f"the next tool round needs {size} bytes; the budget is {limit}"
        return TurnDiscarded(req.request_id, "limit", detail, preview)
    max_tokens = prompt_token_cap(state, budget)
    if max_tokens is not None:
        est = budget.estimator
        tokens = (
            est.request_tokens
            + tools_tokens(est, config.tools)
            + sum(est.message_tokens(m) for m in messages)
        )
        if tokens > max_tokens:
            detail = f"the next tool round needs about {tokens} tokens; the budget is {max_tokens}"
            return TurnDiscarded(req.request_id, "limit", detail, preview)
    return ToolRoundSubmitted(req.request_id, req.round + 1, size)


_HANDLERS: Final[Mapping[type[Message], _Handler]] = {
    Start: _start,
    Submit: _submit,
    Cancel: _end_in_flight,
    Timeout: _end_in_flight,
    Interrupt: _end_in_flight,
    ResponseStarted: _response_started,
    Completed: _completed,
    Failed: _failed,
    ToolDone: _tool_done,
    Edit: _edit,
    Regenerate: _edit,
    Switch: _switch,
    RecordSummary: _record_summary,
    Pin: _pin,
    Unpin: _pin,
}


def decide(
    state: SessionState,
    message: Message,
    *,
    budget: Budget = _DEFAULT_BUDGET,
    preview_chars: int = 0,
) -> tuple[Event, ...]:
    """The events that ``message`` causes in ``state`` (often none).

    Pure: reads no clock, draws no random numbers, changes nothing.

    Args:
        budget: how requests are measured and capped (for Submit).
        preview_chars: preview characters already delivered for the turn in
            flight, recorded on a discard.

    Raises:
        InvalidCommand: the message is not allowed in this state; nothing
            happened.
    """
    allowed = TRANSITIONS.get(type(state), {})
    if type(message) not in allowed:
        raise InvalidCommand(
            f"can't handle {type(message).__name__} in state {type(state).__name__}"
        )
    if state.config is None and type(message) is not Start:
        # Nothing can be recorded for a session whose log does not exist yet.
        raise InvalidCommand(f"{type(message).__name__} before the session started")
    return _HANDLERS[type(message)](state, message, budget, preview_chars)


# --- evolve -----------------------------------------------------------------


def _expect_current(state: SessionState, request_id: RequestId, event: Event) -> None:
    if current_request(state) != request_id:
        raise ReplayError(
            f"{type(event).__name__} for {request_id!r} but "
            f"{current_request(state)!r} is in flight (version {state.version})"
        )


def evolve(state: SessionState, event: Event) -> SessionState:
    """Apply one fact. Pure and total over a well-formed log.

    Raises:
        ReplayError: ``event`` cannot follow ``state``: the log is corrupt.
    """
    row = EVENT_TRANSITIONS[type(state)]
    if type(event) not in row:
        raise ReplayError(
            f"{type(event).__name__} cannot follow state {type(state).__name__} "
            f"(version {state.version})"
        )
    # (The row above holds exact types: an event is never a subclass here,
    # so the branches below compare types.)
    version = state.version + 1
    # What every phase carries, as keywords for the next phase's class:
    # built directly, not through attrs.evolve, which looks the fields up
    # again on every call (evolve runs once per event, in every replay).
    base: dict[str, Any] = {
        "config": state.config,
        "turns": state.turns,
        "context_start": state.context_start,
        "endings": state.endings,
        "version": version,
        "last_request_id": state.last_request_id,
        "calibration": state.calibration,
        "largest_ok": state.largest_ok,
        "overflow_cap": state.overflow_cap,
        "active_branch": state.active_branch,
        "branches": state.branches,
        "fork": state.fork,
        "pins": state.pins,
        "summaries": state.summaries,
    }
    if isinstance(event, SessionStarted):
        if state.config is not None or state.version != 0:
            raise ReplayError("SessionStarted must be the first event, once")
        base["config"] = event
        return Idle(**base)
    if state.config is None:
        raise ReplayError(f"{type(event).__name__} before SessionStarted")
    if isinstance(event, SessionForked):
        if state.version != 1 or state.fork is not None:
            raise ReplayError("SessionForked must follow SessionStarted at once, once")
        if len(state.turns) != event.at_turn:
            # The prefix lives in the source's events: a plain fold cannot
            # see it (replay the fork through the store, see ``_forks``).
            raise ReplayError(
                f"a fork of {event.source!r} at turn {event.at_turn} whose shared turns "
                f"were not resolved ({len(state.turns)} given)"
            )
        base["fork"] = event
        return Committed(**base)
    if type(event) is TurnSubmitted:
        if event.request_id in state.endings:
            raise ReplayError(f"request {event.request_id!r} submitted twice")
        req = InFlight(
            event.request_id,
            event.question,
            event.turns_sent,
            event.turns_dropped,
            event.request_bytes,
            estimated_prompt_tokens=event.estimated_prompt_tokens,
        )
        base["last_request_id"] = event.request_id
        return Pending(**base, request=req)
    if type(event) is TurnRejected:
        if event.request_id in state.endings or event.request_id == current_request(state):
            raise ReplayError(f"request {event.request_id!r} rejected after it was seen")
        base["endings"] = state.endings.record(
            event.request_id, Ending("rejected", event.reason, event.detail)
        )
        return attrs.evolve(state, **base)
    if type(event) is CompletionIgnored:
        return attrs.evolve(state, **base)
    if isinstance(event, (BranchStarted, BranchSwitched)):
        return attrs.evolve(state, **{**base, **_evolve_branch(state, event)})
    if isinstance(event, (SummaryRecorded, PinAdded, PinRemoved)):
        return attrs.evolve(state, **{**base, **_evolve_carried(state, event)})
    assert isinstance(state, IN_FLIGHT)
    _expect_current(state, event.request_id, event)
    if type(event) is StreamStarted:
        return Streaming(**base, request=state.request)
    if type(event) is SummarySent:
        assert isinstance(state, Pending)  # the only phase whose row has it
        return Pending(**base, request=_summary_sent(state, event))
    if isinstance(event, (ToolCallsRequested, ToolResultRecorded, ToolRoundSubmitted)):
        return _evolve_round(state, event, base)
    if type(event) is TurnRetried:
        if state.request.attempt > 1:
            raise ReplayError(f"request {event.request_id!r} retried twice")
        req = attrs.evolve(
            state.request,
            turns_sent=event.turns_sent,
            turns_dropped=event.turns_dropped,
            request_bytes=event.request_bytes,
            estimated_prompt_tokens=event.estimated_prompt_tokens,
            attempt=2,
            summary_id=None,  # a SummarySent follows if the retry sends one
        )
        base["overflow_cap"] = cap_after_overflow(state)
        return Pending(**base, request=req)
    if type(event) is TurnCommitted:
        n = len(state.turns)
        q = state.request.question
        turns = state.turns.append(Turn(event.request_id, q, event.answer, state.request.rounds))
        context_start = state.context_start
        policy = state.config.policy
        if isinstance(policy, Window):
            # The context becomes exactly what was sent plus the new turn,
            # capped; evicted turns never come back.
            context_start = max(n - state.request.turns_sent, n + 1 - policy.max_turns)
        base["turns"] = turns
        base["context_start"] = context_start
        base["endings"] = state.endings.record(
            event.request_id, Ending("committed", "", "", event.answer)
        )
        base["calibration"] = calibrated(state, event.usage)
        base["largest_ok"] = max(state.largest_ok, state.request.estimated_prompt_tokens or 0)
        return Committed(**base)
    assert isinstance(event, TurnDiscarded)
    base["endings"] = state.endings.record(
        event.request_id, Ending("discarded", event.reason, event.detail)
    )
    if event.reason == "context_overflow":
        base["overflow_cap"] = cap_after_overflow(state)
    return Discarded(**base, reason=event.reason)


def _evolve_branch(state: SessionState, event: BranchStarted | BranchSwitched) -> dict[str, Any]:
    # The fields a branch event changes: the records, the active branch, and
    # the history (with its context start) that is now the active path.
    records = branch_records(state.branches, state.active_branch, state.turns, state.context_start)
    if isinstance(event, BranchSwitched):
        try:
            target = find_branch(records, event.branch)
        except UnknownBranch as exc:
            raise ReplayError(f"a switch to an unknown branch: {exc}") from None
        if target.branch_id == state.active_branch:
            raise ReplayError(f"a switch to {event.branch!r}, the active branch")
        return {
            "branches": records,
            "active_branch": target.branch_id,
            "turns": target.turns,
            "context_start": target.context_start,
        }
    if event.parent != state.active_branch:
        raise ReplayError(f"branch {event.branch!r} starts from {event.parent!r}, not active")
    if any(b.branch_id == event.branch for b in records):
        raise ReplayError(f"branch {event.branch!r} started twice")
    if not 0 <= event.at_turn < len(state.turns):
        raise ReplayError(
            f"branch {event.branch!r} starts before turn {event.at_turn} of {len(state.turns)}"
        )
    turns, context_start = _branch_base(state.turns, state.context_start, event.at_turn)
    new = Branch(event.branch, event.parent, event.at_turn, event.kind, turns, context_start)
    return {
        "branches": (*records, new),
        "active_branch": event.branch,
        "turns": turns,
        "context_start": context_start,
    }


def _evolve_carried(
    state: SessionState, event: SummaryRecorded | PinAdded | PinRemoved
) -> dict[str, Any]:
    # The fields a summary or a pin changes; no turn, whatever they say.
    if isinstance(event, SummaryRecorded):
        if event.summary_id != f"s{len(state.summaries) + 1}":
            raise ReplayError(f"summary {event.summary_id!r} out of order")
        records = branch_records(
            state.branches, state.active_branch, state.turns, state.context_start
        )
        try:
            turns = find_branch(records, event.branch).turns
        except UnknownBranch as exc:
            raise ReplayError(f"a summary of an unknown branch: {exc}") from None
        if not (
            0 <= event.start < event.end <= len(turns)
            and turns[event.start].request_id == event.first_request_id
            and turns[event.end - 1].request_id == event.last_request_id
        ):
            raise ReplayError(f"summary {event.summary_id!r} covers turns its branch does not have")
        return {"summaries": (*state.summaries, event)}
    known = [p.pin_id for p in state.pins]
    if isinstance(event, PinAdded):
        if event.pin_id in known:
            raise ReplayError(f"item {event.pin_id!r} pinned twice")
        return {"pins": (*state.pins, event)}
    if event.pin_id not in known:
        raise ReplayError(f"an unpin of {event.pin_id!r}, which is not pinned")
    return {"pins": tuple(p for p in state.pins if p.pin_id != event.pin_id)}


def _summary_sent(state: Pending, event: SummarySent) -> InFlight:
    req = state.request
    summary = summary_of(state, event.summary_id)
    first_sent = len(state.turns) - req.turns_sent
    if (
        req.summary_id is not None
        or summary is None
        or not covers_dropped(summary, state.turns, state.context_start, first_sent)
    ):
        raise ReplayError(
            f"summary {event.summary_id!r} cannot stand for the turns {req.request_id!r} dropped"
        )
    return attrs.evolve(req, summary_id=event.summary_id)


def _carried(state: SessionState) -> tuple[ChatMessage, ...]:
    """What the request in flight sends after the system prompt: the pinned
    items, then its summary (if it sends one)."""
    pins = pin_messages(state.pins)
    req = getattr(state, "request", None)
    summary_id = None if req is None else req.summary_id
    if summary_id is None:
        return pins
    summary = summary_of(state, summary_id)
    assert summary is not None
    return (*pins, summary_message(summary))


def _evolve_round(
    state: SessionState,
    event: ToolCallsRequested | ToolResultRecorded | ToolRoundSubmitted,
    base: dict[str, Any],
) -> SessionState:
    assert isinstance(state, IN_FLIGHT)
    req = state.request
    if isinstance(event, ToolCallsRequested):
        if event.round != req.round or not event.calls:
            raise ReplayError(f"tool calls for round {event.round} in round {req.round}")
        ids = [c.call_id for c in event.calls]
        if len(set(ids)) != len(ids):
            raise ReplayError("tool call ids repeat in a round")
        rounds = (*req.rounds, ToolRound(event.calls, event.content))
        return AwaitingTools(**base, request=attrs.evolve(req, rounds=rounds))
    last = req.rounds[-1]
    if isinstance(event, ToolResultRecorded):
        if event.call_id not in last.pending():
            raise ReplayError(f"a result for call {event.call_id!r}, which is not waiting")
        result = ToolResult(event.call_id, event.content, event.is_error)
        done = attrs.evolve(last, results=(*last.results, result))
        request = attrs.evolve(req, rounds=(*req.rounds[:-1], done))
        return AwaitingTools(**base, request=request)
    if not last.complete or event.round != req.round + 1:
        raise ReplayError(f"round {event.round} submitted before round {req.round} completed")
    request = attrs.evolve(req, round=event.round, request_bytes=event.request_bytes)
    return Pending(**base, request=request)


def replay(events: Iterable[Event], state: SessionState | None = None) -> SessionState:
    """Fold ``events`` into a state, from ``state`` or from the initial state."""
    s: SessionState = initial_state() if state is None else state
    for event in events:
        s = evolve(s, event)
    return s


def request_messages(state: Pending | Streaming) -> list[ChatMessage]:
    """The messages of the request in flight, exactly as projected: the
    history sent, the question and every complete tool round of the turn."""
    assert state.config is not None
    req = state.request
    return build_messages(
        state.config.system, state.turns, req.turns_sent, req.question, req.rounds, _carried(state)
    )
