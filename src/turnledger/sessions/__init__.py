"""Sessions: the pure state machine and projection, and the trio runtime.

The tree shows the boundary. The modules of this folder are the pure core:
``_machine`` (``decide``/``evolve``/``replay`` and the transition tables),
``_phases`` (what each phase holds), ``_budgets`` (the token caps),
``_messages``, ``_history``, ``_results``, ``_projection``, ``_request`` (the
request encoder), ``_replay``, ``_forks`` and ``_diagram``; they import no trio, httpx,
sqlite3 or structlog (``tests/test_architecture.py`` checks every module of
the folder). The trio runtime (``open_hub`` and its types: hub, actors,
tickets, log vocabulary) lives in :mod:`turnledger.runtime`. It stays
imported lazily, on first use (``__getattr__`` below), so that importing the
pure part never loads trio: measured with ``python -X importtime``, the pure
package takes about 90 ms and the runtime adds about 110 ms more (trio and
structlog), which a replay tool or a codec user should not pay.

Ports. ``Provider`` (with ``ChatRequest``, ``Completion`` and ``StreamSink``,
in ``_ports``) is the port this layer uses to reach a model server: it is
defined here, beside the core that consumes it, and adapters implement it.
The other port, ``EventStore``, belongs to :mod:`turnledger.events`, beside
the events it stores.

Names that sound alike, by layer:

- ``Completion``: what a ``Provider`` returns when its stream ended well formed.
- ``Completed``: the message the request task sends the actor with it.
- ``TurnCommitted`` (:mod:`turnledger.events`): the event that puts the turn
  in history.
- ``Committed`` / ``Discarded``: the session's phase after a turn ended (the
  ``from``/``to`` of ``transition`` log lines).
- ``CommittedResult`` / ``DiscardedResult`` / ``RejectedResult``
  (a ``TurnResult``): what ``TurnHandle.outcome()`` gives the caller.
- ``Ending`` / ``ending_of()``: the session's own record of how a request id
  ended (or that it is in flight), kept in ``state.endings``.
"""

from typing import TYPE_CHECKING as _TYPE_CHECKING
from typing import Any as _Any

from ._branches import Branch, BranchInfo
from ._forks import (
    fork_events,
    fork_seed,
    replay_resolved,
    replay_sessions,
    replay_stored,
    seed_of,
)
from ._history import Ending, Endings, History, ToolResult, ToolRound, Turn
from ._machine import (
    EVENT_TRANSITIONS,
    MAX_TOOL_RESULT_BYTES,
    TRANSITIONS,
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
    decide,
    ending_of,
    evolve,
    initial_state,
    is_in_flight,
    prompt_token_cap,
    replay,
    request_messages,
    summary_of,
)
from ._messages import (
    Cancel,
    Completed,
    Edit,
    Failed,
    Failure,
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
)
from ._ports import (
    AnswersAtOnce,
    ChatRequest,
    Completion,
    DescribesModels,
    ModelInfo,
    Provider,
    StreamSink,
)
from ._projection import (
    Budget,
    CharTokenEstimator,
    Plan,
    TokenEstimator,
    build_messages,
    plan,
)
from ._request import ChatMessage, JsonChatEncoder, RequestEncoder, Role
from ._results import CommittedResult, DiscardedResult, RejectedResult, TurnResult
from ._retention import RetentionPolicy, RetentionStep, plan_retention, subject_of
from ._tools import Tool, ToolError, ToolInvocation

if _TYPE_CHECKING:
    from ..runtime import (
        Hub,
        HubStatistics,
        ModelSummarizer,
        SummaryPolicy,
        TurnHandle,
        erase_sessions,
        forks_of,
        open_hub,
        prune_store,
        sessions_of_subject,
        with_forks,
    )

__all__ = [
    "EVENT_TRANSITIONS",
    "MAX_TOOL_RESULT_BYTES",
    "TRANSITIONS",
    "AnswersAtOnce",
    "AwaitingTools",
    "Branch",
    "BranchInfo",
    "Budget",
    "Cancel",
    "CharTokenEstimator",
    "ChatMessage",
    "ChatRequest",
    "Committed",
    "CommittedResult",
    "Completed",
    "Completion",
    "DescribesModels",
    "Discarded",
    "DiscardedResult",
    "Edit",
    "Ending",
    "Endings",
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
    "ModelInfo",
    "ModelSummarizer",
    "Pending",
    "Pin",
    "Plan",
    "Provider",
    "RecordSummary",
    "Regenerate",
    "RejectedResult",
    "RequestEncoder",
    "ResponseStarted",
    "RetentionPolicy",
    "RetentionStep",
    "Role",
    "SessionState",
    "Start",
    "StreamSink",
    "Streaming",
    "Submit",
    "SummaryPolicy",
    "Switch",
    "Timeout",
    "TokenEstimator",
    "Tool",
    "ToolDone",
    "ToolError",
    "ToolInvocation",
    "ToolResult",
    "ToolRound",
    "Turn",
    "TurnHandle",
    "TurnResult",
    "Unpin",
    "branch_turns",
    "branches_of",
    "build_messages",
    "decide",
    "ending_of",
    "erase_sessions",
    "evolve",
    "fork_events",
    "fork_seed",
    "forks_of",
    "initial_state",
    "is_in_flight",
    "open_hub",
    "plan",
    "plan_retention",
    "prompt_token_cap",
    "prune_store",
    "replay",
    "replay_resolved",
    "replay_sessions",
    "replay_stored",
    "request_messages",
    "seed_of",
    "sessions_of_subject",
    "subject_of",
    "summary_of",
    "with_forks",
]

_LAZY = {
    "Hub",
    "HubStatistics",
    "ModelSummarizer",
    "SummaryPolicy",
    "TurnHandle",
    "erase_sessions",
    "forks_of",
    "open_hub",
    "prune_store",
    "sessions_of_subject",
    "with_forks",
}


def __getattr__(name: str) -> _Any:
    if name not in _LAZY:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    from .. import runtime

    value = getattr(runtime, name)
    globals()[name] = value
    return value
