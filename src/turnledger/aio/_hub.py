"""turnledger.aio's hub: the bridge, the handles and ``open_hub`` (see the package docstring)."""

from __future__ import annotations

import asyncio
import collections
import contextlib
import functools
import inspect
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from contextlib import asynccontextmanager
from typing import Any, TypeAlias, TypeVar, final

import attrs
import outcome
import trio

from .._errors import SessionClosed
from .._loops import require_asyncio
from ..events import (
    Erasure,
    EventStore,
    HistoryPolicy,
    OnBusy,
    PinAdded,
    SessionForked,
    SummaryRecorded,
    ToolErrorPolicy,
)
from ..runtime import ModelSummarizer, SummaryFunction, SummaryPolicy
from ..sessions import (
    BranchInfo,
    HubStatistics,
    Provider,
    RetentionPolicy,
    RetentionStep,
    SessionState,
    TokenEstimator,
    Tool,
    Turn,
    TurnResult,
)
from ..sessions import open_hub as _trio_open_hub
from ..sessions._snapshot import SnapshotStore

__all__ = ["Hub", "Opener", "TurnHandle", "open_hub"]

T = TypeVar("T")

#: An object, or a function that returns it (or an awaitable of it), called
#: on the trio side; an object the hub opened this way is closed by it.
Opener: TypeAlias = T | Callable[[], T | Awaitable[T]]


class _Bridge:
    """Runs trio calls for asyncio code, one trio task per call."""

    __slots__ = ("closed", "loop", "nursery", "pending", "token")

    def __init__(
        self, loop: asyncio.AbstractEventLoop, token: trio.lowlevel.TrioToken, nursery: trio.Nursery
    ) -> None:
        self.loop = loop
        self.token = token
        self.nursery = nursery
        self.closed = False
        self.pending: set[asyncio.Future[Any]] = set()

    def start(
        self, fn: Callable[..., Awaitable[T]], *args: Any
    ) -> tuple[asyncio.Future[T], trio.CancelScope]:
        """Start ``fn(*args)`` as a trio task; its result comes on the future."""
        if self.closed:
            raise SessionClosed("the hub is closed")
        future: asyncio.Future[T] = self.loop.create_future()
        scope = trio.CancelScope()
        try:
            self.token.run_sync_soon(self._start, future, scope, fn, args)
        except trio.RunFinishedError:
            raise SessionClosed("the hub is closed") from None
        self.pending.add(future)
        future.add_done_callback(self.pending.discard)
        return future, scope

    def cancel(self, scope: trio.CancelScope) -> None:
        with contextlib.suppress(trio.RunFinishedError):
            self.token.run_sync_soon(scope.cancel)

    async def run(self, fn: Callable[..., Awaitable[T]], *args: Any) -> T:
        future, scope = self.start(fn, *args)
        try:
            return await future
        except asyncio.CancelledError:
            # Only this call's trio task is cancelled: a waiter goes away,
            # the turn it waited for does not.
            self.cancel(scope)
            raise

    def _start(
        self,
        future: asyncio.Future[Any],
        scope: trio.CancelScope,
        fn: Callable[..., Awaitable[Any]],
        args: tuple[Any, ...],
    ) -> None:
        if future.done():
            return
        try:
            self.nursery.start_soon(self._call, future, scope, fn, args)
        except RuntimeError:  # the nursery closed: the hub is gone
            future.set_exception(SessionClosed("the hub is closed"))

    @staticmethod
    async def _call(
        future: asyncio.Future[Any],
        scope: trio.CancelScope,
        fn: Callable[..., Awaitable[Any]],
        args: tuple[Any, ...],
    ) -> None:
        with scope:
            try:
                value = await fn(*args)
            except Exception as exc:
                if not future.done():
                    future.set_exception(exc)
                return
            if not future.done():
                future.set_result(value)
            return
        if not future.done():
            future.set_exception(SessionClosed("the hub closed before the call returned"))

    def fail_pending(self) -> None:
        self.closed = True
        for future in list(self.pending):
            if not future.done():
                future.set_exception(SessionClosed("the hub's trio run ended"))


_END: Any = object()


