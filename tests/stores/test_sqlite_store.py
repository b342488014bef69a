import os
import sqlite3
from collections.abc import AsyncIterator, Iterable, Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
import trio
import trio.testing

from turnledger import ConcurrencyConflict, StoreCorrupted, StoreError, StoreFull, StoreUnavailable
from turnledger.adapters.stores import SQLiteStore
from turnledger.adapters.stores._io_thread import Call
from turnledger.adapters.stores.sqlite import SCHEMA_VERSION
from turnledger.events import DEFAULT_CODEC, EventStore, StoredEvent
from turnledger.testing import EventStoreContract, sample_events

from ._store_scenarios import stream_events as _events


class TestSQLiteStore(EventStoreContract):
    supports_reopen = True

    async def open_store(self, path: Path) -> EventStore:
        return await SQLiteStore.open(path / "events.db")


@pytest.fixture
async def store(tmp_path: Path) -> AsyncIterator[SQLiteStore]:
    s = await SQLiteStore.open(tmp_path / "events.db")
    try:
        yield s
    finally:
        await s.aclose()


async def writer_took_it(store: SQLiteStore) -> None:
    """Wait until the writer thread took the queued append (and now waits for
    the lock), so what is started next queues behind it."""
    await trio.testing.wait_all_tasks_blocked()  # the append is queued
    while not store._writer.queue.empty():
        await trio.sleep(0.01)
    await trio.sleep(0.05)


@contextmanager
def write_lock_held(path: Path) -> Iterator[None]:
    """Hold the database's write lock from another connection, so the store's
    writer waits in BEGIN IMMEDIATE and appends pile up in its queue."""
    conn = sqlite3.connect(path, isolation_level=None)
    try:
        conn.execute("BEGIN IMMEDIATE")
        yield
        conn.execute("COMMIT")
    finally:
        conn.close()


async def test_defaults_are_wal_and_synchronous_full(store: SQLiteStore) -> None:
    assert store.synchronous == "FULL"
    conn = sqlite3.connect(store.path)
    try:
        assert conn.execute("PRAGMA journal_mode").fetchone() == ("wal",)
        assert conn.execute("PRAGMA user_version").fetchone() == (SCHEMA_VERSION,)
    finally:
        conn.close()


async def test_group_commit_many_concurrent_appenders(store: SQLiteStore) -> None:
    sessions, rounds = 200, 3
    versions: dict[str, list[int]] = {}

    async def session(sid: str) -> None:
        for r in range(rounds):
            versions.setdefault(sid, []).append(await store.append(sid, _events(sid, 3 * r), 3 * r))

    with trio.fail_after(30):
        async with trio.open_nursery() as nursery:
            for i in range(sessions):
                nursery.start_soon(session, f"s-{i}")
        feed = await store.read_all()
    assert all(v == [3, 6, 9] for v in versions.values()) and len(versions) == sessions
    stats = store.stats
    assert stats.appends == sessions * rounds
    assert stats.events == len(feed) == sessions * rounds * 3
    # Appends that arrived together shared a transaction.
    assert stats.transactions < stats.appends
    assert stats.largest_group > 1


async def test_a_conflict_inside_a_group_fails_only_its_append(store: SQLiteStore) -> None:
    with trio.fail_after(30):
        for sid in ("a", "b", "c", "d"):
            await store.append(sid, _events(sid, 0, 1), 0)
        before = store.stats
        results: dict[str, object] = {}

        async def append(name: str, sid: str, expected: int) -> None:
            try:
                results[name] = await store.append(sid, _events(sid, expected, 2), expected)
            except ConcurrencyConflict as exc:
                results[name] = exc

        async with trio.open_nursery() as nursery:
            with write_lock_held(store.path):
                # The first append takes the writer into BEGIN IMMEDIATE, where
                # it waits for the lock; the rest queue behind it.
                nursery.start_soon(append, "lead", "lead", 0)
                await writer_took_it(store)
                nursery.start_soon(append, "a-ok", "a", 1)
                nursery.start_soon(append, "b-stale", "b", 0)
                nursery.start_soon(append, "c-ahead", "c", 5)
                nursery.start_soon(append, "d-1", "d", 1)
                nursery.start_soon(append, "d-2", "d", 1)
                nursery.start_soon(append, "e-new", "e", 0)
                await trio.testing.wait_all_tasks_blocked()
    assert results["lead"] == 2
    assert results["a-ok"] == 3 and results["e-new"] == 2
    assert isinstance(results["b-stale"], ConcurrencyConflict)
    assert isinstance(results["c-ahead"], ConcurrencyConflict)
    d = sorted([results["d-1"], results["d-2"]], key=lambda r: isinstance(r, Exception))
    assert d[0] == 3 and isinstance(d[1], ConcurrencyConflict)  # one of the two won
    after = store.stats
    # The lead's transaction, then ONE for everything that queued behind it.
    assert after.transactions - before.transactions == 2
    assert after.largest_group == 3
    assert after.conflicts - before.conflicts == 3
    assert [e.seq for e in await store.read("a")] == [1, 2, 3]
    assert [e.seq for e in await store.read("b")] == [1]
    assert [e.seq for e in await store.read("d")] == [1, 2, 3]


