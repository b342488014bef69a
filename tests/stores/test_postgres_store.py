import json
import os
import socket
import threading
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from functools import partial
from pathlib import Path

import pytest
import trio
from psycopg import sql

from _procs import readline_within, spawn
from turnledger import (
    ConcurrencyConflict,
    LeaseLost,
    SessionOwnedElsewhere,
    StoreCorrupted,
    StoreUnavailable,
)
from turnledger.adapters.stores import PostgresStore
from turnledger.adapters.stores._io_thread import Call as _Call
from turnledger.adapters.stores._io_thread import Thread as _Thread
from turnledger.adapters.stores.postgres import SCHEMA_VERSION
from turnledger.events import DEFAULT_CODEC, EventStore, RequestId, StoredEvent, StreamStarted
from turnledger.testing import EventStoreContract, sample_events

pytestmark = pytest.mark.postgres


class TestPostgresStore(EventStoreContract):
    supports_reopen = True
    dsn = ""

    @pytest.fixture(autouse=True)
    def _dsn(self, pg_dsn: str) -> None:
        # On the class: pytest-trio runs the contract's async `store` fixture
        # with another instance than the test's.
        type(self).dsn = pg_dsn

    async def open_store(self, path: Path) -> EventStore:
        return await PostgresStore.open(self.dsn)

    async def settle(self, store: EventStore) -> None:
        await _settle(self.dsn)


async def _settle(dsn: str) -> None:
    """Wait until every transaction begun on the server before this call has
    ended: other tests' writers (on this shared server) hold the feed back."""
    import psycopg

    def wait() -> None:
        snapshot = "SELECT pg_snapshot_{}(pg_current_snapshot())::text::int8"
        with psycopg.connect(dsn, autocommit=True) as conn:
            (xmax,) = conn.execute(snapshot.format("xmax")).fetchone()  # type: ignore[misc]
            while conn.execute(snapshot.format("xmin")).fetchone()[0] < xmax:  # type: ignore[index]
                time.sleep(0.01)

    await trio.to_thread.run_sync(wait)


def _events(session_id: str, after: int, n: int = 3) -> list[StoredEvent]:
    return [
        DEFAULT_CODEC.encode(
            StreamStarted(RequestId(f"{session_id}/{after + i}")),
            session_id=session_id,
            seq=after + i,
            recorded_at=1.7e9 + after + i,
        )
        for i in range(1, n + 1)
    ]


def _hold(entered: threading.Event, go: threading.Event) -> Callable[[object], None]:
    """A call that holds a store's writer thread until ``go`` is set."""

    def hold(_: object) -> None:
        entered.set()
        go.wait(30)

    return hold


async def _together(thread: _Thread[object], calls: list[Callable[[], Awaitable[None]]]) -> None:
    """Run ``calls`` at once, their requests all waiting in ``thread``'s
    queue before it takes any: held meanwhile, so that they wait together
    however the machine schedules threads."""
    entered, held = threading.Event(), threading.Event()
    async with trio.open_nursery() as nursery:
        nursery.start_soon(thread.call, _Call(_hold(entered, held)))
        await trio.to_thread.run_sync(entered.wait, 30)
        for call in calls:
            nursery.start_soon(call)
        with trio.fail_after(30):
            while thread.queue.qsize() < len(calls):
                await trio.sleep(0.01)
        held.set()


@pytest.fixture
async def owned(pg_dsn: str) -> AsyncIterator[tuple[PostgresStore, PostgresStore]]:
    """Two stores with one-second leases; the first owns "s", at version 3."""
    a = await PostgresStore.open(pg_dsn, lease=1.0, renew_every=0.2)
    b = await PostgresStore.open(pg_dsn, lease=1.0, renew_every=0.2)
    try:
        await a.acquire("s")
        await a.append("s", _events("s", 0), 0)
        yield a, b
    finally:
        await a.aclose()
        await b.aclose()


@pytest.fixture
async def two_stores(pg_dsn: str) -> AsyncIterator[tuple[PostgresStore, PostgresStore]]:
    a = await PostgresStore.open(pg_dsn)
    b = await PostgresStore.open(pg_dsn)
    try:
        yield a, b
    finally:
        await a.aclose()
        await b.aclose()


