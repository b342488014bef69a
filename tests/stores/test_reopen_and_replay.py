"""Every durable store: real sessions appended concurrently, the store closed
and reopened, and the log replays to exactly the state the sessions had."""

from pathlib import Path

import pytest
import trio

from core._reference import meaning, observed
from turnledger.adapters.stores import (
    JournalStore,
    PostgresStore,
    SQLiteStore,
    open_store,
    store_kind,
)
from turnledger.events import DEFAULT_CODEC
from turnledger.sessions import replay

from ._store_scenarios import conversation


def committed(session_id: str) -> list[tuple[str, str]]:
    """The turns ``conversation(session_id, 4 + i % 3)`` commits: every
    fourth one first time, and every fourth one after a timeout."""
    turns = 4 + int(session_id.rpartition("-")[2]) % 3
    answers = {0: "answer {}", 3: "answer {} again"}
    return [
        (f"{session_id}/r{i}", answers[i % 4].format(i)) for i in range(turns) if i % 4 in answers
    ]


@pytest.fixture(params=["sqlite", "journal", pytest.param("postgres", marks=pytest.mark.postgres)])
def target(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    if request.param == "postgres":
        dsn: str = request.getfixturevalue("pg_dsn")
        assert store_kind(dsn) == "postgres"
        return dsn
    return str(tmp_path / ("events.db" if request.param == "sqlite" else "events.jsonl"))


async def test_reopen_and_replay(target: str) -> None:
    assert store_kind(target) in ("sqlite", "journal", "postgres")
    sessions = {f"s-{i}": conversation(f"s-{i}", turns=4 + i % 3) for i in range(12)}
    with trio.fail_after(30):
        store = await open_store(target)
        try:

            async def run(sid: str) -> None:
                batches, _ = sessions[sid]
                version = 0
                for batch in batches:
                    version = await store.append(sid, batch, version)
                    await trio.sleep(0)  # let the sessions interleave

            async with trio.open_nursery() as nursery:
                for sid in sessions:
                    nursery.start_soon(run, sid)
        finally:
            await store.aclose()

        store = await open_store(target)
        try:
            for sid, (batches, live_state) in sessions.items():
                stored = await store.read(sid)
                assert stored == [ev for batch in batches for ev in batch]
                decoded = [DEFAULT_CODEC.decode(e) for e in stored]
                state = replay(decoded)
                assert state == live_state
                # what the conversation committed (see conversation()), and
                # the rest by the independent reference fold
                assert [(t.request_id, t.answer) for t in state.turns] == committed(sid)
                assert observed(state) == meaning(decoded)
            feed = await store.read_all()
            ids = await store.session_ids()
            assert sorted(ids) == sorted(sessions)
        finally:
            await store.aclose()
    positions = [e.position for e in feed]
    assert positions == sorted(positions) and len(set(positions)) == len(feed)
    assert len(feed) == sum(len(b) for batches, _ in sessions.values() for b in batches)
    assert ids == list(dict.fromkeys(e.session_id for e in feed))  # order of first event


def test_open_store_picks_by_name() -> None:
    assert store_kind("postgresql://u@h/db") == "postgres"
    assert store_kind("postgres://u@h/db") == "postgres"
    assert store_kind("log/chat.jsonl") == "journal"
    assert store_kind(Path("chat.JSONL")) == "journal"
    assert store_kind("chat.db") == store_kind("chat") == store_kind("x.json") == "sqlite"


async def test_open_store_opens_each_kind(tmp_path: Path) -> None:
    db = await open_store(tmp_path / "a.db", synchronous="NORMAL")
    journal = await open_store(str(tmp_path / "a.jsonl"), max_bytes=1000)
    try:
        assert isinstance(db, SQLiteStore) and db.synchronous == "NORMAL"
        assert isinstance(journal, JournalStore)
    finally:
        await db.aclose()
        await journal.aclose()


@pytest.mark.postgres
async def test_open_store_opens_postgres(pg_dsn: str) -> None:
    store = await open_store(pg_dsn)
    try:
        assert isinstance(store, PostgresStore)
    finally:
        await store.aclose()
