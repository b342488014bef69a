"""Random schedules of Submit / Cancel / timeouts / provider steps across sessions.

Hypothesis picks the order of everything the outside world does: callers
submit, retry and cancel; each provider request begins, streams, finishes
(well or badly), fails or ends early; time passes (deadlines, idle timeouts,
passivation). After every schedule DESIGN.md's invariants must hold:

1. committed history holds only whole pairs whose answer was accepted;
2. every TurnSubmitted is followed by exactly one TurnCommitted or
   TurnDiscarded for its request, and every submitted turn reaches its
   caller as exactly one outcome, the one in the log;
3. nothing for a request other than the one in flight changes state;
4. replay(store log) == live state, at every quiescent point;
5. a turn reported committed is in the store when the caller learns it.
"""

from __future__ import annotations

from typing import Any

import attrs
import trio
import trio.testing
from hypothesis import given, settings
from hypothesis import strategies as st

from turnledger import SessionClosed
from turnledger.events import (
    DEFAULT_CODEC,
    CompletionIgnored,
    Event,
    SessionStarted,
    StreamStarted,
    TurnCommitted,
    TurnDiscarded,
    TurnRejected,
    TurnRetried,
    TurnSubmitted,
)
from turnledger.sessions import (
    CommittedResult,
    DiscardedResult,
    RejectedResult,
    TurnHandle,
    open_hub,
    replay,
)
from turnledger.testing import Begin, Chunk, Fail, Finish, ScriptedProvider, Step

from ._helpers import HookedStore

SESSIONS = 3
# -1: the session's newest request (mostly); else an older one
which = st.one_of(st.just(-1), st.just(-1), st.just(-1), st.integers(0, 4))
session = st.integers(0, SESSIONS - 1)
SUBMIT = st.tuples(
    st.just("submit"), session, st.sampled_from(["new", "new", "auto", "auto", "empty", "repeat"])
)
# a whole well-formed answer at once (the happy path, so that turns commit)
PLAY = st.tuples(st.just("play"), session, which)
FINISH = st.tuples(
    st.just("finish"),
    session,
    which,
    st.sampled_from(["answer", "answer", "answer", "empty", "blank"]),
    st.sampled_from(["stop", "stop", "stop", "length", None]),
)
OPS = st.one_of(
    SUBMIT,
    SUBMIT,
    SUBMIT,
    PLAY,
    PLAY,
    FINISH,
    st.tuples(st.just("cancel_session"), session),
    st.tuples(st.just("cancel_turn"), st.integers(0, 40)),
    st.tuples(st.just("begin"), session, which),
    st.tuples(st.just("chunk"), session, which),
    st.tuples(st.just("fail"), session, which, st.sampled_from(["transport", "malformed"])),
    st.tuples(st.just("close"), session, which),
    st.tuples(st.just("sleep"), st.sampled_from([0.5, 3.0, 9.0, 21.0, 40.0])),
    st.tuples(st.just("settle")),
    st.tuples(st.just("settle")),
)


@attrs.define
class Asked:
    session_id: str
    request_id: str
    question: str
    handle: TurnHandle
    repeat: bool
    results: list[Any] = attrs.field(factory=list)


def store_events(store: HookedStore, session_id: str) -> list[Event]:
    # Synchronous read of what the store holds right now.
    return [DEFAULT_CODEC.decode(s) for s in store._streams.get(session_id, [])]


class World:
    def __init__(self) -> None:
        self.store = HookedStore()
        self.provider = ScriptedProvider(steered=True)
        self.asked: list[Asked] = []
        self.rids: dict[str, list[str]] = {f"s{i}": [] for i in range(SESSIONS)}
        self.first_terminal: dict[str, Step] = {}
        self.counter = 0

    def target(self, sid: str, pick: int) -> str | None:
        rids = self.rids[sid]
        if not rids:
            return None
        return rids[-1] if pick < 0 else rids[pick % len(rids)]

    def steer(self, rid: str, step: Step) -> None:
        if isinstance(step, (Finish, Fail)) or step == "close":
            self.first_terminal.setdefault(rid, step)  # type: ignore[arg-type]
        channel = self.provider.steer(rid)
        if step == "close":
            channel.close()
        elif rid not in self.first_terminal or self.first_terminal[rid] is step:
            channel.send_nowait(step)

    async def watch(self, asked: Asked) -> None:
        try:
            result = await asked.handle.outcome()
        except SessionClosed as exc:
            asked.results.append(exc)
            return
        asked.results.append(result)
        if isinstance(result, CommittedResult):
            # invariant 5: already durable when the caller hears of it
            assert TurnCommitted(result.request_id, result.answer, "stop") in store_events(
                self.store, asked.session_id
            )

    async def cancel_turn(self, asked: Asked) -> None:
        try:
            result = await asked.handle.cancel()
        except SessionClosed:
            return
        # a cancel never changes an outcome already given
        assert result == (await asked.handle.outcome())

    async def check_quiescent(self, hub: Any) -> None:
        await trio.testing.wait_all_tasks_blocked()
        for sid in self.rids:
            if sid in hub._routes.actors:
                live = await hub.state(sid)
                # invariant 4
                assert live == replay(store_events(self.store, sid))