def _sql(dsn: str, query: str, *args: object) -> list[tuple[object, ...]]:
    import psycopg

    with psycopg.connect(dsn, autocommit=True) as conn:
        cur = conn.execute(query, args)  # type: ignore[arg-type]
        return cur.fetchall() if cur.description else []


async def test_payloads_are_jsonb_and_nul_is_kept_exactly(pg_dsn: str) -> None:
    store = await PostgresStore.open(pg_dsn)
    try:
        batch = [
            DEFAULT_CODEC.encode(e, session_id="s", seq=i, recorded_at=1.7e9)
            for i, e in enumerate(sample_events(), 1)
        ]
        await store.append("s", batch, 0)
        assert await store.read("s") == batch
    finally:
        await store.aclose()
    rows = _sql(
        pg_dsn,
        "SELECT tag, payload->>'request_id', payload_text IS NOT NULL,"
        " position(chr(65533) IN payload::text) > 0 FROM turnledger_events ORDER BY seq",
    )
    by_tag = {tag: (rid, exact, replaced) for tag, rid, exact, replaced in rows}
    # Queryable as jsonb ...
    assert by_tag["stream_started"] == ("r-1", False, False)
    assert by_tag["completion_ignored"] == ("r-2", False, False)
    # ... and where jsonb cannot hold U+0000, the exact text is kept beside it.
    assert by_tag["turn_committed"] == ("r-1", True, True)


async def test_one_owner_per_session(two_stores: tuple[PostgresStore, PostgresStore]) -> None:
    a, b = two_stores
    await a.acquire("s")
    await a.acquire("s")  # again: a no-op
    with pytest.raises(SessionOwnedElsewhere, match=f"turnledger pid={os.getpid()}"):
        await b.acquire("s")
    await b.acquire("t")  # other sessions are free
    # Ownership does not replace optimistic concurrency: both still guard.
    assert await a.append("s", _events("s", 0), 0) == 3
    with pytest.raises(ConcurrencyConflict):
        await a.append("s", _events("s", 0), 0)
    await a.release("s")
    await b.acquire("s")
    assert await b.append("s", _events("s", 3), 3) == 6
    with pytest.raises(SessionOwnedElsewhere):
        await a.acquire("s")


async def test_closing_the_store_releases_its_sessions(pg_dsn: str) -> None:
    a = await PostgresStore.open(pg_dsn)
    b = await PostgresStore.open(pg_dsn)
    try:
        await a.acquire("s")
        await a.acquire("t")
        await a.aclose()
        await b.acquire("s")
        await b.acquire("t")
    finally:
        await a.aclose()
        await b.aclose()


async def test_a_store_that_lost_its_lease_connection_cannot_append(
    two_stores: tuple[PostgresStore, PostgresStore], pg_dsn: str
) -> None:
    a, b = two_stores
    await a.acquire("s")
    assert await a.append("s", _events("s", 0), 0) == 3
    # The server drops a's lease connection (an admin, a network cut ...):
    # the lease is no longer live, another store may take the session over.
    _sql(pg_dsn, "SELECT pg_terminate_backend(backend) FROM turnledger_events_leases")
    await b.acquire("s")
    with pytest.raises(LeaseLost, match="taken over") as caught:
        await a.append("s", _events("s", 3), 3)
    assert (caught.value.epoch, caught.value.current_epoch) == (1, 2)
    assert await b.append("s", _events("s", 3), 3) == 6
    assert [e.seq for e in await b.read("s")] == [1, 2, 3, 4, 5, 6]


async def test_newer_schema_is_refused(pg_dsn: str) -> None:
    await (await PostgresStore.open(pg_dsn)).aclose()
    _sql(pg_dsn, "UPDATE turnledger_events_meta SET value = %s", str(SCHEMA_VERSION + 1))
    with pytest.raises(StoreUnavailable, match="newer turnledger"):
        await PostgresStore.open(pg_dsn)


async def test_unreachable_server_is_unavailable() -> None:
    with pytest.raises(StoreUnavailable):
        await PostgresStore.open("postgresql://postgres@127.0.0.1:1/test", timeout=2)


async def test_table_name_is_configurable(pg_dsn: str) -> None:
    store = await PostgresStore.open(pg_dsn, table="other_events")
    try:
        await store.append("s", _events("s", 0), 0)
    finally:
        await store.aclose()
    assert _sql(pg_dsn, "SELECT count(*) FROM other_events") == [(3,)]


