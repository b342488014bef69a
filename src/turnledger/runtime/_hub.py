"""The hub: starts, routes to and stops session actors.

``open_hub(store, provider, model=...)`` owns a nursery. Each session that
is addressed gets one actor task, recovered by replay from the store; idle
actors are passivated and come back by replay when addressed again. Leaving
the context closes every actor: turns still in flight are discarded as
``interrupted`` (written to the store when it can be) and nothing keeps
running.

Per-session settings: the hub's ``system``/``model``/``policy``/``on_busy``
and tools are the defaults for sessions it creates; :meth:`Hub.open_session` creates a
session with other settings. Either way they are fixed in ``SessionStarted``
when the session is first created, and stay what the log says afterwards.
"""

from __future__ import annotations

import contextlib
import math
import os
import time
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from contextlib import asynccontextmanager
from typing import final

import attrs
import trio

from .._errors import (
    ConcurrencyConflict,
    InvalidCommand,
    SessionClosed,
    SessionExists,
    SessionOwnedElsewhere,
    StoreCapReached,
    StoreError,
    SummaryFailed,
    UnknownSession,
    describe_store_error,
)
from .._loops import require_trio
from ..events import (
    DEFAULT_CODEC,
    BranchId,
    Erasure,
    Event,
    EventStore,
    HistoryPolicy,
    Ledger,
    OnBusy,
    PinAdded,
    RequestId,
    SessionForked,
    SummaryRecorded,
    ToolErrorPolicy,
    TurnSubmitted,
)
from ..sessions._branches import BranchInfo
from ..sessions._forks import fork_events
from ..sessions._history import Turn
from ..sessions._machine import SessionState, branch_turns, branches_of, decide
from ..sessions._messages import (
    Cancel,
    Edit,
    Pin,
    RecordSummary,
    Regenerate,
    Start,
    Submit,
    Switch,
    Unpin,
)
from ..sessions._ports import Provider
from ..sessions._projection import Budget, CharTokenEstimator, TokenEstimator
from ..sessions._results import RejectedResult, TurnResult
from ..sessions._retention import RetentionPolicy, RetentionStep, plan_retention
from ..sessions._snapshot import SnapshotStore
from ..sessions._tools import Tool
from ._actor import KEEP_REQUEST_TASK, Actor, Item
from ._context import Config, Counters, Runtime
from ._lifecycle import (
    apply_step,
    erase_all,
    forks_of,
    log_step,
    plan_store,
    sessions_of_subject,
)
from ._log import get_logger
from ._snapshots import recover_state
from ._summaries import (
    ModelSummarizer,
    Summarizer,
    SummaryPolicy,
    policy_range,
    run_summarizer,
)
from ._tickets import Ticket
from ._timers import Timers

__all__ = ["Hub", "HubStatistics", "TurnHandle", "open_hub"]


@attrs.frozen
class HubStatistics:
    """A snapshot of the hub's runtime (like trio's ``statistics()`` objects)."""

    #: Actor tasks alive (running, starting or stopping).
    actors: int
    #: Requests running (including cancelled ones still unwinding); a
    #: session's request task parks between its requests and is not counted.
    requests: int
    #: Sessions with a turn in flight.
    in_flight: int
    #: Actors started since the hub opened (each start replays the log).
    actors_started: int
    #: Actors stopped after ``passivate_after`` seconds idle.
    actors_passivated: int
    #: Actors stopped by an error (another process took the session over,
    #: a damaged log).
    actors_failed: int
    #: Mailbox messages handled.
    messages: int
    #: Store appends (one per batch of messages that caused events).
    appends: int
    #: Events appended.
    events: int
    #: Writes the store refused (a full disk, an I/O error) whose turns
    #: ended as ``store_error``; the actors went on.
    store_errors: int = 0


# Request ids are drawn _IDS at a time: one os.urandom call for all of
# them (a system call per Submit cost more than the rest of the id), their
# version and variant bits set with one mask over the whole draw.
_IDS = 128
_ID_BITS = 128 * _IDS
_ID_FIXED = sum((0xF0 << 72 | 0xC0 << 56) << (128 * k) for k in range(_IDS))
_ID_SET = sum((0x40 << 72 | 0x80 << 56) << (128 * k) for k in range(_IDS))
_ID_KEEP = ((1 << _ID_BITS) - 1) ^ _ID_FIXED
_ids: list[str] = []
if hasattr(os, "register_at_fork"):
    # A forked process draws its own: none of the ids its parent drew.
    os.register_at_fork(after_in_child=_ids.clear)


