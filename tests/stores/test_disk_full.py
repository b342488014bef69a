"""Full disks for real: SQLite and the journal on a small tmpfs that the test
fills mid-turn and then frees; PostgreSQL through a trigger that makes the
server refuse writes with its own ``disk_full`` error (SQLSTATE 53100), on
INSERT or at COMMIT, and through a trigger that ends the writer's own
connection in the middle of its transaction.

Each time: the turn that cannot be stored (a lost connection is named as
``StoreUnavailable``, a full disk as ``StoreFull``) ends as ``store_error`` with the
system's error named, a question that cannot be stored is rejected and its
request id stays free, the hub and the actor go on, nothing acknowledged is
lost, no file is left damaged, and once space returns the session works
again and its replay equals its history.
"""

from __future__ import annotations

import os
import re
import sqlite3
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

import attrs
import pytest
import structlog.testing
import trio

from _tmpfs import Disk
from turnledger import StoreFull
from turnledger.adapters.stores import JournalStore, open_store
from turnledger.events import DEFAULT_CODEC, EventStore, RequestId, TurnDiscarded
from turnledger.sessions import (
    CommittedResult,
    DiscardedResult,
    RejectedResult,
    TurnResult,
    open_hub,
    replay,
)
from turnledger.testing import Begin, Chunk, Finish, Hook, ScriptedProvider, Step

from ._store_scenarios import stream_events

#: An answer far larger than any slack left in a file's last block.
BIG = "x" * 300_000


@attrs.define
class Full:
    """A store on a disk that a test can fill and free."""

    open: Callable[[], Awaitable[EventStore]]
    fill: Callable[[], None]
    free: Callable[[], None]
    #: What a caller is told (a regular expression).
    detail: str
    #: Checks the files once the store is closed (SQLite: integrity_check).
    check: Callable[[], None] = lambda: None


def _sql(dsn: str, *statements: str) -> None:
    import psycopg

    with psycopg.connect(dsn, autocommit=True, connect_timeout=10) as conn:
        for statement in statements:
            conn.execute(statement.encode())


# The server's own disk_full error, as PostgreSQL raises it when it cannot
# extend a file: on the INSERT (a row trigger), or at COMMIT (a deferred
# constraint trigger: the rows went in, the commit is refused).
_FULL_SERVER = """
CREATE TABLE disk (is_full boolean NOT NULL);
INSERT INTO disk VALUES (false);
CREATE FUNCTION refuse_when_full() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF (SELECT is_full FROM disk) THEN
        RAISE EXCEPTION 'could not extend file "base/16384/16390": No space left on device'
            USING ERRCODE = 'disk_full';
    END IF;
    RETURN NEW;
END $$;
"""
# A connection lost mid-transaction: the server ends the writer's own backend
# from inside its INSERT (as an administrator's pg_terminate_backend, a
# failover or a network cut would), so the transaction never commits.
_CUT_SERVER = """
CREATE TABLE disk (is_full boolean NOT NULL);
INSERT INTO disk VALUES (false);
CREATE FUNCTION cut_when_full() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF (SELECT is_full FROM disk) THEN
        PERFORM pg_terminate_backend(pg_backend_pid());
        PERFORM pg_sleep(5);
    END IF;
    RETURN NEW;
END $$;
CREATE TRIGGER refuse BEFORE INSERT ON turnledger_events
    FOR EACH ROW EXECUTE FUNCTION cut_when_full();
"""
_ON = {
    "insert": "CREATE TRIGGER refuse BEFORE INSERT ON turnledger_events"
    " FOR EACH ROW EXECUTE FUNCTION refuse_when_full()",
    "commit": "CREATE CONSTRAINT TRIGGER refuse AFTER INSERT ON turnledger_events"
    " DEFERRABLE INITIALLY DEFERRED FOR EACH ROW EXECUTE FUNCTION refuse_when_full()",
}


