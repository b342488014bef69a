"""The actor's request task: kept from turn to turn, never waited for when busy."""

from __future__ import annotations

from typing import Any

import trio
from trio.testing import wait_all_tasks_blocked

from turnledger.events import CompletionIgnored, RequestId, TurnCommitted, TurnDiscarded
from turnledger.runtime._actor import KEEP_REQUEST_TASK
from turnledger.sessions import CommittedResult, DiscardedResult, open_hub
from turnledger.testing import Begin, Finish, Hang, Hook, ScriptedProvider, Step

from ._helpers import HookedStore, events_of

R1, R2, R3 = RequestId("r1"), RequestId("r2"), RequestId("r3")


def through_request_task() -> ScriptedProvider:
    """Answers ``ok`` through ``complete()``, in the request task (an
    ``instant()`` provider answers at once, without one)."""
    return ScriptedProvider(lambda _request: [Finish("ok")])


def request_tasks() -> list[trio.lowlevel.Task]:
    """Every task of this run named like the actor's request task."""
    found = []
    todo = [trio.lowlevel.current_root_task()]
    while todo:
        task = todo.pop()
        assert task is not None
        if task.name == "turnledger.request":
            found.append(task)
        for nursery in task.child_nurseries:
            todo.extend(nursery.child_tasks)
    return found


async def test_one_request_task_serves_a_session_turn_after_turn(store: HookedStore) -> None:
    provider = through_request_task()
    seen = []
    async with open_hub(store, provider, model="m") as hub:
        for i in range(5):
            result = await (await hub.submit("s", f"q{i}")).outcome()
            assert result.kind == "committed"
            await wait_all_tasks_blocked()
            seen.append(request_tasks())
            assert hub.statistics().requests == 0  # none running: parked
        await hub.submit("t", "other session")
        await wait_all_tasks_blocked()
        # a task per session, not per turn
        assert len(request_tasks()) == 2
    assert len(provider.requests) == 6
    assert all(len(tasks) == 1 for tasks in seen)
    assert all(tasks[0] is seen[0][0] for tasks in seen)


async def test_a_cancelled_request_ends_its_task_and_the_next_turn_gets_a_new_one(
    store: HookedStore,
) -> None:
    scripts: dict[str, list[Step]] = {"r1": [Begin(), Hang()], "r2": [Begin(), Finish("ok")]}
    provider = ScriptedProvider(lambda req: scripts[req.request_id])
    async with open_hub(store, provider, model="m") as hub:
        turn = await hub.submit("s", "q1", request_id=R1)
        await wait_all_tasks_blocked()
        [first] = request_tasks()
        await hub.cancel("s")
        assert await turn.outcome() == DiscardedResult(R1, "cancelled", "", 0)
        await wait_all_tasks_blocked()
        assert request_tasks() == []  # its scope was cancelled with the turn
        assert provider.cancelled == [R1]
        result = await (await hub.submit("s", "q2", request_id=R2)).outcome()
        await wait_all_tasks_blocked()
        [second] = request_tasks()
    assert second is not first
    assert isinstance(result, CommittedResult) and result.answer == "ok"


async def test_a_request_that_ignores_cancellation_does_not_hold_up_the_next_turn(
    store: HookedStore,
) -> None:
    release = trio.Event()

    async def ignore_cancellation(_: Any) -> None:
        with trio.CancelScope(shield=True):
            await release.wait()

    scripts: dict[str, list[Step]] = {
        "r1": [Begin(), Hook(ignore_cancellation), Finish("too late")],
        "r2": [Begin(), Finish("second")],
        "r3": [Begin(), Finish("third")],
    }
    provider = ScriptedProvider(lambda req: scripts[req.request_id])
    async with open_hub(store, provider, model="m") as hub:
        try:
            turn = await hub.submit("s", "q1", request_id=R1)
            await wait_all_tasks_blocked()
            [stuck] = request_tasks()
            await hub.cancel("s")
            assert (await turn.outcome()).kind == "discarded"
            # The old request still runs; the next turn does not wait for it.
            second = await (await hub.submit("s", "q2", request_id=R2)).outcome()
            assert isinstance(second, CommittedResult) and second.answer == "second"
            await wait_all_tasks_blocked()
            tasks = request_tasks()
            assert len(tasks) == 2 and stuck in tasks
            [current] = [t for t in tasks if t is not stuck]
            release.set()
            await wait_all_tasks_blocked()
            # It reported its result (recorded as late), then stopped.
            assert request_tasks() == [current]
            third = await (await hub.submit("s", "q3", request_id=R3)).outcome()
            await wait_all_tasks_blocked()
            assert request_tasks() == [current]
        finally:
            release.set()  # a failed check must not leave the hub waiting for it
    assert isinstance(third, CommittedResult) and third.answer == "third"
    events = await events_of(store, "s")
    assert TurnDiscarded(R1, "cancelled", "", 0) in events
    assert CompletionIgnored(R1, "completed") in events
    assert [e.request_id for e in events if isinstance(e, TurnCommitted)] == [R2, R3]


async def test_a_passivated_session_leaves_no_request_task(
    store: HookedStore, autojump_clock: Any
) -> None:
    async with open_hub(store, through_request_task(), model="m", passivate_after=10) as hub:
        assert (await (await hub.submit("s", "q")).outcome()).kind == "committed"
        await wait_all_tasks_blocked()
        assert len(request_tasks()) == 1
        await trio.sleep(30)
        assert hub.statistics().actors == 0
        assert hub.statistics().actors_passivated == 1
        assert request_tasks() == []
        # The session comes back (by replay) with a request task of its own.
        assert (await (await hub.submit("s", "again")).outcome()).kind == "committed"
        await wait_all_tasks_blocked()
        assert len(request_tasks()) == 1


async def test_an_idle_session_lets_its_request_task_go(
    store: HookedStore, autojump_clock: Any
) -> None:
    # Without passivation too: the janitor still sweeps for request tasks.
    async with open_hub(store, through_request_task(), model="m", passivate_after=None) as hub:
        assert (await (await hub.submit("s", "q1")).outcome()).kind == "committed"
        await wait_all_tasks_blocked()
        [first] = request_tasks()
        await trio.sleep(KEEP_REQUEST_TASK / 2)
        assert request_tasks() == [first]  # not idle long enough yet
        await trio.sleep(KEEP_REQUEST_TASK)
        assert request_tasks() == []
        assert hub.statistics().actors == 1  # the actor stays
        result = await (await hub.submit("s", "q2")).outcome()
        await wait_all_tasks_blocked()
        [second] = request_tasks()
    assert result.kind == "committed" and second is not first
