"""The event vocabulary of turnledger: typed events, the stored envelope,
the codec, and the ``EventStore`` port.

This package is pure: it imports no trio, httpx, sqlite3 or structlog.
"""

from ._envelope import StoredEvent
from ._events import (
    DISCARD_REASONS,
    REJECT_REASONS,
    WINDOW_SOURCES,
    CompletionIgnored,
    DiscardReason,
    Event,
    HistoryPolicy,
    Ledger,
    OnBusy,
    RejectReason,
    RequestId,
    SessionId,
    SessionStarted,
    StreamStarted,
    TurnCommitted,
    TurnDiscarded,
    TurnRejected,
    TurnRetried,
    TurnSubmitted,
    Usage,
    Window,
    WindowSource,
)
from ._store import EventDecoder, EventStore, PayloadNotJSON
from .codec import DEFAULT_CODEC, SCHEMA_VERSIONS, WIRE_TAGS, EventCodec

__all__ = [
    "DEFAULT_CODEC",
    "DISCARD_REASONS",
    "REJECT_REASONS",
    "SCHEMA_VERSIONS",
    "WINDOW_SOURCES",
    "WIRE_TAGS",
    "CompletionIgnored",
    "DiscardReason",
    "Event",
    "EventCodec",
    "EventDecoder",
    "EventStore",
    "HistoryPolicy",
    "Ledger",
    "OnBusy",
    "PayloadNotJSON",
    "RejectReason",
    "RequestId",
    "SessionId",
    "SessionStarted",
    "StoredEvent",
    "StreamStarted",
    "TurnCommitted",
    "TurnDiscarded",
    "TurnRejected",
    "TurnRetried",
    "TurnSubmitted",
    "Usage",
    "Window",
    "WindowSource",
]
