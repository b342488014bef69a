"""An independent reference fold: what a session log means, read off the
event definitions alone.

It shares nothing with the machine (no ``evolve``, no transition tables, no
``History``, no budget arithmetic): plain lists and dicts, written the
obvious way. Tests compare what the machine's state says with what this
fold says, so a bug in ``evolve`` cannot hide behind a replay that runs the
same ``evolve`` again. It assumes a well-formed log (the machine's tests
check that impossible logs are refused).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from turnledger.events import (
    BranchStarted,
    BranchSwitched,
    CompletionIgnored,
    Event,
    PinAdded,
    PinRemoved,
    SessionStarted,
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
    Window,
)
from turnledger.sessions import SessionState

__all__ = ["meaning", "observed"]

#: A tool round: (assistant content, ((call_id, name, arguments), ...),
#: ((call_id, content, is_error), ...)).
Round = tuple[str, tuple[tuple[str, str, str], ...], tuple[tuple[str, str, bool], ...]]


def meaning(log: Sequence[Event]) -> dict[str, Any]:
    """What ``log`` says: the phase, the committed turns, how each request
    ended, the request in flight and its rounds, and the context's start."""
    phase = "Idle"
    turns: list[tuple[str, str, str, tuple[Round, ...]]] = []
    endings: dict[str, tuple[str, str, str, str | None]] = {}
    in_flight: dict[str, Any] | None = None
    last_request_id: str | None = None
    discard_reason: str | None = None
    context_start = 0
    largest_ok = 0
    config: SessionStarted | None = None
    # branch name -> (its turns, its context start) when it was left
    saved: dict[str, tuple[list[Any], int]] = {}
    active = "main"
    pins: list[tuple[str, str, str]] = []
    summaries: list[tuple[str, str, int, int, str]] = []
    for event in log:
        if isinstance(event, SessionStarted):
            config = event
            phase = "Idle"
        elif isinstance(event, TurnSubmitted):
            in_flight = {
                "request_id": event.request_id,
                "question": event.question,
                "turns_sent": event.turns_sent,
                "round": 0,
                "rounds": [],
                "estimate": event.estimated_prompt_tokens,
            }
            last_request_id = event.request_id
            phase = "Pending"
        elif isinstance(event, TurnRejected):
            endings[event.request_id] = ("rejected", event.reason, event.detail, None)
        elif isinstance(event, CompletionIgnored):
            pass
        elif isinstance(event, StreamStarted):
            phase = "Streaming"
        elif isinstance(event, TurnRetried):
            assert in_flight is not None
            in_flight["turns_sent"] = event.turns_sent
            in_flight["estimate"] = event.estimated_prompt_tokens
            in_flight.pop("summary_id", None)  # a SummarySent follows if it sends one
            phase = "Pending"
        elif isinstance(event, ToolCallsRequested):
            assert in_flight is not None
            calls = [(c.call_id, c.name, c.arguments) for c in event.calls]
            in_flight["rounds"].append([event.content, calls, []])
            phase = "AwaitingTools"
        elif isinstance(event, ToolResultRecorded):
            assert in_flight is not None
            in_flight["rounds"][-1][2].append((event.call_id, event.content, event.is_error))
            phase = "AwaitingTools"
        elif isinstance(event, ToolRoundSubmitted):
            assert in_flight is not None
            in_flight["round"] = event.round
            phase = "Pending"
        elif isinstance(event, TurnCommitted):
            assert in_flight is not None and config is not None
            turns.append(
                (event.request_id, in_flight["question"], event.answer, _rounds(in_flight))
            )
            if isinstance(config.policy, Window):
                # What was sent, plus the new turn, at most max_turns of them.
                kept = min(in_flight["turns_sent"] + 1, config.policy.max_turns)
                context_start = len(turns) - kept
            endings[event.request_id] = ("committed", "", "", event.answer)
            largest_ok = max(largest_ok, in_flight["estimate"] or 0)
            in_flight = None
            phase = "Committed"
        elif isinstance(event, TurnDiscarded):
            endings[event.request_id] = ("discarded", event.reason, event.detail, None)
            discard_reason = event.reason
            in_flight = None
            phase = "Discarded"
        elif isinstance(event, BranchStarted):
            # a new branch keeps the active one's first at_turn turns
            saved[active] = (turns, context_start)
            turns = list(turns[: event.at_turn])
            context_start = min(context_start, event.at_turn)
            active = event.branch
        elif isinstance(event, BranchSwitched):
            saved[active] = (turns, context_start)
            turns, context_start = saved[event.branch]
            active = event.branch
        elif isinstance(event, PinAdded):
            pins.append((event.pin_id, event.text, event.origin))
        elif isinstance(event, PinRemoved):
            pins = [p for p in pins if p[0] != event.pin_id]
        elif isinstance(event, SummaryRecorded):
            # a summary changes no turn: it is only remembered
            summaries.append((event.summary_id, event.branch, event.start, event.end, event.text))
        elif isinstance(event, SummarySent):
            assert in_flight is not None
            in_flight["summary_id"] = event.summary_id
        else:  # pragma: no cover - a new event type needs a line here
            raise AssertionError(f"the reference fold does not know {type(event).__name__}")
    return {
        "phase": phase,
        "version": len(log),
        "config": config,
        "turns": turns,
        "endings": endings,
        "in_flight": None if in_flight is None else in_flight["request_id"],
        "round": None if in_flight is None else in_flight["round"],
        "rounds": None if in_flight is None else _rounds(in_flight),
        "last_request_id": last_request_id,
        "discard_reason": discard_reason if phase == "Discarded" else None,
        "context_start": context_start,
        "largest_ok": largest_ok,
        "active_branch": active,
        "pins": pins,
        "summaries": summaries,
        "summary_sent": None if in_flight is None else in_flight.get("summary_id"),
    }


def _rounds(in_flight: dict[str, Any]) -> tuple[Round, ...]:
    return tuple((c, tuple(calls), tuple(results)) for c, calls, results in in_flight["rounds"])


def observed(state: SessionState) -> dict[str, Any]:
    """The same view, read off a machine state."""
    request = getattr(state, "request", None)

    def rounds(rs: Any) -> tuple[Round, ...]:
        return tuple(
            (
                r.content,
                tuple((c.call_id, c.name, c.arguments) for c in r.calls),
                tuple((x.call_id, x.content, x.is_error) for x in r.results),
            )
            for r in rs
        )

    return {
        "phase": type(state).__name__,
        "version": state.version,
        "config": state.config,
        "turns": [(t.request_id, t.question, t.answer, rounds(t.rounds)) for t in state.turns],
        "endings": {rid: (e.kind, e.reason, e.detail, e.answer) for rid, e in state.endings},
        "in_flight": None if request is None else request.request_id,
        "round": None if request is None else request.round,
        "rounds": None if request is None else rounds(request.rounds),
        "last_request_id": state.last_request_id,
        "discard_reason": getattr(state, "reason", None),
        "context_start": state.context_start,
        "largest_ok": state.largest_ok,
        "active_branch": state.active_branch,
        "pins": [(p.pin_id, p.text, p.origin) for p in state.pins],
        "summaries": [(x.summary_id, x.branch, x.start, x.end, x.text) for x in state.summaries],
        "summary_sent": None if request is None else request.summary_id,
    }
