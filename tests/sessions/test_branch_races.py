"""Branches in the running hub, against its races: an edit or a regenerate
while a turn is in flight follows the session's busy policy, and an answer
that arrives late for a turn of another branch changes nothing."""

from __future__ import annotations

import pytest
import trio
from trio.testing import Sequencer, wait_all_tasks_blocked

from turnledger.events import (
    BranchStarted,
    CompletionIgnored,
    RequestId,
    StreamStarted,
    TurnCommitted,
    TurnDiscarded,
    TurnRejected,
    TurnSubmitted,
)
from turnledger.sessions import (
    CommittedResult,
    DiscardedResult,
    RejectedResult,
    Turn,
    branch_turns,
    branches_of,
    open_hub,
)
from turnledger.testing import Begin, Chunk, Finish, Hang, InSequence

from ._helpers import HookedStore, at, events_of, replayed
from .test_races import by_request, hold

R0, R1, E1 = RequestId("r0"), RequestId("r1"), RequestId("e1")


async def test_a_late_answer_for_a_turn_of_another_branch_changes_nothing(
    store: HookedStore,
) -> None:
    # r1 streams on main; an edit supersedes it and asks on b1; r1's complete
    # answer is queued behind the edit: it arrives for a turn of main that
    # already ended, while b1 is active.
    seq = Sequencer()
    provider = by_request(
        {
            "r0": [Begin(), Finish("a0")],
            "r1": [Begin(), Chunk("old"), InSequence(seq, 2), Finish("old answer")],
            "e1": [Begin(), Finish("new answer")],
        }
    )
    async with open_hub(store, provider, model="m", on_busy="supersede") as hub:
        await (await hub.submit("s", "q0", request_id=R0)).outcome()
        # Held in r1's StreamStarted append: the edit is sent (1), then r1's
        # Completed is queued behind it (2).
        store.before(
            "stream_started",
            hold(lambda: at(seq, 0), lambda: at(seq, 3), wait_all_tasks_blocked),
        )
        first = await hub.submit("s", "q1", request_id=R1)
        async with seq(1):
            edited = await hub.edit("s", 0, "q0 again", request_id=E1)
        r1, e1 = await first.outcome(), await edited.outcome()
        await wait_all_tasks_blocked()
        history = await hub.history("s")
        listed = await hub.branches("s")

    assert r1 == DiscardedResult(R1, "superseded", "by e1", 3)
    assert e1 == CommittedResult(E1, "new answer", "stop")
    tail = (await events_of(store, "s"))[-7:]
    assert [type(e) for e in tail] == [
        StreamStarted,
        TurnDiscarded,
        BranchStarted,
        TurnSubmitted,
        CompletionIgnored,
        StreamStarted,
        TurnCommitted,
    ]
    assert tail[4] == CompletionIgnored(R1, "completed")
    # b1 holds the edit, main holds r0 alone: the late answer is on neither
    assert history == (Turn(E1, "q0 again", "new answer"),)
    assert [(b.branch_id, b.length, b.head, b.active) for b in listed] == [
        ("main", 1, R0, False),
        ("b1", 1, E1, True),
    ]
    state = await replayed(store, "s")
    assert [t.request_id for t in branch_turns(state, "main")] == [R0]
    assert tuple(state.turns) == history


@pytest.mark.parametrize("command", ["edit", "regenerate"])
async def test_an_edit_or_regenerate_while_busy_is_rejected_and_starts_no_branch(
    store: HookedStore, command: str
) -> None:
    provider = by_request({"r0": [Begin(), Finish("a0")], "r1": [Begin(), Chunk("x"), Hang()]})
    async with open_hub(store, provider, model="m", on_busy="reject") as hub:
        await (await hub.submit("s", "q0", request_id=R0)).outcome()
        busy = await hub.submit("s", "q1", request_id=R1)
        with trio.fail_after(10):
            async for delta in busy.preview():
                if delta:
                    break
        if command == "edit":
            handle = await hub.edit("s", 0, "q0 again", request_id=E1)
        else:
            handle = await hub.regenerate("s", request_id=E1)
        refused = await handle.outcome()
        assert isinstance(refused, RejectedResult) and refused.reason == "busy"
        assert [b.branch_id for b in await hub.branches("s")] == ["main"]
        assert isinstance(await busy.cancel(), DiscardedResult)
        assert await hub.history("s") == (Turn(R0, "q0", "a0"),)
    events = await events_of(store, "s")
    assert TurnRejected(E1, "busy", "request r1 is in flight") in events
    assert not any(isinstance(e, BranchStarted) for e in events)
    assert len(branches_of(await replayed(store, "s"))) == 1


