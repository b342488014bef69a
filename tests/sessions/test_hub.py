"""The hub: identity of requests, settings, recovery, passivation, shutdown, failures."""

from __future__ import annotations

import os
import re
import threading
import uuid
from pathlib import Path
from typing import Any

import pytest
import trio
from structlog.testing import capture_logs
from trio.testing import wait_all_tasks_blocked

from turnledger import (
    InvalidCommand,
    ReplayError,
    SessionClosed,
    SessionOwnedElsewhere,
)
from turnledger.events import (
    DEFAULT_CODEC,
    CompletionIgnored,
    RequestId,
    SessionStarted,
    StreamStarted,
    TurnDiscarded,
    TurnRejected,
    TurnSubmitted,
    Window,
)
from turnledger.runtime import _hub
from turnledger.runtime._log import EVENTS, FIELDS
from turnledger.sessions import (
    ChatMessage,
    CommittedResult,
    DiscardedResult,
    RejectedResult,
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
    MemoryStore,
    ScriptedProvider,
    Step,
)

from ._helpers import HookedStore, events_of, lines, replayed, tags_of

R0, R1, R2, R3 = (RequestId(f"r{i}") for i in range(4))
DOCS = Path(__file__).parents[2] / "docs" / "logging.md"


def by_request(
    scripts: dict[str, list[Step]], default: list[Step] | None = None
) -> ScriptedProvider:
    return ScriptedProvider(lambda req: scripts.get(req.request_id, default or [Finish("ok")]))


async def test_a_repeated_request_id_is_never_recorded_twice(store: HookedStore) -> None:
    gate = trio.Event()

    async def wait(_: Any) -> None:
        await gate.wait()

    provider = by_request({"r1": [Begin(), Chunk("a"), Hook(wait), Chunk("b"), Finish()]})
    async with open_hub(store, provider, model="m") as hub:
        first = await hub.submit("s", "q", request_id=R1)
        await wait_all_tasks_blocked()
        # while in flight: the retry joins the turn, preview from the start
        again = await hub.submit("s", "q", request_id=R1)
        await wait_all_tasks_blocked()
        gate.set()
        r_first, r_again = await first.outcome(), await again.outcome()
        assert [d async for d in again.preview()] == ["a", "b"]
        # after it ended: the recorded outcome, marked as such
        later = await (await hub.submit("s", "something else", request_id=R1)).outcome()
    assert r_first == r_again == CommittedResult(R1, "ab", "stop")
    assert later == CommittedResult(R1, "ab", "stop", repeated=True)
    # and in a new hub on the same store (the session is replayed)
    async with open_hub(store, provider, model="m") as hub:
        replayed_result = await (await hub.submit("s", "q", request_id=R1)).outcome()
        rejected = await (await hub.submit("s", " ", request_id=R2)).outcome()
        rejected_again = await (await hub.submit("s", "now real", request_id=R2)).outcome()
    assert replayed_result == later
    assert rejected == RejectedResult(R2, "empty_question", "the question is empty")
    assert rejected_again == RejectedResult(R2, "empty_question", "the question is empty", True)
    tags = await tags_of(store, "s")
    assert tags.count("turn_submitted") == 1 and tags.count("turn_rejected") == 1
    assert len(provider.requests) == 1


async def test_a_submit_without_request_id_gets_a_fresh_uuid4(store: HookedStore) -> None:
    async with open_hub(store, ScriptedProvider.instant(), model="m") as hub:
        handles = [await hub.submit("s", f"q{i}") for i in range(50)]
        for h in handles:
            await h.outcome()
    ids = [h.request_id for h in handles]
    assert len(set(ids)) == len(ids)
    for rid in ids:
        parsed = uuid.UUID(hex=rid)
        assert (parsed.hex, parsed.version, parsed.variant) == (rid, 4, uuid.RFC_4122)


