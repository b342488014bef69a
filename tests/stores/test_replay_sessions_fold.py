"""``replay_sessions`` on every store: the bulk replay's fast fold gives the
state the live sessions had, through each store's way of reading (rows of
JSON text on SQLite and PostgreSQL, parsed envelopes on the journal and in
memory)."""

from pathlib import Path

import pytest
import trio

from turnledger.adapters.stores import open_store
from turnledger.events import DEFAULT_CODEC, EventStore
from turnledger.sessions import replay, replay_sessions
from turnledger.testing import MemoryStore

from ._store_scenarios import conversation


@pytest.fixture(
    params=["memory", "sqlite", "journal", pytest.param("postgres", marks=pytest.mark.postgres)]
)
def target(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    if request.param == "postgres":
        dsn: str = request.getfixturevalue("pg_dsn")
        return dsn
    if request.param == "memory":
        return "memory"
    return str(tmp_path / ("events.db" if request.param == "sqlite" else "events.jsonl"))


async def test_replay_sessions_is_the_live_state_on_every_store(target: str) -> None:
    sessions = {f"s-{i}": conversation(f"s-{i}", turns=3 + i % 5) for i in range(10)}
    with trio.fail_after(30):
        store: EventStore = MemoryStore() if target == "memory" else await open_store(target)
        try:
            for sid, (batches, _) in sessions.items():
                version = 0
                for batch in batches:
                    version = await store.append(sid, batch, version)
            ids = [*sessions, "never-written"]
            states = await replay_sessions(store, ids)
            assert list(states) == ids
            for sid, (_, live_state) in sessions.items():
                assert states[sid] == live_state
                assert states[sid] == replay(await store.read_decoded(sid, DEFAULT_CODEC))
            assert states["never-written"] == replay([])
        finally:
            await store.aclose()
