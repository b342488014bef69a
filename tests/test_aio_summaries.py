"""Summaries and pinned items from asyncio (turnledger.aio), on a real SQLite file."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from pathlib import Path

import pytest

from test_aio_branches import _replayed
from turnledger import SummaryFailed, UnknownPin, aio
from turnledger.adapters.stores import SQLiteStore
from turnledger.sessions import (
    CommittedResult,
    SessionState,
    SummaryPolicy,
    Turn,
)
from turnledger.testing import ScriptedProvider


def test_summarize_pin_and_a_policy_from_asyncio(tmp_path: Path) -> None:
    db = tmp_path / "aio.db"
    seen: list[int] = []

    async def on_asyncio(turns: Sequence[Turn]) -> str:
        # an asyncio coroutine: it may await asyncio things
        await asyncio.sleep(0)
        seen.append(len(turns))
        return f"summary of {len(turns)} turns"

    async def failing(turns: Sequence[Turn]) -> str:
        await asyncio.sleep(0)
        raise ValueError("nope")

    policy = SummaryPolicy(after_dropped=2, summarizer=on_asyncio)

    async def main() -> SessionState:
        async with aio.open_hub(
            lambda: SQLiteStore.open(db),
            ScriptedProvider(),
            model="m",
            max_request_bytes=400,
            summary_policy=policy,
        ) as hub:
            for i in range(3):
                await (await hub.submit("s", f"question {i}")).outcome()
            ev = await hub.summarize("s", end=2, summarizer=on_asyncio)
            assert (ev.summary_id, ev.origin, ev.end) == ("s1", "function", 2)
            assert ev.origin_name.endswith("on_asyncio")
            with pytest.raises(SummaryFailed, match="ValueError"):
                await hub.summarize("s", summarizer=failing)
            assert await hub.pin("s", "Ada", origin="memory") == "p1"
            assert [p.text for p in await hub.pins("s")] == ["Ada"]
            with pytest.raises(UnknownPin):
                await hub.unpin("s", "p7")
            for i in range(3, 9):
                r = await (await hub.submit("s", f"question {i}")).outcome()
                assert isinstance(r, CommittedResult)
            # the policy's summaries ran on this loop, beside the turns
            for _ in range(200):
                if len(await hub.summaries("s")) > 1:
                    break
                await asyncio.sleep(0.01)
            assert len(await hub.summaries("s")) > 1 and len(seen) > 1
            await hub.unpin("s", "p1")
            assert await hub.pins("s") == ()
            return await hub.state("s")

    live = asyncio.run(main())
    assert _replayed(db, "s") == live
    assert len(live.turns) == 9


def test_the_request_sends_the_pin_from_asyncio(tmp_path: Path) -> None:
    db = tmp_path / "aio.db"
    provider = ScriptedProvider()

    async def main() -> SessionState:
        async with aio.open_hub(
            lambda: SQLiteStore.open(db), provider, model="m", system="sys"
        ) as hub:
            await (await hub.submit("s", "one")).outcome()
            await hub.pin("s", "Answer in French.", origin="policy")
            await (await hub.submit("s", "two")).outcome()
            return await hub.state("s")

    live = asyncio.run(main())
    assert _replayed(db, "s") == live
    sent = [(m.role, m.content) for m in provider.requests[-1].messages]
    assert sent[:2] == [("system", "sys"), ("user", "Answer in French.")]
    assert sent[-1] == ("user", "two")