def test_request_ids_are_drawn_in_batches_of_distinct_uuid4s() -> None:
    # Several draws, from several threads at once: each id is handed out once.
    per_thread = 3 * _hub._IDS
    drawn: list[list[str]] = [[] for _ in range(4)]

    def draw(out: list[str]) -> None:
        out.extend(_hub.uuid4_hex() for _ in range(per_thread))

    threads = [threading.Thread(target=draw, args=(out,)) for out in drawn]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    ids = [rid for out in drawn for rid in out]
    assert len(ids) == len(set(ids)) == 4 * per_thread
    for rid in ids:
        parsed = uuid.UUID(hex=rid)
        assert (parsed.hex, parsed.version, parsed.variant) == (rid, 4, uuid.RFC_4122)


@pytest.mark.skipif(not hasattr(os, "fork"), reason="no fork")
def test_a_forked_process_draws_request_ids_of_its_own() -> None:
    _hub.uuid4_hex()  # the parent has ids drawn ahead
    ahead = set(_hub._ids)
    assert ahead
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # pragma: no cover (the child)
        os.write(write, _hub.uuid4_hex().encode())
        os._exit(0)
    os.close(write)
    with os.fdopen(read) as f:
        child = f.read()
    assert os.waitpid(pid, 0)[1] == 0
    assert len(child) == 32 and child not in ahead


def test_ids_in_any_unicode_text_are_accepted() -> None:
    for value in ("s", "café", "会話-1", "🙂"):
        _hub._check_id("session id", value)


async def test_rejections_happen_before_any_transport(store: HookedStore) -> None:
    provider = by_request({"r1": [Begin(), Hang()]})
    async with open_hub(store, provider, model="m", max_request_bytes=200) as hub:
        busy_turn = await hub.submit("s", "first", request_id=R1)
        busy = await (await hub.submit("s", "second", request_id=R2)).outcome()
        empty = await (await hub.submit("s", "\n\t ", request_id=R3)).outcome()
        big = await (await hub.submit("other", "x" * 500, request_id=R0)).outcome()
        assert [d async for d in (await hub.submit("s", "", request_id="r4")).preview()] == []
        await busy_turn.cancel()
    assert busy == RejectedResult(R2, "busy", "request r1 is in flight")
    assert empty.reason == "empty_question"
    assert isinstance(big, RejectedResult) and big.reason == "over_budget"
    assert [r.request_id for r in provider.requests] == [R1]
    evs = await events_of(store, "s")
    assert TurnRejected(R2, "busy", "request r1 is in flight") in evs


async def test_supersede_discards_the_turn_in_flight(store: HookedStore) -> None:
    provider = by_request({"r1": [Begin(), Chunk("par"), Hang()], "r2": [Finish("two")]})
    async with open_hub(store, provider, model="m", on_busy="supersede") as hub:
        first = await hub.submit("s", "one", request_id=R1)
        await wait_all_tasks_blocked()
        second = await hub.submit("s", "two?", request_id=R2)
        assert await first.outcome() == DiscardedResult(R1, "superseded", "by r2", 3)
        assert await second.outcome() == CommittedResult(R2, "two", "stop")
        assert await hub.history("s") == (Turn(R2, "two?", "two"),)
    assert provider.cancelled == [R1]


async def test_new_session_start_says_what_a_new_session_would_record(
    store: HookedStore,
) -> None:
    provider = ScriptedProvider()
    async with open_hub(store, provider, model="m", system="default", context_window=4096) as hub:
        start = await hub.new_session_start()
        # nothing written, no actor started
        assert await store.session_ids() == []
        assert hub.statistics().actors == 0
        assert (start.system, start.model, start.context_window, start.window_source) == (
            "default",
            "m",
            4096,
            "user",
        )
        state = await hub.open_session("s")
        assert state.config is not None
        assert (state.config.context_window, state.config.output_reserve) == (
            start.context_window,
            start.output_reserve,
        )