# --- two processes ------------------------------------------------------------

_HUB = """
import sys, trio
from turnledger import SessionOwnedElsewhere
from turnledger.adapters.stores import PostgresStore
from turnledger.events import DEFAULT_CODEC, RequestId, StreamStarted

async def main(dsn, sid):
    store = await PostgresStore.open(dsn)
    try:
        await store.acquire(sid)
    except SessionOwnedElsewhere as exc:
        print("elsewhere", exc, flush=True)
        await trio.to_thread.run_sync(sys.stdin.readline)  # told to take over
        with trio.fail_after(20):
            while True:
                try:
                    await store.acquire(sid)
                    break
                except SessionOwnedElsewhere:
                    await trio.sleep(0.05)
        events = await store.read(sid)
        print("took-over", len(events), flush=True)
        await store.aclose()
        return
    print("owner", flush=True)
    for n in range(4):
        batch = [
            DEFAULT_CODEC.encode(StreamStarted(RequestId(f"r{n}-{i}")), session_id=sid,
                                 seq=3 * n + i, recorded_at=1.7e9)
            for i in (1, 2, 3)
        ]
        await store.append(sid, batch, 3 * n)
    print("appended", 12, flush=True)
    await trio.to_thread.run_sync(sys.stdin.readline)  # told to exit
    import os
    os._exit(0)  # die without closing anything: the server must free the session

trio.run(main, sys.argv[1], sys.argv[2])
"""


def test_two_processes_one_session(pg_dsn: str) -> None:
    procs = [spawn(_HUB, pg_dsn, "shared"), spawn(_HUB, pg_dsn, "shared")]
    try:
        first = [readline_within(p) for p in procs]
        assert sorted(line.split()[0] for line in first) == ["elsewhere", "owner"]
        owner, other = procs if first[0] == "owner" else procs[::-1]
        refusal = first[procs.index(other)]
        assert f"turnledger pid={owner.pid}" in refusal  # names the holder
        assert readline_within(owner) == "appended 12"
        assert owner.stdin is not None and other.stdin is not None
        owner.stdin.write(b"exit\n")
        assert owner.wait(timeout=30) == 0
        other.stdin.write(b"go\n")
        assert readline_within(other) == "took-over 12"
        assert other.wait(timeout=30) == 0
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait(30)


@pytest.mark.parametrize(
    "damage",
    [
        "payload = '[1, 2]'::jsonb, payload_text = NULL",  # JSON, but not an object
        "payload_text = chr(65279) || payload::text",  # a BOM before the exact text
        "payload_text = '{\"request_id\":'",  # not JSON
    ],
)
async def test_a_damaged_payload_is_reported_by_every_read(pg_dsn: str, damage: str) -> None:
    store = await PostgresStore.open(pg_dsn)
    try:
        await store.append("s", _events("s", 0), 0)
        _sql(pg_dsn, f"UPDATE turnledger_events SET {damage} WHERE seq = 2")
        with pytest.raises(StoreCorrupted, match="position"):
            await store.read("s")
        with pytest.raises(StoreCorrupted, match="session 's' seq 2"):
            await store.read_decoded("s", DEFAULT_CODEC)
        with pytest.raises(StoreCorrupted, match="session 's' seq 2"):
            await store.read_decoded_many(["s"], DEFAULT_CODEC, lambda sid, events: events)
        assert len(await store.read_decoded("s", DEFAULT_CODEC, after=2)) == 1
    finally:
        await store.aclose()


# --- the feed without a lock, group commit, leases, migration -----------------


async def test_the_feed_stops_below_an_older_open_transaction(pg_dsn: str) -> None:
    import psycopg

    store = await PostgresStore.open(pg_dsn)
    try:
        await store.append("before", _events("before", 0, 1), 0)
        # A writer that took its transaction id (and so its positions) first,
        # and commits last: the feed must not show what committed after it.
        with psycopg.connect(pg_dsn) as slow:
            (xid,) = slow.execute("SELECT pg_current_xact_id()::text::int8").fetchone()  # type: ignore[misc]
            ev = _events("slow", 0, 1)[0]
            slow.execute(
                "INSERT INTO turnledger_events (position, session_id, seq, tag, schema_version,"
                " payload, recorded_at) VALUES (%s, 'slow', 1, %s, %s, %s::jsonb, %s)",
                (xid << 20, ev.tag, ev.schema_version, json.dumps(ev.payload), ev.recorded_at),
            )
            await store.append("fast", _events("fast", 0, 2), 0)
            assert [e.session_id for e in await store.read("fast")] == ["fast", "fast"]
            feed = await store.read_all()
            assert [e.session_id for e in feed] == ["before"]
            slow.commit()
        feed += await store.read_all(after=feed[-1].position or 0)
        assert [e.session_id for e in feed] == ["before", "slow", "fast", "fast"]
        assert [e.position for e in await store.read_all()] == [e.position for e in feed]
    finally:
        await store.aclose()


