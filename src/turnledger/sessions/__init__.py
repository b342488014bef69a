"""Sessions: the pure state machine and projection, and the trio runtime.

The pure part (``decide``, ``evolve``, ``replay``, the projection and the
request encoder) imports no trio, httpx, sqlite3 or structlog.
"""

from ._history import History, Outcome, Outcomes, Turn
from ._hub import Hub, HubStatistics, TurnHandle, open_hub
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
from ._projection import Budget, Plan, build_messages, naive_plan, plan
from ._request import ChatMessage, JsonChatEncoder, RequestEncoder, Role
from ._results import CommittedResult, DiscardedResult, RejectedResult, TurnResult

__all__ = [
    "EVENT_TRANSITIONS",
    "TRANSITIONS",
    "Budget",
    "Cancel",
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
    "request_messages",
]