async def test_a_failed_group_is_retried_append_by_append(store: SQLiteStore) -> None:
    # Cap the file so the group's one transaction cannot fit: every append
    # then gets its own transaction, and only the one that cannot fit fails.
    await store.append("warm", _events("warm", 0, 1), 0)

    def cap(conn: sqlite3.Connection | None) -> None:
        assert conn is not None
        (pages,) = conn.execute("PRAGMA page_count").fetchone()
        conn.execute(f"PRAGMA max_page_count = {pages + 40}")

    await store._writer.call(Call(cap))
    huge = "x" * 400_000
    results: dict[str, object] = {}

    async def append(sid: str, text: str) -> None:
        try:
            results[sid] = await store.append(sid, _events(sid, 0, 1, text), 0)
        except StoreError as exc:
            results[sid] = exc

    with trio.fail_after(30):
        async with trio.open_nursery() as nursery:
            with write_lock_held(store.path):
                nursery.start_soon(append, "lead", "")
                await writer_took_it(store)
                for sid in ("s1", "s2", "s3"):
                    nursery.start_soon(append, sid, "")
                nursery.start_soon(append, "big", huge)
                await trio.testing.wait_all_tasks_blocked()
        assert isinstance(results["big"], StoreFull)
        assert [results[s] for s in ("lead", "s1", "s2", "s3")] == [1, 1, 1, 1]
        assert await store.read("big") == []
        assert len(await store.read_all()) == 5


async def test_an_append_sqlite_cannot_bind_fails_alone(store: SQLiteStore) -> None:
    # A tag with a lone surrogate passes the envelope checks but cannot be
    # bound as UTF-8 text: only that append fails, the rest of its group commits.
    import attrs

    await store.append("warm", _events("warm", 0, 1), 0)
    bad = [attrs.evolve(ev, tag="stream_started\ud800") for ev in _events("bad", 0, 1)]
    results: dict[str, object] = {}

    async def append(sid: str, events: list[StoredEvent]) -> None:
        try:
            results[sid] = await store.append(sid, events, 0)
        except StoreError as exc:
            results[sid] = exc

    with trio.fail_after(30):
        async with trio.open_nursery() as nursery:
            with write_lock_held(store.path):
                nursery.start_soon(append, "lead", _events("lead", 0, 1))
                await writer_took_it(store)
                for sid in ("s1", "s2"):
                    nursery.start_soon(append, sid, _events(sid, 0, 1))
                nursery.start_soon(append, "bad", bad)
                await trio.testing.wait_all_tasks_blocked()
    assert isinstance(results["bad"], StoreError)
    assert [results[s] for s in ("lead", "s1", "s2")] == [1, 1, 1]
    assert await store.read("bad") == []


async def test_cancelled_append_is_not_abandoned(store: SQLiteStore) -> None:
    got: list[int] = []
    scope = trio.CancelScope()

    async def appender() -> None:
        with scope:
            got.append(await store.append("s", _events("s", 0), 0))
            await trio.sleep(0)  # the cancellation lands here
            got.append(-1)

    with trio.fail_after(30):
        async with trio.open_nursery() as nursery:
            with write_lock_held(store.path):
                nursery.start_soon(appender)
                await writer_took_it(store)
                scope.cancel()  # while the writer waits for the lock
                await trio.sleep(0.1)
        assert scope.cancelled_caught
        # The append waited for its transaction and reported it.
        assert got == [3]
        assert [e.seq for e in await store.read("s")] == [1, 2, 3]


