"""What a session actor gets from its hub: one immutable :class:`Runtime`.

The actor reads its store, provider, settings and budget from it, counts into
its :class:`Counters`, starts request tasks in its nursery and times its turns
with its :class:`~._timers.Timers`. It never sees
the hub itself: which actors exist and which are stopping is the hub's alone
(the actor reports its life through the :class:`Routing` the hub gives it).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping
from typing import Any, Generic, Protocol, TypeVar

import attrs
import trio

from ..events import EventStore
from ..sessions._messages import Start
from ..sessions._ports import AnswersAtOnce, ChatRequest, Completion, Provider
from ..sessions._projection import Budget, TokenEstimator
from ..sessions._tools import Tool
from ._timers import Timers
from ._window import WindowCache

#: The actor type a :class:`Routing` routes to. A type parameter rather than
#: an import of ``_actor``, which imports this module: no circle, even for types.
A = TypeVar("A")
A_contra = TypeVar("A_contra", contravariant=True)

__all__ = ["Config", "Counters", "Routing", "Runtime"]


def _positive_or_none(_: object, attribute: attrs.Attribute[Any], value: float | None) -> None:
    if value is not None and not value > 0:
        raise ValueError(f"{attribute.name} must be positive or None, got {value!r}")


@attrs.frozen(kw_only=True)
class Config:
    """The hub's settings, checked once when it opens."""

    start: Start
    max_request_bytes: int | None
    max_prompt_tokens: int | None
    token_estimator: TokenEstimator
    #: The context window (tokens) of new sessions; ``None``: ask the provider.
    context_window: int | None = attrs.field(default=None)
    #: Tokens of the window kept for the answer; ``None``: a default share.
    output_reserve: int | None = attrs.field(default=None)
    turn_deadline: float | None = attrs.field(validator=_positive_or_none)
    idle_timeout: float | None = attrs.field(validator=_positive_or_none)
    passivate_after: float | None = attrs.field(validator=_positive_or_none)
    mailbox_size: int = attrs.field(validator=attrs.validators.ge(1))
    shutdown_grace: float = attrs.field(validator=attrs.validators.gt(0))
    clock: Callable[[], float]
    #: A snapshot is written after this many events since the last one
    #: (``None``: never by count), or this many characters of committed text.
    snapshot_every: int | None = attrs.field(default=1000, validator=_positive_or_none)
    snapshot_chars: int | None = attrs.field(default=4_000_000, validator=_positive_or_none)
    #: The pinned items' own budget and a summary's cap (estimated tokens).
    max_pinned_tokens: int | None = attrs.field(default=None, validator=_positive_or_none)
    max_summary_tokens: int | None = attrs.field(default=None, validator=_positive_or_none)

    def __attrs_post_init__(self) -> None:
        window, reserve = self.context_window, self.output_reserve
        if window is not None and (type(window) is not int or window < 1):
            raise ValueError(f"context_window must be a positive integer or None, got {window!r}")
        if reserve is not None and (type(reserve) is not int or reserve < 0):
            raise ValueError(f"output_reserve must be an integer >= 0 or None, got {reserve!r}")
        if window is not None and reserve is not None and reserve >= window:
            raise ValueError(f"output_reserve ({reserve}) must be below context_window ({window})")


class Counters:
    """The hub's running counts (the source of :class:`HubStatistics`)."""

    __slots__ = (
        "actor_tasks",
        "actors_failed",
        "actors_passivated",
        "actors_started",
        "appends",
        "events",
        "messages",
        "request_tasks",
        "store_errors",
    )

    def __init__(self) -> None:
        #: Actor tasks alive (running, starting or stopping).
        self.actor_tasks = 0
        #: Requests running (including cancelled ones still unwinding).
        self.request_tasks = 0
        self.actors_started = 0
        self.actors_passivated = 0
        self.actors_failed = 0
        self.messages = 0
        self.appends = 0
        self.events = 0
        self.store_errors = 0


class Routing(Protocol[A_contra]):
    """How an actor tells its hub where it stands; the hub keeps the table."""

    def started(self, actor: A_contra) -> None:
        """The actor recovered its state: route its session to it."""
        ...

    def stopping(self, actor: A_contra) -> None:
        """The actor is stopping: route nothing more to it, and make
        whoever wants its session wait until :meth:`stopped`."""
        ...

    def stopped(self, actor: A_contra) -> None:
        """The actor has released its session; a new one may start."""
        ...


@attrs.frozen(kw_only=True, eq=False)
class Runtime(Generic[A]):
    """Everything a session actor needs from the hub that started it."""

    store: EventStore
    provider: Provider
    config: Config
    #: The request budget (``max_request_bytes``, measured with the provider's encoder).
    budget: Budget
    counters: Counters
    #: Where request tasks run (the hub's nursery).
    nursery: trio.Nursery
    routing: Routing[A]
    #: The deadline and idle timers of the turns in flight.
    timers: Timers
    #: Where snapshots of long sessions are kept (``None``: none are).
    snapshots: Any = None
    #: The scopes of snapshots being written: on close the hub gives them
    #: ``shutdown_grace`` seconds, then cancels them (losing one costs a
    #: longer replay, never an event).
    snapshot_scopes: set[trio.CancelScope] = attrs.field(factory=set)
    #: Tool functions by name: the hub's, and those given to open_session.
    tools: Mapping[str, Tool] = attrs.field(factory=dict)
    session_tools: dict[str, Mapping[str, Tool]] = attrs.field(factory=dict)

    #: When the store's size cap refuses an append: make room (the hub's
    #: retention, sparing the session named) and say whether any was made.
    make_room: Callable[[str], Awaitable[bool]] | None = None
    #: After a question this actor decided is submitted: ``(session id, the
    #: state after it, its TurnSubmitted)``, for the hub's summary policy.
    #: Must not block (it may only start a task of the hub's).
    on_submitted: Callable[[str, Any, Any], None] | None = None

    def tools_of(self, session_id: str) -> Mapping[str, Tool]:
        """The tool functions a session's calls run."""
        return self.session_tools.get(session_id, self.tools)

    #: What the provider said about each model's window.
    windows: WindowCache = attrs.field(factory=WindowCache)
    #: The provider's ``answer_now`` (:class:`AnswersAtOnce`), looked up once:
    #: the actor asks it before it hands a request to its request task.
    answer_now: Callable[[ChatRequest], Completion | None] | None = attrs.field(
        init=False,
        default=attrs.Factory(
            lambda self: (
                self.provider.answer_now if isinstance(self.provider, AnswersAtOnce) else None
            ),
            takes_self=True,
        ),
    )
