"""turnledger.aio: the hub from asyncio, trio running as a guest on the asyncio loop."""

from __future__ import annotations

import asyncio
import gc
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest
import trio

from turnledger import InvalidCommand, SessionClosed, StoreUnavailable, WrongEventLoop, aio
from turnledger.events import DEFAULT_CODEC, TurnDiscarded
from turnledger.sessions import (
    ChatRequest,
    CommittedResult,
    DiscardedResult,
    RejectedResult,
    open_hub,
)
from turnledger.testing import Chunk, Finish, Hang, MemoryStore, Pause, ScriptedProvider, Step


def slow_script(request: ChatRequest) -> list[Step]:
    """Two chunks 0.3 s apart: long enough for a waiter to leave in between."""
    return [Chunk("one "), Pause(0.3), Chunk("two"), Finish()]


def run(
    store: MemoryStore,
    provider: ScriptedProvider,
    body: Callable[[aio.Hub], Awaitable[Any]],
    **options: Any,
) -> Any:
    async def main() -> Any:
        async with aio.open_hub(store, provider, model="m", **options) as hub:
            return await body(hub)

    return asyncio.run(main())


def tags(store: MemoryStore, session_id: str) -> list[str]:
    async def read() -> list[str]:
        return [e.tag for e in await store.read(session_id)]

    return trio.run(read)


def discard_reasons(store: MemoryStore, session_id: str) -> list[str]:
    async def read() -> list[str]:
        events = await store.read_decoded(session_id, DEFAULT_CODEC)
        return [e.reason for e in events if isinstance(e, TurnDiscarded)]

    return trio.run(read)


def test_submit_preview_outcome_history_state() -> None:
    store = MemoryStore()

    async def body(hub: aio.Hub) -> None:
        handle = await hub.submit("s1", "hello", request_id="r1")
        assert (handle.session_id, handle.request_id) == ("s1", "r1")
        assert [c async for c in handle.preview()] == ["echo: ", "hello"]
        result = await handle.outcome()
        assert isinstance(result, CommittedResult) and result.answer == "echo: hello"
        assert handle.done
        # A second preview replays from the start, as the trio one does.
        assert [c async for c in handle.preview()] == ["echo: ", "hello"]
        again = await hub.submit("s1", "hello", request_id="r1")
        repeated = await again.outcome()
        assert isinstance(repeated, CommittedResult) and repeated.repeated
        history = await hub.history("s1")
        assert [(t.question, t.answer) for t in history] == [("hello", "echo: hello")]
        state = await hub.state("s1")
        assert len(state.turns) == 1
        opened = await hub.open_session("s2", system="Be brief.")
        assert opened.config is not None and opened.config.system == "Be brief."
        await hub.cancel("s2")  # nothing in flight: nothing happens
        assert hub.statistics().actors == 2

    run(store, ScriptedProvider(), body)
    assert tags(store, "s1")[-1] == "turn_committed"


def test_cancelling_the_outcome_waiter_does_not_cancel_the_turn() -> None:
    store = MemoryStore()
    provider = ScriptedProvider(slow_script)

    async def body(hub: aio.Hub) -> None:
        handle = await hub.submit("s1", "q")
        waiter = asyncio.create_task(handle.outcome())
        await asyncio.sleep(0.1)
        waiter.cancel()
        with pytest.raises(asyncio.CancelledError):
            await waiter
        result = await handle.outcome()
        assert isinstance(result, CommittedResult) and result.answer == "one two"

    run(store, provider, body)
    assert provider.cancelled == []
    assert "turn_discarded" not in tags(store, "s1")


def test_cancelling_the_preview_reader_does_not_cancel_the_turn(
    caplog: pytest.LogCaptureFixture,
) -> None:
    store = MemoryStore()
    provider = ScriptedProvider(slow_script)

    async def body(hub: aio.Hub) -> None:
        handle = await hub.submit("s1", "q")
        seen: list[str] = []

        async def read() -> None:
            async for chunk in handle.preview():
                seen.append(chunk)

        reader = asyncio.create_task(read())
        await asyncio.sleep(0.1)
        assert seen == ["one "]
        reader.cancel()
        with pytest.raises(asyncio.CancelledError):
            await reader
        # Breaking out of the loop early is the same: the turn goes on.
        async for _ in handle.preview():
            break
        result = await asyncio.wait_for(handle.outcome(), 5)
        assert isinstance(result, CommittedResult)
        assert [c async for c in handle.preview()] == ["one ", "two"]

    run(store, provider, body)
    assert provider.cancelled == []
    assert tags(store, "s1")[-1] == "turn_committed"
    gc.collect()  # a future left with an unread error would be reported now
    assert [r.getMessage() for r in caplog.records if r.name == "asyncio"] == []


