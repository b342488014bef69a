"""The session actor: the one place where messages, I/O and state meet.

One trio task per session owns its state. For every batch of mailbox
messages it runs the pure core, writes first and acts after::

    events = decide(state, message)        (for each message of the batch)
    store.append(events, expected_version=state.version)
    state  = evolve(state, events)         (only once the append returned)
    effects                                (start or cancel a request, tell callers)

Batching. A turn is several messages (Submit, ResponseStarted, Completed).
The actor takes whatever is queued when it wakes (its ``_mailbox.Mailbox``
hands over a whole batch at once), decides the messages one after another
against the provisional state, and appends all their events in one store
call. This is safe because effects run only after the append, in event
order, and only the final state matters for them: a turn submitted and
cancelled in one batch never goes out.

Timers. The deadline and the idle timeout of the turn in flight cost no
cancel scope and no task of their own: the actor waits for its mailbox
without a deadline, and the hub's one timer task (``_timers.Timers``, a heap
of the turns in flight) sends ``Timeout(request_id, "deadline" | "idle")``
into the mailbox when the turn expires, behind whatever was queued before.
If the mailbox is full at that moment, the actor reads the clock itself
before it waits again and takes the messages already queued, then the
Timeout. The idle clock restarts on ``started()`` and on every delta; the
provider's task only writes a timestamp, it never wakes the actor.

Requests run in the hub's nursery, in a request task of the actor's
(:class:`_Worker`) that parks between turns and is woken with the next
request, and never touch state: they send ``ResponseStarted`` /
``Completed`` / ``Failed`` with their request id and round. Tool tasks (one
per call of a round, run concurrently once ``ToolCallsRequested`` is
recorded) are the same: each sends its ``ToolDone``; the turn's end cancels
them all, and a result that comes anyway is recorded as ignored. While tools
run, the idle timer waits (a tool sends no deltas); the turn's deadline still
holds. Deltas go to the turn's tickets (previews), not to the mailbox, the
state or the log.

Store failures. A write the store refuses (a full disk, an I/O error) ends
the batch's turns as ``store_error`` rather than the actor: the state stays
that of the last event the store holds (read again, in case the write
landed after all), a question not written is rejected, and the turn in
flight is discarded, its discard written at once or, if the store refuses
that too, before anything else the session writes (``_unrecorded``), tried
again meanwhile at growing intervals. Only a session another process owns,
or a damaged log, stops the actor; its callers' ``SessionClosed`` names why.
"""

from __future__ import annotations

import contextlib
import json
import logging
import math
import sys
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Final, TypeAlias

import attrs
import structlog
import trio

