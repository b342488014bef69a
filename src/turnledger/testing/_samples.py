"""Sample events: one of every wire tag, with awkward text."""

from __future__ import annotations

from ..events import (
    BranchId,
    BranchStarted,
    BranchSwitched,
    CompletionIgnored,
    Event,
    PinAdded,
    PinRemoved,
    RequestId,
    SessionForked,
    SessionId,
    SessionStarted,
    StreamStarted,
    SummaryRecorded,
    SummarySent,
    ToolCall,
    ToolCallsRequested,
    ToolResultRecorded,
    ToolRoundSubmitted,
    ToolSpec,
    TurnCommitted,
    TurnDiscarded,
    TurnRejected,
    TurnRetried,
    TurnSubmitted,
    Usage,
    Window,
)

__all__ = ["sample_events"]

_R = RequestId("r-1")


def sample_events() -> list[Event]:
    """One event of every wire tag, with awkward text (CJK, emoji, quotes,
    backslashes, newlines, control characters and NUL)."""
    awkward = '你好，"Java" 🌱\\n\nline2\t\x01\x00end'
    return [
        SessionStarted(
            awkward,
            "gpt-4o-mini",
            Window(4),
            "supersede",
            context_window=8192,
            output_reserve=1024,
            window_source="fallback",
        ),
        TurnSubmitted(_R, awkward, 3, 1, 1234, 321),
        TurnRejected(RequestId("r-0"), "busy", awkward),
        StreamStarted(_R),
        TurnCommitted(_R, awkward, "stop", Usage(10, 20, 30)),
        TurnDiscarded(RequestId("r-2"), "timeout", awkward, 17),
        CompletionIgnored(RequestId("r-2"), "failed:http_status"),
        SessionStarted(
            awkward,
            "m",
            tools=(ToolSpec("clock", awkward), ToolSpec("calc", "", '{"type":"object"}')),
            tool_choice="required",
            max_tool_rounds=3,
            on_tool_error="stop",
        ),
        ToolCallsRequested(
            _R, 0, (ToolCall("c-1", "calc", '{"q":"\\u00e9 \\"x\\""}'),), awkward, Usage(1, 2, 3)
        ),
        ToolResultRecorded(_R, "c-1", awkward, True, 12),
        ToolRoundSubmitted(_R, 1, 4321),
        TurnRetried(_R, "context_overflow", awkward, 1, 3, 600, 150),
        BranchStarted(BranchId("b1"), BranchId("main"), 2, "edit", RequestId("r-3")),
        BranchSwitched(BranchId("main")),
        SessionForked(SessionId("s-source"), 12, BranchId("b1"), 3),
        SummaryRecorded(
            "s1",
            BranchId("main"),
            0,
            2,
            _R,
            RequestId("r-3"),
            awkward,
            "model",
            "concise",
            RequestId("sum-1"),
            Usage(50, 12, 62),
            len(awkward.encode()),
            9,
        ),
        SummarySent(_R, "s1"),
        PinAdded("p1", awkward, "memory"),
        PinRemoved("p1"),
    ]