async def run_schedule(ops: list[tuple[Any, ...]], on_busy: str) -> World:
    world = World()
    async with (
        trio.open_nursery() as side,
        open_hub(
            world.store,
            world.provider,
            model="m",
            on_busy=on_busy,  # type: ignore[arg-type]
            turn_deadline=20,
            idle_timeout=8,
            passivate_after=30,
            mailbox_size=4,
        ) as hub,
    ):
        for op in ops:
            kind = op[0]
            if kind == "submit":
                sid = f"s{op[1]}"
                if op[2] == "repeat" and world.rids[sid]:
                    rid = world.rids[sid][world.counter % len(world.rids[sid])]
                    question, repeat = f"q-{rid}", True
                else:
                    world.counter += 1
                    rid = f"{sid}-r{world.counter}"
                    question = "  " if op[2] == "empty" else f"q-{rid}"
                    repeat = False
                    world.rids[sid].append(rid)
                if op[2] == "auto":  # its provider answers well at once
                    for step in (Begin(), Chunk("x"), Finish(f"ans-{rid}", "stop")):
                        world.steer(rid, step)
                handle = await hub.submit(sid, question, request_id=rid)
                asked = Asked(sid, rid, question, handle, repeat)
                world.asked.append(asked)
                side.start_soon(world.watch, asked)
            elif kind == "cancel_session":
                await hub.cancel(f"s{op[1]}")
            elif kind == "cancel_turn":
                if world.asked:
                    side.start_soon(world.cancel_turn, world.asked[op[1] % len(world.asked)])
            elif kind == "sleep":
                await trio.sleep(op[1])
            elif kind == "settle":
                await world.check_quiescent(hub)
            else:
                rid = world.target(f"s{op[1]}", op[2])
                if rid is None:
                    continue
                step: Any
                if kind == "play":
                    for step in (Begin(), Chunk("x"), Finish(f"ans-{rid}", "stop")):
                        world.steer(rid, step)
                    continue
                if kind == "begin":
                    step = Begin()
                elif kind == "chunk":
                    step = Chunk("x")
                elif kind == "finish":
                    answer = {"answer": f"ans-{rid}", "empty": "", "blank": " \n"}[op[3]]
                    step = Finish(answer, op[4])
                elif kind == "fail":
                    step = Fail(op[3])
                else:
                    step = "close"
                world.steer(rid, step)
        await world.check_quiescent(hub)
    return world


def check_log(world: World, sid: str) -> None:
    events = store_events(world.store, sid)
    if not events:
        return
    assert isinstance(events[0], SessionStarted)
    current: str | None = None
    seen: set[str] = set()
    for ev in events[1:]:
        assert not isinstance(ev, SessionStarted)
        rid = ev.request_id
        if isinstance(ev, (TurnSubmitted, TurnRejected)):
            # a request id is recorded once, and a new turn waits for the last
            assert rid not in seen and rid != current
            seen.add(rid)
            if isinstance(ev, TurnSubmitted):
                assert current is None
                current = rid
        elif isinstance(ev, (StreamStarted, TurnRetried)):
            assert rid == current  # invariant 3
        elif isinstance(ev, (TurnCommitted, TurnDiscarded)):
            assert rid == current  # invariants 2 and 3
            current = None
        else:
            assert isinstance(ev, CompletionIgnored) and rid != current
    assert current is None  # the hub's close ended every turn

    # invariant 1: every committed pair is a question asked and an accepted answer
    state = replay(events)
    asked = {a.request_id: a.question for a in world.asked if not a.repeat}
    for turn in state.turns:
        assert turn.question == asked[turn.request_id]
        assert turn.answer == f"ans-{turn.request_id}"
        assert world.first_terminal[turn.request_id] == Finish(turn.answer, "stop")


def _ending(result: Any) -> tuple[Any, ...]:
    """What a result says about its turn, whoever asked."""
    detail = getattr(result, "answer", None) or getattr(result, "reason", None)
    return type(result), result.request_id, detail


def check_outcomes(world: World) -> None:
    first = {a.request_id: a for a in world.asked if not a.repeat}
    for a in world.asked:
        assert len(a.results) == 1, a  # exactly one outcome per submitted turn
        (result,) = a.results
        events = [
            e
            for e in store_events(world.store, a.session_id)
            if not isinstance(e, (SessionStarted, CompletionIgnored))
            and e.request_id == a.request_id
        ]
        assert not isinstance(result, SessionClosed), (a, events)
        if not a.repeat:
            assert not result.repeated, a  # the first submit of an id is never a repeat
        else:
            # a repeat gets the first submit's outcome: joined while in
            # flight (repeated=False) or given back once ended (repeated=True)
            assert _ending(result) == _ending(first[a.request_id].results[0]), a
        final = events[-1]
        if isinstance(result, CommittedResult):
            assert isinstance(final, TurnCommitted) and final.answer == result.answer
        elif isinstance(result, DiscardedResult):
            assert isinstance(final, TurnDiscarded) and final.reason == result.reason
        else:
            assert isinstance(result, RejectedResult)
            assert isinstance(final, TurnRejected) and final.reason == result.reason


@settings(max_examples=300, deadline=None)
@given(
    ops=st.lists(OPS, min_size=10, max_size=60),
    on_busy=st.sampled_from(["reject", "supersede"]),
)
def test_random_schedules_keep_the_invariants(ops: list[tuple[Any, ...]], on_busy: str) -> None:
    world = trio.run(run_schedule, ops, on_busy, clock=trio.testing.MockClock(autojump_threshold=0))
    for sid in world.rids:
        check_log(world, sid)
    check_outcomes(world)