def test_handle_cancel_is_what_cancels_a_turn() -> None:
    store = MemoryStore()
    provider = ScriptedProvider(lambda request: [Chunk("par"), Hang()])

    async def body(hub: aio.Hub) -> None:
        handle = await hub.submit("s1", "q")
        async for _ in handle.preview():
            break
        result = await handle.cancel()
        assert isinstance(result, DiscardedResult) and result.reason == "cancelled"
        assert result.preview_chars == 3
        busy = await hub.submit("s1", "next")
        await asyncio.sleep(0.05)
        await hub.cancel("s1")
        second = await busy.outcome()
        assert isinstance(second, DiscardedResult) and second.reason == "cancelled"

    run(store, provider, body)
    assert discard_reasons(store, "s1") == ["cancelled", "cancelled"]


def test_errors_cross_as_the_same_types() -> None:
    store = MemoryStore()
    provider = ScriptedProvider(lambda request: [Hang()])

    async def body(hub: aio.Hub) -> aio.Hub:
        with pytest.raises(InvalidCommand, match="session id"):
            await hub.submit("", "q")
        await hub.open_session("s1", system="A")
        with pytest.raises(InvalidCommand, match="exists with system"):
            await hub.open_session("s1", system="B")
        await hub.submit("s1", "first")
        rejected = await (await hub.submit("s1", "second")).outcome()
        assert isinstance(rejected, RejectedResult) and rejected.reason == "busy"
        return hub

    hub = run(store, provider, body)

    async def after() -> None:
        with pytest.raises(SessionClosed):
            await hub.submit("s1", "too late")

    asyncio.run(after())


def test_leaving_the_context_interrupts_turns_in_flight() -> None:
    store = MemoryStore()
    provider = ScriptedProvider(lambda request: [Chunk("x"), Hang()])
    results: list[Any] = []

    async def main() -> None:
        async with aio.open_hub(store, provider, model="m") as hub:
            handles = [await hub.submit(f"s{i}", "q") for i in range(3)]
            waiters = [asyncio.create_task(h.outcome()) for h in handles]
            await asyncio.sleep(0.05)
        results.extend(await asyncio.gather(*waiters))

    asyncio.run(main())
    assert all(isinstance(r, DiscardedResult) and r.reason == "interrupted" for r in results)
    for i in range(3):
        assert discard_reasons(store, f"s{i}") == ["interrupted"]
    assert len(provider.cancelled) == 3


@pytest.mark.parametrize("how", ["the holder is cancelled", "asyncio.run is ending"])
def test_a_cancelled_holder_still_shuts_the_hub_down(how: str) -> None:
    # The task holding the hub (with a turn in flight) is cancelled, by the
    # application or by asyncio.run cancelling the tasks left when main returns.
    store = MemoryStore()
    provider = ScriptedProvider(lambda request: [Chunk("x"), Hang()])

    async def hold(ready: asyncio.Event) -> None:
        async with aio.open_hub(store, provider, model="m") as hub:
            await hub.submit("s1", "q")
            ready.set()
            await asyncio.Event().wait()

    async def main() -> None:
        ready = asyncio.Event()
        holder = asyncio.get_running_loop().create_task(hold(ready))
        await ready.wait()
        await asyncio.sleep(0.05)
        if how == "the holder is cancelled":
            holder.cancel()
            with pytest.raises(asyncio.CancelledError):
                await holder

    asyncio.run(main())
    assert discard_reasons(store, "s1") == ["interrupted"]
    assert provider.cancelled


def test_a_store_that_opens_under_trio_is_given_as_an_opener(tmp_path: Any) -> None:
    from turnledger.adapters.stores import SQLiteStore

    path = tmp_path / "chats.db"

    async def body(hub: aio.Hub) -> None:
        result = await (await hub.submit("s1", "hi")).outcome()
        assert isinstance(result, CommittedResult)

    async def main() -> None:
        async with aio.open_hub(
            lambda: SQLiteStore.open(path), ScriptedProvider(), model="m"
        ) as hub:
            await body(hub)

    asyncio.run(main())

    async def check() -> None:
        store = await SQLiteStore.open(path)
        try:
            events = await store.read("s1")
            assert events[-1].tag == "turn_committed"
        finally:
            await store.aclose()

    trio.run(check)


async def test_the_asyncio_hub_under_trio_says_which_one_to_use() -> None:
    with pytest.raises(WrongEventLoop, match=r"turnledger\.sessions\.open_hub"):
        async with aio.open_hub(MemoryStore(), ScriptedProvider(), model="m"):
            pass  # pragma: no cover