async def test_a_second_writer_is_refused_and_readers_go_on(tmp_path: Path) -> None:
    # One writer per file (in this process or another): the second is
    # refused naming the holder's pid; readers read beside the writer.
    path = tmp_path / "events.db"
    with trio.fail_after(30):
        a = await SQLiteStore.open(path)
        try:
            assert await a.append("s", _events("s", 0), 0) == 3
            with pytest.raises(
                StoreUnavailable, match=f"locked by another writer \\(pid {os.getpid()},"
            ):
                await SQLiteStore.open(path)
            reader = await SQLiteStore.open(path, read_only=True)
            try:
                assert [e.seq for e in await reader.read("s")] == [1, 2, 3]
                assert await a.append("s", _events("s", 3), 3) == 6
                assert [e.seq for e in await reader.read("s")] == list(range(1, 7))
            finally:
                await reader.aclose()
        finally:
            await a.aclose()
        # Closing the writer released the lock.
        b = await SQLiteStore.open(path)
        await b.aclose()


async def test_a_write_by_another_connection_is_seen(tmp_path: Path) -> None:
    # Something else than a store (the sqlite3 shell) wrote to the file: the
    # versions the writer caches must not go stale.
    path = tmp_path / "events.db"
    with trio.fail_after(30):
        a = await SQLiteStore.open(path)
        try:
            assert await a.append("s", _events("s", 0), 0) == 3
            other = sqlite3.connect(path)
            other.execute(
                "INSERT INTO events (session_id, seq, tag, schema_version, payload, recorded_at)"
                " VALUES ('s', 4, 't', 1, '{}', 0)"
            )
            other.commit()
            other.close()
            with pytest.raises(ConcurrencyConflict):
                await a.append("s", _events("s", 3), 3)
            assert await a.append("s", _events("s", 4), 4) == 7
        finally:
            await a.aclose()


async def test_newer_schema_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "events.db"
    await (await SQLiteStore.open(path)).aclose()
    conn = sqlite3.connect(path)
    conn.execute(f"PRAGMA user_version = {SCHEMA_VERSION + 1}")
    conn.close()
    with pytest.raises(StoreUnavailable, match="newer turnledger"):
        await SQLiteStore.open(path)


async def test_foreign_database_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "other.db"
    conn = sqlite3.connect(path)
    conn.execute("CREATE TABLE t (x)")
    conn.close()
    with pytest.raises(StoreUnavailable, match="not a turnledger database"):
        await SQLiteStore.open(path)


async def test_garbage_file_is_corrupted(tmp_path: Path) -> None:
    path = tmp_path / "events.db"
    path.write_bytes(b"this is not a database" * 100)
    with pytest.raises(StoreCorrupted):
        await SQLiteStore.open(path)
    assert path.read_bytes() == b"this is not a database" * 100


async def test_unopenable_path_is_unavailable(tmp_path: Path) -> None:
    with pytest.raises(StoreUnavailable):
        await SQLiteStore.open(tmp_path / "missing" / "events.db")


async def test_closed_store_refuses_calls(tmp_path: Path) -> None:
    s = await SQLiteStore.open(tmp_path / "events.db")
    await s.aclose()
    await s.aclose()  # idempotent
    with pytest.raises(StoreError, match="closed"):
        await s.append("s", _events("s", 0), 0)
    with pytest.raises(StoreError, match="closed"):
        await s.read("s")


async def test_one_transaction_per_append_when_grouping_is_off(tmp_path: Path) -> None:
    s = await SQLiteStore.open(tmp_path / "events.db", group_commit=False, synchronous="NORMAL")
    try:
        with trio.fail_after(30):
            async with trio.open_nursery() as nursery:
                for i in range(50):
                    nursery.start_soon(s.append, f"s-{i}", _events(f"s-{i}", 0), 0)
        assert s.stats.transactions == s.stats.appends == 50
        assert s.synchronous == "NORMAL"
    finally:
        await s.aclose()


_GOOD = b'{"request_id":"s/2"}'


