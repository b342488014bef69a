"""Each cancellation race, forced into one order, with its history, log and log lines."""

from __future__ import annotations

import math
from typing import Any

import pytest
import structlog
import trio
from structlog.testing import capture_logs
from trio.testing import Sequencer, wait_all_tasks_blocked

from turnledger.events import (
    CompletionIgnored,
    Ledger,
    RequestId,
    SessionStarted,
    StreamStarted,
    TurnCommitted,
    TurnDiscarded,
    TurnSubmitted,
)
from turnledger.sessions import (
    Committed,
    CommittedResult,
    DiscardedResult,
    Turn,
    open_hub,
)
from turnledger.testing import (
    Begin,
    Chunk,
    Fail,
    Finish,
    Hang,
    Hook,
    InSequence,
    Pause,
    ScriptedProvider,
    Step,
)

from ._helpers import HookedStore, at, events_of, lines, replayed

R1, R2 = RequestId("r1"), RequestId("r2")


def by_request(scripts: dict[str, list[Step]]) -> ScriptedProvider:
    return ScriptedProvider(lambda req: scripts[req.request_id])


def hold(*steps: Any) -> Any:
    """A store hook that runs ``steps`` (coroutine factories) in order."""

    async def run() -> None:
        for step in steps:
            await step()

    return run


#: What a session of these hubs starts with: the provider cannot describe
#: models, so the default window applies, a quarter of it kept for the answer.
STARTED = SessionStarted(
    "", "m", Ledger(), "reject", context_window=8192, output_reserve=2048, window_source="fallback"
)


def est(question: str) -> int:
    """The default estimator's tokens of a request holding only ``question``."""
    return 3 + 4 + math.ceil(len(question) / 4)


def one(found: list[dict[str, Any]]) -> dict[str, Any]:
    assert len(found) == 1, found
    return found[0]


async def test_cancel_before_the_response_starts(store: HookedStore) -> None:
    provider = by_request({"r1": [Hang()]})
    with capture_logs() as logs:
        async with open_hub(store, provider, model="m") as hub:
            turn = await hub.submit("s", "why?", request_id=R1)
            await wait_all_tasks_blocked()
            assert provider.open == 1
            result = await turn.cancel()
            assert await hub.history("s") == ()
            await wait_all_tasks_blocked()
            assert provider.open == 0

    assert result == DiscardedResult(R1, "cancelled", "", 0)
    assert await events_of(store, "s") == [
        STARTED,
        TurnSubmitted(R1, "why?", 0, 0, 73, est("why?")),
        TurnDiscarded(R1, "cancelled", "", 0),
    ]
    assert provider.cancelled == [R1] and provider.closed == [R1]
    msg = one(lines(logs, "message_received", msg_type="Cancel"))
    assert msg["session_id"] == "s" and msg["request_id"] == R1
    assert msg["stale"] is False and msg["in_flight"] == R1
    t = one(lines(logs, "transition", tag="turn_discarded"))
    assert (t["from"], t["to"], t["reason"]) == ("Pending", "Discarded", "cancelled")
    assert t["session_id"] == "s" and t["request_id"] == R1
    assert not lines(logs, "transition", tag="stream_started")


async def test_cancel_mid_stream(store: HookedStore) -> None:
    provider = by_request({"r1": [Begin(), Chunk("Hel"), Chunk("lo"), Hang()]})
    with capture_logs() as logs:
        async with open_hub(store, provider, model="m") as hub:
            turn = await hub.submit("s", "greet", request_id=R1)
            await wait_all_tasks_blocked()
            result = await turn.cancel()
            seen = [d async for d in turn.preview()]

    assert result == DiscardedResult(R1, "cancelled", "", 5)
    assert seen == ["Hel", "lo"]
    assert await events_of(store, "s") == [
        STARTED,
        TurnSubmitted(R1, "greet", 0, 0, 74, est("greet")),
        StreamStarted(R1),
        TurnDiscarded(R1, "cancelled", "", 5),
    ]
    assert tuple((await replayed(store, "s")).turns) == ()
    assert provider.cancelled == [R1]
    t = one(lines(logs, "transition", tag="turn_discarded"))
    assert (t["from"], t["to"], t["reason"], t["preview_chars"]) == (
        "Streaming",
        "Discarded",
        "cancelled",
        5,
    )
    assert t["request_id"] == R1 and t["session_id"] == "s"
    # the preview went to the caller, never to the log
    assert all("Hel" not in str(line.values()) for line in logs)