class _Pipe:
    """Preview chunks from a trio task to one asyncio iterator (same thread)."""

    __slots__ = ("error", "items", "waiter")

    def __init__(self) -> None:
        self.items: collections.deque[str] = collections.deque()
        self.waiter: asyncio.Future[None] | None = None
        self.error: BaseException | None = None

    def wake(self, _: object = None) -> None:
        waiter = self.waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    async def pump(self, chunks: AsyncIterator[str]) -> None:
        try:
            async for chunk in chunks:
                self.items.append(chunk)
                self.wake()
        except Exception as exc:
            self.error = exc
        self.items.append(_END)
        self.wake()


@final
class TurnHandle:
    """One submitted question, as asyncio code holds it (see
    :class:`turnledger.sessions.TurnHandle`)."""

    __slots__ = ("_bridge", "_handle", "request_id", "session_id")

    def __init__(self, bridge: _Bridge, handle: Any) -> None:
        #: The session the question went to.
        self.session_id: str = handle.session_id
        #: The request id (given by the caller, or a fresh uuid4 hex).
        self.request_id: str = handle.request_id
        self._bridge = bridge
        self._handle = handle

    def __repr__(self) -> str:
        return f"<aio.TurnHandle {self.session_id!r} {self.request_id!r}>"

    @property
    def done(self) -> bool:
        """True once the turn has a result (or can no longer get one)."""
        return bool(self._handle.done)

    async def preview(self) -> AsyncIterator[str]:
        """The answer's text as it streams, until the turn ends.

        Preview text is never history: check :meth:`outcome`. Every call
        iterates from the start. Cancelling the task that iterates (or
        leaving the loop) stops this iterator only; the turn goes on.
        """
        require_asyncio("TurnHandle.preview")
        pipe = _Pipe()
        loop = self._bridge.loop
        call, scope = self._bridge.start(pipe.pump, self._handle.preview())
        call.add_done_callback(pipe.wake)
        try:
            while True:
                items = pipe.items
                while items:
                    item = items.popleft()
                    if item is _END:
                        if pipe.error is not None:
                            raise pipe.error
                        return
                    yield item
                if call.done():
                    call.result()  # the hub closed under the pump: raise why
                    return
                pipe.waiter = loop.create_future()
                await pipe.waiter
                pipe.waiter = None
        finally:
            if not call.done():
                call.cancel()  # nobody will read its result
                self._bridge.cancel(scope)

    async def outcome(self) -> TurnResult:
        """Wait for the turn's result (as :meth:`turnledger.sessions.TurnHandle.outcome`).

        Cancellation: detaches this waiter; no effect on the turn.
        """
        require_asyncio("TurnHandle.outcome")
        result: TurnResult = await self._bridge.run(self._handle.outcome)
        return result

    async def cancel(self) -> TurnResult:
        """Cancel this turn and wait for its result (as
        :meth:`turnledger.sessions.TurnHandle.cancel`).

        Cancellation: if cancelled before the Cancel was queued, nothing was
        sent; afterwards the turn is cancelled and only the wait is abandoned.
        """
        require_asyncio("TurnHandle.cancel")
        result: TurnResult = await self._bridge.run(self._handle.cancel)
        return result


