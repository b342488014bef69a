"""Snapshot stores: the latest snapshot of each session, kept apart from the
events (see :mod:`turnledger.sessions._snapshot` and docs/snapshots.md).

Each keeps one row per session, replaced only by a later one. The SQLite
file uses ``secure_delete``, so a dropped snapshot's bytes are overwritten.

A snapshot's older part (``Snapshot.older``) is kept in the same row, but
``latest`` does not read it: the snapshot it returns carries a loader
(``Snapshot.load_older``) that reads it, on the calling thread, the first
time the session needs an older turn. The loader reads that very version:
once a later snapshot replaced the row, it finds nothing (the session's
actor forces the read before it saves its next snapshot).
"""

from __future__ import annotations

import functools
import os
import sqlite3
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

import trio

from ..._errors import StoreUnavailable
from ...sessions._snapshot import Snapshot

__all__ = ["MemorySnapshots", "PostgresSnapshots", "SQLiteSnapshots"]

_T = TypeVar("_T")


class MemorySnapshots:
    """Snapshots in a dict: for tests and for a :class:`MemoryStore`."""

    def __init__(self) -> None:
        self.kept: dict[str, Snapshot] = {}

    async def save(self, snapshot: Snapshot) -> None:
        """Keep it unless a later one is kept. Cancellation: no await inside."""
        await trio.lowlevel.checkpoint()
        old = self.kept.get(snapshot.session_id)
        if old is None or old.version <= snapshot.version:
            self.kept[snapshot.session_id] = snapshot

    async def latest(self, session_id: str) -> Snapshot | None:
        """Cancellation: reads only; a cancelled call changed nothing."""
        await trio.lowlevel.checkpoint()
        return self.kept.get(session_id)

    async def drop(self, session_id: str) -> None:
        """Remove the session's snapshot. Cancellation: no await inside."""
        await trio.lowlevel.checkpoint()
        self.kept.pop(session_id, None)

    async def aclose(self) -> None:
        """Nothing to release.

        Cancellation: nothing to interrupt.
        """


_COLUMNS = "session_id, version, schema, checksum, anchor_tag, anchor_at, body"
_SAVED = _COLUMNS + ", older"


def _row(r: Any, load_older: Callable[[str, int], bytes | None]) -> Snapshot:
    return Snapshot(
        r[0],
        r[1],
        r[2],
        r[3],
        r[4],
        r[5],
        bytes(r[6]),
        load_older=functools.partial(load_older, r[0], r[1]),
    )


class _Threaded:
    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._limiter = trio.CapacityLimiter(1)

    async def _run(self, fn: Callable[[], _T]) -> _T:
        def locked() -> _T:
            with self._lock:
                return fn()

        return await trio.to_thread.run_sync(locked, limiter=self._limiter)


class SQLiteSnapshots(_Threaded):
    """Snapshots in a SQLite file of their own (``<db>.snapshots`` by
    convention: :func:`snapshots_beside`)."""

    def __init__(self, conn: sqlite3.Connection, path: Path) -> None:
        super().__init__()
        self._conn = conn
        self.path = path

    @classmethod
    async def open(cls, path: str | os.PathLike[str]) -> SQLiteSnapshots:
        """Open (creating if needed) the snapshot file ``path``.

        Raises:
            StoreUnavailable: it cannot be opened.

        Cancellation: opened on a worker thread; a cancelled call may still
        have created the file.
        """
        p = Path(path)

        def run() -> SQLiteSnapshots:
            try:
                conn = sqlite3.connect(p, isolation_level=None, check_same_thread=False)
                conn.execute("PRAGMA secure_delete=ON")
                conn.execute("PRAGMA journal_mode=DELETE")
                conn.execute("PRAGMA busy_timeout=10000")
                conn.execute(
                    "CREATE TABLE IF NOT EXISTS snapshots(session_id TEXT PRIMARY KEY,"
                    " version INTEGER NOT NULL, schema INTEGER NOT NULL, checksum TEXT NOT NULL,"
                    " anchor_tag TEXT NOT NULL, anchor_at REAL NOT NULL, body BLOB NOT NULL,"
                    " older BLOB NOT NULL DEFAULT x'')"
                )
                columns = {r[1] for r in conn.execute("PRAGMA table_info(snapshots)")}
                if "older" not in columns:  # a file from before snapshots had two parts
                    conn.execute("ALTER TABLE snapshots ADD COLUMN older BLOB NOT NULL DEFAULT x''")
            except sqlite3.Error as exc:
                raise StoreUnavailable(f"cannot open snapshots {os.fspath(p)!r}: {exc}") from exc
            return cls(conn, p)

        return await trio.to_thread.run_sync(run)

    async def save(self, snapshot: Snapshot) -> None:
        """Keep it unless a later one is kept (one statement).

        Cancellation: written on a worker thread, whole or not at all.
        """
        s = snapshot

        def run() -> None:
            self._conn.execute(
                f"INSERT INTO snapshots({_SAVED}) VALUES (?, ?, ?, ?, ?, ?, ?, ?)"
                " ON CONFLICT(session_id) DO UPDATE SET version=excluded.version,"
                " schema=excluded.schema, checksum=excluded.checksum,"
                " anchor_tag=excluded.anchor_tag, anchor_at=excluded.anchor_at,"
                " body=excluded.body, older=excluded.older"
                " WHERE excluded.version >= snapshots.version",
                (
                    *(s.session_id, s.version, s.schema, s.checksum),
                    *(s.anchor_tag, s.anchor_at, s.body, s.older),
                ),
            )

        await self._run(run)

    async def latest(self, session_id: str) -> Snapshot | None:
        """Cancellation: reads only; a cancelled call changed nothing."""

        def run() -> Snapshot | None:
            r = self._conn.execute(
                f"SELECT {_COLUMNS} FROM snapshots WHERE session_id=?", (session_id,)
            ).fetchone()
            return None if r is None else _row(r, self._older_now)

        return await self._run(run)

    def _older_now(self, session_id: str, version: int) -> bytes | None:
        """The older part of that snapshot, read on the calling thread
        (``None``: replaced, dropped, or the file is closed)."""
        try:
            with self._lock:
                r = self._conn.execute(
                    "SELECT older FROM snapshots WHERE session_id=? AND version=?",
                    (session_id, version),
                ).fetchone()
        except sqlite3.Error:
            return None
        return None if r is None else bytes(r[0])

    async def drop(self, session_id: str) -> None:
        """Remove the session's snapshot.

        Cancellation: one statement on a worker thread.
        """

        def run() -> None:
            self._conn.execute("DELETE FROM snapshots WHERE session_id=?", (session_id,))

        await self._run(run)

    async def aclose(self) -> None:
        """Close the file.

        Cancellation: closed on a worker thread.
        """
        await self._run(self._conn.close)