async def test_completed_already_queued_when_cancel_arrives(store: HookedStore) -> None:
    seq = Sequencer()
    # The actor is held inside the StreamStarted append while the provider
    # queues its Completed (position 1) and then the caller its Cancel (2).
    store.before("stream_started", hold(lambda: at(seq, 0), lambda: at(seq, 3)))
    provider = by_request({"r1": [Begin(), Chunk("4"), InSequence(seq, 1), Finish("42")]})
    cancelled: list[Any] = []
    with capture_logs() as logs:
        async with open_hub(store, provider, model="m") as hub, trio.open_nursery() as nursery:
            turn = await hub.submit("s", "answer?", request_id=R1)

            async def cancel() -> None:
                cancelled.append(await turn.cancel())

            async with seq(2):
                await wait_all_tasks_blocked()  # the Completed is queued
                nursery.start_soon(cancel)
                await wait_all_tasks_blocked()  # and the Cancel behind it
            result = await turn.outcome()

    assert result == CommittedResult(R1, "42", "stop")
    assert cancelled == [result]  # the cancel found nothing: commit won
    assert await events_of(store, "s") == [
        STARTED,
        TurnSubmitted(R1, "answer?", 0, 0, 76, est("answer?")),
        StreamStarted(R1),
        TurnCommitted(R1, "42", "stop"),
    ]
    assert tuple((await replayed(store, "s")).turns) == (Turn(R1, "answer?", "42"),)
    received = lines(logs, "message_received", request_id=R1)
    assert [m["msg_type"] for m in received] == ["Submit", "ResponseStarted", "Completed", "Cancel"]
    completed, cancel_line = received[2], received[3]
    assert completed["stale"] is False and completed["in_flight"] == R1
    assert cancel_line["stale"] is True and cancel_line["in_flight"] is None
    assert all(m["session_id"] == "s" for m in received)
    t = one(lines(logs, "transition", tag="turn_committed"))
    assert (t["from"], t["to"], t["request_id"]) == ("Streaming", "Committed", R1)
    assert not lines(logs, "transition", tag="turn_discarded")


@pytest.mark.parametrize("mailbox_size", [16, 1])
async def test_completed_queued_before_the_deadline_is_noticed_wins(
    store: HookedStore, autojump_clock: Any, mailbox_size: int
) -> None:
    # The actor is stuck in an append until t=61; the answer was queued at
    # t=30; the 60 s deadline is noticed at t=61, after what was queued.
    # With a mailbox of 1 the answer fills it, so the timer cannot queue the
    # Timeout at t=60 and the actor reads the clock itself at t=61.
    store.before("stream_started", lambda: trio.sleep(61))
    provider = by_request({"r1": [Begin(), Pause(30), Finish("in time")]})
    with capture_logs() as logs:
        async with open_hub(
            store, provider, model="m", idle_timeout=None, mailbox_size=mailbox_size
        ) as hub:
            turn = await hub.submit("s", "q", request_id=R1)
            result = await turn.outcome()
            assert trio.current_time() == 61

    assert result == CommittedResult(R1, "in time", "stop")
    assert [type(e).__name__ for e in await events_of(store, "s")] == [
        "SessionStarted",
        "TurnSubmitted",
        "StreamStarted",
        "TurnCommitted",
    ]
    timeout = one(lines(logs, "message_received", msg_type="Timeout"))
    assert timeout["stale"] is True and timeout["detail"] == "deadline"
    assert timeout["request_id"] == R1 and timeout["in_flight"] is None
    msgs = [m["msg_type"] for m in lines(logs, "message_received", request_id=R1)]
    assert msgs[-2:] == ["Completed", "Timeout"]