async def test_open_session_fixes_the_settings_once(store: HookedStore) -> None:
    provider = ScriptedProvider()
    async with open_hub(store, provider, model="m", system="default") as hub:
        state = await hub.open_session("s", system="be brief", policy=Window(1))
        started = SessionStarted(
            "be brief",
            "m",
            Window(1),
            "reject",
            context_window=8192,
            output_reserve=2048,
            window_source="fallback",
        )
        assert state.config == started
        await hub.open_session("s", system="be brief")  # same: fine
        with pytest.raises(InvalidCommand, match="system"):
            await hub.open_session("s", system="be verbose")
        for i in range(3):
            await (await hub.submit("s", f"q{i}", request_id=f"w{i}")).outcome()
        # a session the hub creates itself takes the hub's defaults
        await (await hub.submit("other", "hi")).outcome()
    # Window(1): the third request carries only the second turn
    assert provider.requests[-2].messages == (
        ChatMessage("system", "be brief"),
        ChatMessage("user", "q1"),
        ChatMessage("assistant", "echo: q1"),
        ChatMessage("user", "q2"),
    )
    assert provider.requests[-1].messages[0] == ChatMessage("system", "default")
    # a new hub with other defaults: the log's settings stand
    async with open_hub(store, provider, model="other-model", system="x") as hub:
        await (await hub.submit("s", "q3")).outcome()
        assert (await hub.state("s")).config == started
    assert provider.requests[-1].model == "m"


async def test_recovery_closes_a_log_that_ends_in_flight(store: HookedStore) -> None:
    dangling = [SessionStarted("sys", "m"), TurnSubmitted(R0, "lost?", 0, 0, 90), StreamStarted(R0)]
    await store.append(
        "s",
        [
            DEFAULT_CODEC.encode(e, session_id="s", seq=i, recorded_at=0.0)
            for i, e in enumerate(dangling, start=1)
        ],
        0,
    )
    provider = ScriptedProvider()
    with capture_logs() as logs:
        async with open_hub(store, provider, model="m") as hub:
            result = await (await hub.submit("s", "again", request_id=R1)).outcome()
            retry = await (await hub.submit("s", "lost?", request_id=R0)).outcome()
    evs = await events_of(store, "s")
    assert evs[3] == TurnDiscarded(R0, "interrupted", "recovered in flight", 0)
    assert isinstance(evs[4], TurnSubmitted) and evs[4].request_id == R1
    assert result == CommittedResult(R1, "echo: again", "stop")
    assert retry == DiscardedResult(R0, "interrupted", "recovered in flight", repeated=True)
    t = lines(logs, "transition", tag="turn_discarded")[0]
    assert (t["from"], t["to"], t["reason"], t["request_id"]) == (
        "Streaming",
        "Discarded",
        "interrupted",
        R0,
    )
    # the interrupt is written before the actor accepts messages
    started = lines(logs, "actor_started")[0]
    assert logs.index(t) < logs.index(started) and started["version"] == 4


async def test_passivation_and_reactivation_by_replay(
    store: HookedStore, autojump_clock: Any
) -> None:
    provider = ScriptedProvider()
    with capture_logs() as logs:
        async with open_hub(store, provider, model="m", passivate_after=10) as hub:
            await (await hub.submit("s", "one")).outcome()
            assert hub.statistics().actors == 1
            await trio.sleep(11)
            stats = hub.statistics()
            assert (stats.actors, stats.actors_passivated) == (0, 1)
            assert store.released == ["s"]
            # still readable without an actor
            assert len(await hub.history("s")) == 1
            assert hub.statistics().actors == 0
            result = await (await hub.submit("s", "two")).outcome()
            assert hub.statistics().actors_started == 2
    assert isinstance(result, CommittedResult)
    assert provider.requests[-1].messages[:2] == (
        ChatMessage("user", "one"),
        ChatMessage("assistant", "echo: one"),
    )
    assert [line["why"] for line in lines(logs, "actor_stopped")] == ["passivated", "hub_closed"]
    assert store.acquired == ["s", "s"] and store.released == ["s", "s"]


async def test_a_busy_session_is_not_passivated(store: HookedStore, autojump_clock: Any) -> None:
    provider = by_request({"r1": [Begin(), Chunk("x", delay=50), Finish()]})
    async with open_hub(store, provider, model="m", passivate_after=10, idle_timeout=None) as hub:
        result = await (await hub.submit("s", "q", request_id=R1)).outcome()
        assert hub.statistics().actors_passivated == 0
    assert result == CommittedResult(R1, "x", "stop")


