"""Sessions: the pure state machine and projection, and the trio runtime.

The pure part (``decide``, ``evolve``, ``replay``, the projection and the
request encoder) imports no trio, httpx, sqlite3 or structlog. The runtime
(``open_hub`` and its types) is imported lazily, on first use, so that
importing the pure part never loads trio.
"""

from typing import TYPE_CHECKING as _TYPE_CHECKING
from typing import Any as _Any

from ._history import History, Outcome, Outcomes, Turn
from ._machine import (
    EVENT_TRANSITIONS,
    TRANSITIONS,
    Committed,
    Discarded,
    Idle,
    InFlight,
    Pending,
    SessionState,
    Streaming,
    decide,
    evolve,
    initial_state,
    is_in_flight,
    outcome_of,
    replay,
    request_messages,
)
from ._messages import (
    Cancel,
    Completed,
    Failed,
    Failure,
    Interrupt,
    Message,
    ResponseStarted,
    Start,
    Submit,
    Timeout,
)
from ._ports import ChatRequest, Completion, Provider, StreamSink
from ._projection import (
    Budget,
    CharTokenEstimator,
    Plan,
    TokenEstimator,
    build_messages,
    naive_plan,
    plan,
)
from ._replay import replay_sessions
from ._request import ChatMessage, JsonChatEncoder, RequestEncoder, Role
from ._results import CommittedResult, DiscardedResult, RejectedResult, TurnResult

if _TYPE_CHECKING:
    from ._hub import Hub, HubStatistics, TurnHandle, open_hub

__all__ = [
    "EVENT_TRANSITIONS",
    "TRANSITIONS",
    "Budget",
    "Cancel",
    "CharTokenEstimator",
    "ChatMessage",
    "ChatRequest",
    "Committed",
    "CommittedResult",
    "Completed",
    "Completion",
    "Discarded",
    "DiscardedResult",
    "Failed",
    "Failure",
    "History",
    "Hub",
    "HubStatistics",
    "Idle",
    "InFlight",
    "Interrupt",
    "JsonChatEncoder",
    "Message",
    "Outcome",
    "Outcomes",
    "Pending",
    "Plan",
    "Provider",
    "RejectedResult",
    "RequestEncoder",
    "ResponseStarted",
    "Role",
    "SessionState",
    "Start",
    "StreamSink",
    "Streaming",
    "Submit",
    "Timeout",
    "TokenEstimator",
    "Turn",
    "TurnHandle",
    "TurnResult",
    "build_messages",
    "decide",
    "evolve",
    "initial_state",
    "is_in_flight",
    "naive_plan",
    "open_hub",
    "outcome_of",
    "plan",
    "replay",
    "replay_sessions",
    "request_messages",
]

_LAZY = {"Hub", "HubStatistics", "TurnHandle", "open_hub"}


def __getattr__(name: str) -> _Any:
    if name not in _LAZY:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    from . import _hub

    value = getattr(_hub, name)
    globals()[name] = value
    return value