@pytest.mark.parametrize("command", ["edit", "regenerate"])
async def test_an_edit_or_regenerate_while_busy_supersedes_under_supersede(
    store: HookedStore, command: str
) -> None:
    provider = by_request(
        {
            "r0": [Begin(), Finish("a0")],
            "r0b": [Begin(), Finish("a0b")],
            "r1": [Begin(), Chunk("x"), Hang()],
            "e1": [Begin(), Finish("again")],
        }
    )
    async with open_hub(store, provider, model="m", on_busy="supersede") as hub:
        await (await hub.submit("s", "q0", request_id=R0)).outcome()
        await (await hub.submit("s", "q0b", request_id=RequestId("r0b"))).outcome()
        busy = await hub.submit("s", "q1", request_id=R1)
        with trio.fail_after(10):
            async for delta in busy.preview():
                if delta:
                    break
        if command == "edit":
            handle = await hub.edit("s", 1, "q0b edited", request_id=E1)
        else:
            handle = await hub.regenerate("s", request_id=E1)
        assert await handle.outcome() == CommittedResult(E1, "again", "stop")
        superseded = await busy.outcome()
        assert isinstance(superseded, DiscardedResult) and superseded.reason == "superseded"
        listed = await hub.branches("s")
        question = "q0b edited" if command == "edit" else "q0b"
        assert await hub.history("s") == (Turn(R0, "q0", "a0"), Turn(E1, question, "again"))
    # main keeps both its turns; the discarded one entered no branch
    assert [(b.branch_id, b.parent, b.at_turn, b.kind, b.length) for b in listed] == [
        ("main", None, 0, None, 2),
        ("b1", "main", 1, command, 2),
    ]


async def test_a_repeated_request_id_joins_its_turn_and_starts_no_second_branch(
    store: HookedStore,
) -> None:
    # A caller that retries an edit or a regenerate (a lost response) with the
    # same request id gets the turn's result again; nothing more is written,
    # even once another branch is active.
    provider = by_request({rid: [Begin(), Finish(f"a {rid}")] for rid in ("r0", "r1", "e1", "g1")})
    async with open_hub(store, provider, model="m") as hub:
        await (await hub.submit("s", "q0", request_id=R0)).outcome()
        await (await hub.submit("s", "q1", request_id=R1)).outcome()
        first = await (await hub.edit("s", 1, "q1 again", request_id=E1)).outcome()
        regen = await (await hub.regenerate("s", request_id="g1")).outcome()
        written = len(await events_of(store, "s"))
        again = await (await hub.edit("s", 1, "q1 again", request_id=E1)).outcome()
        regen_again = await (await hub.regenerate("s", request_id="g1")).outcome()
        await hub.switch("s", "main")
        on_main = await (await hub.edit("s", 1, "q1 again", request_id=E1)).outcome()
        listed = [b.branch_id for b in await hub.branches("s")]
        history = await hub.history("s")
    assert first == CommittedResult(E1, "a e1", "stop")
    assert again == on_main == CommittedResult(E1, "a e1", "stop", repeated=True)
    assert regen == CommittedResult(RequestId("g1"), "a g1", "stop")
    assert regen_again == CommittedResult(RequestId("g1"), "a g1", "stop", repeated=True)
    assert listed == ["main", "b1", "b2"]
    assert [t.question for t in history] == ["q0", "q1"]
    assert len(await events_of(store, "s")) == written + 1  # the switch alone