async def test_leaving_the_hub_interrupts_turns_and_stops_everything(store: HookedStore) -> None:
    provider = by_request({}, default=[Begin(), Chunk("so far"), Hang()])
    turns = []
    nurseries = list(trio.lowlevel.current_task().child_nurseries)
    async with open_hub(store, provider, model="m") as hub:
        for i in range(5):
            turns.append(await hub.submit(f"s{i}", "q", request_id=R1))
        await wait_all_tasks_blocked()
        assert hub.statistics().requests == 5 and hub.statistics().in_flight == 5
    assert trio.lowlevel.current_task().child_nurseries == nurseries
    assert hub._nursery.child_tasks == frozenset()
    stats = hub.statistics()
    assert (stats.actors, stats.requests, stats.in_flight) == (0, 0, 0)
    for i, turn in enumerate(turns):
        assert await turn.outcome() == DiscardedResult(R1, "interrupted", "hub closed", 6)
        assert (await events_of(store, f"s{i}"))[-1] == TurnDiscarded(
            R1, "interrupted", "hub closed", 6
        )
    assert sorted(provider.cancelled) == [R1] * 5 and provider.open == 0
    with pytest.raises(SessionClosed):
        await hub.submit("s0", "late")


async def test_questions_still_queued_at_close_are_refused(
    store: HookedStore, autojump_clock: Any
) -> None:
    store.before("turn_submitted", lambda: trio.sleep(1))
    provider = by_request({}, default=[Hang()])
    async with open_hub(store, provider, model="m") as hub:
        held = await hub.submit("s", "first", request_id=R1)
        await wait_all_tasks_blocked()  # the actor is inside r1's append
        queued = await hub.submit("s", "second", request_id=R2)
    assert await held.outcome() == DiscardedResult(R1, "interrupted", "hub closed", 0)
    with pytest.raises(SessionClosed):
        await queued.outcome()
    assert R2 not in str(await events_of(store, "s"))


async def test_an_exception_in_the_body_propagates_unwrapped(store: HookedStore) -> None:
    provider = by_request({}, default=[Hang()])
    with pytest.raises(KeyError):
        async with open_hub(store, provider, model="m") as hub:
            turn = await hub.submit("s", "q", request_id=R1)
            await wait_all_tasks_blocked()
            raise KeyError("boom")
    assert await turn.outcome() == DiscardedResult(R1, "interrupted", "hub closed", 0)


async def test_an_outer_cancel_still_writes_the_interrupts(
    store: HookedStore, autojump_clock: Any
) -> None:
    provider = by_request({}, default=[Hang()])
    with trio.move_on_after(5):
        async with open_hub(store, provider, model="m") as hub:
            turn = await hub.submit("s", "q", request_id=R1)
            await trio.sleep_forever()
    assert await turn.outcome() == DiscardedResult(R1, "interrupted", "hub closed", 0)
    assert (await tags_of(store, "s"))[-1] == "turn_discarded"
    assert store.released == ["s"]


async def test_a_conflict_discards_the_turn_and_goes_on(store: HookedStore) -> None:
    async def foreign_write(_: Any) -> None:
        # another process writes to the session while our turn streams
        await wait_all_tasks_blocked()
        version = len(await store.read("s"))
        ev = DEFAULT_CODEC.encode(
            CompletionIgnored(RequestId("zz"), "completed"),
            session_id="s",
            seq=version + 1,
            recorded_at=0.0,
        )
        await store.append("s", [ev], version)

    provider = by_request({"r1": [Begin(), Hook(foreign_write), Finish("mine")]})
    with capture_logs() as logs:
        async with open_hub(store, provider, model="m") as hub:
            result = await (await hub.submit("s", "q", request_id=R1)).outcome()
            after = await (await hub.submit("s", "next", request_id=R2)).outcome()
            await wait_all_tasks_blocked()
            assert await hub.state("s") == await replayed(store, "s")
    assert result.reason == "conflict" and isinstance(result, DiscardedResult)
    assert after == CommittedResult(R2, "ok", "stop")
    assert [type(e).__name__ for e in await events_of(store, "s")][3:] == [
        "CompletionIgnored",  # theirs
        "TurnDiscarded",  # ours: conflict
        "CompletionIgnored",  # our Completed, decided again: now late
        "TurnSubmitted",
        "StreamStarted",
        "TurnCommitted",
    ]
    conflict = lines(logs, "append_conflict")[0]
    assert conflict["session_id"] == "s" and conflict["expected_version"] == 3
    assert conflict["actual_version"] == 4