def _draw_ids() -> list[str]:
    n = int.from_bytes(os.urandom(_ID_BITS // 8), "big") & _ID_KEEP | _ID_SET
    h = n.to_bytes(_ID_BITS // 8, "big").hex()
    return [h[i : i + 32] for i in range(0, len(h), 32)]


def uuid4_hex() -> str:
    """``uuid.uuid4().hex``: random 128 bits (from ``os.urandom``) with the
    version (4) and variant (RFC 4122) bits set, without building a ``UUID``;
    one is drawn for every Submit without a request id."""
    while True:
        try:
            return _ids.pop()
        except IndexError:  # none left (or another thread took the last)
            _ids.extend(_draw_ids())


def _new_request_id(request_id: str | None) -> RequestId:
    if request_id is not None:
        _check_id("request id", request_id)
    return RequestId(uuid4_hex() if request_id is None else request_id)


def _check_id(what: str, value: object) -> None:
    # Ids go into every event and log line: plain, non-empty UTF-8 text.
    if not isinstance(value, str) or not value:
        raise InvalidCommand(f"a {what} must be a non-empty string")
    if value.isascii():
        return  # UTF-8 as it is, without encoding it
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        raise InvalidCommand(f"a {what} must be valid Unicode text") from None


class _Routes:
    """Which actors exist, which are starting and which are stopping.

    The hub's alone: actors report their life through its :class:`Routing`
    methods, and only these methods and the hub change the table.
    """

    __slots__ = ("actors", "closed", "ending", "erasing", "starting")

    def __init__(self) -> None:
        self.actors: dict[str, Actor] = {}
        self.starting: dict[str, trio.Event] = {}
        self.ending: dict[str, trio.Event] = {}
        #: Sessions being erased or trimmed: no actor starts for them until done.
        self.erasing: dict[str, trio.Event] = {}
        self.closed = False

    def started(self, actor: Actor) -> None:
        self.actors[actor.session_id] = actor
        if self.closed:
            # It started while the hub was closing: it stops at once.
            actor.request_stop()

    def stopping(self, actor: Actor) -> None:
        sid = actor.session_id
        if self.actors.get(sid) is actor:
            del self.actors[sid]
        # (An erasure may have made it already, to wait for this actor.)
        self.ending.setdefault(sid, trio.Event())

    def stopped(self, actor: Actor) -> None:
        self.ending.pop(actor.session_id).set()


class _WarningsOnly:
    """The log of a window asked for a session not yet created: the
    provider's fallback warning is said (once per model, whoever asks
    first), the ``context_window`` line is left to the session that records
    the window."""

    def __init__(self) -> None:
        self._log = get_logger()

    def info(self, event: str, **fields: object) -> None:
        pass

    def warning(self, event: str, **fields: object) -> None:
        self._log.warning(event, **fields)


_window_log = _WarningsOnly()


@final
class TurnHandle:
    """One submitted question, as the caller holds it.

    Several handles may stand for the same turn (a Submit repeated with the
    same request id); they share its preview and its result.
    """

    __slots__ = ("_hub", "_ticket", "request_id", "session_id")

    def __init__(self, hub: Hub, session_id: str, request_id: RequestId, ticket: Ticket) -> None:
        #: The session the question went to.
        self.session_id = session_id
        #: The request id (given by the caller, or a fresh uuid4 hex).
        self.request_id = request_id
        self._hub = hub
        self._ticket = ticket

    def __repr__(self) -> str:
        return f"<TurnHandle {self.session_id!r} {self.request_id!r}>"

    @property
    def done(self) -> bool:
        """True once the turn has a result (or can no longer get one)."""
        return self._ticket.done

    async def preview(self) -> AsyncIterator[str]:
        """The answer's text as it streams, from the first delta, until the turn ends.

        Preview text is never history: check :meth:`outcome`. Every call
        iterates from the start; several consumers may iterate at once.
        """
        ticket = self._ticket
        i = 0
        while True:
            chunks = ticket.chunks
            while i < len(chunks):
                yield chunks[i]
                i += 1
            if ticket.done:
                return
            await ticket.wait()

    async def outcome(self) -> TurnResult:
        """Wait for the turn's result.

        Returns:
            :class:`CommittedResult` (the pair is durable in the store),
            :class:`DiscardedResult` or :class:`RejectedResult`. A store
            that refused the turn's events gives reason ``store_error``
            (the turn discarded, or the question rejected if none of it was
            written), with the system's error in ``detail``.

        Raises:
            SessionClosed: the hub closed, or the session's actor stopped,
                before the turn was decided. An actor stops when it cannot go
                on: another process took the session over
                (:class:`~turnledger.SessionOwnedElsewhere`,
                :class:`~turnledger.LeaseLost`) or the log is damaged; the
                message names the error and ``__cause__`` holds it. A turn
                whose fate is unknown (recorded as in flight) is closed as
                ``interrupted`` when its session next starts (by whichever
                process owns it); submit the same request id again to learn it.

        Cancellation: no effect on the turn.
        """
        ticket = self._ticket
        if ticket.done:
            await trio.lowlevel.checkpoint()
        while not ticket.done:
            # ticket.wait(), without its coroutine: one per turn.
            await trio.lowlevel.wait_task_rescheduled(ticket.park())
        if ticket.result is None:
            assert ticket.error is not None
            if isinstance(ticket.error, InvalidCommand):
                # An edit or a regenerate its session refused (the branch
                # changed after the hub looked): nothing was written.
                raise ticket.error
            raise SessionClosed(str(ticket.error)) from ticket.error.__cause__
        return ticket.result

    async def cancel(self) -> TurnResult:
        """Cancel this turn (only this one: ``Cancel(request_id)``) and wait for its result.

        The result may still be committed: a completion already queued when
        the cancel arrives wins, and the cancel finds nothing to do.

        Raises:
            SessionClosed: as for :meth:`outcome`.

        Cancellation: if cancelled before the Cancel was queued, nothing was
        sent; afterwards, the turn is cancelled and only the wait is abandoned.
        """
        if not self._ticket.done:
            # If the hub is closing, its shutdown resolves the ticket.
            with contextlib.suppress(SessionClosed):
                await self._hub._send(self.session_id, (Cancel(self.request_id), None))
        return await self.outcome()


@final
class Hub:
    """Routes messages to session actors. Get one from :func:`open_hub`."""

    def __init__(
        self,
        nursery: trio.Nursery,
        store: EventStore,
        provider: Provider,
        config: Config,
        tools: Mapping[str, Tool] | None = None,
        retention: RetentionPolicy | None = None,
        snapshots: SnapshotStore | None = None,
        summary_policy: SummaryPolicy | None = None,
    ) -> None:
        self._nursery = nursery
        self._summary_policy = summary_policy
        #: Sessions a summary of the policy's is being written for.
        self._summarizing: set[str] = set()
        #: When the policy's last summary of a session failed (trio clock).
        self._summary_failed_at: dict[str, float] = {}
        #: The scopes of the policy's summaries: cancelled when the hub closes.
        self._summary_scopes: set[trio.CancelScope] = set()
        self._config = config
        self._retention = retention
        self._counters = Counters()
        self._routes = routes = _Routes()
        self._runtime = Runtime(
            store=store,
            provider=provider,
            config=config,
            budget=Budget(
                config.max_request_bytes,
                provider.encoder,
                config.max_prompt_tokens,
                config.token_estimator,
                config.max_pinned_tokens,
                config.max_summary_tokens,
            ),
            counters=self._counters,
            nursery=nursery,
            routing=routes,
            timers=Timers(config.idle_timeout),
            tools=dict(tools or {}),
            make_room=None if retention is None else self._make_room,
            snapshots=snapshots,
            on_submitted=None if summary_policy is None else self._on_submitted,
        )
        self._store = store
        self._janitor_scope = trio.CancelScope()
        nursery.start_soon(self._janitor, config.passivate_after, name="turnledger.janitor")
        self._timers_scope = trio.CancelScope()
        if config.turn_deadline is not None or config.idle_timeout is not None:
            nursery.start_soon(self._timers, name="turnledger.timers")

    # -- routing -----------------------------------------------------------

    async def _actor(self, session_id: str, start: Start | None = None) -> Actor:
        while True:
            if self._routes.closed:
                raise SessionClosed("the hub is closed")
            actor = self._routes.actors.get(session_id)
            if actor is not None:
                return actor
            busy = self._routes.starting.get(session_id)
            if busy is None:
                busy = self._routes.ending.get(session_id)
            if busy is None:
                busy = self._routes.erasing.get(session_id)
            if busy is not None:
                await busy.wait()
                continue
            started = self._routes.starting[session_id] = trio.Event()
            try:
                new = Actor(self._runtime, session_id, start or self._config.start)
                await self._nursery.start(new.run)
            finally:
                del self._routes.starting[session_id]
                started.set()

    async def _send(self, session_id: str, item: Item, start: Start | None = None) -> Actor:
        # A cancel point first: once past it, the message is sent. A mailbox
        # with room then takes it without a task switch; the caller's next
        # wait (for the outcome, usually) is its schedule point.
        await trio.lowlevel.checkpoint_if_cancelled()
        routes = self._routes
        while True:
            # A running actor is found without awaiting _actor().
            actor = None if routes.closed else routes.actors.get(session_id)
            if actor is None:
                actor = await self._actor(session_id, start)
            try:
                actor.mailbox.send_nowait(item)
                return actor
            except trio.WouldBlock:
                pass
            except trio.BrokenResourceError:
                continue  # it stopped before taking the message: not delivered
            # Counted from the lookup on, with no checkpoint in between, so
            # the actor cannot passivate under a message on its way.
            actor.senders += 1
            try:
                await actor.mailbox.send(item)
                return actor
            except trio.BrokenResourceError:
                continue  # it stopped before taking the message: not delivered
            finally:
                actor.senders -= 1

    # -- public API ----------------------------------------------------------

    async def submit(
        self,
        session_id: str,
        question: str,
        *,
        request_id: str | None = None,
        subject: str | None = None,
    ) -> TurnHandle:
        """Ask ``question`` in ``session_id`` (created with the hub's defaults if new).

        Returns once the Submit is in the session's mailbox (waiting while the
        mailbox is full); the turn goes on without the caller. A cancel point;
        a mailbox with room takes the Submit without a schedule point (the
        wait for :meth:`TurnHandle.outcome` is one).

        Args:
            request_id: the caller's id for this question. Submitting the
                same id again never records the question twice: the new
                handle gets the original turn's result (``repeated=True``
                once it had ended) or joins it while in flight.
            subject: whom a session created by this Submit belongs to
                (recorded in its ``SessionStarted``; see :meth:`erase_subject`).
                A session that exists keeps the subject it was created with.

        A new session whose first event the store's size cap refuses (after
        the hub's retention, if any, tried to make room) gets a
        :class:`~turnledger.sessions.RejectedResult` with reason ``limit``.

        Raises:
            SessionClosed: the hub is closed.
            SessionOwnedElsewhere: another process holds the session.
            StoreError, ReplayError, CodecError: the session could not be
                started (recovered) from the store.

        Cancellation: if cancelled, the question was not sent.
        """
        _check_id("session id", session_id)
        if request_id is not None:
            _check_id("request id", request_id)
        rid = RequestId(uuid4_hex() if request_id is None else request_id)
        ticket = Ticket()
        start = None if subject is None else attrs.evolve(self._config.start, subject=subject)
        try:
            try:
                await self._send(session_id, (Submit(rid, question), ticket), start)
            except StoreCapReached:
                # A new session whose first event the store's cap refused:
                # room made by the retention, once, else it cannot fit.
                if not await self._make_room(session_id):
                    raise
                await self._send(session_id, (Submit(rid, question), ticket), start)
        except StoreCapReached as exc:
            ticket.resolve(RejectedResult(rid, "limit", describe_store_error(exc)))
        return TurnHandle(self, session_id, rid, ticket)

    async def open_session(
        self,
        session_id: str,
        *,
        system: str | None = None,
        model: str | None = None,
        policy: HistoryPolicy | None = None,
        on_busy: OnBusy | None = None,
        tools: Sequence[Tool] | None = None,
        subject: str | None = None,
        retention: RetentionPolicy | None = None,
    ) -> SessionState:
        """Start the session's actor, creating the session with these settings if new.

        ``subject`` names whom the session belongs to (an erasure of every
        session of one person finds it by that); ``retention`` is the
        session's own retention, recorded with it (whole seconds and turns),
        applied by :meth:`prune` on top of the hub's.

        Settings left ``None`` take the hub's defaults. A session that exists
        keeps the settings of its ``SessionStarted``. ``tools`` replace the
        hub's for this session: their definitions are recorded when the
        session is created, their functions run its calls from now on.

        Returns:
            The session's state once its actor runs.

        Raises:
            InvalidCommand: the session exists with a different value for a
                setting given here.
            SessionClosed, SessionOwnedElsewhere, StoreError: as for :meth:`submit`.
        """
        _check_id("session id", session_id)
        base = self._config.start
        start = attrs.evolve(
            base,
            system=base.system if system is None else system,
            model=base.model if model is None else model,
            policy=base.policy if policy is None else policy,
            on_busy=base.on_busy if on_busy is None else on_busy,
            tools=base.tools if tools is None else tuple(t.spec for t in tools),
            subject=subject,
            retain_seconds=_whole_seconds(retention),
            retain_turns=None if retention is None else retention.max_turns,
        )
        if tools is not None:
            self._runtime.session_tools[session_id] = _by_name(tools)
        given: dict[str, object] = {
            "system": system,
            "model": model,
            "policy": policy,
            "on_busy": on_busy,
            "subject": subject,
        }
        actor = await self._actor(session_id, start)
        config = actor.state.config
        assert config is not None
        for name, value in given.items():
            if value is not None and getattr(config, name) != value:
                raise InvalidCommand(
                    f"session {session_id!r} exists with {name}={getattr(config, name)!r}"
                )
        await trio.lowlevel.checkpoint()
        return actor.state

    async def cancel(self, session_id: str) -> None:
        """Cancel the turn in flight in ``session_id``, if any (``Cancel()``).

        Returns once the Cancel is queued. A session whose actor is not
        running has nothing in flight; nothing is sent.

        Raises:
            SessionClosed: the hub is closed.
        """
        if self._routes.closed:
            raise SessionClosed("the hub is closed")
        if session_id in self._routes.actors or session_id in self._routes.starting:
            await self._send(session_id, (Cancel(), None))
        else:
            await trio.lowlevel.checkpoint()

    async def state(self, session_id: str) -> SessionState:
        """The session's state: the live actor's, or replayed from the store
        (read-only, without starting an actor) if it is not running."""
        actor = self._routes.actors.get(session_id)
        if actor is not None:
            await trio.lowlevel.checkpoint()
            return actor.state
        state, _ = await recover_state(
            self._store,
            session_id,
            self._runtime.snapshots,
            get_logger().bind(session_id=session_id),
            lazy=False,  # the caller holds it past the hub's life, maybe
        )
        return state

    async def new_session_start(self) -> Start:
        """What a session created now would record in its ``SessionStarted``:
        the hub's system prompt, model and policies, with the context window
        and output reserve the model gets (the provider is asked once per
        model for the hub's life, as a new session asks). Nothing is written.

        An edge that must refuse a first question without creating its
        session (``turnledger serve``) measures it against this.

        Cancellation: asking the provider may be cancelled; nothing changes.
        """
        rt = self._runtime
        return await rt.windows.start(rt.provider, self._config.start, rt.config, _window_log)

    async def history(self, session_id: str) -> tuple[Turn, ...]:
        """The session's committed turns, oldest first (the active branch's path)."""
        return tuple((await self.state(session_id)).turns)

    # -- branches --------------------------------------------------------------

    async def edit(
        self, session_id: str, turn_index: int, question: str, *, request_id: str | None = None
    ) -> TurnHandle:
        """Ask ``question`` instead of turn ``turn_index`` (from 0) of the
        active branch: a new branch keeps the turns before it, becomes the
        active branch and asks the question. The branch it started from keeps
        every turn; :meth:`switch` goes back to it.

        A question that is empty, over budget or arrives while a turn is in
        flight is handled as :meth:`submit` handles it (a
        :class:`RejectedResult`, or under ``supersede`` the turn in flight is
        discarded); a rejected edit starts no branch.

        Raises:
            UnknownSession: no session has this id (nothing is created).
            UnknownTurn: the active branch has no turn ``turn_index``;
                nothing was written. (If the branch changes between this
                check and the session's own, :meth:`TurnHandle.outcome`
                raises it instead.)
            SessionClosed: the hub is closed.

        Cancellation: if cancelled, the question was not sent.
        """
        rid = _new_request_id(request_id)
        return await self._ask_on_branch(session_id, Edit(rid, turn_index, question))

    async def regenerate(self, session_id: str, *, request_id: str | None = None) -> TurnHandle:
        """Ask the active branch's last question again, on a new branch that
        keeps the turns before it (the answer it had stays on the old branch).

        Raises:
            UnknownSession: no session has this id.
            UnknownTurn: the active branch has no turn yet.
            SessionClosed: the hub is closed.

        Cancellation: if cancelled, the question was not sent.
        """
        rid = _new_request_id(request_id)
        return await self._ask_on_branch(session_id, Regenerate(rid))

    async def switch(self, session_id: str, branch: str) -> None:
        """Make ``branch`` the active branch: history is its path again, and
        the next question continues it. Returns once the switch is recorded
        (switching to the active branch records nothing).

        Raises:
            UnknownSession: no session has this id.
            UnknownBranch: the session has no such branch; nothing was written.
            SessionBusy: a turn is in flight and the busy policy is
                ``reject`` (under ``supersede`` the turn is discarded first).
            StoreError: the store refused to record the switch (a full
                disk, an I/O error); the active branch is unchanged.
            SessionClosed: the hub is closed, or the session stopped.

        Cancellation: if cancelled before the switch was queued, nothing was
        sent; afterwards the switch happens and only the wait is abandoned.
        """
        msg = Switch(BranchId(branch))
        await self._check_command(session_id, msg)
        await self._settled(session_id, msg)

    async def branches(self, session_id: str) -> tuple[BranchInfo, ...]:
        """Every branch of the session, ``main`` first, with where it starts,
        its length, its newest turn's request id and whether it is active.

        Raises:
            UnknownSession: no session has this id.
        """
        return branches_of(await self._existing(session_id))

    # -- summaries and pinned items -------------------------------------------

    async def summarize(
        self,
        session_id: str,
        *,
        start: int = 0,
        end: int | None = None,
        branch: str | None = None,
        summarizer: Summarizer | None = None,
        timeout: float | None = 60.0,
        request_id: str | None = None,
    ) -> SummaryRecorded:
        """Summarize turns ``start`` to ``end`` (from 0, ``end`` excluded;
        ``None``: every turn) of ``branch``'s path (``None``: the active
        branch) and record the summary. A later request that has to drop
        those turns may send it in their place (docs/summaries.md).

        The summary is written here, in the caller's task, never in the
        session's: its turns go on meanwhile, and only the finished text
        goes through the session (one event, ``summary_recorded``).

        Args:
            summarizer: a :class:`ModelSummarizer` (the session's own model
                with a named prompt; the default) or an async function that
                takes the turns and returns the text.
            timeout: seconds the summarizer may take (``None``: no limit).
            request_id: the summarizing request's id (default: a new one);
                recording the same id twice records it once.

        Returns:
            The recorded event: its id (``s1``, ``s2``...), the turns it
            covers, its text, origin, usage, size and estimated tokens.

        Raises:
            UnknownSession: no session has this id.
            UnknownBranch, UnknownTurn: no such branch, or no such turns on
                it; nothing was asked or written.
            SummaryFailed: the summarizer raised, gave no text or timed out
                (logged as ``summary_failed``); nothing was written.
            StoreError: the store refused the summary; nothing was written.
            SessionClosed: the hub is closed.

        Cancellation: if cancelled while the summary is written, nothing is
        recorded; once its text is queued for the session, it is recorded
        and only the wait is abandoned.
        """
        _check_id("session id", session_id)
        rid = _new_request_id(request_id)
        state = await self._existing(session_id)
        name = BranchId(state.active_branch if branch is None else branch)
        turns = branch_turns(state, name)  # UnknownBranch
        stop = len(turns) if end is None else end
        log = get_logger().bind(session_id=session_id, request_id=rid)
        # The session's own check of the range, before anything is asked.
        check = RecordSummary(rid, name, start, stop, "?", "function", "check")
        decide(state, check, budget=self._runtime.budget)
        config = state.config
        assert config is not None
        chosen: Summarizer = ModelSummarizer() if summarizer is None else summarizer
        log.info("summary_started", branch=name, start=start, end=stop)
        try:
            text, origin, origin_name, usage = await run_summarizer(
                chosen, self._runtime.provider, config.model, turns[start:stop], rid, timeout
            )
        except SummaryFailed as exc:
            log.warning("summary_failed", branch=name, start=start, end=stop, error=str(exc))
            raise
        msg = RecordSummary(rid, name, start, stop, text, origin, origin_name, usage)
        await self._settled(session_id, msg)
        for x in (await self.state(session_id)).summaries:
            if x.request_id == rid:
                log.info("summary_recorded", summary_id=x.summary_id, tokens=x.estimated_tokens)
                return x
        raise SessionClosed(f"session {session_id!r} stopped before the summary was recorded")

    async def summaries(self, session_id: str) -> tuple[SummaryRecorded, ...]:
        """Every summary of the session (of any branch), oldest first.

        Raises:
            UnknownSession: no session has this id.
        """
        return (await self._existing(session_id)).summaries

    async def pin(
        self, session_id: str, text: str, *, origin: str, pin_id: str | None = None
    ) -> str:
        """Pin ``text`` to the session's context: every later request sends
        it right after the system prompt (pinned items in the order they
        were pinned), within the pinned items' own budget
        (``max_pinned_tokens``: over it, a question is rejected as
        ``over_budget``, as one whose system prompt is too large).

        Args:
            origin: where it comes from (``memory``, ``retrieval:doc-7``,
                ``policy``...), recorded with it.
            pin_id: its id (default: ``p1``, ``p2``..., the first free).

        Returns:
            The pinned item's id.

        Raises:
            UnknownSession: no session has this id.
            SessionBusy: a turn is in flight (pins change between turns).
            InvalidCommand: empty text or origin, a bad or taken id.
            StoreError: the store refused it; nothing was written.
            SessionClosed: the hub is closed.

        Cancellation: if cancelled before the pin was queued, nothing was
        sent; afterwards it is recorded and only the wait is abandoned.
        """
        _check_id("session id", session_id)
        if pin_id is None:
            taken = {p.pin_id for p in (await self._existing(session_id)).pins}
            pin_id = next(f"p{k}" for k in range(1, len(taken) + 2) if f"p{k}" not in taken)
        msg = Pin(pin_id, text, origin)
        await self._check_command(session_id, msg)
        await self._settled(session_id, msg)
        return pin_id

    async def unpin(self, session_id: str, pin_id: str) -> None:
        """Stop sending the pinned item ``pin_id`` (its events stay in the log).

        Raises:
            UnknownSession: no session has this id.
            UnknownPin: the session has no such pinned item.
            SessionBusy: a turn is in flight.
            StoreError: the store refused it; nothing was written.
            SessionClosed: the hub is closed.

        Cancellation: as :meth:`pin`.
        """
        msg = Unpin(pin_id)
        await self._check_command(session_id, msg)
        await self._settled(session_id, msg)

    async def pins(self, session_id: str) -> tuple[PinAdded, ...]:
        """The items pinned now, in the order they are sent.

        Raises:
            UnknownSession: no session has this id.
        """
        return (await self._existing(session_id)).pins

    async def _settled(self, session_id: str, msg: Switch | RecordSummary | Pin | Unpin) -> None:
        # Send a command that reports no turn, and wait until it is recorded.
        ticket = Ticket()
        await self._send(session_id, (msg, ticket))
        while not ticket.done:
            await ticket.wait()
        error = ticket.error
        if isinstance(error, (InvalidCommand, StoreError)):
            raise error  # refused, or not recorded: nothing changed
        if error is not None:
            raise SessionClosed(str(error)) from error.__cause__

    def _on_submitted(self, session_id: str, state: SessionState, ev: TurnSubmitted) -> None:
        # The summary policy, after a question went out: start a summary in a
        # task of the hub's if one is due; never wait for it here.
        policy = self._summary_policy
        if policy is None or session_id in self._summarizing or self._routes.closed:
            return
        failed = self._summary_failed_at.get(session_id)
        if failed is not None and trio.current_time() - failed < policy.retry_after:
            return
        span = policy_range(policy, state, ev)
        if span is None:
            return
        self._summarizing.add(session_id)
        self._nursery.start_soon(
            self._summarize_for_policy,
            session_id,
            state.active_branch,
            *span,
            name="turnledger.summary",
        )

    async def _summarize_for_policy(
        self, session_id: str, branch: BranchId, start: int, end: int
    ) -> None:
        policy = self._summary_policy
        assert policy is not None
        scope = trio.CancelScope()
        self._summary_scopes.add(scope)
        try:
            with scope:
                await self.summarize(
                    session_id,
                    start=start,
                    end=end,
                    branch=branch,
                    summarizer=policy.summarizer,
                    timeout=policy.timeout,
                )
                self._summary_failed_at.pop(session_id, None)
        except (SummaryFailed, InvalidCommand, StoreError, SessionClosed, UnknownSession) as exc:
            # Logged (summarize logs a summarizer's failure itself) and tried
            # again on a later question.
            self._summary_failed_at[session_id] = trio.current_time()
            if not isinstance(exc, SummaryFailed):
                get_logger().bind(session_id=session_id).warning(
                    "summary_failed", error=type(exc).__name__, detail=str(exc)
                )
        finally:
            self._summary_scopes.discard(scope)
            self._summarizing.discard(session_id)
            if scope.cancelled_caught:
                get_logger().bind(session_id=session_id).info("summary_cancelled")

    async def _existing(self, session_id: str) -> SessionState:
        state = await self.state(session_id)
        if state.config is None:
            raise UnknownSession(f"no session {session_id!r}")
        return state

    async def _check_command(
        self, session_id: str, msg: Edit | Regenerate | Switch | Pin | Unpin
    ) -> None:
        # The session's own decision on the hub's view of it, thrown away: a
        # bad turn or branch is refused here, before anything is sent, with
        # the error the session itself would give.
        _check_id("session id", session_id)
        state = await self._existing(session_id)
        decide(state, msg, budget=self._runtime.budget)

    async def _ask_on_branch(self, session_id: str, msg: Edit | Regenerate) -> TurnHandle:
        await self._check_command(session_id, msg)
        ticket = Ticket()
        await self._send(session_id, (msg, ticket))
        return TurnHandle(self, session_id, msg.request_id, ticket)

    # -- nodes of a cluster ----------------------------------------------------

    async def drop(self, session_id: str) -> None:
        """Stop the session's actor, if one runs, as closing the hub would
        (queued questions get :class:`~turnledger.SessionClosed`; a turn in
        flight is ended as ``interrupted`` if the store still takes the
        write). For a session whose lease another process took over: its
        writes are refused (:class:`~turnledger.LeaseLost`), so its callers
        learn the outcome the new owner records. The next message starts a
        new actor, by replay.

        Cancellation: the actor stops anyway; only the wait is abandoned.
        """
        actor = self._routes.actors.get(session_id)
        if actor is None:
            await trio.lowlevel.checkpoint()
            return
        ending = self._routes.ending.setdefault(session_id, trio.Event())
        actor.request_stop()
        await ending.wait()

    def idle_sessions(self) -> list[str]:
        """Sessions whose actor runs with no turn in flight and nothing being
        handled (those :meth:`drop` stops without ending a turn)."""
        return [sid for sid, actor in self._routes.actors.items() if not actor.busy]

    # -- forks -----------------------------------------------------------------

    async def fork(
        self, source: str, new_session_id: str, at_turn: int | None = None
    ) -> SessionForked:
        """Start ``new_session_id`` as a fork of ``source``: its history
        begins with the first ``at_turn`` turns of ``source``'s active branch
        (``None``: all of them), and goes on by itself from there.

        The shared turns are not copied: the fork's log holds two events
        (its ``SessionStarted``, with the source's settings and subject, and
        :class:`~turnledger.events.SessionForked`), whatever the length of
        the history, and the source's events are never changed. Reading the
        fork (history, replay, export, an actor reopening it) resolves them
        from the source's events as they stood at the fork. An erasure of
        the source erases its forks too (:meth:`erase`).

        With the source open in this hub (its actor running) a fork reads
        nothing; otherwise the source is replayed once to find its branch.

        Returns:
            The fork's ``SessionForked`` event, as recorded.

        Raises:
            UnknownSession: ``source`` has no events; nothing was written.
            UnknownTurn: ``at_turn`` is not between 0 and the length of the
                source's active branch; nothing was written.
            SessionExists: ``new_session_id`` already has events (or is
                ``source``); nothing was written.
            SessionClosed: the hub is closed.
            StoreError, SessionOwnedElsewhere: the store refused the fork's
                events; nothing was written.

        Cancellation: once its events are being written the write is not
        interrupted: a cancelled call made the fork whole or not at all.
        """
        _check_id("session id", source)
        _check_id("session id", new_session_id)
        if self._routes.closed:
            raise SessionClosed("the hub is closed")
        live = self._routes.actors.get(source)
        state = live.state if live is not None else await self.state(source)
        started, forked = fork_events(state, source, at_turn)
        if new_session_id == source or new_session_id in self._routes.actors:
            raise SessionExists(new_session_id)
        async with self._exclusive(new_session_id, busy_ok=False):
            store = self._store
            if await store.read(new_session_id):
                raise SessionExists(new_session_id)
            now = self._config.clock()
            events: tuple[Event, ...] = (started, forked)
            stored = [
                DEFAULT_CODEC.encode(ev, session_id=new_session_id, seq=seq, recorded_at=now)
                for seq, ev in enumerate(events, 1)
            ]
            with trio.CancelScope(shield=True):
                await store.acquire(new_session_id)
                try:
                    await store.append(new_session_id, stored, expected_version=0)
                except ConcurrencyConflict as exc:
                    raise SessionExists(new_session_id) from exc
                finally:
                    await store.release(new_session_id)
                # An erasure of the source that ran meanwhile either finds
                # this fork when it looks again after erasing the source
                # (see erase), or erased the source before this read: then
                # the fork goes too, and the source is unknown.
                if not await store.read(source, after=forked.source_seq - 1):
                    await store.erase(new_session_id)
                    raise UnknownSession(source, f"session {source!r} was erased meanwhile")
        get_logger().info(
            "session_forked",
            session_id=new_session_id,
            source=source,
            source_seq=forked.source_seq,
            branch=forked.branch,
            at_turn=forked.at_turn,
        )
        return forked

    # -- erasure and retention -------------------------------------------------

    @contextlib.asynccontextmanager
    async def _exclusive(self, session_id: str, *, busy_ok: bool) -> AsyncIterator[bool]:
        """Hold ``session_id`` with no actor running and none starting: a
        running one is stopped first, writing nothing more (its turn in
        flight ends as ``erased``). With ``busy_ok`` false, a session whose
        turn is in flight is left alone (yields False)."""
        routes = self._routes
        while True:
            if routes.closed:
                raise SessionClosed("the hub is closed")
            other = routes.erasing.get(session_id) or routes.starting.get(session_id)
            if other is None:
                break
            await other.wait()
        gate = routes.erasing[session_id] = trio.Event()
        try:
            actor = routes.actors.get(session_id)
            if actor is not None and actor.busy and not busy_ok:
                yield False
                return
            if actor is not None:
                ending = routes.ending.setdefault(session_id, trio.Event())
                actor.request_erase()
                await ending.wait()
            else:
                ending_now = routes.ending.get(session_id)
                if ending_now is not None:
                    await ending_now.wait()
            yield True
        finally:
            del routes.erasing[session_id]
            gate.set()

    async def _drop_snapshot(self, session_id: str) -> None:
        # A snapshot holds the session's content: it goes first (losing one
        # costs a longer replay, never an event), then the events.
        snapshots = self._runtime.snapshots
        if snapshots is not None:
            await snapshots.drop(session_id)

    async def erase(self, session_id: str) -> Erasure:
        """Erase the session: every event of it leaves the store, so that it
        reads as unknown everywhere (history, replay, export, search).

        A turn in flight is cancelled first: its callers get a
        :class:`~turnledger.sessions.DiscardedResult` with reason
        ``erased``, questions still queued get ``SessionClosed``, and the
        actor stops without writing anything more. The store keeps only a
        content-free :class:`~turnledger.events.Erasure` record (the id's
        SHA-256, the time, the event count). A later Submit to the same id
        starts a new, empty session.

        Its forks (sessions started by :meth:`fork` from it, and their
        forks) share its turns: they are erased with it, first, each as if
        erased alone (a ``session_erased`` line and a record of its own).

        Returns:
            The session's erasure record.

        Raises:
            UnknownSession: the store holds no such session; nothing changed.
            SessionClosed: the hub is closed.
            StoreError, SessionOwnedElsewhere: the store refused; the
                session is as it was (its actor restarts when addressed).

        Cancellation: once the store's erasure started it is not
        interrupted; a cancelled call either erased the session or left it
        whole (its actor may have been stopped: it comes back by replay).
        """
        _check_id("session id", session_id)
        if session_id not in self._routes.actors and not await self._store.read(session_id):
            raise UnknownSession(session_id)
        for fork in await forks_of(self._store, session_id):
            with contextlib.suppress(UnknownSession):  # gone meanwhile
                await self._erase_one(fork)
        record = await self._erase_one(session_id)
        # Once more: a fork made while the above ran (hub.fork looks for its
        # source after writing, so one made after this scan goes by itself).
        for fork in await forks_of(self._store, session_id):
            with contextlib.suppress(UnknownSession):
                await self._erase_one(fork)
        return record

    async def _erase_one(self, session_id: str) -> Erasure:
        async with self._exclusive(session_id, busy_ok=True):
            with trio.CancelScope(shield=True):
                await self._drop_snapshot(session_id)
                record = await self._store.erase(session_id)
        self._runtime.session_tools.pop(session_id, None)
        log_step(session_id, record, "erase")
        return record

    async def erase_subject(self, subject: str) -> list[Erasure]:
        """:meth:`erase` every session whose ``SessionStarted`` names
        ``subject``; ``[]`` if there is none.

        Raises:
            SessionClosed, StoreError: as :meth:`erase` (the sessions
                erased before the error stay erased).

        Cancellation: each erasure happened or did not; the ones done stay done.
        """
        _check_id("subject", subject)
        ids = await sessions_of_subject(self._store, subject)
        return await erase_all(self._store, ids, self.erase)

    async def prune(
        self,
        policy: RetentionPolicy | None = None,
        *,
        now: float | None = None,
        dry_run: bool = False,
    ) -> list[RetentionStep]:
        """Apply the retention policy (``policy``, else the hub's, with each
        session's own on top): erase the sessions idle for too long, cut the
        oldest turns of the ones that keep too many. Pruning is an erasure,
        with its guarantees, and each step is logged (``session_erased``,
        ``session_trimmed``). A session whose turn is in flight is left for
        the next time, as is one another process owns (PostgreSQL: a node of
        a cluster prunes its own).

        Args:
            now: the time to judge idleness by (default: the hub's clock).
            dry_run: only say what would be done; nothing changes.

        Returns:
            The steps taken (with ``dry_run``, the steps that would be).

        Cancellation: each step happened or did not; the ones done stay done.
        """
        return await self._prune(policy, now, dry_run, ())

    async def _make_room(self, session_id: str) -> bool:
        """The store's cap refused ``session_id``'s append: apply the
        retention to the other sessions; whether it erased or cut anything."""
        if self._retention is None:
            return False
        return bool(await self._prune(None, None, False, (session_id,)))

    async def _prune(
        self,
        policy: RetentionPolicy | None,
        now: float | None,
        dry_run: bool,
        spare: Sequence[str],
    ) -> list[RetentionStep]:
        rule = policy or self._retention or RetentionPolicy()
        when = self._config.clock() if now is None else now
        busy = [sid for sid, a in self._routes.actors.items() if a.busy]
        steps = await plan_store(self._store, rule, when, skip=[*busy, *spare])
        if dry_run:
            return steps
        done = []
        for step in steps:
            async with self._exclusive(step.session_id, busy_ok=False) as free:
                if not free:
                    continue
                # Planned again now that nothing writes to it.
                fresh = plan_retention(
                    step.session_id, await self._store.read(step.session_id), rule, when
                )
                if fresh is None:
                    continue
                try:
                    with trio.CancelScope(shield=True):
                        await self._drop_snapshot(step.session_id)
                        await apply_step(self._store, fresh)
                except SessionOwnedElsewhere:
                    # Another process (a node of a cluster) holds it: its
                    # own retention prunes it, or this one's next round.
                    continue
                if fresh.action == "erase":
                    self._runtime.session_tools.pop(step.session_id, None)
                done.append(fresh)
        return done

    def statistics(self) -> HubStatistics:
        """Counters for monitoring and tests."""
        c = self._counters
        return HubStatistics(
            actors=c.actor_tasks,
            requests=c.request_tasks,
            in_flight=sum(1 for a in self._routes.actors.values() if a.in_flight),
            actors_started=c.actors_started,
            actors_passivated=c.actors_passivated,
            actors_failed=c.actors_failed,
            messages=c.messages,
            appends=c.appends,
            events=c.events,
            store_errors=c.store_errors,
        )

    async def _janitor(self, after: float | None) -> None:
        # One task for the whole hub rather than a timer per idle actor: an
        # idle actor then costs no cancel scope and no deadline. An actor
        # idle for KEEP_REQUEST_TASK seconds lets its request task go; one
        # idle for `after` seconds is passivated. A sweep every half of the
        # shorter of the two: each happens at most that long after it is due.
        keep = KEEP_REQUEST_TASK
        period = (keep if after is None else min(after, keep)) / 2
        with self._janitor_scope:
            while True:
                await trio.sleep(period)
                now = trio.current_time()
                for actor in list(self._routes.actors.values()):
                    since = actor.idle_since
                    if since is None:
                        continue
                    if after is not None and now - since >= after:
                        actor.poke()
                    elif now - since >= keep:
                        actor.retire_request_task()

    async def _timers(self) -> None:
        with self._timers_scope:
            await self._runtime.timers.run()

    def _close(self) -> None:
        self._routes.closed = True
        self._janitor_scope.cancel()
        self._timers_scope.cancel()
        for actor in list(self._routes.actors.values()):
            actor.request_stop()
        grace = trio.current_time() + self._config.shutdown_grace
        for scope in self._runtime.snapshot_scopes:
            scope.deadline = min(scope.deadline, grace)
        for scope in self._summary_scopes:
            scope.cancel()  # a summary not written yet is never needed


@asynccontextmanager
async def open_hub(
    store: EventStore,
    provider: Provider,
    *,
    model: str,
    system: str = "",
    policy: HistoryPolicy | None = None,
    on_busy: OnBusy = "reject",
    tools: Sequence[Tool] = (),
    tool_choice: str = "auto",
    max_tool_rounds: int = 8,
    on_tool_error: ToolErrorPolicy = "report",
    max_request_bytes: int | None = None,
    max_prompt_tokens: int | None = None,
    token_estimator: TokenEstimator | None = None,
    context_window: int | None = None,
    output_reserve: int | None = None,
    turn_deadline: float | None = 60.0,
    idle_timeout: float | None = 30.0,
    passivate_after: float | None = 300.0,
    mailbox_size: int = 16,
    shutdown_grace: float = 5.0,
    clock: Callable[[], float] = time.time,
    retention: RetentionPolicy | None = None,
    snapshots: SnapshotStore | None = None,
    snapshot_every: int | None = 1000,
    snapshot_chars: int | None = 4_000_000,
    max_pinned_tokens: int | None = None,
    max_summary_tokens: int | None = None,
    summary_policy: SummaryPolicy | None = None,
) -> AsyncIterator[Hub]:
    """Run session actors for ``store`` and ``provider`` while the context is open.

    Args:
        store: where every session's events go (the hub does not close it).
        provider: the model server; its ``encoder`` measures request budgets.
        model, system, policy, on_busy: the settings of sessions the hub
            creates (see :meth:`Hub.open_session` for others). ``policy``
            defaults to :class:`~turnledger.events.Ledger`; ``on_busy`` is
            ``"reject"`` (a Submit while a turn is in flight is refused) or
            ``"supersede"`` (it discards the turn in flight and goes ahead).
        tools: tools the model may call in sessions the hub creates (their
            definitions are sent with every request); a turn then takes
            rounds of calls before its answer, committed all together.
        tool_choice: ``auto``, ``required`` or ``none`` (OpenAI servers).
        max_tool_rounds: rounds of tool calls a turn may take before it is
            discarded as ``limit``.
        on_tool_error: ``report`` (a tool's error is the call's result, the
            model goes on) or ``stop`` (the turn is discarded as ``tool_error``).
        max_request_bytes: cap on the encoded request body; ``None`` for none.
        max_prompt_tokens: optional second cap, on the estimated prompt
            tokens (``token_estimator``, default :class:`CharTokenEstimator`).
        context_window: the model's context window in tokens, for sessions
            the hub creates. ``None`` (default): ask the provider once per
            model (see :class:`~turnledger.sessions.DescribesModels`), else
            a fallback (a known model family, or 8,192). Each session
            records its window, reserve and their source in its first event;
            its prompt budget is ``context_window - output_reserve`` by the
            calibrated token estimate, on top of the caps above.
        output_reserve: tokens of the window kept for the answer; ``None``:
            the provider's ``max_tokens``, or a quarter of the window (at
            most 4,096).
        turn_deadline: seconds a turn may take in all (``Timeout "deadline"``).
        idle_timeout: seconds without progress (response start or delta)
            before a turn is discarded (``Timeout "idle"``).
        passivate_after: seconds without messages after which an idle
            session's actor stops (checked every ``passivate_after / 2``
            seconds, or 15 if that is less); it comes back by replay when
            addressed. Idle for 30 seconds, an actor already lets the task
            that runs its requests go (the next turn starts a new one).
        mailbox_size: messages a session queues before senders wait.
        shutdown_grace: seconds each actor may take, on exit, to write the
            ``interrupted`` discards (even if the exit is a cancellation).
        clock: wall clock for events' ``recorded_at`` (injectable for tests).
        retention: the policy :meth:`Hub.prune` applies (each session's own
            applies too); ``None``: only sessions' own.
        snapshots: where to keep snapshots of long sessions (for example
            ``await snapshots_beside(db)``, see docs/snapshots.md); an actor
            then starts from its session's latest snapshot plus the events
            after it. ``None`` (default): every start replays in full.
        snapshot_every, snapshot_chars: a snapshot is written, in the
            background, once this many events or this many characters of
            committed questions and answers came since the last one
            (``None`` turns either trigger off).
        max_pinned_tokens: the pinned items' own budget, in estimated
            tokens, all together (``None``: only the request's caps); a
            question whose pinned items are over it is rejected.
        max_summary_tokens: a summary over this many estimated tokens is
            never sent (``None``: only the request's caps).
        summary_policy: when the hub writes summaries by itself
            (:class:`SummaryPolicy`); ``None``: only :meth:`Hub.summarize`.

    On exit every actor stops: queued questions are refused with
    :class:`~turnledger.SessionClosed`, queued results are still handled,
    turns in flight are discarded as ``interrupted``, request tasks are
    cancelled. An exception from the body propagates unwrapped.

    Raises:
        WrongEventLoop: not called from trio (asyncio code uses
            :func:`turnledger.aio.open_hub`).
    """
    require_trio("open_hub")
    by_name = _by_name(tools)
    seal = getattr(store, "seal_snapshots", None)
    if snapshots is not None and seal is not None and not getattr(snapshots, "sealed", False):
        # An encrypted store's snapshots hold content too: seal them.
        snapshots = seal(snapshots)
    config = Config(
        start=Start(
            system,
            model,
            Ledger() if policy is None else policy,
            on_busy,
            tuple(t.spec for t in tools),
            tool_choice,
            max_tool_rounds,
            on_tool_error,
        ),
        max_request_bytes=max_request_bytes,
        max_prompt_tokens=max_prompt_tokens,
        token_estimator=token_estimator or CharTokenEstimator(),
        context_window=context_window,
        output_reserve=output_reserve,
        turn_deadline=turn_deadline,
        idle_timeout=idle_timeout,
        passivate_after=passivate_after,
        mailbox_size=mailbox_size,
        shutdown_grace=shutdown_grace,
        clock=clock,
        snapshot_every=snapshot_every,
        snapshot_chars=snapshot_chars,
        max_pinned_tokens=max_pinned_tokens,
        max_summary_tokens=max_summary_tokens,
    )
    unwrapped: BaseException | None = None
    try:
        async with trio.open_nursery() as nursery:
            hub = Hub(
                nursery,
                store,
                provider,
                config,
                by_name,
                retention=retention,
                snapshots=snapshots,
                summary_policy=summary_policy,
            )
            try:
                yield hub
            finally:
                hub._close()
    except BaseExceptionGroup as group:
        # Actors never raise into the nursery, so a lone exception is the
        # body's own: give it back as it was raised.
        if len(group.exceptions) != 1:
            raise
        unwrapped = group.exceptions[0]
    if unwrapped is not None:
        raise unwrapped


def _whole_seconds(retention: RetentionPolicy | None) -> int | None:
    if retention is None or retention.max_idle is None:
        return None
    return max(1, math.ceil(retention.max_idle))


def _by_name(tools: Sequence[Tool]) -> dict[str, Tool]:
    out = {t.name: t for t in tools}
    if len(out) != len(tools):
        raise InvalidCommand("two tools have the same name")
    return out