@final
class Hub:
    """The session hub for asyncio code. Get one from :func:`open_hub`.

    Every method is the trio hub's (:class:`turnledger.sessions.Hub`), awaited
    from asyncio, with the same arguments, results and exceptions.
    """

    __slots__ = ("_bridge", "_hub")

    def __init__(self, bridge: _Bridge, hub: Any) -> None:
        self._bridge = bridge
        self._hub = hub

    async def submit(
        self,
        session_id: str,
        question: str,
        *,
        request_id: str | None = None,
        subject: str | None = None,
    ) -> TurnHandle:
        """Ask ``question`` in ``session_id``; returns once it is in the mailbox
        (``subject``: whom a session this creates belongs to).

        Cancellation: the question may still have been sent; submit again
        with the same ``request_id`` to join it without asking twice.
        """
        require_asyncio("Hub.submit")
        handle = await self._bridge.run(self._submit, session_id, question, request_id, subject)
        return TurnHandle(self._bridge, handle)

    async def _submit(
        self, session_id: str, question: str, request_id: str | None, subject: str | None
    ) -> Any:
        return await self._hub.submit(session_id, question, request_id=request_id, subject=subject)

    async def open_session(
        self,
        session_id: str,
        *,
        system: str | None = None,
        model: str | None = None,
        policy: HistoryPolicy | None = None,
        on_busy: OnBusy | None = None,
        subject: str | None = None,
        retention: RetentionPolicy | None = None,
    ) -> SessionState:
        """Start the session's actor, creating the session with these settings if new."""
        require_asyncio("Hub.open_session")

        async def call() -> SessionState:
            state: SessionState = await self._hub.open_session(
                session_id,
                system=system,
                model=model,
                policy=policy,
                on_busy=on_busy,
                subject=subject,
                retention=retention,
            )
            return state

        return await self._bridge.run(call)

    async def erase(self, session_id: str) -> Erasure:
        """Erase the session (see :meth:`turnledger.sessions.Hub.erase`).

        Cancellation: the erasure happened or it did not.
        """
        require_asyncio("Hub.erase")
        record: Erasure = await self._bridge.run(self._hub.erase, session_id)
        return record

    async def erase_subject(self, subject: str) -> list[Erasure]:
        """Erase every session of ``subject`` (see ``Hub.erase_subject``).

        Cancellation: each erasure happened or did not.
        """
        require_asyncio("Hub.erase_subject")
        records: list[Erasure] = await self._bridge.run(self._hub.erase_subject, subject)
        return records

    async def prune(
        self, policy: RetentionPolicy | None = None, *, dry_run: bool = False
    ) -> list[RetentionStep]:
        """Apply the retention policy (see ``Hub.prune``).

        Cancellation: each step happened or did not.
        """
        require_asyncio("Hub.prune")

        async def call() -> list[RetentionStep]:
            steps: list[RetentionStep] = await self._hub.prune(policy, dry_run=dry_run)
            return steps

        return await self._bridge.run(call)

    async def cancel(self, session_id: str) -> None:
        """Cancel the turn in flight in ``session_id``, if any."""
        require_asyncio("Hub.cancel")
        await self._bridge.run(self._hub.cancel, session_id)

    async def state(self, session_id: str) -> SessionState:
        """The session's state (the live actor's, or replayed from the store)."""
        require_asyncio("Hub.state")
        state: SessionState = await self._bridge.run(self._hub.state, session_id)
        return state

    async def history(self, session_id: str) -> tuple[Turn, ...]:
        """The session's committed turns, oldest first."""
        require_asyncio("Hub.history")
        turns: tuple[Turn, ...] = await self._bridge.run(self._hub.history, session_id)
        return turns

    async def edit(
        self, session_id: str, turn_index: int, question: str, *, request_id: str | None = None
    ) -> TurnHandle:
        """Ask ``question`` instead of the active branch's turn ``turn_index``,
        on a new branch (see :meth:`turnledger.sessions.Hub.edit`).

        Raises:
            UnknownSession, UnknownTurn: nothing was written.

        Cancellation: the question may still have been sent; submit again
        with the same ``request_id`` to join it without asking twice.
        """
        require_asyncio("Hub.edit")

        async def call() -> Any:
            return await self._hub.edit(session_id, turn_index, question, request_id=request_id)

        return TurnHandle(self._bridge, await self._bridge.run(call))

    async def regenerate(self, session_id: str, *, request_id: str | None = None) -> TurnHandle:
        """Ask the last question again on a new branch (see
        :meth:`turnledger.sessions.Hub.regenerate`).

        Raises:
            UnknownSession, UnknownTurn: nothing was written.

        Cancellation: as for :meth:`edit`.
        """
        require_asyncio("Hub.regenerate")

        async def call() -> Any:
            return await self._hub.regenerate(session_id, request_id=request_id)

        return TurnHandle(self._bridge, await self._bridge.run(call))

    async def switch(self, session_id: str, branch: str) -> None:
        """Make ``branch`` the active branch (see :meth:`turnledger.sessions.Hub.switch`).

        Raises:
            UnknownSession, UnknownBranch, SessionBusy: nothing was written.

        Cancellation: the switch happened or it did not; :meth:`branches` tells.
        """
        require_asyncio("Hub.switch")
        await self._bridge.run(self._hub.switch, session_id, branch)

    async def summarize(
        self,
        session_id: str,
        *,
        start: int = 0,
        end: int | None = None,
        branch: str | None = None,
        summarizer: ModelSummarizer | SummaryFunction | None = None,
        timeout: float | None = 60.0,
        request_id: str | None = None,
    ) -> SummaryRecorded:
        """Summarize turns ``start`` to ``end`` of a branch and record the
        summary (see :meth:`turnledger.sessions.Hub.summarize`). A function
        ``summarizer`` is an asyncio coroutine function: it runs on this loop.

        Raises:
            UnknownSession, UnknownBranch, UnknownTurn, SummaryFailed,
            StoreError: nothing was written.

        Cancellation: while the summary is written, nothing is recorded;
        afterwards it is recorded or not, and :meth:`summaries` tells.
        """
        require_asyncio("Hub.summarize")
        chosen = summarizer
        if chosen is not None and not isinstance(chosen, ModelSummarizer):
            chosen = _on_asyncio(chosen, asyncio.get_running_loop())
        call = functools.partial(
            self._hub.summarize,
            session_id,
            start=start,
            end=end,
            branch=branch,
            summarizer=chosen,
            timeout=timeout,
            request_id=request_id,
        )
        recorded: SummaryRecorded = await self._bridge.run(call)
        return recorded

    async def summaries(self, session_id: str) -> tuple[SummaryRecorded, ...]:
        """Every summary of the session, oldest first."""
        require_asyncio("Hub.summaries")
        listed: tuple[SummaryRecorded, ...] = await self._bridge.run(
            self._hub.summaries, session_id
        )
        return listed

    async def pin(
        self, session_id: str, text: str, *, origin: str, pin_id: str | None = None
    ) -> str:
        """Pin ``text`` to the session's context (see
        :meth:`turnledger.sessions.Hub.pin`); returns its id.

        Raises:
            UnknownSession, SessionBusy, InvalidCommand, StoreError: nothing
            was written.

        Cancellation: the pin happened or it did not; :meth:`pins` tells.
        """
        require_asyncio("Hub.pin")
        call = functools.partial(self._hub.pin, session_id, text, origin=origin, pin_id=pin_id)
        pinned: str = await self._bridge.run(call)
        return pinned

    async def unpin(self, session_id: str, pin_id: str) -> None:
        """Stop sending a pinned item (see :meth:`turnledger.sessions.Hub.unpin`).

        Raises:
            UnknownSession, UnknownPin, SessionBusy, StoreError: nothing was written.

        Cancellation: the unpin happened or it did not; :meth:`pins` tells.
        """
        require_asyncio("Hub.unpin")
        await self._bridge.run(self._hub.unpin, session_id, pin_id)

    async def pins(self, session_id: str) -> tuple[PinAdded, ...]:
        """The items pinned now, in the order they are sent."""
        require_asyncio("Hub.pins")
        listed: tuple[PinAdded, ...] = await self._bridge.run(self._hub.pins, session_id)
        return listed

    async def branches(self, session_id: str) -> tuple[BranchInfo, ...]:
        """Every branch of the session, ``main`` first (see
        :meth:`turnledger.sessions.Hub.branches`)."""
        require_asyncio("Hub.branches")
        listed: tuple[BranchInfo, ...] = await self._bridge.run(self._hub.branches, session_id)
        return listed

    async def drop(self, session_id: str) -> None:
        """Stop the session's actor, if one runs (see
        :meth:`turnledger.sessions.Hub.drop`).

        Cancellation: the actor stops anyway; only the wait is abandoned.
        """
        require_asyncio("Hub.drop")
        await self._bridge.run(self._hub.drop, session_id)

    def idle_sessions(self) -> list[str]:
        """Sessions whose actor runs with nothing in flight (see
        :meth:`turnledger.sessions.Hub.idle_sessions`)."""
        idle: list[str] = self._hub.idle_sessions()
        return idle

    async def fork(
        self, source: str, new_session_id: str, at_turn: int | None = None
    ) -> SessionForked:
        """Start ``new_session_id`` as a fork of ``source``, sharing its
        first ``at_turn`` turns by reference (see
        :meth:`turnledger.sessions.Hub.fork`).

        Raises:
            UnknownSession, UnknownTurn, SessionExists: nothing was written.

        Cancellation: the fork was made whole or not at all;
        :meth:`history` of ``new_session_id`` tells.
        """
        require_asyncio("Hub.fork")
        forked: SessionForked = await self._bridge.run(
            self._hub.fork, source, new_session_id, at_turn
        )
        return forked

    def statistics(self) -> HubStatistics:
        """Counters for monitoring and tests."""
        stats: HubStatistics = self._hub.statistics()
        return stats


