"""Forks on the real PostgreSQL: two rows, the shared turns read back by a
new store and hub, and an erasure of the source that takes the fork."""

from __future__ import annotations

import pytest

from turnledger import SessionExists
from turnledger.adapters.stores import open_store
from turnledger.sessions import CommittedResult, open_hub, replay_sessions, replay_stored
from turnledger.testing import ScriptedProvider

pytestmark = pytest.mark.postgres


async def test_a_fork_on_postgres(pg_dsn: str) -> None:
    store = await open_store(pg_dsn)
    try:
        async with open_hub(store, ScriptedProvider(), model="m") as hub:
            for q in ("one", "two", "three"):
                assert isinstance(await (await hub.submit("s", q)).outcome(), CommittedResult)
            before = [(e.seq, e.tag, e.payload) for e in await store.read("s")]
            await hub.fork("s", "f", 2)
            with pytest.raises(SessionExists):
                await hub.fork("s", "f")
            assert [e.tag for e in await store.read("f")] == ["session_started", "session_forked"]
            await (await hub.submit("f", "trois")).outcome()
            live = await hub.state("f")
        assert [(e.seq, e.tag, e.payload) for e in await store.read("s")] == before
    finally:
        await store.aclose()

    store = await open_store(pg_dsn)
    try:
        assert await replay_stored(store, "f") == live
        assert (await replay_sessions(store, ["f"]))["f"] == live
        assert [t.question for t in live.turns] == ["one", "two", "trois"]
        async with open_hub(store, ScriptedProvider(), model="m") as hub:
            assert await hub.history("f") == tuple(live.turns)
            await hub.erase("s")
            assert sorted(await store.session_ids()) == []
    finally:
        await store.aclose()