async def test_a_session_owned_elsewhere_is_a_typed_error(store: HookedStore) -> None:
    store.owned_elsewhere.add("theirs")
    async with open_hub(store, ScriptedProvider(), model="m") as hub:
        with pytest.raises(SessionOwnedElsewhere):
            await hub.submit("theirs", "q")
        with pytest.raises(SessionOwnedElsewhere):
            await hub.open_session("theirs")
        assert isinstance(await (await hub.submit("mine", "q")).outcome(), CommittedResult)
        assert hub.statistics().actors == 1


async def test_provider_errors_become_discards(store: HookedStore) -> None:
    async def bug(_: Any) -> None:
        raise ValueError("token=sk-secret")

    provider = by_request(
        {"r1": [Hook(bug)], "r2": [Fail("http_status", "429")], "r3": [Fail("made_up")]}
    )
    with capture_logs() as logs:
        async with open_hub(store, provider, model="m") as hub:
            r1 = await (await hub.submit("s", "a", request_id=R1)).outcome()
            r2 = await (await hub.submit("s", "b", request_id=R2)).outcome()
            r3 = await (await hub.submit("s", "c", request_id=R3)).outcome()
            assert hub.statistics().actors == 1
    assert r1 == DiscardedResult(R1, "provider_error", "ValueError", 0)
    assert r2 == DiscardedResult(R2, "http_status", "429", 0)
    assert isinstance(r3, DiscardedResult) and r3.reason == "provider_error"
    assert "sk-secret" not in repr(logs) and "sk-secret" not in repr(await store.read("s"))
    err = lines(logs, "request_error")[0]
    assert (err["error"], err["request_id"]) == ("ValueError", R1)


async def test_a_caller_that_outruns_a_session_waits(store: HookedStore) -> None:
    gate = trio.Event()
    store.before("turn_submitted", gate.wait)
    provider = by_request({}, default=[Hang()])
    sent: list[int] = []
    async with open_hub(store, provider, model="m", mailbox_size=2) as hub:

        async def submit(i: int) -> None:
            await hub.submit("s", f"q{i}", request_id=f"q{i}")
            sent.append(i)

        async with trio.open_nursery() as nursery:
            for i in range(6):
                nursery.start_soon(submit, i)
                await wait_all_tasks_blocked()
            # one held in the append, two queued, the rest wait
            assert sorted(sent) == [0, 1, 2]
            gate.set()
        assert sorted(sent) == list(range(6))
        await hub.cancel("s")


async def test_previews_for_several_consumers(store: HookedStore) -> None:
    provider = by_request({"r1": [Chunk("a"), Chunk("b", delay=0.01), Chunk("c"), Finish()]})
    async with open_hub(store, provider, model="m") as hub:
        turn = await hub.submit("s", "q", request_id=R1)
        got: dict[int, list[str]] = {}

        async def read(k: int) -> None:
            got[k] = [d async for d in turn.preview()]

        async with trio.open_nursery() as nursery:
            nursery.start_soon(read, 1)
            nursery.start_soon(read, 2)
        assert await turn.outcome() == CommittedResult(R1, "abc", "stop")
        assert got == {1: ["a", "b", "c"], 2: ["a", "b", "c"]}
        assert [d async for d in turn.preview()] == ["a", "b", "c"]
        assert turn.done


async def test_replay_of_the_log_equals_the_live_state(store: HookedStore) -> None:
    provider = by_request({"r2": [Fail("transport")]}, default=[Chunk("x"), Finish()])
    async with open_hub(store, provider, model="m", policy=Window(2)) as hub:
        for rid in ("r1", "r2", "r3", "r4"):
            await (await hub.submit("s", "q", request_id=rid)).outcome()
            assert await hub.state("s") == await replayed(store, "s")


async def test_config_is_validated(store: HookedStore) -> None:
    with pytest.raises(ValueError, match="turn_deadline"):
        async with open_hub(store, ScriptedProvider(), model="m", turn_deadline=0):
            pass