def test_an_asyncio_handle_used_from_trio_says_which_one_to_use() -> None:
    store = MemoryStore()

    async def body(hub: aio.Hub) -> None:
        handle = await hub.submit("s1", "q")
        await handle.outcome()
        errors: list[BaseException] = []

        async def from_trio() -> None:
            try:
                await handle.outcome()
            except WrongEventLoop as exc:
                errors.append(exc)

        # A trio task of the same guest run, as trio code would call it.
        await hub._bridge.run(from_trio)
        assert errors and "turnledger.sessions" in str(errors[0])

    run(store, ScriptedProvider(), body)


def test_an_opener_that_fails_fails_open_hub_with_its_error() -> None:
    closed: list[str] = []

    class Provider(ScriptedProvider):
        async def aclose(self) -> None:
            closed.append("provider")

    async def broken() -> MemoryStore:
        await trio.lowlevel.checkpoint()  # runs on the trio side
        raise StoreUnavailable("the disk went away")

    async def main() -> None:
        with pytest.raises(StoreUnavailable, match="the disk went away"):
            async with aio.open_hub(broken, Provider, model="m"):
                pass  # pragma: no cover

    asyncio.run(main())
    assert closed == []  # the provider's opener is called after the store's

    async def second() -> None:
        async with aio.open_hub(MemoryStore, Provider, model="m") as hub:
            await (await hub.submit("s1", "q")).outcome()

    asyncio.run(second())
    assert closed == ["provider"]  # what the hub opened, it closed


def test_the_trio_hub_under_asyncio_says_which_one_to_use() -> None:
    async def main() -> None:
        with pytest.raises(WrongEventLoop, match=r"turnledger\.aio\.open_hub"):
            async with open_hub(MemoryStore(), ScriptedProvider(), model="m"):
                pass  # pragma: no cover

    asyncio.run(main())


def test_asyncio_code_erases_and_prunes(tmp_path: Path) -> None:
    from turnledger.adapters.stores import open_store as _open_store
    from turnledger.aio import open_hub as _aio_open_hub
    from turnledger.sessions import RetentionPolicy
    from turnledger.testing import ScriptedProvider as _Scripted

    async def main() -> tuple[int, list[str], int, int]:
        async with _aio_open_hub(
            lambda: _open_store(tmp_path / "e.db"), _Scripted.instant("yes"), model="m"
        ) as hub:
            await hub.open_session("a", subject="u")
            await (await hub.submit("b", "q", subject="u")).outcome()
            await (await hub.submit("c", "q1")).outcome()
            await (await hub.submit("c", "q2")).outcome()
            one = await hub.erase("a")
            rest = await hub.erase_subject("u")
            steps = await hub.prune(RetentionPolicy(max_turns=1))
            return (
                one.events,
                [r.session_hash for r in rest],
                len(steps),
                len(await hub.history("c")),
            )

    events, hashes, steps, turns = asyncio.run(main())
    assert events == 1 and len(hashes) == 1 and steps == 1 and turns == 1


def test_snapshots_are_given_as_an_opener_and_closed_on_the_trio_side() -> None:
    from turnledger.adapters.stores import MemorySnapshots

    opened: list[MemorySnapshots] = []
    closed: list[bool] = []

    class Watched(MemorySnapshots):
        async def aclose(self) -> None:
            closed.append(True)
            await super().aclose()

    def opener() -> MemorySnapshots:
        trio.lowlevel.current_trio_token()  # raises unless called on the trio side
        opened.append(Watched())
        return opened[-1]

    async def main() -> None:
        async with aio.open_hub(
            MemoryStore(), ScriptedProvider(), model="m", snapshots=opener, snapshot_every=1
        ) as hub:
            for i in range(3):
                await (await hub.submit("s", f"q{i}")).outcome()
            # Snapshots are written in the background (guest mode: one thread).
            for _ in range(500):
                if "s" in opened[0].kept:
                    break
                await asyncio.sleep(0.01)
            assert "s" in opened[0].kept

    asyncio.run(main())
    assert len(opened) == 1 and closed == [True]


def test_drop_and_idle_sessions_from_asyncio() -> None:
    store = MemoryStore()

    async def body(hub: aio.Hub) -> tuple[list[str], list[str], int]:
        await (await hub.submit("s1", "hello", request_id="r1")).outcome()
        idle = hub.idle_sessions()
        await hub.drop("s1")
        after = hub.idle_sessions()
        # The next question starts a new actor by replay.
        await (await hub.submit("s1", "again", request_id="r2")).outcome()
        return idle, after, hub.statistics().actors_started

    assert run(store, ScriptedProvider(), body) == (["s1"], [], 2)
