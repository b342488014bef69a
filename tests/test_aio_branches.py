"""Branches from asyncio (turnledger.aio), on a real SQLite file."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
import trio

from turnledger import SessionBusy, UnknownBranch, UnknownSession, UnknownTurn, aio
from turnledger.adapters.stores import SQLiteStore
from turnledger.events import DEFAULT_CODEC
from turnledger.sessions import ChatRequest, CommittedResult, SessionState, replay
from turnledger.testing import Begin, Chunk, Finish, Hang, ScriptedProvider, Step


def _replayed(db: Path, session_id: str) -> SessionState:
    async def read() -> SessionState:
        store = await SQLiteStore.open(db, read_only=True)
        try:
            return replay(await store.read_decoded(session_id, DEFAULT_CODEC))
        finally:
            await store.aclose()

    return trio.run(read)


def test_edit_regenerate_switch_and_branches_from_asyncio(tmp_path: Path) -> None:
    db = tmp_path / "aio.db"

    async def main() -> SessionState:
        async with aio.open_hub(lambda: SQLiteStore.open(db), ScriptedProvider(), model="m") as hub:
            for q in ("one", "two"):
                await (await hub.submit("s", q)).outcome()
            with pytest.raises(UnknownSession):
                await hub.edit("nobody", 0, "q")
            with pytest.raises(UnknownTurn):
                await hub.edit("s", 2, "q")
            with pytest.raises(UnknownBranch):
                await hub.switch("s", "b1")
            edit = await hub.edit("s", 1, "two, asked differently", request_id="e1")
            result = await edit.outcome()
            assert isinstance(result, CommittedResult)
            assert result.answer == "echo: two, asked differently"
            again = await (await hub.regenerate("s")).outcome()
            assert isinstance(again, CommittedResult)
            questions = [t.question for t in await hub.history("s")]
            assert questions == ["one", "two, asked differently"]
            await hub.switch("s", "main")
            assert [t.question for t in await hub.history("s")] == ["one", "two"]
            listed = await hub.branches("s")
            assert [(b.branch_id, b.length, b.active) for b in listed] == [
                ("main", 2, True),
                ("b1", 2, False),
                ("b2", 2, False),
            ]
            return await hub.state("s")

    live = asyncio.run(main())
    assert _replayed(db, "s") == live


def _hang_on_hang(request: ChatRequest) -> list[Step]:
    if request.messages[-1].content == "hang":
        return [Begin(), Chunk("x"), Hang()]
    return [Begin(), Chunk("ok"), Finish()]


def test_a_switch_while_busy_is_refused_from_asyncio(tmp_path: Path) -> None:
    db = tmp_path / "busy.db"

    async def main() -> None:
        provider = ScriptedProvider(_hang_on_hang)
        async with aio.open_hub(lambda: SQLiteStore.open(db), provider, model="m") as hub:
            await (await hub.submit("s", "first")).outcome()
            await (await hub.edit("s", 0, "first again")).outcome()
            busy = await hub.submit("s", "hang")
            async with asyncio.timeout(10):
                async for _ in busy.preview():
                    break
            with pytest.raises(SessionBusy):
                await hub.switch("s", "main")
            await busy.cancel()
            await hub.switch("s", "main")
            assert [t.question for t in await hub.history("s")] == ["first"]

    asyncio.run(main())


def test_fork_from_asyncio_shares_the_prefix(tmp_path: Path) -> None:
    from turnledger import SessionExists
    from turnledger.events import SessionForked
    from turnledger.sessions import replay_stored

    db = tmp_path / "aio-fork.db"

    async def main() -> tuple[SessionState, SessionForked]:
        async with aio.open_hub(lambda: SQLiteStore.open(db), ScriptedProvider(), model="m") as hub:
            for q in ("one", "two", "three"):
                await (await hub.submit("s", q)).outcome()
            with pytest.raises(UnknownSession):
                await hub.fork("nobody", "f")
            with pytest.raises(UnknownTurn):
                await hub.fork("s", "f", 4)
            with pytest.raises(SessionExists):
                await hub.fork("s", "s")
            forked = await hub.fork("s", "f", 2)
            await (await hub.submit("f", "three, on the fork")).outcome()
            assert [t.question for t in await hub.history("f")] == [
                "one",
                "two",
                "three, on the fork",
            ]
            assert len(await hub.history("s")) == 3
            return await hub.state("f"), forked

    live, forked = asyncio.run(main())
    assert (forked.source, forked.at_turn) == ("s", 2)

    async def read() -> SessionState:
        store = await SQLiteStore.open(db, read_only=True)
        try:
            return await replay_stored(store, "f")
        finally:
            await store.aclose()

    assert trio.run(read) == live