def _on_asyncio(fn: SummaryFunction, loop: asyncio.AbstractEventLoop) -> SummaryFunction:
    """``fn`` (an asyncio coroutine function) as one the trio side awaits:
    its coroutine runs as a task of ``loop``, cancelled with the trio wait."""

    async def on_loop(turns: Sequence[Turn]) -> str:
        token = trio.lowlevel.current_trio_token()
        done = trio.Event()
        task = loop.create_task(_text(fn, turns))
        task.add_done_callback(lambda _: token.run_sync_soon(done.set))
        try:
            await done.wait()
        except BaseException:
            task.cancel()
            raise
        return task.result()

    on_loop.__qualname__ = getattr(fn, "__qualname__", type(fn).__name__)
    return on_loop


async def _text(fn: SummaryFunction, turns: Sequence[Turn]) -> str:
    return await fn(turns)


async def _opened(stack: contextlib.AsyncExitStack, given: Any) -> Any:
    if not callable(given):
        return given
    value = given()
    if inspect.isawaitable(value):
        value = await value
    close = getattr(value, "aclose", None)
    if close is not None:
        stack.push_async_callback(close)
    return value


class _Run:
    """The trio guest run behind one :func:`open_hub` context."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.loop = loop
        self.ready: asyncio.Future[Hub] = loop.create_future()
        self.done: asyncio.Future[None] = loop.create_future()
        self.token: trio.lowlevel.TrioToken | None = None
        self.stop_requested = False
        self.stop = trio.Event()
        self.bridge: _Bridge | None = None

    async def main(self, store: Any, provider: Any, options: dict[str, Any]) -> None:
        self.token = trio.lowlevel.current_trio_token()
        async with contextlib.AsyncExitStack() as stack:
            opened_store = await _opened(stack, store)
            opened_provider = await _opened(stack, provider)
            options = {**options, "snapshots": await _opened(stack, options.get("snapshots"))}
            async with trio.open_nursery() as calls:
                async with _trio_open_hub(opened_store, opened_provider, **options) as hub:
                    self.bridge = _Bridge(self.loop, self.token, calls)
                    if not self.ready.done():
                        self.ready.set_result(Hub(self.bridge, hub))
                    if not self.stop_requested:
                        await self.stop.wait()
                    self.bridge.closed = True
                # The hub is shut down: every ticket is resolved, so the calls
                # still waiting return; the grace only bounds a stuck one.
                calls.cancel_scope.deadline = trio.current_time() + options.get(
                    "shutdown_grace", 5.0
                )

    def request_stop(self) -> None:
        self.stop_requested = True
        if self.token is not None:
            with contextlib.suppress(trio.RunFinishedError):
                self.token.run_sync_soon(self.stop.set)

    def finished(self, result: outcome.Outcome[None]) -> None:
        if self.bridge is not None:
            self.bridge.fail_pending()
        if self.done.done():
            return
        if isinstance(result, outcome.Error):
            self.done.set_exception(result.error)
        else:
            self.done.set_result(None)

    async def wait_done(self) -> None:
        """Wait for the trio run to end, even through cancellations."""
        cancelled = False
        while not self.done.done():
            try:
                await asyncio.wait((self.done,))
            except asyncio.CancelledError:
                cancelled = True
        if cancelled:
            raise asyncio.CancelledError
        self.done.result()


def start_guest(
    loop: asyncio.AbstractEventLoop,
    done: Callable[[outcome.Outcome[Any]], object],
    fn: Callable[..., Awaitable[Any]],
    *args: Any,
) -> None:
    """Start ``fn(*args)`` as a trio guest run on ``loop`` (``done`` gets its
    outcome): how :func:`open_hub` runs trio, and benchmarks/aio.py too."""
    trio.lowlevel.start_guest_run(
        fn,
        *args,
        run_sync_soon_threadsafe=loop.call_soon_threadsafe,
        run_sync_soon_not_threadsafe=loop.call_soon,
        done_callback=done,
        host_uses_signal_set_wakeup_fd=True,
    )


@asynccontextmanager
async def open_hub(
    store: Opener[EventStore],
    provider: Opener[Provider],
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
    snapshots: Opener[SnapshotStore] | None = None,
    snapshot_every: int | None = 1000,
    snapshot_chars: int | None = 4_000_000,
    max_pinned_tokens: int | None = None,
    max_summary_tokens: int | None = None,
    summary_policy: SummaryPolicy | None = None,
) -> AsyncIterator[Hub]:
    """Run the session hub on the running asyncio loop while the context is open.

    Args:
        store, provider: the objects :func:`turnledger.sessions.open_hub`
            takes, or openers of them (see :data:`Opener`): a store that
            opens under trio is given as ``lambda: SQLiteStore.open(path)``.
        model, and every other keyword: those of
            :func:`turnledger.sessions.open_hub`, with the same defaults
            and meaning (``system``, ``policy``, ``on_busy``, ``tools``,
            ``max_request_bytes``, ``context_window``, ``turn_deadline``,
            ``idle_timeout``, ``shutdown_grace``, ``retention``, ...); a test checks that
            the two signatures agree, so a type checker catches a
            misspelt option here as it does there. ``snapshots``, like
            ``store``, may be an opener (``lambda: snapshots_beside(db)``),
            called and closed on the trio side. A ``summary_policy``'s
            function summarizer is an asyncio coroutine function, run on
            this loop.

    Raises:
        WrongEventLoop: called from trio (use :func:`turnledger.sessions.open_hub`).
        The errors of :func:`turnledger.sessions.open_hub` and of the openers.

    On exit the hub shuts down as the trio one does; an exit by cancellation
    waits for that shutdown (bounded by ``shutdown_grace``) before the
    cancellation goes on.

    Cancellation: cancelling the task that enters the context, while the hub
    opens, stops the trio run and waits for it to end before the
    cancellation goes on; cancelling the task that holds the context shuts
    the hub down as leaving it does.
    """
    options: dict[str, Any] = {
        "model": model,
        "system": system,
        "policy": policy,
        "on_busy": on_busy,
        "tools": tools,
        "tool_choice": tool_choice,
        "max_tool_rounds": max_tool_rounds,
        "on_tool_error": on_tool_error,
        "max_request_bytes": max_request_bytes,
        "max_prompt_tokens": max_prompt_tokens,
        "token_estimator": token_estimator,
        "context_window": context_window,
        "output_reserve": output_reserve,
        "turn_deadline": turn_deadline,
        "idle_timeout": idle_timeout,
        "passivate_after": passivate_after,
        "mailbox_size": mailbox_size,
        "shutdown_grace": shutdown_grace,
        "clock": clock,
        "retention": retention,
        "snapshots": snapshots,
        "snapshot_every": snapshot_every,
        "snapshot_chars": snapshot_chars,
        "max_pinned_tokens": max_pinned_tokens,
        "max_summary_tokens": max_summary_tokens,
        "summary_policy": summary_policy,
    }
    require_asyncio("open_hub")
    loop = asyncio.get_running_loop()
    if summary_policy is not None and not isinstance(summary_policy.summarizer, ModelSummarizer):
        options["summary_policy"] = attrs.evolve(
            summary_policy, summarizer=_on_asyncio(summary_policy.summarizer, loop)
        )
    run = _Run(loop)
    start_guest(loop, run.finished, run.main, store, provider, options)
    try:
        await asyncio.wait((run.ready, run.done), return_when=asyncio.FIRST_COMPLETED)
    except BaseException:
        run.request_stop()
        await run.wait_done()
        raise
    if not run.ready.done():
        await run.wait_done()  # raises the error that ended the run
        raise SessionClosed("the hub's trio run ended before the hub opened")
    hub = run.ready.result()
    try:
        yield hub
    finally:
        hub._bridge.closed = True
        run.request_stop()
        await run.wait_done()