async def test_timeout_first_then_a_late_completed(store: HookedStore, autojump_clock: Any) -> None:
    # The deadline fires at t=60; while the discard is being written the
    # provider finishes (t=60.5) and its Completed is queued: it is late.
    store.before("turn_discarded", lambda: trio.sleep(1))
    provider = by_request({"r1": [Begin(), Pause(60.5), Finish("too late")]})
    with capture_logs() as logs:
        async with open_hub(store, provider, model="m", idle_timeout=None) as hub:
            turn = await hub.submit("s", "q", request_id=R1)
            result = await turn.outcome()
            assert trio.current_time() == 61
            await wait_all_tasks_blocked()
            assert await hub.history("s") == ()

    assert result == DiscardedResult(R1, "timeout", "deadline", 0)
    assert (await events_of(store, "s"))[3:] == [
        TurnDiscarded(R1, "timeout", "deadline", 0),
        CompletionIgnored(R1, "completed"),
    ]
    timeout = one(lines(logs, "message_received", msg_type="Timeout"))
    assert timeout["stale"] is False and timeout["request_id"] == R1
    completed = one(lines(logs, "message_received", msg_type="Completed"))
    assert completed["stale"] is True and completed["in_flight"] is None
    late = one(lines(logs, "late_completion"))
    assert late["request_id"] == R1 and late["outcome"] == "completed"
    assert late["session_id"] == "s" and late["delay_s"] == 0.0
    t = one(lines(logs, "transition", tag="turn_discarded"))
    assert (t["reason"], t["detail"]) == ("timeout", "deadline")


async def test_a_60s_deadline_cancels_the_request(store: HookedStore, autojump_clock: Any) -> None:
    provider = by_request({"r1": [Begin(), Hang()]})
    async with open_hub(store, provider, model="m", idle_timeout=None) as hub:
        result = await (await hub.submit("s", "q", request_id=R1)).outcome()
        assert trio.current_time() == 60
    assert result == DiscardedResult(R1, "timeout", "deadline", 0)
    assert provider.cancelled == [R1]


async def test_idle_timeout_between_chunks(store: HookedStore, autojump_clock: Any) -> None:
    provider = by_request({"r1": [Begin(), Chunk("a", delay=5), Chunk("b", delay=25), Finish()]})
    async with open_hub(store, provider, model="m", idle_timeout=20) as hub:
        result = await (await hub.submit("s", "q", request_id=R1)).outcome()
        assert trio.current_time() == 25
    assert result == DiscardedResult(R1, "timeout", "idle", 1)


async def test_late_completed_after_supersede(store: HookedStore) -> None:
    seq = Sequencer()
    # Held in the StreamStarted append of r1: r2 is submitted (1), then r1's
    # Completed is queued behind it (2).
    store.before(
        "stream_started",
        hold(lambda: at(seq, 0), lambda: at(seq, 3), wait_all_tasks_blocked),
    )
    provider = by_request(
        {
            "r1": [Begin(), Chunk("old"), InSequence(seq, 2), Finish("old answer")],
            "r2": [Begin(), Finish("new answer")],
        }
    )
    with capture_logs() as logs:
        async with open_hub(store, provider, model="m", on_busy="supersede") as hub:
            first = await hub.submit("s", "one", request_id=R1)
            async with seq(1):
                second = await hub.submit("s", "two", request_id=R2)
            r1, r2 = await first.outcome(), await second.outcome()
            await wait_all_tasks_blocked()
            assert await hub.history("s") == (Turn(R2, "two", "new answer"),)

    assert r1 == DiscardedResult(R1, "superseded", "by r2", 3)
    assert r2 == CommittedResult(R2, "new answer", "stop")
    assert (await events_of(store, "s"))[3:] == [
        TurnDiscarded(R1, "superseded", "by r2", 3),
        TurnSubmitted(R2, "two", 0, 0, 72, est("two")),
        CompletionIgnored(R1, "completed"),
        StreamStarted(R2),
        TurnCommitted(R2, "new answer", "stop"),
    ]
    completed = one(lines(logs, "message_received", msg_type="Completed", request_id=R1))
    assert completed["stale"] is True and completed["in_flight"] == R2
    late = one(lines(logs, "late_completion"))
    assert late["request_id"] == R1 and late["in_flight"] == R2
    assert isinstance(late["delay_s"], float) and late["delay_s"] >= 0
    sup = one(lines(logs, "transition", tag="turn_discarded"))
    assert (sup["from"], sup["to"], sup["reason"], sup["request_id"]) == (
        "Streaming",
        "Discarded",
        "superseded",
        R1,
    )
    assert provider.cancelled == []  # r1 had already returned; nothing to cancel


