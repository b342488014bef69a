"""A deterministic simulation of the whole runtime under faults.

:func:`simulate` runs the real hub and actors under trio's ``MockClock``
(autojump) with everything random drawn from one seed: trio's own scheduler
(as pytest-trio does under Hypothesis), a :class:`FaultyStore` over a
:class:`MemoryStore`, a :class:`FaultyProvider`, tools that answer, hang or
raise, and a workload of callers per session that submit with and without
request ids, retry with the same id, cancel a turn or the session, submit
over a turn in flight (``on_busy`` reject or supersede), wait long enough
for their actor to be passivated, and see the hub shut down or the process
crash. The same seed gives the same run, event for event.

A run is a few incarnations of a process on one store. Each ends by a
graceful shutdown (possibly with turns in flight) or a crash
(:meth:`FaultyStore.kill`; its callers die with it), and the next reopens
the store from what was durable. A last incarnation without faults starts
every session (closing turns left in flight) and asks again, with the same
request id, every question that was acknowledged as committed.

The invariants, checked on a session after every step of its caller and
every result a caller receives, and on every session after each
incarnation and at the end (:func:`check_log` is the log half):

- nothing acknowledged as committed is lost after any crash: a
  ``CommittedResult`` a caller received is in the store, with its answer;
- history equals replay of the store: the live actor's state at rest equals
  ``replay`` of the log, whose turns equal a reference fold that does not
  use ``evolve``; what a caller was told equals what the log says;
- every request id ends exactly once (at most once while running, exactly
  once at the end), and no event of a request follows its end
  (``CompletionIgnored`` excepted: it records exactly that);
- no tool call without its result, in history or in any request sent;
- no preview text in history: every committed answer is an answer the
  provider returned for that request and its last round;
- epochs only grow: the incarnations' writes come in order of epoch (none
  after a crash), and a request's rounds go 0, 1, 2 ...;
- an actor stops only for a store fault or a shutdown, never for anything
  else (a log it could not fold, say).

Store faults. Today a store fault under a turn stops the session's actor
(its callers get ``SessionClosed``); a runtime may instead end the turn as
a store error and go on. The invariants hold under both: a store fault may
end a turn or close a session, but never loses an acknowledged commit and
never lets anything unaccepted into history. (A result whose reason is
``store_error`` is not compared with the log: the store could not say.)
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import logging
import random
import traceback
from collections.abc import Callable, Sequence
from typing import Any, Final

import attrs
import structlog
import trio
import trio.testing

from .._errors import InvalidCommand, ReplayError, SessionClosed, StoreError
from ..adapters.stores.memory import MemoryStore
from ..events import (
    DEFAULT_CODEC,
    CompletionIgnored,
    Event,
    StreamStarted,
    ToolCallsRequested,
    ToolResultRecorded,
    ToolRoundSubmitted,
    TurnCommitted,
    TurnDiscarded,
    TurnRejected,
    TurnRetried,
    TurnSubmitted,
)
from ..sessions import (
    CommittedResult,
    DiscardedResult,
    SessionState,
    Tool,
    ToolError,
    ToolInvocation,
    TurnResult,
    is_in_flight,
    open_hub,
    replay,
)
from ._faults import FaultyProvider, FaultyStore, Leases, dangling_calls

__all__ = ["SimulationFailure", "SimulationReport", "check_log", "simulate"]

#: What a failing seed prints to be replayed exactly.
REPLAY: Final = "python scripts/simulate.py --seed {seed}"

_ENDS: Final = (TurnCommitted, TurnDiscarded, TurnRejected)


class SimulationFailure(AssertionError):
    """An invariant broke; the message names the seed and how to replay it."""

    def __init__(self, seed: int, problems: Sequence[str]) -> None:
        self.seed = seed
        self.problems = tuple(problems)
        lines = "\n".join(f"  {p}" for p in problems[:20])
        super().__init__(
            f"seed {seed}: {len(problems)} invariant(s) broken\n{lines}\n"
            f"replay: {REPLAY.format(seed=seed)}"
        )


@attrs.frozen
class SimulationReport:
    """What one seed did."""

    seed: int
    incarnations: int
    crashes: int
    #: Processes that stalled, had their sessions taken over, and woke up.
    stalls: int
    submits: int
    committed: int
    store_faults: int
    events: int
    #: A digest of every stored event and every result: equal for equal runs.
    digest: str


@attrs.define
class _Run:
    """What a run has seen so far: the ground truth the checks compare with."""

    seed: int
    rng: random.Random
    inner: MemoryStore
    provider: FaultyProvider
    leases: Leases = attrs.Factory(Leases)
    writes: list[tuple[int, str, int, int]] = attrs.Factory(list)
    #: (session, request id) -> answer, for every CommittedResult received.
    acked: dict[tuple[str, str], str] = attrs.Factory(dict)
    #: (session, request id, result) for every result received.
    results: list[tuple[str, str, TurnResult]] = attrs.Factory(list)
    problems: list[str] = attrs.Factory(list)
    decoded: dict[str, list[Event]] = attrs.Factory(dict)
    #: The replay of each session's first events (a fold goes on from there).
    replayed: dict[str, tuple[int, SessionState]] = attrs.Factory(dict)
    submits: int = 0
    crashes: int = 0
    stalls: int = 0
    store_faults: int = 0

    def fail(self, problem: str) -> None:
        if problem not in self.problems:
            self.problems.append(problem)


def check_log(
    session_id: str,
    events: Sequence[Event],
    answers: dict[tuple[str, int], list[str]] | None = None,
) -> list[str]:
    """The invariants of one session's log, without ``evolve`` (a reference
    fold of its own), and ``replay`` checked against it.

    Args:
        answers: the answers the provider returned, by ``(request id,
            round)``; when given, every committed answer must be one of
            them for the request's last round.

    Returns:
        What is wrong, one line each (empty if nothing).
    """
    return _check_log(session_id, events, answers)[0]


def _check_log(
    session_id: str,
    events: Sequence[Event],
    answers: dict[tuple[str, int], list[str]] | None,
    replayed: tuple[int, SessionState] | None = None,
) -> tuple[list[str], SessionState | None]:
    # ``replayed``: the replay of the first events, folded on from there.
    out: list[str] = []
    questions: dict[str, str] = {}
    rounds: dict[str, int] = {}
    ended: dict[str, Event] = {}
    history: list[tuple[str, str, str]] = []
    where = session_id
    for i, ev in enumerate(events, 1):
        rid = getattr(ev, "request_id", None)
        if rid is None or type(ev) is CompletionIgnored:
            continue
        at = f"{where} seq {i} {type(ev).__name__}({rid})"
        if rid in ended:
            out.append(f"{at} follows the request's end {type(ended[rid]).__name__}")
            continue
        if type(ev) is TurnSubmitted:
            questions[rid] = ev.question
            rounds[rid] = 0
        elif type(ev) is TurnRejected:
            ended[rid] = ev
        elif rid not in questions:
            out.append(f"{at} for a request never submitted")
        elif type(ev) is ToolCallsRequested:
            if ev.round != rounds[rid]:
                out.append(f"{at} round {ev.round} while round {rounds[rid]} is out")
        elif type(ev) is ToolRoundSubmitted:
            if ev.round != rounds[rid] + 1:
                out.append(f"{at} round {ev.round} after round {rounds[rid]}")
            rounds[rid] = ev.round
        elif type(ev) is TurnCommitted:
            ended[rid] = ev
            history.append((rid, questions[rid], ev.answer))
            if answers is not None and ev.answer not in answers.get((rid, rounds[rid]), ()):
                out.append(
                    f"{at} answer {ev.answer!r} is not what the provider answered "
                    f"to round {rounds[rid]}"
                )
        elif type(ev) is TurnDiscarded:
            ended[rid] = ev
        else:
            assert type(ev) in (StreamStarted, ToolResultRecorded, TurnRetried), ev
    try:
        done, state = (0, None) if replayed is None else replayed
        state = replay(events[done:], state)
    except ReplayError as exc:
        return [*out, f"{where}: the log does not replay: {exc}"], None
    turns = [(t.request_id, t.question, t.answer) for t in state.turns]
    if turns != history:
        out.append(f"{where}: replay's history {turns} is not the log's {history}")
    for t in state.turns:
        for r in t.rounds:
            if not r.complete:
                out.append(f"{where}: {t.request_id} is history with a call left unanswered")
    return out, state


def _ending(events: Sequence[Event], rid: str) -> Event | None:
    for ev in events:
        if type(ev) in _ENDS and ev.request_id == rid:  # type: ignore[union-attr]
            return ev
    return None


def _agrees(result: TurnResult, ending: Event | None) -> bool:
    if isinstance(result, CommittedResult):
        return type(ending) is TurnCommitted and ending.answer == result.answer
    if isinstance(result, DiscardedResult):
        return type(ending) is TurnDiscarded and ending.reason == result.reason
    return type(ending) is TurnRejected and ending.reason == result.reason


async def _check_session(run: _Run, sid: str, hub: Any = None) -> None:
    """Every invariant of one session, now."""
    events = await _events(run, sid)
    problems, state = _check_log(sid, events, run.provider.answers, run.replayed.get(sid))
    for p in problems:
        run.fail(p)
    if state is not None:
        run.replayed[sid] = (len(events), state)
    for (s, rid), answer in run.acked.items():
        ending = _ending(events, rid) if s == sid else None
        if s == sid and not (type(ending) is TurnCommitted and ending.answer == answer):
            run.fail(f"{sid}/{rid} was acknowledged as committed and is not in the store")
    for s, rid, result in run.results:
        if s == sid and not _agrees(result, _ending(events, rid)):
            run.fail(f"{sid}/{rid}: the caller was told {result!r}, the log says otherwise")
    if hub is not None:
        actor = hub._routes.actors.get(sid)
        at_rest = actor is not None and actor.state.version == len(events)
        if at_rest and actor.state != state:
            run.fail(f"{sid}: the live state is not the replay of the store")


async def _events(run: _Run, sid: str) -> list[Event]:
    """The session's events in the store, decoded (each once per run: a
    store never changes what it holds)."""
    decoded = run.decoded.setdefault(sid, [])
    stored = await run.inner.read(sid, len(decoded))
    # (Another check may have read some of them meanwhile.)
    decoded += [DEFAULT_CODEC.decode(e) for e in stored if e.seq > len(decoded)]
    return decoded


def _check_writes(run: _Run) -> None:
    last: dict[str, int] = {}
    for epoch, sid, seq, _ in run.writes:
        if epoch < last.get(sid, 0):
            run.fail(f"{sid} seq {seq} was written under epoch {epoch} after epoch {last[sid]}")
        last[sid] = max(epoch, last.get(sid, 0))


def _tools(rng: random.Random) -> list[Tool]:
    async def lookup(inv: ToolInvocation) -> str:
        await trio.sleep(rng.uniform(0.0, 3.0))
        return f"looked up for {inv.call_id}"

    async def hang(inv: ToolInvocation) -> str:
        await trio.sleep_forever()
        raise AssertionError("unreachable")

    async def broken(inv: ToolInvocation) -> str:
        await trio.sleep(rng.uniform(0.0, 1.0))
        if rng.random() < 0.5:
            raise ToolError("the tool said no")
        raise RuntimeError("the tool crashed")

    return [Tool("lookup", lookup), Tool("hang", hang), Tool("broken", broken)]


@attrs.frozen
class _Plan:
    """What one seed does (drawn from it)."""

    sessions: tuple[str, ...]
    supersede: frozenset[str]
    store_rate: float
    incarnations: int
    ops: int
    mailbox_size: int


def _plan(rng: random.Random) -> _Plan:
    n = rng.randint(1, 3)
    sessions = tuple(f"s{i}" for i in range(n))
    return _Plan(
        sessions,
        frozenset(s for s in sessions if rng.random() < 0.5),
        rng.choice((0.0, 0.03, 0.1, 0.25)),
        rng.randint(1, 3),
        rng.randint(2, 5),
        rng.choice((2, 16)),
    )


async def _watch(run: _Run, sid: str, handle: Any, cancel: bool, hub: Any) -> None:
    try:
        result = await (handle.cancel() if cancel else handle.outcome())
    except SessionClosed as exc:
        cause = exc.__cause__
        if cause is not None and not isinstance(cause, StoreError):
            run.fail(f"{sid}: the actor stopped on {type(cause).__name__}: {cause}")
        return
    # A turn ended by a store error may or may not be in the log (the store
    # failed to say): the caller learns its fate by asking again.
    if getattr(result, "reason", None) != "store_error":
        run.results.append((sid, handle.request_id, result))
    if isinstance(result, CommittedResult):
        run.acked[(sid, handle.request_id)] = result.answer
    await _check_session(run, sid, hub)


async def _caller(
    run: _Run, hub: Any, sid: str, plan: _Plan, rng: random.Random, watchers: trio.Nursery
) -> None:
    known: list[str] = []
    handles: list[Any] = []
    for _ in range(plan.ops):
        what = rng.choices(
            ("submit", "submit_anon", "retry", "cancel_turn", "cancel", "wait", "idle", "empty"),
            (6, 2, 2, 1, 1, 2, 1, 1),
        )[0]
        try:
            if what.startswith("submit") or what == "empty" or (what == "retry" and known):
                if what == "retry":
                    rid: str | None = rng.choice(known)
                elif what == "submit_anon":
                    rid = None
                else:
                    rid = f"{sid}-{run.submits}"
                run.submits += 1
                question = "" if what == "empty" else f"question {run.submits} of {sid}"
                handle = await hub.submit(sid, question, request_id=rid)
                known.append(handle.request_id)
                handles.append(handle)
                watchers.start_soon(_watch, run, sid, handle, False, hub)
            elif what == "cancel_turn" and handles:
                watchers.start_soon(_watch, run, sid, rng.choice(handles), True, hub)
            elif what == "cancel":
                await hub.cancel(sid)
            elif what == "wait" and handles:
                with trio.move_on_after(rng.uniform(0.0, 120.0)):
                    await handles[-1].outcome()
            elif what == "idle":
                await trio.sleep(rng.uniform(30.0, 200.0))  # the actor passivates
        except (SessionClosed, StoreError):
            pass  # the hub is closing, or the store refuses: try the next step
        await trio.sleep(rng.uniform(0.0, 10.0))
        await _check_session(run, sid, hub)


async def _callers(
    run: _Run, hub: Any, plan: _Plan, seconds: float, watchers: trio.Nursery
) -> None:
    with trio.move_on_after(seconds):
        async with trio.open_nursery() as callers:
            for sid in plan.sessions:
                rng = random.Random(run.rng.random())
                callers.start_soon(_caller, run, hub, sid, plan, rng, watchers)


async def _incarnation(
    run: _Run,
    plan: _Plan,
    *,
    last: bool,
    task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED,
) -> None:
    """One process on the store, until it closes, crashes or stalls (the
    next one starts when it crashed or closed, or as soon as it stalls)."""
    rng = run.rng
    store = FaultyStore(
        run.inner,
        random.Random(rng.random()),
        rate=0.0 if last else plan.store_rate,
        leases=run.leases,
        writes=run.writes,
    )
    ending = "close" if last else rng.choice(("close", "crash", "crash", "stall"))
    hub_options: dict[str, Any] = {
        "model": "sim",
        "tools": _tools(random.Random(rng.random())),
        "turn_deadline": 120.0,
        "idle_timeout": 30.0,
        "passivate_after": 60.0,
        "mailbox_size": plan.mailbox_size,
        "clock": trio.current_time,
    }
    started = False
    with trio.CancelScope() as life:
        async with (
            trio.open_nursery() as watchers,
            open_hub(store, run.provider, **hub_options) as hub,
        ):
            for sid in plan.sessions:
                with contextlib.suppress(SessionClosed, StoreError, InvalidCommand):
                    await hub.open_session(
                        sid, on_busy="supersede" if sid in plan.supersede else "reject"
                    )
            if last:
                for sid, rid in list(run.acked):
                    handle = await hub.submit(sid, "asked again", request_id=rid)
                    watchers.start_soon(_watch, run, sid, handle, False, hub)
            else:
                await _callers(run, hub, plan, rng.uniform(0.0, 400.0), watchers)
            if ending == "crash":
                # The process dies here: nothing it does from now on
                # reaches the store, and its callers die with it.
                store.kill()
                run.crashes += 1
                life.cancel()
            elif ending == "stall":
                # It stalls; the next process takes its sessions over. Then it
                # wakes up and goes on for a while, as if nothing happened.
                store.freeze()
                run.stalls += 1
                task_status.started()
                started = True
                await trio.sleep(rng.uniform(10.0, 300.0))
                store.thaw()
                await _callers(run, hub, plan, rng.uniform(0.0, 100.0), watchers)
    store.kill()  # the process has exited: its leases, if any, are free
    run.store_faults += sum(len(f) for f in store.injected.values())
    for sid in plan.sessions:
        await _check_session(run, sid)
    _check_writes(run)
    if not started:
        task_status.started()


async def _main(run: _Run) -> SimulationReport:
    plan = _plan(run.rng)
    async with trio.open_nursery() as processes:
        for _ in range(plan.incarnations):
            await processes.start(functools.partial(_incarnation, run, plan, last=False))
    await _incarnation(run, plan, last=True)
    digest = hashlib.sha256()
    events = 0
    for sid in plan.sessions:
        stored = await run.inner.read(sid)
        decoded = await _events(run, sid)
        events += len(decoded)
        problems, state = _check_log(sid, decoded, run.provider.answers)  # all over again
        for p in problems:
            run.fail(p)
        if state is None or is_in_flight(state):
            run.fail(f"{sid}: still in flight after every session was started again")
        for ev in decoded:
            if type(ev) is TurnSubmitted and _ending(decoded, ev.request_id) is None:
                run.fail(f"{sid}/{ev.request_id} never ended")
        digest.update(repr([(e.seq, e.tag, e.payload) for e in stored]).encode())
    for dangling in (dangling_calls(r) for r in run.provider.requests):
        if dangling:
            run.fail(f"a request carried tool calls without their results: {dangling}")
    digest.update(repr(run.results).encode())
    committed = sum(1 for *_, r in run.results if isinstance(r, CommittedResult))
    return SimulationReport(
        run.seed,
        plan.incarnations,
        run.crashes,
        run.stalls,
        run.submits,
        committed,
        run.store_faults,
        events,
        digest.hexdigest()[:16],
    )


def _leaves(exc: BaseException) -> list[BaseException]:
    if isinstance(exc, BaseExceptionGroup):
        return [leaf for sub in exc.exceptions for leaf in _leaves(sub)]
    return [exc]


def simulate(seed: int, *, on_problem: Callable[[str], None] | None = None) -> SimulationReport:
    """Run the simulation of ``seed`` (see the module docstring).

    Args:
        on_problem: called with each broken invariant as it is found
            (default: none; they are raised together at the end).

    Raises:
        SimulationFailure: an invariant broke; its message ends with the
            command that replays the seed.
    """
    import trio._core._run as trio_run

    from ..runtime import _hub as hub_ids

    rng = random.Random(seed)
    provider = FaultyProvider(random.Random(rng.random()), tools=("lookup", "hang", "broken"))
    run = _Run(seed, rng, MemoryStore(), provider)
    # trio picks the order of each batch of runnable tasks from its own
    # random source: seeded, the run is the seed's alone (pytest-trio does
    # the same under Hypothesis).
    saved = trio_run._ALLOW_DETERMINISTIC_SCHEDULING
    trio_run._ALLOW_DETERMINISTIC_SCHEDULING = True  # type: ignore[misc]
    trio_run._r.seed(seed)
    # The ids the hub gives Submits without one come from os.urandom: these
    # come from the seed.
    ids = hub_ids._ids[:]
    hub_ids._ids[:] = [f"{rng.getrandbits(128):032x}" for _ in range(256)]
    logging_config = structlog.get_config()
    # Thousands of lines a seed otherwise; restored after the run.
    structlog.configure(wrapper_class=structlog.make_filtering_bound_logger(logging.CRITICAL))
    try:
        report = trio.run(_main, run, clock=trio.testing.MockClock(autojump_threshold=0))
    except Exception as exc:
        for leaf in _leaves(exc):
            where = traceback.extract_tb(leaf.__traceback__)[-1]
            run.fail(
                f"the run raised {type(leaf).__name__}: {leaf} ({where.filename}:{where.lineno})"
            )
        report = None
    finally:
        trio_run._ALLOW_DETERMINISTIC_SCHEDULING = saved  # type: ignore[misc]
        hub_ids._ids[:] = ids
        structlog.configure(**logging_config)
    if run.problems:
        if on_problem is not None:
            for p in run.problems:
                on_problem(p)
        raise SimulationFailure(seed, run.problems)
    assert report is not None
    return report