class PostgresSnapshots(_Threaded):
    """Snapshots in a PostgreSQL table (default ``turnledger_snapshots``)."""

    def __init__(self, conn: Any, table: str) -> None:
        super().__init__()
        self._conn = conn
        self._table = table

    @classmethod
    async def open(
        cls, dsn: str, *, schema: str | None = None, table: str = "turnledger_snapshots"
    ) -> PostgresSnapshots:
        """Connect and create the table if needed.

        Raises:
            StoreUnavailable: psycopg is missing or the server cannot be reached.

        Cancellation: connected on a worker thread; a cancelled call may
        still have created the table.
        """
        try:
            import psycopg
            from psycopg import sql
        except ImportError as exc:  # pragma: no cover - the postgres extra
            raise StoreUnavailable("PostgreSQL snapshots need psycopg") from exc

        def run() -> PostgresSnapshots:
            try:
                conn = psycopg.connect(dsn, autocommit=True)
            except psycopg.Error as exc:
                raise StoreUnavailable(f"cannot reach PostgreSQL for snapshots: {exc}") from exc
            name = sql.Identifier(schema, table) if schema else sql.Identifier(table)
            conn.execute(
                sql.SQL(
                    "CREATE TABLE IF NOT EXISTS {} (session_id text PRIMARY KEY,"
                    " version bigint NOT NULL, schema integer NOT NULL, checksum text NOT NULL,"
                    " anchor_tag text NOT NULL, anchor_at double precision NOT NULL,"
                    " body bytea NOT NULL)"
                ).format(name)
            )
            conn.execute(
                sql.SQL(
                    "ALTER TABLE {} ADD COLUMN IF NOT EXISTS older bytea NOT NULL DEFAULT ''"
                ).format(name)
            )
            return cls(conn, name.as_string(conn))

        return await trio.to_thread.run_sync(run)

    async def save(self, snapshot: Snapshot) -> None:
        """Keep it unless a later one is kept (one statement).

        Cancellation: written on a worker thread, whole or not at all.
        """
        s, t = snapshot, self._table

        def run() -> None:
            self._conn.execute(
                f"INSERT INTO {t} ({_SAVED}) VALUES (%s, %s, %s, %s, %s, %s, %s, %s)"
                " ON CONFLICT (session_id) DO UPDATE SET version = excluded.version,"
                " schema = excluded.schema, checksum = excluded.checksum,"
                " anchor_tag = excluded.anchor_tag, anchor_at = excluded.anchor_at,"
                " body = excluded.body, older = excluded.older"
                f" WHERE excluded.version >= {t}.version",
                (
                    *(s.session_id, s.version, s.schema, s.checksum),
                    *(s.anchor_tag, s.anchor_at, s.body, s.older),
                ),
            )

        await self._run(run)

    async def latest(self, session_id: str) -> Snapshot | None:
        """Cancellation: reads only; a cancelled call changed nothing."""

        def run() -> Snapshot | None:
            r = self._conn.execute(
                f"SELECT {_COLUMNS} FROM {self._table} WHERE session_id = %s", (session_id,)
            ).fetchone()
            return None if r is None else _row(r, self._older_now)

        return await self._run(run)

    def _older_now(self, session_id: str, version: int) -> bytes | None:
        """The older part of that snapshot, read on the calling thread
        (``None``: replaced, dropped, or the connection is closed)."""
        import psycopg

        try:
            with self._lock:
                r = self._conn.execute(
                    f"SELECT older FROM {self._table} WHERE session_id = %s AND version = %s",
                    (session_id, version),
                ).fetchone()
        except psycopg.Error:
            return None
        return None if r is None else bytes(r[0])

    async def drop(self, session_id: str) -> None:
        """Remove the session's snapshot.

        Cancellation: one statement on a worker thread.
        """

        def run() -> None:
            self._conn.execute(f"DELETE FROM {self._table} WHERE session_id = %s", (session_id,))

        await self._run(run)

    async def aclose(self) -> None:
        """Close the connection.

        Cancellation: closed on a worker thread.
        """
        await self._run(self._conn.close)


async def snapshots_beside(url_or_path: str | os.PathLike[str], **options: Any) -> Any:
    """The snapshot store that goes with the event store ``url_or_path``:
    ``<file>.snapshots`` beside a SQLite database or a journal, the table
    ``turnledger_snapshots`` in the same PostgreSQL database (``schema=``
    as for the store).

    Cancellation: see each store's ``open``.
    """
    from ._open import store_kind

    if store_kind(url_or_path) == "postgres":
        return await PostgresSnapshots.open(os.fspath(url_or_path), schema=options.get("schema"))
    return await SQLiteSnapshots.open(os.fspath(url_or_path) + ".snapshots")
