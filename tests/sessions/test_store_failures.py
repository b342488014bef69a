"""A store that refuses a write under a turn (a full disk, an I/O error): the
turn ends as ``store_error`` with the cause named, the actor and the hub go
on, and the log catches up once the store takes writes again. A session
that another process took over stops, and its callers are told why.

(These drive the actor through a memory store that fails on cue; the same
scenarios on real files on a full disk are in tests/stores/test_disk_full.py.)
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

import pytest
import trio
from structlog.testing import capture_logs

from turnledger import LeaseLost, SessionClosed, StoreCorrupted, StoreError, StoreFull
from turnledger.events import RequestId, TurnDiscarded
from turnledger.sessions import (
    CommittedResult,
    DiscardedResult,
    Hub,
    RejectedResult,
    TurnResult,
    open_hub,
    replay,
)
from turnledger.testing import Begin, Chunk, Finish, ScriptedProvider, Step

from ._helpers import HookedStore, events_of, lines, replayed, tags_of

R1, R2 = RequestId("r1"), RequestId("r2")
#: What the callers are told: the error's type and the OS error's name.
ENOSPC = "StoreFull: ENOSPC (No space left on device)"


def fail_next(store: HookedStore, n: int) -> Callable[[], Awaitable[None]]:
    async def arm() -> None:
        store.fail_appends = n

    return arm


async def ask(hub: Hub, rid: RequestId, question: str = "q") -> TurnResult:
    return await (await hub.submit("s", question, request_id=rid)).outcome()


def provider(r1: list[Step] | None = None) -> ScriptedProvider:
    scripts = {"r1": r1 or [Begin(), Chunk("so far"), Finish()]}
    return ScriptedProvider(lambda req: scripts.get(req.request_id, [Finish("ok")]))


async def test_a_turn_the_store_cannot_keep_is_discarded_as_store_error(
    store: HookedStore,
) -> None:
    store.before("turn_committed", fail_next(store, 1))
    with capture_logs() as logs:
        async with open_hub(store, provider(), model="m") as hub:
            first = await ask(hub, R1)
            after = await ask(hub, R2, "next")
            again = await ask(hub, R1)
            stats = hub.statistics()
            assert await hub.state("s") == await replayed(store, "s")
    # The caller learns why, with the OS error named (not the file's path).
    assert first == DiscardedResult(R1, "store_error", ENOSPC, 6)
    assert after == CommittedResult(R2, "ok", "stop")
    assert again == DiscardedResult(R1, "store_error", ENOSPC, repeated=True)
    assert (stats.actors_failed, stats.store_errors, stats.actors) == (0, 1, 1)
    events = await events_of(store, "s")
    # The discard is on the record, and only the next turn is history.
    assert TurnDiscarded(R1, "store_error", ENOSPC, 6) in events
    assert [t.request_id for t in replay(events).turns] == [R2]
    (line,) = lines(logs, "store_error")
    assert line["error"] == "StoreFull" and line["session_id"] == "s"
    assert "/data/chats.db" in line["detail"]  # the whole message goes to the log
    assert lines(logs, "actor_failed") == []


async def test_a_discard_the_store_refuses_too_is_written_once_it_takes_writes(
    store: HookedStore, autojump_clock: Any
) -> None:
    # The commit fails, then the discard, then R2's question (which first
    # tries the discard again): three refusals, then the disk has room.
    store.before("turn_committed", fail_next(store, 3))
    async with open_hub(store, provider(), model="m") as hub:
        first = await ask(hub, R1)
        assert first == DiscardedResult(R1, "store_error", ENOSPC, 6)
        # Told at once; the store still holds the turn in flight, and the
        # actor keeps the state of what the store holds.
        assert (await tags_of(store, "s"))[-1] == "turn_submitted"
        assert await hub.state("s") == await replayed(store, "s")
        refused = await ask(hub, R2, "next")
        assert refused == RejectedResult(R2, "store_error", ENOSPC)
        # Without any message, the actor writes the discard once it can.
        await trio.sleep(1)
        events = await events_of(store, "s")
        assert events[-1] == TurnDiscarded(R1, "store_error", ENOSPC, 6)
        assert R2 not in str(events)  # nothing was written: the id stays free
        after = await ask(hub, R2, "next")
        assert after == CommittedResult(R2, "ok", "stop")
        assert hub.statistics().actors_failed == 0
        assert await hub.state("s") == await replayed(store, "s")


async def test_the_pending_discard_goes_first_when_the_next_question_comes(
    store: HookedStore,
) -> None:
    store.before("turn_committed", fail_next(store, 2))
    async with open_hub(store, provider(), model="m") as hub:
        first = await ask(hub, R1)
        # at once, before the actor's own retry
        after = await ask(hub, R2, "next")
    assert first == DiscardedResult(R1, "store_error", ENOSPC, 6)
    assert after == CommittedResult(R2, "ok", "stop")
    assert [type(e).__name__ for e in (await events_of(store, "s"))[1:]] == [
        "TurnSubmitted",
        "TurnDiscarded",
        "TurnSubmitted",
        "StreamStarted",
        "TurnCommitted",
    ]


async def test_a_question_the_store_refuses_is_rejected_and_its_id_stays_free(
    store: HookedStore,
) -> None:
    store.before("turn_submitted", fail_next(store, 1))
    async with open_hub(store, provider(), model="m") as hub:
        refused = await ask(hub, R1)
        assert await tags_of(store, "s") == ["session_started"]
        retried = await ask(hub, R1)
    assert refused == RejectedResult(R1, "store_error", ENOSPC)
    assert retried == CommittedResult(R1, "so far", "stop")


async def test_a_session_whose_start_cannot_be_written_is_an_error_to_its_caller(
    store: HookedStore,
) -> None:
    store.before("session_started", fail_next(store, 1))
    async with open_hub(store, provider(), model="m") as hub:
        with pytest.raises(StoreFull):
            await hub.submit("s", "q", request_id=R1)
        result = await ask(hub, R1)
        assert hub.statistics().actors_failed == 0
    assert isinstance(result, CommittedResult)


@pytest.mark.parametrize(
    ("failure", "named"),
    [
        (lambda: LeaseLost("s", 1, 2), r"LeaseLost: session 's' .*taken over"),
        (lambda: StoreCorrupted("line 7 is damaged"), "StoreCorrupted: line 7 is damaged"),
    ],
)
async def test_an_actor_that_cannot_go_on_tells_its_callers_why(
    store: HookedStore, failure: Callable[[], StoreError], named: str
) -> None:
    store.failure = failure  # type: ignore[method-assign]
    store.before("turn_committed", fail_next(store, 1))
    async with open_hub(store, provider(), model="m") as hub:
        turn = await hub.submit("s", "q", request_id=R1)
        stopped = f"stopped before the turn was decided: {named}"
        with pytest.raises(SessionClosed, match=stopped) as info:
            await turn.outcome()
        assert type(info.value.__cause__) is type(failure())
        stats = hub.statistics()
        assert (stats.actors_failed, stats.store_errors) == (1, 0)
        # The hub goes on for the other sessions.
        assert isinstance(await (await hub.submit("t", "q")).outcome(), CommittedResult)
    # Nothing more was written to that session: it is not this process's to close.
    assert (await tags_of(store, "s"))[-1] == "turn_submitted"