@pytest.fixture(
    params=["sqlite", "journal", "postgres-insert", "postgres-commit", "postgres-connection-lost"]
)
async def full(request: pytest.FixtureRequest) -> AsyncIterator[Full]:
    kind: str = request.param
    if kind.startswith("postgres"):
        dsn: str = request.getfixturevalue("pg_dsn")
        await (await open_store(dsn)).aclose()  # creates the table
        if kind == "postgres-connection-lost":
            _sql(dsn, _CUT_SERVER)
            detail = r"StoreUnavailable: .*server closed the connection unexpectedly.*"
        else:
            _sql(dsn, _FULL_SERVER, _ON[kind.split("-")[1]])
            detail = re.escape(
                'StoreFull: could not extend file "base/16384/16390": No space left on device'
            )
        yield Full(
            open=lambda: open_store(dsn),
            fill=lambda: _sql(dsn, "UPDATE disk SET is_full = true"),
            free=lambda: _sql(dsn, "UPDATE disk SET is_full = false"),
            detail=detail,
        )
        return
    disk: Disk = request.getfixturevalue("tmpfs")
    if kind == "journal":
        path = disk.path / "chats.jsonl"
        detail = re.escape("StoreFull: ENOSPC (No space left on device)")
    else:
        path = disk.path / "chats.db"
        detail = re.escape("StoreFull: database or disk is full (SQLITE_FULL)")

    def integrity() -> None:
        if kind == "sqlite":
            with sqlite3.connect(path) as conn:
                assert conn.execute("PRAGMA integrity_check").fetchall() == [("ok",)]
        else:  # nothing was cut, nothing saved aside
            assert sorted(os.listdir(disk.path)) == ["chats.jsonl", "chats.jsonl.lock"]

    yield Full(lambda: open_store(path), disk.fill, disk.free, detail, integrity)


async def _ask(hub: Any, rid: str, question: str) -> TurnResult:
    result: TurnResult = await (await hub.submit("s", question, request_id=rid)).outcome()
    return result


async def _discards(store: EventStore) -> list[TurnDiscarded]:
    events = await store.read_decoded("s", DEFAULT_CODEC)
    return [e for e in events if isinstance(e, TurnDiscarded)]


async def test_a_full_disk_ends_the_turn_as_store_error_and_the_session_goes_on(
    full: Full,
) -> None:
    async def fill(_: Any) -> None:
        await trio.to_thread.run_sync(full.fill)

    # r2 streams, the disk fills up, then its (large) answer comes.
    scripts: dict[str, list[Step]] = {"r2": [Begin(), Chunk("so far"), Hook(fill), Finish(BIG)]}
    provider = ScriptedProvider(lambda req: scripts.get(req.request_id, [Finish("ok")]))
    store = await full.open()
    try:
        with structlog.testing.capture_logs():
            async with open_hub(store, provider, model="m") as hub:
                assert isinstance(await _ask(hub, "r1", "first"), CommittedResult)
                r2 = await _ask(hub, "r2", "second")
                assert isinstance(r2, DiscardedResult)
                assert (r2.reason, r2.preview_chars) == ("store_error", 6)
                assert re.fullmatch(full.detail, r2.detail), r2.detail
                # A question whose own events cannot be written: rejected,
                # nothing recorded under its id.
                r3 = await _ask(hub, "r3", "q" * 20_000)
                assert isinstance(r3, RejectedResult) and r3.reason == "store_error"
                assert re.fullmatch(full.detail, r3.detail), r3.detail
                stats = hub.statistics()
                assert (stats.actors, stats.actors_failed) == (1, 0)
                assert stats.store_errors >= 2
                # Nothing of r2 became history; the committed turn is there.
                assert [t.request_id for t in (await hub.state("s")).turns] == ["r1"]

                await trio.to_thread.run_sync(full.free)
                # The actor records r2's discard by itself once it can.
                with trio.fail_after(10):
                    while not await _discards(store):
                        await trio.sleep(0.05)
                assert await _discards(store) == [
                    TurnDiscarded(RequestId("r2"), "store_error", r2.detail, 6)
                ]
                assert isinstance(await _ask(hub, "r4", "fourth"), CommittedResult)
                # r3's id stayed free: the same question goes through now.
                assert isinstance(await _ask(hub, "r3", "q" * 20_000), CommittedResult)
                again = await _ask(hub, "r2", "second")
                assert again == DiscardedResult(RequestId("r2"), "store_error", r2.detail, 0, True)
                live = await hub.state("s")
                assert live == replay(await store.read_decoded("s", DEFAULT_CODEC))
    finally:
        await store.aclose()
    full.check()
    # Reopened: every acknowledged turn, nothing else, no damage found.
    reopened = await full.open()
    try:
        state = replay(await reopened.read_decoded("s", DEFAULT_CODEC))
        assert state == live
        assert [t.request_id for t in state.turns] == ["r1", "r4", "r3"]
    finally:
        await reopened.aclose()


# --- the journal: a short write is damage repaired, never silent loss ------------