async def test_appends_that_wait_together_share_one_transaction(pg_dsn: str) -> None:
    store = await PostgresStore.open(pg_dsn)
    try:
        await store.append("stale", _events("stale", 0, 1), 0)
        writer = store._writer
        assert writer is not None
        before = writer.transactions
        results: dict[str, object] = {}

        async def one(sid: str, expected: int) -> None:
            try:
                results[sid] = await store.append(sid, _events(sid, expected), expected)
            except ConcurrencyConflict as exc:
                results[sid] = exc

        calls = [partial(one, f"s{i}", 0) for i in range(40)]
        calls.append(partial(one, "stale", 0))  # the stream is at 1: refused alone
        await _together(writer, calls)
        committed = writer.transactions - before
        assert committed == 1  # one transaction for all, not one each
        assert all(results[f"s{i}"] == 3 for i in range(40))
        assert isinstance(results["stale"], ConcurrencyConflict)
        assert results["stale"].actual_version == 1
        assert len(await store.read("stale")) == 1
        # Within a transaction, positions follow the order of the appends.
        with trio.fail_after(30):
            await _settle(pg_dsn)
        feed = await store.read_all()
        assert len(feed) == 1 + 40 * 3 and len({e.position for e in feed}) == len(feed)
    finally:
        await store.aclose()


async def test_reads_that_wait_together_share_one_statement(pg_dsn: str) -> None:
    store = await PostgresStore.open(pg_dsn)
    try:
        for i in range(5):
            await store.append(f"s{i}", _events(f"s{i}", 0, i + 1), 0)
        await store.append("bad", _events("bad", 0), 0)
        _sql(pg_dsn, "UPDATE turnledger_events SET payload_text = '{' WHERE session_id = 'bad'")
        reader = store._reader
        before = reader.statements
        asked = [(f"s{i}", 0) for i in range(5)] + [("s4", 3), ("s4", 5), ("none", 0), ("bad", 0)]
        results: dict[int, object] = {}

        async def one(n: int, sid: str, after: int) -> None:
            try:
                events = await store.read_decoded(sid, DEFAULT_CODEC, after=after)
                results[n] = [e.request_id for e in events]
            except StoreCorrupted as exc:
                results[n] = exc

        await _together(reader, [partial(one, n, sid, a) for n, (sid, a) in enumerate(asked)])
        assert reader.statements - before == 1  # one statement for all
        for i in range(5):  # each read has its own session's events, in order
            assert results[i] == [f"s{i}/{k}" for k in range(1, i + 2)]
        assert results[5] == ["s4/4", "s4/5"]  # the same session twice, each after its own
        assert results[6] == [] and results[7] == []
        assert isinstance(results[8], StoreCorrupted)  # fails alone
        assert "session 'bad' seq 1" in str(results[8])
    finally:
        await store.aclose()