async def test_recorded_at_comes_from_the_injected_clock(store: HookedStore) -> None:
    async with open_hub(store, ScriptedProvider(), model="m", clock=lambda: 1234.5) as hub:
        await (await hub.submit("s", "q")).outcome()
    assert {s.recorded_at for s in await store.read("s")} == {1234.5}


async def test_log_names_are_the_documented_ones(store: HookedStore) -> None:
    provider = by_request({"r1": [Begin(), Hang()]})
    with capture_logs() as logs:
        async with open_hub(store, provider, model="m", on_busy="supersede") as hub:
            await hub.submit("s", "q", request_id=R1)
            await (await hub.submit("s", "q", request_id=R2)).outcome()
            await hub.cancel("s")
    assert {line["event"] for line in logs} <= set(EVENTS)
    for line in logs:
        assert set(line) - {"event", "log_level"} <= FIELDS, line
        assert line["log_level"] == EVENTS[line["event"]]
        assert "q" not in {v for k, v in line.items() if k not in ("session_id",)}
    documented = set(re.findall(r"`([a-z_]+)`", DOCS.read_text(encoding="utf-8")))
    assert set(EVENTS) | FIELDS <= documented


async def test_a_session_created_meanwhile_by_another_writer(store: HookedStore) -> None:
    async def they_create_it_first() -> None:
        ev = DEFAULT_CODEC.encode(
            SessionStarted("theirs", "their-model"), session_id="s", seq=1, recorded_at=0.0
        )
        await MemoryStore.append(store, "s", [ev], 0)

    store.before("session_started", they_create_it_first)
    with capture_logs() as logs:
        async with open_hub(store, ScriptedProvider(), model="m") as hub:
            result = await (await hub.submit("s", "q")).outcome()
    assert isinstance(result, CommittedResult)
    assert (await events_of(store, "s"))[0] == SessionStarted("theirs", "their-model")
    assert await tags_of(store, "s") == [
        "session_started",
        "turn_submitted",
        "stream_started",
        "turn_committed",
    ]
    assert lines(logs, "append_conflict")[0]["expected_version"] == 0


async def test_a_store_that_hangs_at_shutdown_is_given_up_after_the_grace(
    store: HookedStore, autojump_clock: Any
) -> None:
    store.before("turn_discarded", trio.sleep_forever)
    provider = by_request({}, default=[Hang()])
    async with open_hub(store, provider, model="m", shutdown_grace=2) as hub:
        turn = await hub.submit("s", "q", request_id=R1)
        await wait_all_tasks_blocked()
        t0 = trio.current_time()
    assert trio.current_time() - t0 == 2
    with pytest.raises(SessionClosed):
        await turn.outcome()
    assert hub.statistics().actors == 0 and provider.open == 0
    # the next start finds the turn in flight and closes it
    async with open_hub(store, provider, model="m") as hub:
        assert await (await hub.submit("s", "q", request_id=R1)).outcome() == DiscardedResult(
            R1, "interrupted", "recovered in flight", repeated=True
        )


async def test_state_of_a_session_never_seen(store: HookedStore) -> None:
    async with open_hub(store, ScriptedProvider(), model="m") as hub:
        state = await hub.state("nobody")
        assert state.version == 0 and state.config is None
        assert await hub.history("nobody") == ()
        assert hub.statistics().actors == 0


async def test_a_corrupt_log_is_a_typed_error_at_start(store: HookedStore) -> None:
    corrupt = [SessionStarted("", "m"), TurnRejected(R1, "busy"), TurnRejected(R1, "busy")]
    await store.append(
        "s",
        [
            DEFAULT_CODEC.encode(e, session_id="s", seq=i, recorded_at=0.0)
            for i, e in enumerate(corrupt, start=1)
        ],
        0,
    )
    async with open_hub(store, ScriptedProvider(), model="m") as hub:
        with pytest.raises(ReplayError):
            await hub.submit("s", "q")
        assert hub.statistics().actors == 0 and store.released == ["s"]
        assert isinstance(await (await hub.submit("other", "q")).outcome(), CommittedResult)