async def _journal_cut_short(
    disk: Disk, monkeypatch: pytest.MonkeyPatch
) -> tuple[JournalStore, Path, bytes, bytes]:
    """A journal on a full disk whose last append landed in part (a short
    write into the slack of the file's last block) and could not be cut off
    again: the store, its path, the file before and after."""
    path = disk.path / "events.jsonl"
    store = await JournalStore.open(path)
    await store.append("a", stream_events("a", 0), 0)
    if path.stat().st_size % 4096 == 0:  # leave slack in the last block
        await store.append("a", stream_events("a", 3, 1), 3)
    before = path.read_bytes()
    disk.fill()
    big = stream_events("a", len(await store.read("a")), 3, "y" * 20_000)
    # At first the failed part is cut off again: the file is as it was.
    with pytest.raises(StoreFull, match="No space left on device"):
        await store.append("a", big, big[0].seq - 1)
    assert path.read_bytes() == before

    def cannot_cut(fd: int, length: int) -> None:
        raise OSError(5, "Input/output error")

    monkeypatch.setattr(os, "ftruncate", cannot_cut)
    with pytest.raises(StoreFull, match="No space left on device"):
        await store.append("a", big, big[0].seq - 1)
    monkeypatch.undo()
    after = path.read_bytes()
    # A short write: part of the batch landed, and stays for now.
    assert after.startswith(before) and len(after) > len(before)
    assert after.count(b"\n") < before.count(b"\n") + len(big)
    return store, path, before, after


async def test_a_short_write_left_in_place_is_cut_before_the_next_append(
    tmpfs: Disk, monkeypatch: pytest.MonkeyPatch
) -> None:
    store, path, before, _ = await _journal_cut_short(tmpfs, monkeypatch)
    try:
        version = len(await store.read("a"))
        tmpfs.free()
        more = stream_events("a", version)
        assert await store.append("a", more, version) == version + 3
        assert len(await store.read("a")) == version + 3
    finally:
        await store.aclose()
    reopened = await JournalStore.open(path)  # no torn tail, no damage
    try:
        assert len(await reopened.read("a")) == version + 3
    finally:
        await reopened.aclose()
    assert path.read_bytes().startswith(before)
    assert sorted(os.listdir(tmpfs.path)) == ["events.jsonl", "events.jsonl.lock"]


async def test_a_short_write_left_by_a_stopped_process_is_repaired_on_reopen(
    tmpfs: Disk, monkeypatch: pytest.MonkeyPatch
) -> None:
    store, path, before, after = await _journal_cut_short(tmpfs, monkeypatch)
    events = await store.read("a")
    await store.aclose()  # as a process that stops now leaves it
    # Still full: the tail cannot be saved aside, so it is not cut either.
    with pytest.raises(StoreFull, match="could not be saved aside"):
        await JournalStore.open(path)
    assert path.read_bytes() == after
    assert sorted(os.listdir(tmpfs.path)) == [".filler", "events.jsonl", "events.jsonl.lock"]
    tmpfs.free()
    with structlog.testing.capture_logs() as logs:
        reopened = await JournalStore.open(path)
    try:
        assert await reopened.read("a") == events  # every acknowledged event
        assert path.read_bytes() == before
        (warning,) = [line for line in logs if line["event"] == "journal_torn_tail_cut"]
        side = Path(warning["saved_to"])
        assert side.read_bytes() == after[len(before) :]  # the cut bytes, kept
        version = len(events)
        assert await reopened.append("a", stream_events("a", version), version) == version + 3
    finally:
        await reopened.aclose()


async def test_a_failed_fsync_is_a_store_error_and_changes_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # (An fsync that fails cannot be had on a tmpfs; the journal's sync is
    # replaced by one that reports EIO, as a failing device does.)
    from turnledger.adapters.stores import journal as journal_module

    path = tmp_path / "chats.jsonl"
    store = await JournalStore.open(path)

    def eio(fd: int) -> None:
        raise OSError(5, "Input/output error")

    async def break_sync(_: Any) -> None:
        monkeypatch.setattr(journal_module, "_sync", eio)

    scripts: dict[str, list[Step]] = {
        "r2": [Begin(), Chunk("so far"), Hook(break_sync), Finish("lost")]
    }
    provider = ScriptedProvider(lambda req: scripts.get(req.request_id, [Finish("ok")]))
    try:
        async with open_hub(store, provider, model="m") as hub:
            assert isinstance(await _ask(hub, "r1", "first"), CommittedResult)
            r2 = await _ask(hub, "r2", "second")
            assert r2 == DiscardedResult(
                RequestId("r2"), "store_error", "StoreUnavailable: EIO (Input/output error)", 6
            )
            monkeypatch.undo()
            with trio.fail_after(10):
                while not await _discards(store):
                    await trio.sleep(0.05)
            assert isinstance(await _ask(hub, "r3", "third"), CommittedResult)
            live = await hub.state("s")
    finally:
        await store.aclose()
    reopened = await JournalStore.open(path)
    try:
        assert replay(await reopened.read_decoded("s", DEFAULT_CODEC)) == live
        assert [t.answer for t in live.turns] == ["ok", "ok"]
    finally:
        await reopened.aclose()