async def test_a_renewed_lease_outlives_its_length_and_an_expired_one_is_taken_over(
    pg_dsn: str,
) -> None:
    a = await PostgresStore.open(pg_dsn, lease=1.0, renew_every=0.2)
    b = await PostgresStore.open(pg_dsn, lease=1.0, renew_every=0.2)
    try:
        await a.acquire("s")
        await a.append("s", _events("s", 0), 0)
        await trio.sleep(1.5)  # longer than the lease: the renewals kept it
        with pytest.raises(SessionOwnedElsewhere, match=f"pid={os.getpid()}.*epoch 1"):
            await b.acquire("s")
        [lease] = await b.owners()
        assert (lease.session_id, lease.pid, lease.epoch, lease.live) == ("s", os.getpid(), 1, True)
        assert lease.host == socket.gethostname()
        # a stalls: no renewals (its renewal thread stopped), its lease runs out
        await _stop_renewing(a)
        with trio.fail_after(5):
            while True:
                try:
                    await b.acquire("s")
                    break
                except SessionOwnedElsewhere:
                    await trio.sleep(0.1)
        [lease] = await a.owners()
        assert lease.epoch == 2 and lease.live
        assert await a.renew() == ["s"]  # a's renewal finds it lost the session
        with pytest.raises(LeaseLost):
            await a.append("s", _events("s", 3), 3)
        with pytest.raises(SessionOwnedElsewhere, match="epoch 2"):
            await a.acquire("s")  # acquiring again is a real attempt
        assert await a.renew() == []
        assert await b.append("s", _events("s", 3), 3) == 6
        await a.release("s")  # a no-op: the lease is b's now
        assert [x.epoch for x in await b.owners()] == [2]
        await b.release("s")
        assert await b.owners() == []
    finally:
        await a.aclose()
        await b.aclose()


async def test_lease_settings_are_checked() -> None:
    with pytest.raises(ValueError, match="renew_every"):
        await PostgresStore.open("postgresql://postgres@127.0.0.1:1/test", lease=1, renew_every=2)
    with pytest.raises(ValueError, match="renew_every"):
        await PostgresStore.open("postgresql://postgres@127.0.0.1:1/test", lease=0)


_V1_DDL = """
CREATE TABLE turnledger_events_meta (key text PRIMARY KEY, value text NOT NULL);
INSERT INTO turnledger_events_meta VALUES ('schema_version', '1');
CREATE TABLE turnledger_events (
    position       bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    session_id     text             NOT NULL,
    seq            integer          NOT NULL CHECK (seq >= 1),
    tag            text             NOT NULL,
    schema_version integer          NOT NULL,
    payload        jsonb            NOT NULL,
    payload_text   text,
    recorded_at    double precision NOT NULL,
    UNIQUE (session_id, seq)
);
CREATE INDEX turnledger_events_first ON turnledger_events (position) WHERE seq = 1;
"""


async def test_a_version_1_table_is_migrated_and_replays(pg_dsn: str) -> None:
    import psycopg

    old = _events("old", 0) + _events("other", 0, 1)
    with psycopg.connect(pg_dsn) as conn:
        conn.execute(_V1_DDL)
        for ev in old:
            conn.execute(
                "INSERT INTO turnledger_events (session_id, seq, tag, schema_version, payload,"
                " recorded_at) VALUES (%s, %s, %s, %s, %s::jsonb, %s)",
                (
                    ev.session_id,
                    ev.seq,
                    ev.tag,
                    ev.schema_version,
                    json.dumps(ev.payload),
                    ev.recorded_at,
                ),
            )
    # A read-only store reads version 1 as it is, and changes nothing.
    ro = await PostgresStore.open(pg_dsn, read_only=True)
    try:
        assert [e.seq for e in await ro.read("old")] == [1, 2, 3]
        assert await ro.owners() == []
    finally:
        await ro.aclose()
    store = await PostgresStore.open(pg_dsn)
    try:
        assert _sql(pg_dsn, "SELECT value FROM turnledger_events_meta") == [(str(SCHEMA_VERSION),)]
        assert [e.payload for e in await store.read("old")] == [e.payload for e in old[:3]]
        await store.acquire("old")
        assert await store.append("old", _events("old", 3, 1), 3) == 4
        await store.append("new", _events("new", 0, 1), 0)
        feed = await store.read_all()
        assert [(e.session_id, e.seq) for e in feed] == [
            ("old", 1),
            ("old", 2),
            ("old", 3),
            ("other", 1),
            ("old", 4),
            ("new", 1),
        ]
        assert [e.position for e in feed][:4] == [1, 2, 3, 4]
        assert await store.session_ids() == ["old", "other", "new"]
    finally:
        await store.aclose()
    # Opening again changes nothing more.
    store = await PostgresStore.open(pg_dsn)
    await store.aclose()
    assert _sql(pg_dsn, "SELECT count(*) FROM turnledger_events") == [(6,)]