async def test_late_failed_after_cancel(store: HookedStore) -> None:
    seq = Sequencer()
    store.before(
        "stream_started",
        hold(lambda: at(seq, 0), lambda: at(seq, 3), wait_all_tasks_blocked),
    )
    provider = by_request({"r1": [Begin(), InSequence(seq, 2), Fail("transport", "reset")]})
    with capture_logs() as logs:
        async with open_hub(store, provider, model="m") as hub:
            turn = await hub.submit("s", "q", request_id=R1)
            async with seq(1):
                await hub.cancel("s")
            result = await turn.outcome()
            await wait_all_tasks_blocked()

    assert result == DiscardedResult(R1, "cancelled", "", 0)
    assert (await events_of(store, "s"))[3:] == [
        TurnDiscarded(R1, "cancelled", "", 0),
        CompletionIgnored(R1, "failed:transport"),
    ]
    cancel = one(lines(logs, "message_received", msg_type="Cancel"))
    assert cancel["request_id"] == R1 and cancel["stale"] is False
    failed = one(lines(logs, "message_received", msg_type="Failed"))
    assert failed["stale"] is True and failed["reason"] == "transport"
    late = one(lines(logs, "late_completion"))
    assert late["outcome"] == "failed:transport" and late["request_id"] == R1


async def test_cancel_on_an_idle_session(store: HookedStore) -> None:
    provider = ScriptedProvider()
    with capture_logs() as logs:
        async with open_hub(store, provider, model="m") as hub:
            done = await (await hub.submit("s", "hi", request_id=R1)).outcome()
            before = await events_of(store, "s")
            await hub.cancel("s")
            await wait_all_tasks_blocked()
            state = await hub.state("s")
            # a session with no actor has nothing in flight: nothing starts
            await hub.cancel("nobody")
            assert hub.statistics().actors == 1

    assert isinstance(done, CommittedResult)
    assert await events_of(store, "s") == before
    assert isinstance(state, Committed)
    assert tuple(state.turns) == (Turn(R1, "hi", "echo: hi"),)
    cancel = one(lines(logs, "message_received", msg_type="Cancel"))
    assert cancel["stale"] is True and cancel["request_id"] is None
    assert cancel["in_flight"] is None and cancel["session_id"] == "s"
    # nothing was decided after it
    assert logs[-2]["event"] == "message_received" and logs[-2]["msg_type"] == "Cancel"


async def test_provider_logs_carry_session_and_request_ids(store: HookedStore) -> None:
    async def say(_request: Any) -> None:
        structlog.get_logger("provider").info("provider_line")

    provider = by_request({"r1": [Hook(say), Finish("ok")]})
    with capture_logs(processors=[structlog.contextvars.merge_contextvars]) as logs:
        structlog.contextvars.bind_contextvars(caller="web-42")
        async with open_hub(store, provider, model="m") as hub:
            await (await hub.submit("s", "q", request_id=R1)).outcome()
        structlog.contextvars.clear_contextvars()
    line = one(lines(logs, "provider_line"))
    assert line["session_id"] == "s" and line["request_id"] == R1
    # the actor's context is the session's, not its first caller's
    assert "caller" not in line