@pytest.mark.parametrize(
    "damage",
    [
        b'{"request_id":',
        b"[1, 2]",
        b"",
        b'"text"',
        b"\xef\xbb\xbf" + _GOOD,  # a BOM: not JSON text (json.loads of bytes would skip it)
        _GOOD.decode().encode("utf-16-le"),  # not UTF-8 (json.loads of bytes would guess)
        b'{"request_id":"\xed\xa0\x80"}',  # an encoded lone surrogate: not UTF-8
        b'{"request_id":"\xff"}',
        b'{"request_id":' + b"[" * 5000 + b"]" * 5000 + b"}",  # deeper than the stack
    ],
)
async def test_a_damaged_payload_is_reported_by_every_read(tmp_path: Path, damage: bytes) -> None:
    path = tmp_path / "events.db"
    s = await SQLiteStore.open(path)
    await s.append("s", _events("s", 0), 0)
    await s.aclose()
    conn = sqlite3.connect(path)
    with conn:
        conn.execute("UPDATE events SET payload = CAST(? AS TEXT) WHERE seq = 2", (damage,))
        (kind,) = conn.execute("SELECT typeof(payload) FROM events WHERE seq = 2").fetchone()
        assert kind == "text"
    conn.close()
    s = await SQLiteStore.open(path, read_only=True)
    try:
        with pytest.raises(StoreCorrupted, match="position 2"):
            await s.read("s")
        with pytest.raises(StoreCorrupted, match="position 2"):
            await s.read_all()
        with pytest.raises(StoreCorrupted, match="session 's' seq 2: the payload is"):
            await s.read_decoded("s", DEFAULT_CODEC)
        # The events after the damaged one still read, typed or not.
        assert [e.seq for e in await s.read("s", after=2)] == [3]
        assert len(await s.read_decoded("s", DEFAULT_CODEC, after=2)) == 1
    finally:
        await s.aclose()


async def test_read_decoded_many_reads_one_snapshot(tmp_path: Path) -> None:
    # The reader's transaction spans every session of the call: a commit
    # from another connection lands either before all reads or after all.
    path = tmp_path / "events.db"
    s = await SQLiteStore.open(path)
    try:
        await s.append("a", _events("a", 0), 0)
        await s.append("b", _events("b", 0), 0)
        other = sqlite3.connect(path, check_same_thread=False)

        class Writing:
            # A decoder that, while "a" is being read, commits to "b"
            # through another connection.
            def decode(self, stored: StoredEvent) -> int:  # pragma: no cover - SQLite uses JSON
                raise AssertionError

            def decode_rows(
                self, session_id: str, rows: Iterable[tuple[int, str, int, str | bytes]]
            ) -> list[int]:
                if session_id == "a":
                    with other:
                        other.execute(
                            "INSERT INTO events (session_id, seq, tag, schema_version, payload,"
                            " recorded_at) VALUES ('b', 4, 'stream_started', 1,"
                            ' \'{"request_id":"b/4"}\', 0)'
                        )
                return [row[0] for row in rows]

        got = await s.read_decoded_many(["a", "b"], Writing(), lambda sid, seqs: seqs)
        other.close()
        assert got == {"a": [1, 2, 3], "b": [1, 2, 3]}
        assert [e.seq for e in await s.read("b")] == [1, 2, 3, 4]
    finally:
        await s.aclose()


async def test_a_utf16_database_reads_like_a_utf8_one(tmp_path: Path) -> None:
    # Every file this store creates is UTF-8, but SQLite lets a file be made
    # UTF-16 before its first table; its payloads must read the same.
    path = tmp_path / "u16.db"
    conn = sqlite3.connect(path)
    conn.execute("PRAGMA encoding='UTF-16le'")
    conn.execute("CREATE TABLE _x (a)")
    conn.execute("DROP TABLE _x")
    conn.close()
    batch = [
        DEFAULT_CODEC.encode(e, session_id="s", seq=i, recorded_at=1.7e9)
        for i, e in enumerate(sample_events(), 1)
    ]
    s = await SQLiteStore.open(path)
    try:
        await s.append("s", batch, 0)
        assert await s.read("s") == batch
        assert await s.read_all() == await s.read("s")
        assert await s.read_decoded("s", DEFAULT_CODEC) == sample_events()
    finally:
        await s.aclose()
    conn = sqlite3.connect(path)
    assert conn.execute("PRAGMA encoding").fetchone() == ("UTF-16le",)
    conn.close()