from .._errors import (
    ConcurrencyConflict,
    InvalidCommand,
    ProviderError,
    SessionClosed,
    SessionOwnedElsewhere,
    StoreCapReached,
    StoreCorrupted,
    StoreError,
    describe_store_error,
)
from ..events import (
    DEFAULT_CODEC,
    DISCARD_REASONS,
    BranchStarted,
    BranchSwitched,
    CompletionIgnored,
    Event,
    PinAdded,
    PinRemoved,
    RequestId,
    SessionForked,
    SessionStarted,
    StoredEvent,
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
)
from ..sessions._machine import (
    Pending,
    SessionState,
    Streaming,
    current_request,
    decide,
    ending_of,
    evolve,
    initial_state,
    is_in_flight,
    request_messages,
)
from ..sessions._messages import (
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
from ..sessions._ports import ChatRequest, Completion
from ..sessions._results import (
    CommittedResult,
    DiscardedResult,
    RejectedResult,
    TurnResult,
    result_of,
)
from ..sessions._tools import Tool, ToolError, ToolInvocation, result_text
from ._context import Runtime
from ._log import bind_request_id, get_logger, is_enabled, message_fields, transition_fields
from ._mailbox import Mailbox
from ._snapshots import recover_state, write_snapshot
from ._tickets import Ticket

__all__ = ["EFFECTS", "KEEP_REQUEST_TASK", "Actor", "Item"]

_logger = get_logger()

#: Most messages handled in one batch (one store append).
MAX_BATCH: Final = 64
#: Conflicts tolerated in a row before the actor gives up (another writer is active).
MAX_CONFLICTS: Final = 5
#: How many ended turns the actor remembers (for the delay of late completions).
REMEMBER_ENDED: Final = 32
#: Seconds an actor stays idle before the hub's janitor lets its request task
#: go (about 2.1 KB; the next turn starts a new one, which costs microseconds).
KEEP_REQUEST_TASK: Final = 30.0
#: Seconds before an actor first tries again to record a ``store_error``
#: discard the store refused; each failure doubles the wait, up to RETRY_MAX.
RETRY_FIRST: Final = 0.25
RETRY_MAX: Final = 5.0


#: What a mailbox carries: a message, and the caller's ticket for a Submit.
Item: TypeAlias = tuple[Message, Ticket | None]

#: Messages that ask a question under a request id, with a caller's ticket
#: (an edit and a regenerate ask on a new branch).
_ASKS: Final = (Submit, Edit, Regenerate)
#: Messages a caller sends with a ticket: the asks and a switch.
#: Commands whose ticket is settled once recorded (no turn to report).
_SETTLED: Final = (Switch, RecordSummary, Pin, Unpin)
_COMMANDS: Final = (Submit, Edit, Regenerate, *_SETTLED)

#: An entry of :data:`EFFECTS`: ``(actor, message, event, state after the
#: step, now)``; the event is of the type the entry is keyed by.
_Effect: TypeAlias = Callable[["Actor", "Message | None", Any, "SessionState", float], None]


class _Flight:
    """The turn in flight that this actor owns; also the provider's StreamSink."""

    __slots__ = (
        "_log",
        "actor",
        "chars",
        "deadline",
        "ended",
        "last_activity",
        "missed",
        "request_id",
        "round",
        "running",
        "scope",
        "scopes",
        "tickets",
        "timed",
        "timed_out",
        "tools_running",
    )

    def __init__(self, actor: Actor, request_id: RequestId, deadline: float, now: float) -> None:
        self.actor = actor
        self.request_id = request_id
        self._log: Any = None
        self.tickets: Sequence[Ticket] = ()
        #: The cancel scopes of the turn's request and tool tasks still
        #: running: the first in a slot of its own (a turn without tools has
        #: one, the request task's), any more in a list.
        self.scope: trio.CancelScope | None = None
        self.scopes: list[trio.CancelScope] | None = None
        #: The round whose request is (or goes) out.
        self.round = 0
        #: Tool tasks of the round still running.
        self.tools_running = 0
        self.chars = 0
        self.deadline = deadline
        self.last_activity = now
        #: Its request task was started / has returned.
        self.running = False
        self.ended = False
        #: Its Timeout is on its way to the mailbox (or in the batch).
        self.timed_out = False
        #: The hub's timers know it (since its first request went out).
        self.timed = False
        #: Its timer found it expired but the mailbox full: the actor reads
        #: the clock itself before it waits again.
        self.missed = False

    def hold(self, scope: trio.CancelScope) -> None:
        """Cancel ``scope`` with the turn (at once if the turn already ended):
        the scope of one of the turn's tasks, which calls :meth:`close_scope`
        once its work for the turn is done."""
        if self.ended:
            scope.cancel()
        if self.scope is None:
            self.scope = scope
        elif self.scopes is None:
            self.scopes = [scope]
        else:
            self.scopes.append(scope)

    def close_scope(self, scope: trio.CancelScope) -> None:
        # A task that returned needs no cancel when the turn ends. (A plain
        # method rather than a generator context manager: this runs for
        # every request.)
        if self.scope is scope:
            self.scope = None
        elif self.scopes is not None and scope in self.scopes:
            self.scopes.remove(scope)

    @property
    def log(self) -> Any:
        """The session's logger bound to this request id (bound on first use)."""
        log = self._log
        if log is None:
            log = self._log = self.actor.logger.bind(request_id=self.request_id)
        return log

    # -- StreamSink --------------------------------------------------------

    async def started(self) -> None:
        """Report that the server accepted the request (one mailbox message)."""
        self.last_activity = trio.current_time()
        item: Item = (ResponseStarted(self.request_id, self.round), None)
        # report() without its coroutine while the mailbox has room (every turn).
        if not self.actor.offer(item):
            await self.actor.report_blocking(item)

    async def delta(self, text: str) -> None:
        """Hand ``text`` to the turn's previews.

        Never blocks and is not a checkpoint: a delta costs a list append per
        subscriber, so providers may call it for every tiny chunk.
        """
        if self.ended:
            return
        self.last_activity = trio.current_time()
        self.chars += len(text)
        for ticket in self.tickets:
            ticket.push(text)

    def end(self) -> None:
        """The turn ended: cancel every task of it that still runs, and let go
        of the callers' tickets. The timers' heap may keep this object until
        it is next compacted; what it no longer holds cannot grow old with it
        (objects that reach the oldest generation make the cyclic GC walk the
        whole heap sooner)."""
        self.ended = True
        if self.scope is not None:
            self.scope.cancel()
            self.scope = None
        if self.scopes is not None:
            for scope in self.scopes:
                scope.cancel()
            self.scopes = None
        self.tickets = ()

    # -- timers ------------------------------------------------------------

    def wake_at(self, idle: float | None) -> float:
        if idle is None or self.tools_running:
            return self.deadline
        return min(self.deadline, self.last_activity + idle)

    def expired(self, now: float, idle: float | None) -> str | None:
        if now >= self.deadline:
            return "deadline"
        if idle is not None and not self.tools_running and now >= self.last_activity + idle:
            return "idle"
        return None

    def fire(self, detail: str) -> None:
        """(Timed) The hub's timers found this turn expired: send its Timeout."""
        if self.ended or self.timed_out:
            return
        try:
            self.actor.mailbox.send_nowait((Timeout(self.request_id, detail), None))
        except trio.WouldBlock:
            # The actor is busy with a full mailbox; it looks at the clock
            # itself before it waits again.
            self.missed = True
            return
        except trio.BrokenResourceError:
            return
        self.timed_out = True


class _Worker:
    """The actor's request task, kept from one request to the next.

    A turn sends one request (more with tool rounds or a retry), and the next
    one is decided only after the last has returned its result. A task of
    its own for each would cost a task, a copy of the context and a cancel
    scope per request (about a tenth of a turn through the hub); the worker
    instead parks once its request has returned, and the actor wakes it with
    the next one (:meth:`give`).

    Cancellation: the worker runs inside one cancel scope for its whole life,
    which the turn whose request runs holds (``_Flight.hold``) until the
    request returns. The turn's end cancels it as it cancelled a task of the
    request's own: the request is interrupted where it waits, and the worker
    stops after it. A worker not parked when the next request comes (a
    cancelled request that has not returned yet, one that ignores
    cancellation, a result still waiting for room in the mailbox) is never
    waited for: the actor starts a new worker, and the old one stops once it
    returns (:meth:`Actor._work`). :meth:`stop` ends a parked worker when
    its actor stops, or has been idle for ``KEEP_REQUEST_TASK`` seconds.
    """

    __slots__ = ("flight", "parked", "request", "scope")

    def __init__(self, flight: _Flight, request: ChatRequest) -> None:
        self.scope = trio.CancelScope()
        #: The worker's task while it waits for its next request.
        self.parked: trio.lowlevel.Task | None = None
        #: The request to run next, and its turn.
        self.flight: _Flight | None = flight
        self.request: ChatRequest | None = request

    def give(self, flight: _Flight, request: ChatRequest) -> bool:
        """Wake the parked worker with ``request``; False if it is not parked."""
        task = self.parked
        if task is None:
            return False
        self.parked = None
        self.flight = flight
        self.request = request
        trio.lowlevel.reschedule(task)
        return True

    def __call__(self, _: object) -> trio.lowlevel.Abort:
        """Abort the parked wait (its abort function, without a closure):
        the worker was stopped, or the hub's nursery was cancelled."""
        self.parked = None
        return trio.lowlevel.Abort.SUCCEEDED

    def stop(self) -> None:
        """End the worker: at once if parked, else once its request returns."""
        self.scope.cancel()


@attrs.frozen(slots=True)
class Transition:
    """One event folded into a state: what the ``transition`` log line tells."""

    event: Event
    #: The phase before the event (the state class's name).
    before: str
    #: The state after the event.
    state: SessionState

    @property
    def after(self) -> str:
        return type(self.state).__name__

    @property
    def seq(self) -> int:
        return self.state.version


def _survivable(exc: StoreError) -> bool:
    """Whether the actor goes on after ``exc``: a write refused for want of
    space or I/O, or a stream that moved, is; a session another process
    owns, or a damaged log, stops it."""
    return not isinstance(exc, (SessionOwnedElsewhere, StoreCorrupted))


def _cancels(exc: BaseException) -> bool:
    """Whether ``exc`` is (or carries) trio's ``Cancelled``."""
    if isinstance(exc, BaseExceptionGroup):
        return exc.subgroup(trio.Cancelled) is not None
    return isinstance(exc, trio.Cancelled)


def transition(state: SessionState, event: Event) -> Transition:
    """Fold ``event`` into ``state`` (``evolve``), keeping what the log needs."""
    return Transition(event, type(state).__name__, evolve(state, event))


#: One decided message of a batch (the message is None for events read back
#: from the store): ``(message, ticket, events, state after them,
#: transitions)``. The transitions (each event with the states around it) are
#: kept only when the ``transition`` lines are logged, else ``()``. A plain
#: tuple: one is built for every message, and it is never changed after.
_Step: TypeAlias = tuple[
    "Message | None", "Ticket | None", Sequence[Event], SessionState, Sequence[Transition]
]


def _fold(
    state: SessionState,
    events: Sequence[Event],
    message: Message | None,
    ticket: Ticket | None,
    *,
    log: bool,
) -> _Step:
    """Fold ``events`` into ``state``; with ``log``, keep every transition."""
    if log:
        transitions = []
        for ev in events:
            step = transition(state, ev)
            transitions.append(step)
            state = step.state
        return (message, ticket, events, state, transitions)
    for ev in events:
        state = evolve(state, ev)
    return (message, ticket, events, state, ())


def _request_of(state: Pending | Streaming, request_id: RequestId) -> ChatRequest:
    """The request the session's state calls for (its current round)."""
    config = state.config
    assert config is not None
    return ChatRequest(
        request_id,
        config.model,
        tuple(request_messages(state)),
        config.tools,
        config.tool_choice,
        state.request.round,
    )


class Actor:
    """One session: its mailbox, its state, its turn in flight."""

    __slots__ = (
        "_batch",
        "_debug",
        "_declined",
        "_ended",
        "_erasing",
        "_flight",
        "_info",
        "_inline",
        "_log",
        "_received_at",
        "_retry_in",
        "_snap_busy",
        "_snap_chars",
        "_snap_turns",
        "_snap_version",
        "_start",
        "_stop",
        "_unrecorded",
        "_unsynced",
        "_waiting",
        "_worker",
        "idle_since",
        "mailbox",
        "rt",
        "senders",
        "session_id",
        "state",
    )

    def __init__(self, rt: Runtime[Actor], session_id: str, start: Start) -> None:
        self.rt = rt
        self.session_id = session_id
        self._start = start
        self.mailbox: Mailbox[Item] = Mailbox(rt.config.mailbox_size)
        #: Callers between looking this actor up and handing it a message.
        self.senders = 0
        self.state: SessionState = initial_state()
        self._flight: _Flight | None = None
        #: The task that runs this actor's requests, once one was sent.
        self._worker: _Worker | None = None
        #: The messages of a request the provider answered at once
        #: (:meth:`_answer_at_once`), for the next batch.
        self._inline: list[Item] | None = None
        #: A turn's first request the provider could not answer at once
        #: (:meth:`_answer_ahead`): the request task gets this very one.
        self._declined: ChatRequest | None = None
        #: Tickets of accepted Submits whose turn has not ended, by request id.
        self._waiting: dict[RequestId, list[Ticket]] = {}
        #: When recent turns ended (trio clock), to time late completions.
        self._ended: dict[RequestId, float] | None = None
        self._batch: Sequence[Item] = ()
        self._received_at = 0.0
        self._log = _logger.bind(session_id=session_id)
        # Whether the logger passes these levels (fixed once bound): when it
        # does not, the fields of the lines are not even built.
        self._debug = is_enabled(self._log, logging.DEBUG)
        self._info = is_enabled(self._log, logging.INFO)
        #: When the actor last came to rest (trio clock); None while in flight.
        self.idle_since: float | None = None
        self._stop = False
        #: Stopping because the session is being erased: nothing more is
        #: written, and the turn in flight ends as ``erased``.
        self._erasing = False
        #: The store may hold events this state has not seen (a cancelled
        #: append, a conflict): read before writing again.
        self._unsynced = False
        #: A turn whose callers were told ``store_error`` but whose discard
        #: the store refused too: ``(request_id, detail, preview_chars)``,
        #: recorded before anything else the session writes.
        self._unrecorded: tuple[RequestId, str, int] | None = None
        self._retry_in = RETRY_FIRST
        #: Snapshots: the version of the latest one, the committed turns and
        #: characters since, and whether one is being written.
        self._snap_version = 0
        self._snap_turns = 0
        self._snap_chars = 0
        self._snap_busy = False

    @property
    def logger(self) -> Any:
        """The session's logger (``session_id`` bound)."""
        return self._log

    @property
    def in_flight(self) -> bool:
        return self._flight is not None

    @property
    def busy(self) -> bool:
        """A turn in flight, or a batch being handled (a retention run must
        leave such a session alone: its actor may itself be waiting for room)."""
        return self._flight is not None or bool(self._batch)

    def request_stop(self) -> None:
        """Stop after the current batch (the hub is closing)."""
        self._stop = True
        self.poke()

    def request_erase(self) -> None:
        """Stop at once, writing nothing more: the session is being erased
        (its turn in flight, if any, ends as ``erased``)."""
        self._erasing = True
        self.request_stop()

    def retire_request_task(self) -> None:
        """Let the request task go (the session is idle): it stops where it
        waits for the next request, and the next turn starts a new one."""
        worker = self._worker
        if worker is not None and self._flight is None:
            self._worker = None
            worker.stop()

    def poke(self) -> None:
        """Wake the actor to look at its flags (the hub is closing, or it has
        been idle long enough) if it waits for its mailbox, or make it look
        before its next wait."""
        self.mailbox.poke()

    async def report(self, msg: Message) -> None:
        """Send a message from one of this actor's own tasks.

        Does not yield unless the mailbox is full, so a provider's
        ``started()`` and its result usually reach the actor in one batch
        (one store append).
        """
        item: Item = (msg, None)
        if not self.offer(item):
            await self.report_blocking(item)

    def offer(self, item: Item) -> bool:
        """:meth:`report` if the mailbox has room (False if it has none); not
        a checkpoint."""
        # If the actor has stopped, nobody is waiting for this any more.
        # (try/except rather than contextlib.suppress: this runs twice a turn.)
        try:
            self.mailbox.send_nowait(item)
        except trio.WouldBlock:
            return False
        except trio.BrokenResourceError:
            pass
        return True

    async def report_blocking(self, item: Item) -> None:
        """:meth:`report` once the mailbox was found full: wait for room."""
        with contextlib.suppress(trio.BrokenResourceError):
            await self.mailbox.send(item)

    # -- life --------------------------------------------------------------

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        rt = self.rt
        # The task inherited the context of whichever caller started it; its
        # log context must be the session's alone (and the process's node).
        node = structlog.contextvars.get_contextvars().get("node_id")
        structlog.contextvars.clear_contextvars()
        if node is None:
            structlog.contextvars.bind_contextvars(session_id=self.session_id)
        else:
            structlog.contextvars.bind_contextvars(node_id=node, session_id=self.session_id)
        rt.counters.actor_tasks += 1
        registered = acquired = False
        why = "hub_closed"
        error: Exception | None = None
        try:
            await rt.store.acquire(self.session_id)
            acquired = True
            await self._recover()
            rt.routing.started(self)
            registered = True
            rt.counters.actors_started += 1
            task_status.started()
            # It refers to start()'s temporary nursery; keeping it for the
            # actor's whole life would cost ~1 KB per idle session.
            del task_status
            self._log.debug("actor_started", version=self.state.version, phase=self._phase())
            why = await self._loop()
        except Exception as exc:
            if not registered:
                raise
            error, why = exc, "failed"
            rt.counters.actors_failed += 1
            self._log.error(
                "actor_failed",
                error=type(exc).__name__,
                detail=str(exc),
                version=self.state.version,
            )
        finally:
            try:
                with trio.CancelScope(shield=True) as scope:
                    scope.deadline = trio.current_time() + rt.config.shutdown_grace
                    await self._shutdown(why, error, registered=registered, acquired=acquired)
            finally:
                rt.counters.actor_tasks -= 1

    async def _recover(self) -> None:
        rt = self.rt
        self.state, self._snap_version = await recover_state(
            rt.store, self.session_id, rt.snapshots, self._log
        )
        self._snap_turns = len(self.state.turns)
        if self.state.config is None:
            rt = self.rt
            start = await rt.windows.start(rt.provider, self._start, rt.config, self._log)
            try:
                await self._handle([(start, None)], recovering=True)
            except InvalidCommand:
                # Another writer created the session between our read and our
                # append; the retry reloaded its SessionStarted, which stands.
                if self.state.config is None:
                    raise
        if is_in_flight(self.state):
            await self._handle([(Interrupt("recovered in flight"), None)], recovering=True)

    async def _loop(self) -> str:
        config = self.rt.config
        mailbox = self.mailbox
        idle = config.idle_timeout
        self.idle_since = trio.current_time()
        while True:
            if self._stop:
                return "erased" if self._erasing else "hub_closed"
            flight = self._flight
            # At rest, and in flight too, a plain wait: no cancel scope and
            # no timer. The hub's janitor pokes actors idle for too long; its
            # timers send a turn's Timeout into the mailbox when it expires,
            # and if they could not (a full mailbox), the clock is read here.
            detail = (
                flight.expired(trio.current_time(), idle)
                if flight is not None and flight.missed and not flight.timed_out
                else None
            )
            inline = self._inline
            if inline is not None:
                # A request answered at once: its messages come after those
                # already queued, as a request task's would, with no wait
                # (the store's append was the batch's checkpoint).
                self._inline = None
                batch = mailbox.receive_nowait(MAX_BATCH)
                batch += inline
                del inline
            elif self._unrecorded is not None and (flight is None or detail is None):
                batch = await self._receive_or_retry()
            elif flight is None or detail is None:
                batch = await mailbox.receive(MAX_BATCH)
            else:
                # Whatever is queued arrived before the timer fired.
                flight.timed_out = True
                batch = mailbox.receive_nowait(len(mailbox))
                batch.append((Timeout(flight.request_id, detail), None))
            if batch:
                done = await self._handle(batch)
                self.idle_since = done if self._flight is None else None
                # Waiting, the actor holds no message it has handled (the
                # last answer, say) for however long the session stays idle.
                del batch
            elif (
                self._flight is None
                and self._unrecorded is None  # (it would be closed as interrupted)
                and not self._stop
                and self.senders == 0
                and not len(mailbox)
                and self._idle_for() >= (config.passivate_after or math.inf)
            ):
                # Poked while idle. No await between this check and
                # _shutdown closing the mailbox: nobody can slip a message in.
                return "passivated"

    async def _shutdown(
        self, why: str, error: Exception | None, *, registered: bool, acquired: bool
    ) -> None:
        rt = self.rt
        sid = self.session_id
        queued: list[Item] = []
        if registered:
            # Synchronously: stop routing, take what is queued, refuse the
            # rest. Blocked and later senders get BrokenResourceError and
            # retry with a new actor, which waits until we are stopped.
            rt.routing.stopping(self)
            queued = self.mailbox.receive_nowait(sys.maxsize)
            if self._inline is not None:
                # A request answered at once counts as a queued result.
                queued += self._inline
        self._inline = None
        self.mailbox.close()
        interrupted, self._batch = self._batch, ()
        try:
            if registered and error is None and why != "erased":
                try:
                    if self._unsynced:
                        await self._reload()
                    # Submits of a batch whose append was cancelled: the store
                    # says whether they were recorded.
                    for msg, ticket in interrupted:
                        if isinstance(msg, _ASKS) and ticket is not None and not ticket.done:
                            self._adopt(msg.request_id, ticket)
                    # Results already queued still count; new questions do not.
                    rest: list[Item] = [
                        (m, None) for m, _ in queued if not isinstance(m, _COMMANDS)
                    ]
                    if rest:
                        await self._handle(rest)
                    if is_in_flight(self.state):
                        await self._handle([(Interrupt("hub closed"), None)])
                except Exception as exc:
                    error = exc
                    self._log.error(
                        "actor_failed",
                        error=type(exc).__name__,
                        detail=str(exc),
                        version=self.state.version,
                    )
            if acquired:
                try:
                    await rt.store.release(sid)
                except Exception as exc:
                    self._log.error("actor_failed", error=type(exc).__name__, detail=str(exc))
        finally:
            if error is None:
                gone = SessionClosed(f"session {sid!r} stopped ({why}) before the turn was decided")
            else:
                # The cause, named: another process took the session over
                # (SessionOwnedElsewhere, LeaseLost), a damaged log, ...
                gone = SessionClosed(
                    f"session {sid!r} stopped before the turn was decided: "
                    f"{type(error).__name__}: {error}"
                )
                gone.__cause__ = error
            if why == "erased":
                gone = SessionClosed(f"session {sid!r} was erased")
                self._end_erased()
            for _, ticket in (*interrupted, *queued):
                if ticket is not None and not ticket.done:
                    ticket.fail(gone)
            for tickets in self._waiting.values():
                for ticket in tickets:
                    ticket.fail(gone)
            self._waiting.clear()
            flight = self._flight
            if flight is not None:
                self._flight = None
                flight.end()
            worker = self._worker
            if worker is not None:
                self._worker = None
                worker.stop()
            if registered:
                if why == "passivated":
                    rt.counters.actors_passivated += 1
                self._log.debug("actor_stopped", why=why, version=self.state.version)
                rt.routing.stopped(self)

    def _end_erased(self) -> None:
        """The session is being erased: its turn in flight ends as
        ``erased`` for whoever waits for it (nothing is written: every
        event of the session is about to go)."""
        flight = self._flight
        for rid, tickets in self._waiting.items():
            preview = flight.chars if flight is not None and flight.request_id == rid else 0
            result = DiscardedResult(rid, "erased", "the session was erased", preview)
            for ticket in tickets:
                if not ticket.done:
                    ticket.resolve(result)
        self._waiting.clear()

    def _adopt(self, request_id: RequestId, ticket: Ticket) -> None:
        ending = ending_of(self.state, request_id)
        if ending is None:
            return  # never recorded; failed with SessionClosed below
        if ending.kind == "in_flight":
            self._waiting.setdefault(request_id, []).append(ticket)
        else:
            ticket.resolve(attrs.evolve(result_of(request_id, ending), repeated=False))

    # -- one batch ---------------------------------------------------------

    async def _handle(self, batch: Sequence[Item], *, recovering: bool = False) -> float:
        """Decide, record and act on ``batch``; returns when it was done (trio clock).

        A store that fails to write (:func:`_survivable`) ends the batch's
        turns with ``store_error`` instead (:meth:`_store_failed`), and the
        actor goes on; only while ``recovering`` (the actor is starting) is
        the error raised, to whoever addressed the session.
        """
        rt = self.rt
        rt.counters.messages += len(batch)
        self._batch = batch
        if self._info:
            # Only the late_completion line (info) tells it.
            self._received_at = trio.current_time()
        conflicted = False
        room_made = False
        for attempt in range(MAX_CONFLICTS + 1):
            decided: list[Event] | None = None
            try:
                if self._unsynced:
                    await self._reload()
                    if conflicted:
                        await self._discard_conflicted()
                if self._unrecorded is not None:
                    await self._close_unrecorded()
                steps, events, state = self._decide(batch, self.state, log=attempt == 0)
                if rt.answer_now is not None and events:
                    ahead = self._answer_ahead(rt.answer_now, state, events)
                    if ahead is not None:
                        more, events_more, state = self._decide(ahead, state, log=attempt == 0)
                        steps += more
                        events = events + events_more
                decided = events
                if events:
                    # The store's append awaited here rather than in a method
                    # of its own: one coroutine less per batch.
                    encoded = self._encode(events)
                    await rt.store.append(
                        self.session_id, encoded, expected_version=self.state.version
                    )
                    self._appended(len(events))
                    if rt.snapshots is not None:
                        self._snapshot_if_due(state, encoded[-1])
            except ConcurrencyConflict as exc:
                self._log.warning(
                    "append_conflict",
                    expected_version=exc.expected_version,
                    actual_version=exc.actual_version,
                    attempt=attempt + 1,
                )
                conflicted = True
                continue
            except StoreError as exc:
                if recovering or not _survivable(exc):
                    raise
                if isinstance(exc, StoreCapReached) and not room_made:
                    # The store's cap: the hub's retention may make room
                    # (erasing idle sessions, trimming old turns); once.
                    room_made = True
                    make_room = rt.make_room
                    if make_room is not None and await make_room(self.session_id):
                        continue
                await self._store_failed(batch, decided, exc)
                self._batch = ()
                return trio.current_time()
            self.state = state
            self._batch = ()
            now = trio.current_time()
            self._effects(steps, now)
            return now
        raise SessionOwnedElsewhere(
            self.session_id,
            f"{MAX_CONFLICTS + 1} conflicting appends in a row: another writer is active",
        )

    def _decide(
        self, batch: Sequence[Item], state: SessionState, *, log: bool
    ) -> tuple[list[_Step], list[Event], SessionState]:
        """Decide ``batch`` from ``state`` (the actor's, or the provisional
        state of the messages decided before in the same batch)."""
        budget = self.rt.budget
        flight = self._flight
        steps: list[_Step] = []
        events: list[Event] = []
        debug = log and self._debug
        info = self._info
        for msg, ticket in batch:
            if debug:
                self._msg_log().debug("message_received", **message_fields(msg, state))
            preview = (
                flight.chars
                if flight is not None and current_request(state) == flight.request_id
                else 0
            )
            try:
                decided = decide(state, msg, budget=budget, preview_chars=preview)
            except InvalidCommand as exc:
                # A branch command's bad input (an unknown turn or branch, a
                # switch while busy) is its caller's error, not the actor's.
                if ticket is None or not isinstance(msg, _COMMANDS):
                    raise
                ticket.fail(exc)
                continue
            if info:
                step = _fold(state, decided, msg, ticket, log=True)
                state = step[3]
                steps.append(step)
            else:
                # _fold(), inline: this runs for every message.
                for ev in decided:
                    state = evolve(state, ev)
                steps.append((msg, ticket, decided, state, ()))
            events += decided
        return steps, events, state

    def _encode(self, events: Sequence[Event]) -> list[StoredEvent]:
        """The stored envelopes of ``events``, to append after this state's
        version; from now on the store may hold what this state has not seen."""
        encode = DEFAULT_CODEC.encode
        sid = self.session_id
        seq = self.state.version
        now = self.rt.config.clock()
        stored = []
        # (A loop rather than a comprehension: in this Python a comprehension
        # is a function object and a frame more, for every batch.)
        for ev in events:
            seq += 1
            stored.append(encode(ev, session_id=sid, seq=seq, recorded_at=now))
        # A cancelled append wrote all or nothing: whoever goes on must re-read.
        self._unsynced = True
        return stored

    def _snapshot_if_due(self, state: SessionState, last: StoredEvent) -> None:
        """Start writing a snapshot of ``state`` (after ``last``) in the
        background if enough events or committed text came since the last
        one: the turn does not wait for it (the state is immutable, so it is
        encoded on a worker thread while the session goes on)."""
        turns = state.turns
        for t in turns[self._snap_turns :]:
            self._snap_chars += len(t.question) + len(t.answer)
        self._snap_turns = len(turns)
        config = self.rt.config
        every, chars = config.snapshot_every, config.snapshot_chars
        due = (every is not None and state.version - self._snap_version >= every) or (
            chars is not None and self._snap_chars >= chars
        )
        if not due or self._snap_busy:
            return
        self._snap_busy = True
        self._snap_version = state.version
        self._snap_chars = 0
        self.rt.nursery.start_soon(self._write_snapshot, state, last.tag, last.recorded_at)

    async def _write_snapshot(self, state: SessionState, tag: str, at: float) -> None:
        scopes = self.rt.snapshot_scopes
        with trio.CancelScope() as scope:
            scopes.add(scope)
            try:
                await write_snapshot(self.rt.snapshots, self.session_id, state, tag, at, self._log)
            finally:
                scopes.discard(scope)
                self._snap_busy = False

    def _appended(self, count: int) -> None:
        self._unsynced = False
        counters = self.rt.counters
        counters.appends += 1
        counters.events += count

    async def _reload(self) -> None:
        """Catch up with the store: fold and act on the events this state has not seen."""
        events = await self.rt.store.read_decoded(
            self.session_id, DEFAULT_CODEC, after=self.state.version
        )
        step = _fold(self.state, events, None, None, log=self._info)
        self.state = step[3]
        self._unsynced = False
        if events:
            self._effects([step], trio.current_time())

    async def _discard_conflicted(self) -> None:
        # Our turn is still in flight, but the stream moved under it: this
        # writer can no longer vouch for its outcome. No message of the core
        # stands for this (it comes from neither the caller, the provider nor
        # the timer), so the actor states the fact; evolve still checks it.
        flight = self._flight
        if flight is None or current_request(self.state) != flight.request_id:
            return
        await self._record_discard(
            TurnDiscarded(
                flight.request_id,
                "conflict",
                f"the stream moved under the turn (now at version {self.state.version})",
                flight.chars,
            )
        )

    async def _record_discard(self, ev: TurnDiscarded) -> None:
        # A discard the actor states itself (evolve still checks it): write,
        # fold, act, as for a batch.
        step = _fold(self.state, (ev,), None, None, log=self._info)
        await self.rt.store.append(
            self.session_id, self._encode((ev,)), expected_version=self.state.version
        )
        self._appended(1)
        self.state = step[3]
        self._effects([step], trio.current_time())

    # -- a store that fails --------------------------------------------------

    async def _store_failed(
        self, batch: Sequence[Item], decided: Sequence[Event] | None, exc: StoreError
    ) -> None:
        """The store refused to write (a full disk, an I/O error, a failed
        fsync, a lost connection): tell the batch's callers ``store_error``
        and go on, with the state of the last event the store holds.

        The store is read again first: a write whose answer was lost may have
        landed, and what it holds is what happened. A question it does not
        hold is rejected (``store_error``; nothing was written, so its
        request id stays unused). The turn in flight is discarded
        (``store_error``) if the refused write was about it (``decided``:
        the batch's events; ``None``, not decided, counts as about it) or if
        the store holds a turn in flight that this actor does not run.
        """
        detail = describe_store_error(exc)
        self.rt.counters.store_errors += 1
        self._log.error(
            "store_error", error=type(exc).__name__, detail=str(exc), version=self.state.version
        )
        if self._unsynced:
            try:
                await self._reload()
            except StoreError as again:
                if not _survivable(again):
                    raise
        state = self.state
        for msg, ticket in batch:
            if ticket is not None and isinstance(msg, _SETTLED):
                # Recorded (a write whose answer was lost) or not.
                if _recorded(state, msg):
                    ticket.settle()
                else:
                    ticket.fail(exc)
            if ticket is None or ticket.done or not isinstance(msg, _ASKS):
                continue
            rid = msg.request_id
            ending = ending_of(state, rid)
            if ending is None:
                # The store's own cap, with no room to be made: the session
                # cannot fit (``limit``); anything else is ``store_error``.
                reason = "limit" if isinstance(exc, StoreCapReached) else "store_error"
                ticket.resolve(RejectedResult(rid, reason, detail))
            elif ending.kind == "in_flight":
                self._wait_for(rid, ticket)  # resolved with its turn, below or later
            else:
                ticket.resolve(result_of(rid, ending))
        current = current_request(state)
        if current is None:
            return
        flight = self._flight
        if (
            flight is None
            or flight.request_id != current
            or decided is None
            or any(getattr(ev, "request_id", None) == current for ev in decided)
        ):
            await self._end_with_store_error(current, detail)

    async def _end_with_store_error(self, request_id: RequestId, detail: str) -> None:
        flight = self._flight
        preview = flight.chars if flight is not None and flight.request_id == request_id else 0
        pending = self._unrecorded
        if pending is None or pending[0] != request_id:
            # (Already pending, it keeps what its callers were told first.)
            self._unrecorded = pending = (request_id, detail, preview)
        try:
            await self._close_unrecorded()
        except StoreError as exc:
            if not _survivable(exc):
                raise
            # The store takes not even the discard: its callers learn it
            # now, and it is written before the session's next events.
            self._retry_in = RETRY_FIRST
            rid, detail, preview = pending
            result = DiscardedResult(rid, "store_error", detail, preview)
            self._turn_ended(rid, result, trio.current_time())

    async def _close_unrecorded(self) -> None:
        """Record the ``store_error`` discard of :attr:`_unrecorded`, if the
        store still holds that turn in flight (the way recovery closes a
        turn left in flight, with the reason its callers were given)."""
        pending = self._unrecorded
        assert pending is not None
        if self._unsynced:
            await self._reload()
        rid, detail, preview = pending
        if current_request(self.state) == rid:
            await self._record_discard(TurnDiscarded(rid, "store_error", detail, preview))
        self._unrecorded = None

    async def _receive_or_retry(self) -> list[Item]:
        """Wait for messages, and meanwhile (at growing intervals) try to
        record the pending ``store_error`` discard: the log catches up once
        the store takes writes again, messages or not.

        Cancellation: nothing was taken from the mailbox.
        """
        with trio.move_on_after(self._retry_in):
            return await self.mailbox.receive(MAX_BATCH)
        try:
            await self._close_unrecorded()
        except StoreError as exc:
            if not _survivable(exc):
                raise
            self._retry_in = min(self._retry_in * 2, RETRY_MAX)
        return []

    # -- effects -----------------------------------------------------------

    def _effects(self, steps: Sequence[_Step], now: float) -> None:
        """Act on the steps of a batch once recorded; ``now`` is the trio clock.

        What each event asks of the actor is looked up in :data:`EFFECTS`
        by the event's exact type (events are never subclassed: the codec
        could not have written one), as the machine looks its transitions up.
        """
        # (A local: the table is looked up once a batch, not once an event.)
        effects = EFFECTS
        for msg, ticket, events, after, logged in steps:
            if ticket is not None and isinstance(msg, _ASKS):
                self._wait_for(msg.request_id, ticket)
            for i, ev in enumerate(events):
                if logged:
                    t = logged[i]
                    self._msg_log().info(
                        "transition",
                        seq=t.seq,
                        **{"from": t.before, "to": t.after},
                        **transition_fields(ev),
                    )
                effect = effects[type(ev)]
                # (None: nothing to do, and no call made for it: StreamStarted
                # is one of these, and every streamed turn records one.)
                if effect is not None:
                    effect(self, msg, ev, after, now)
            if ticket is not None and isinstance(msg, _SETTLED):
                ticket.settle()  # recorded (or nothing to record: already so)
            if not events and ticket is not None and isinstance(msg, _ASKS):
                # A request id seen before: a client retry, never recorded twice.
                ending = ending_of(after, msg.request_id)
                if ending is not None and ending.kind != "in_flight":
                    self._resolve(msg.request_id, result_of(msg.request_id, ending))
        self._send_if_due()

    def _send_if_due(self) -> None:
        """Hand the request of the turn in flight to the request task, if the
        recorded events call for one (a new turn, a tool round, a retry)."""
        rt = self.rt
        flight = self._flight
        state = self.state
        declined, self._declined = self._declined, None
        if flight is not None and not flight.running and isinstance(state, (Pending, Streaming)):
            round_ = state.request.round
            flight.running = True
            if not flight.timed:
                flight.timed = True
                rt.timers.add(flight)
            answer_now = rt.answer_now
            if (
                declined is not None
                and declined.request_id == flight.request_id
                and declined.round == round_
            ):
                # Asked before its question was written, and not answered:
                # the request task sends it (asked once, not twice).
                request = declined
            else:
                request = _request_of(state, flight.request_id)
                if answer_now is not None:
                    inline = self._answer_at_once(answer_now, request)
                    if inline is not None:
                        self._inline = inline
                        return
            worker = self._worker
            if worker is None or not worker.give(flight, request):
                worker = self._worker = _Worker(flight, request)
                rt.nursery.start_soon(self._work, worker, name="turnledger.request")

    def _answer_ahead(
        self,
        answer_now: Callable[[ChatRequest], Completion | None],
        state: SessionState,
        events: Sequence[Event],
    ) -> list[Item] | None:
        """The answer at once of the turn this batch submits, to decide and
        append with its question (one append, one batch per turn).

        Only a turn's first request, asked while its question is not yet
        written: ``answer_now`` has no effect outside the provider (the
        port says so), so an answer whose question the store then refuses
        is one nobody saw. Retries and tool rounds go out after the append
        (:meth:`_send_if_due`). ``None``: no such turn, or no answer at once
        (the request task then sends this very request).
        """
        last = events[-1]
        if type(last) is not TurnSubmitted or not isinstance(state, Pending):
            return None
        rid = last.request_id
        if state.request.request_id != rid or state.request.round != 0:
            return None
        request = _request_of(state, rid)
        items = self._answer_at_once(answer_now, request)
        if items is None:
            self._declined = request
        return items

    def _answer_at_once(
        self,
        answer_now: Callable[[ChatRequest], Completion | None],
        request: ChatRequest,
    ) -> list[Item] | None:
        """Ask the provider to answer ``request`` at once (:class:`AnswersAtOnce`).

        Returns the messages its request task would have sent (the stream
        began, then the result), or ``None``: the request goes to the
        request task. Why: a turn through the request task costs the
        worker's wake-up, its two reports, a second wake-up of the actor
        and a second append; an answer that needs no wait costs none of them.
        """
        rid = request.request_id
        try:
            completion = answer_now(request)
        except ProviderError as exc:
            reason = exc.reason if exc.reason in DISCARD_REASONS else "provider_error"
            return [(Failed(rid, Failure(reason, str(exc)), request.round), None)]
        except Exception as exc:
            # As from complete(): a provider bug ends the turn, not the hub,
            # and only the type of its message is kept.
            self._log.error("request_error", request_id=rid, error=type(exc).__name__)
            failure = Failure("provider_error", type(exc).__name__)
            return [(Failed(rid, failure, request.round), None)]
        if completion is None:
            return None
        return [
            (ResponseStarted(rid, request.round), None),
            (
                Completed(
                    rid,
                    completion.answer,
                    completion.finish_reason,
                    completion.usage,
                    request.round,
                    completion.tool_calls,
                ),
                None,
            ),
        ]

    # Each effect below takes ``(message, event, state after the step, now)``:
    # the message the event was decided from (None when it was read back from
    # the store or stated by the actor), and the trio clock.

    def _on_submitted(
        self, msg: Message | None, ev: TurnSubmitted, after: SessionState, now: float
    ) -> None:
        # Only a turn this actor decided goes out from here (one read back
        # from the store belongs to whoever wrote it).
        if isinstance(msg, _ASKS) and msg.request_id == ev.request_id:
            cfg = self.rt.config
            deadline = now + cfg.turn_deadline if cfg.turn_deadline is not None else math.inf
            flight = self._flight = _Flight(self, ev.request_id, deadline, now)
            flight.tickets = self._waiting.get(ev.request_id, [])
            hook = self.rt.on_submitted
            if hook is not None:
                hook(self.session_id, after, ev)  # starts a summary, never waits for one
            # Timed once its request goes out (_send_if_due), in this same
            # step: a turn answered at once with its question never is, and
            # the timers' heap does not keep it alive after it ended.

    def _on_tools_requested(
        self, msg: Message | None, ev: ToolCallsRequested, after: SessionState, now: float
    ) -> None:
        flight = self._flight
        if flight is not None and flight.request_id == ev.request_id:
            flight.running = False
            self._start_tools(flight, ev.calls)

    def _on_round_submitted(
        self, msg: Message | None, ev: ToolRoundSubmitted, after: SessionState, now: float
    ) -> None:
        flight = self._flight
        if flight is not None and flight.request_id == ev.request_id:
            flight.round = ev.round
            flight.last_activity = now
            self.rt.timers.add(flight)  # the idle clock runs again

    def _on_retried(
        self, msg: Message | None, ev: TurnRetried, after: SessionState, now: float
    ) -> None:
        flight = self._flight
        if flight is not None and flight.request_id == ev.request_id:
            # The same turn goes out again, with the smaller projection: a
            # new request task (in a scope of its own).
            flight.running = False

    def _on_committed(
        self, msg: Message | None, ev: TurnCommitted, after: SessionState, now: float
    ) -> None:
        result = CommittedResult(ev.request_id, ev.answer, ev.finish_reason, ev.usage)
        self._turn_ended(ev.request_id, result, now)

    def _on_discarded(
        self, msg: Message | None, ev: TurnDiscarded, after: SessionState, now: float
    ) -> None:
        result = DiscardedResult(ev.request_id, ev.reason, ev.detail, ev.preview_chars)
        self._turn_ended(ev.request_id, result, now)

    def _on_rejected(
        self, msg: Message | None, ev: TurnRejected, after: SessionState, now: float
    ) -> None:
        self._resolve(ev.request_id, RejectedResult(ev.request_id, ev.reason, ev.detail))

    def _on_ignored(
        self, msg: Message | None, ev: CompletionIgnored, after: SessionState, now: float
    ) -> None:
        ended = self._ended.get(ev.request_id) if self._ended else None
        self._msg_log().info(
            "late_completion",
            request_id=ev.request_id,
            outcome=ev.outcome,
            delay_s=None if ended is None else max(self._received_at - ended, 0.0),
            in_flight=current_request(after),
        )

    def _start_tools(self, flight: _Flight, calls: Sequence[ToolCall]) -> None:
        tools = self.rt.tools_of(self.session_id)
        for call in calls:
            flight.tools_running += 1
            self.rt.nursery.start_soon(
                self._tool, flight, call, tools.get(call.name), name="turnledger.tool"
            )

    def _wait_for(self, request_id: RequestId, ticket: Ticket) -> None:
        """Give ``ticket`` the result of ``request_id`` in flight, when it ends."""
        known = self._waiting.get(request_id)
        if known is None:
            self._waiting[request_id] = [ticket]
        else:
            # A retry while the turn is in flight: same preview so far.
            ticket.chunks.extend(known[0].chunks)
            known.append(ticket)

    def _resolve(self, request_id: RequestId, result: TurnResult) -> None:
        for ticket in self._waiting.pop(request_id, ()):
            ticket.resolve(result)

    def _turn_ended(self, request_id: RequestId, result: TurnResult, now: float) -> None:
        self._resolve(request_id, result)
        flight = self._flight
        if flight is not None and flight.request_id == request_id:
            self._flight = None
            flight.end()
        ended = self._ended
        if ended is None:
            ended = self._ended = {}
        elif len(ended) >= REMEMBER_ENDED:
            del ended[next(iter(ended))]
        ended[request_id] = now

    # -- the request task --------------------------------------------------

    async def _work(self, worker: _Worker) -> None:
        """The worker's task: run the request it was started with, then each
        request it is given (:meth:`_Worker.give`)."""
        with worker.scope:
            while True:
                flight, request = worker.flight, worker.request
                assert flight is not None and request is not None
                worker.flight = worker.request = None
                await self._request(flight, request, worker.scope)
                # Parked, it holds neither its last turn nor that request's messages.
                del flight, request
                if self._worker is not worker:
                    return  # replaced while its request ran
                # Parked here rather than in a method of the worker's: one
                # coroutine less per request.
                worker.parked = trio.lowlevel.current_task()
                await trio.lowlevel.wait_task_rescheduled(worker)

    async def _request(
        self, flight: _Flight, request: ChatRequest, scope: trio.CancelScope
    ) -> None:
        """Run one request inside ``scope`` (the worker's, entered), which
        the turn cancels when it ends."""
        rt = self.rt
        rid = flight.request_id
        bind_request_id(rid)
        rt.counters.request_tasks += 1
        flight.hold(scope)
        try:
            msg: Message
            try:
                completion = await rt.provider.complete(request, flight)
            except ProviderError as exc:
                # Typed as a discard reason; a third-party provider may
                # still set anything at run time.
                reason = exc.reason if exc.reason in DISCARD_REASONS else "provider_error"
                msg = Failed(rid, Failure(reason, str(exc)), request.round)
            except Exception as exc:
                # A provider bug must not take the hub down. Its message
                # may hold anything, so only the type is kept.
                flight.log.error("request_error", error=type(exc).__name__)
                msg = Failed(rid, Failure("provider_error", type(exc).__name__), request.round)
            else:
                msg = Completed(
                    rid,
                    completion.answer,
                    completion.finish_reason,
                    completion.usage,
                    request.round,
                    completion.tool_calls,
                )
            # A result the provider did return is reported even if the
            # turn was discarded meanwhile (a provider that cannot be
            # interrupted, such as a blocking SDK in a worker thread):
            # report() does not yield when the mailbox has room, so the
            # late result is recorded as CompletionIgnored. (report()
            # without its coroutine while there is room: every turn.)
            item: Item = (msg, None)
            if not self.offer(item):
                await self.report_blocking(item)
        finally:
            flight.close_scope(scope)
            rt.counters.request_tasks -= 1

    # -- tool tasks --------------------------------------------------------

    async def _tool(self, flight: _Flight, call: ToolCall, tool: Tool | None) -> None:
        rid = flight.request_id
        bind_request_id(rid)
        started = trio.current_time()
        scope = trio.CancelScope()
        flight.hold(scope)
        try:
            with scope:
                content, is_error = await self._run_tool(flight, call, tool)
                ms = round((trio.current_time() - started) * 1000)
                flight.log.info(
                    "tool_call",
                    tool=call.name,
                    call_id=call.call_id,
                    ok=not is_error,
                    result_bytes=len(content.encode("utf-8", "replace")),
                    duration_ms=ms,
                )
                # As for a provider's result: reported even if the turn ended
                # meanwhile (a tool that shields itself), then ignored.
                await self.report(ToolDone(rid, call.call_id, content, is_error, ms))
        finally:
            flight.close_scope(scope)
            flight.tools_running -= 1

    async def _run_tool(
        self, flight: _Flight, call: ToolCall, tool: Tool | None
    ) -> tuple[str, bool]:
        if tool is None:
            return "the tool is not available", True
        invocation = ToolInvocation(
            flight.request_id, call.call_id, call.name, json.loads(call.arguments)
        )
        try:
            return result_text(await tool.run(invocation)), False
        except ToolError as exc:
            return str(exc) or "the tool failed", True
        except BaseException as exc:
            # Whatever a tool raises ends its call, not the hub: SystemExit
            # and KeyboardInterrupt too (a tool's sys.exit() must not stop a
            # service). Only trio's own cancellation goes on up: it is how
            # the turn's end stops its tools.
            if _cancels(exc):
                raise
            # Its message may hold anything: the model and the log get the type.
            flight.log.warning("tool_error", tool=call.name, error=type(exc).__name__)
            return f"the tool failed ({type(exc).__name__})", True

    # -- helpers -----------------------------------------------------------

    def _msg_log(self) -> Any:
        flight = self._flight
        return flight.log if flight is not None else self._log

    def _idle_for(self) -> float:
        since = self.idle_since
        return 0.0 if since is None else trio.current_time() - since

    def _phase(self) -> str:
        return type(self.state).__name__


#: What the actor does once an event is recorded, by the event's exact type
#: (:meth:`Actor._effects`), like the machine's own tables: every event type
#: the machine can emit has an entry, ``None`` where the recorded state is
#: all there is to it (the session starting, a stream starting, a tool result,
#: whose tool task already ended). tests/sessions/test_effects_table.py checks
#: that no event type is missing.
EFFECTS: Final[Mapping[type[Event], _Effect | None]] = {
    SessionStarted: None,
    TurnSubmitted: Actor._on_submitted,
    TurnRetried: Actor._on_retried,
    TurnRejected: Actor._on_rejected,
    StreamStarted: None,
    TurnCommitted: Actor._on_committed,
    TurnDiscarded: Actor._on_discarded,
    CompletionIgnored: Actor._on_ignored,
    ToolCallsRequested: Actor._on_tools_requested,
    ToolResultRecorded: None,
    ToolRoundSubmitted: Actor._on_round_submitted,
    # The recorded state is all there is to a branch starting (its question's
    # TurnSubmitted follows) or switched (its caller's ticket is settled).
    BranchStarted: None,
    BranchSwitched: None,
    # A fork's second event is written by the hub before any actor runs.
    SessionForked: None,
    # Summaries and pins change what later requests carry, nothing now (a
    # request's SummarySent is read when it is built).
    SummaryRecorded: None,
    SummarySent: None,
    PinAdded: None,
    PinRemoved: None,
}


def _recorded(state: SessionState, msg: Switch | RecordSummary | Pin | Unpin) -> bool:
    """Whether ``state`` shows the settled command ``msg`` as done."""
    if isinstance(msg, Switch):
        return state.active_branch == msg.branch
    if isinstance(msg, RecordSummary):
        return any(x.request_id == msg.request_id for x in state.summaries)
    pinned = any(p.pin_id == msg.pin_id for p in state.pins)
    return pinned if isinstance(msg, Pin) else not pinned
