"""Sample events: one of every wire tag, with awkward text."""

from __future__ import annotations

from ..events import (
    CompletionIgnored,
    Event,
    RequestId,
    SessionStarted,
    StreamStarted,
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
        SessionStarted(awkward, "gpt-4o-mini", Window(4), "supersede", 8192, 1024, "fallback"),
        TurnSubmitted(_R, awkward, 3, 1, 1234, 321),
        TurnRejected(RequestId("r-0"), "busy", awkward),
        StreamStarted(_R),
        TurnCommitted(_R, awkward, "stop", Usage(10, 20, 30)),
        TurnDiscarded(RequestId("r-2"), "timeout", awkward, 17),
        CompletionIgnored(RequestId("r-2"), "failed:http_status"),
        TurnRetried(_R, "context_overflow", awkward, 1, 3, 600, 150),
    ]