async def test_a_stream_moved_by_another_store_conflicts_alone_in_its_group(
    two_stores: tuple[PostgresStore, PostgresStore],
) -> None:
    a, b = two_stores
    assert await a.append("s", _events("s", 0), 0) == 3
    assert await b.append("s", _events("s", 3), 3) == 6  # a's writer does not know
    results: dict[str, object] = {}

    async def one(sid: str, expected: int) -> None:
        try:
            results[sid] = await a.append(sid, _events(sid, expected), expected)
        except ConcurrencyConflict as exc:
            results[sid] = exc

    async with trio.open_nursery() as nursery:
        nursery.start_soon(one, "s", 3)  # stale: the unique key refuses it
        for i in range(5):
            nursery.start_soon(one, f"t{i}", 0)
    assert isinstance(results["s"], ConcurrencyConflict)
    assert all(results[f"t{i}"] == 3 for i in range(5))
    assert await a.append("s", _events("s", 6), 6) == 9
    assert [e.seq for e in await b.read("s")] == list(range(1, 10))


async def _append_or_lost(store: PostgresStore, into: list[object]) -> None:
    """Append 3 events after 3 to "s"; the new version or the LeaseLost."""
    try:
        into.append(await store.append("s", _events("s", 3), 3))
    except LeaseLost as exc:
        into.append(exc)


async def _stop_renewing(store: PostgresStore) -> None:
    await trio.to_thread.run_sync(store._leases.stop_renewing)


async def _take_over(store: PostgresStore, session_id: str) -> None:
    """Acquire ``session_id`` as soon as its owner's lease lets go (10 s at most)."""
    with trio.fail_after(10):
        while True:
            try:
                await store.acquire(session_id)
                return
            except SessionOwnedElsewhere:
                await trio.sleep(0.1)


class _PausedQuery(sql.Composable):
    """A query that holds the writer thread while it is being sent: the
    append's transaction is open, its lease row locked."""

    def __init__(self, query: object) -> None:
        super().__init__(query)
        self.reached = threading.Event()
        self.go = threading.Event()

    def as_bytes(self, context: object = None) -> bytes:
        self.reached.set()
        self.go.wait(60)
        return self._obj.as_bytes(context)  # type: ignore[no-any-return]


async def test_an_owner_stalled_inside_an_append_loses_the_session_after_its_lease(
    owned: tuple[PostgresStore, PostgresStore],
) -> None:
    a, b = owned
    # a stalls in the middle of its next append, between the check of its
    # lease (the row locked) and the INSERT, and renews no more.
    paused = a._sql.insert = _PausedQuery(a._sql.insert)
    await _stop_renewing(a)
    stale: list[object] = []

    async with trio.open_nursery() as nursery:
        nursery.start_soon(_append_or_lost, a, stale)
        try:
            await trio.to_thread.run_sync(paused.reached.wait, 30)
            # b takes the session over once the lease has run out,
            # whatever a's append is doing.
            await _take_over(b, "s")
            assert [x.epoch for x in await b.owners()] == [2]
            assert await b.append("s", _events("s", 3), 3) == 6
        finally:
            paused.go.set()  # a wakes up: its append is refused, writes nothing
    [refused] = stale
    assert isinstance(refused, LeaseLost)
    assert (refused.epoch, refused.current_epoch) == (1, 2)
    assert [e.payload for e in await b.read("s")] == [
        e.payload for e in _events("s", 0) + _events("s", 3)
    ]


async def test_an_append_queued_before_the_loss_was_found_is_refused(
    owned: tuple[PostgresStore, PostgresStore],
) -> None:
    a, b = owned
    await _stop_renewing(a)  # a stalls: its lease runs out, b takes the session
    await _take_over(b, "s")
    writer = a._writer
    assert writer is not None
    entered, held = threading.Event(), threading.Event()

    stale: list[object] = []

    async with trio.open_nursery() as nursery:
        nursery.start_soon(writer.call, _Call(_hold(entered, held)))
        await trio.to_thread.run_sync(entered.wait, 30)
        nursery.start_soon(_append_or_lost, a, stale)  # queued while a still thinks it owns s
        with trio.fail_after(30):
            while writer.queue.qsize() < 1:
                await trio.sleep(0.01)
        # a's renewal finds the loss while the append waits in the queue
        assert await trio.to_thread.run_sync(a._leases.renew) == ["s"]
        held.set()
    [refused] = stale
    assert isinstance(refused, LeaseLost) and refused.epoch == 1
    assert len(await b.read("s")) == 3  # nothing written by a
