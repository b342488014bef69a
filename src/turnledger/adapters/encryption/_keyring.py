"""Key rings: where each session's wrapped data key is kept, apart from its
events, so that destroying one key makes a session's ciphertext unreadable
wherever copies of it survive (crypto-shredding).

Two rings: a SQLite file (beside a SQLite database or a journal, or anywhere
else, for instance off the machine's backups) and a PostgreSQL table. Both
run their blocking calls on a worker thread, one at a time.
"""

from __future__ import annotations

import os
import sqlite3
import threading
import uuid
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, Protocol, TypeVar

import trio

from ..._errors import StoreUnavailable
from ._providers import WrappedKey

__all__ = ["KeyRing", "PostgresKeyRing", "SQLiteKeyRing"]

_T = TypeVar("_T")


class KeyRing(Protocol):
    """The wrapped data keys of a store's sessions, and the store's identity."""

    @property
    def store_id(self) -> str:
        """A random id made when the ring was created: associated data of
        every ciphertext, so a row copied into another store never opens."""
        ...

    async def get_many(self, session_ids: Sequence[str]) -> dict[str, WrappedKey]:
        """The wrapped keys of those of ``session_ids`` that have one.

        Cancellation: an implementation says; the bundled ones run on a worker thread, so a
        cancelled call may still have done it.
        """
        ...

    async def add(self, session_id: str, wrapped: WrappedKey) -> WrappedKey:
        """Keep ``wrapped`` unless the session already has a key; return the
        key the session has now (another writer's, if it won the race).

        Cancellation: an implementation says; the bundled ones run on a worker thread, so a
        cancelled call may still have done it.
        """
        ...

    async def replace(self, session_id: str, old: WrappedKey, new: WrappedKey) -> bool:
        """Swap ``old`` for ``new`` (a rewrap); False if ``old`` is no longer there.

        Cancellation: an implementation says; the bundled ones run on a worker thread, so a
        cancelled call may still have done it.
        """
        ...

    async def forget(self, session_id: str) -> bool:
        """Destroy the session's key; True if it had one.

        Cancellation: an implementation says; the bundled ones run on a worker thread, so a
        cancelled call may still have done it.
        """
        ...

    async def begin_erasure(self, session_id: str) -> bool:
        """Destroy the session's key and, in the same transaction, record
        that its erasure is under way (the rows are still to be removed);
        True if it had a key. A process killed before :meth:`end_erasure`
        leaves the record, and the next writer that opens the store finishes
        the erasure (see :meth:`pending_erasures`).

        Cancellation: an implementation says; the bundled ones run on a worker thread, so a
        cancelled call may still have done it.
        """
        ...

    async def pending_erasures(self) -> list[str]:
        """The sessions whose key was destroyed by :meth:`begin_erasure` and
        whose erasure has not been ended.

        Cancellation: an implementation says; the bundled ones run on a worker thread, so a
        cancelled call may still have done it.
        """
        ...

    async def end_erasure(self, session_id: str) -> None:
        """Drop the record of the session's erasure (its rows are gone).

        Cancellation: an implementation says; the bundled ones run on a worker thread, so a
        cancelled call may still have done it.
        """
        ...

    async def all(self) -> list[tuple[str, WrappedKey]]:
        """Every ``(session_id, wrapped key)``.

        Cancellation: an implementation says; the bundled ones run on a worker thread, so a
        cancelled call may still have done it.
        """
        ...

    async def one_of(self, kek_id: str) -> tuple[str, WrappedKey] | None:
        """Any one session's key wrapped with ``kek_id``, or ``None``.

        Cancellation: an implementation says; the bundled ones run on a worker thread, so a
        cancelled call may still have done it.
        """
        ...

    async def aclose(self) -> None:
        """Release the ring's connection.

        Cancellation: an implementation says; the bundled ones run on a worker thread, so a
        cancelled call may still have done it.
        """
        ...


class _Threaded:
    """One blocking connection, used by one worker thread at a time."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._limiter = trio.CapacityLimiter(1)

    async def _run(self, fn: Callable[[], _T]) -> _T:
        def locked() -> _T:
            with self._lock:
                return fn()

        return await trio.to_thread.run_sync(locked, limiter=self._limiter)

    def _here(self, fn: Callable[[], _T], errors: type[Exception], where: str) -> _T:
        # ``fn`` on the calling thread (a worker thread), its errors as StoreUnavailable.
        with self._lock:
            try:
                return fn()
            except errors as exc:
                raise StoreUnavailable(f"{where}: {exc}") from exc


class SQLiteKeyRing(_Threaded):
    """Wrapped data keys in a SQLite file of their own.

    The file uses ``secure_delete`` and a rollback journal, so a forgotten
    key's bytes are overwritten in the file, not left on a free page.
    """

    def __init__(self, conn: sqlite3.Connection, path: Path, store_id: str) -> None:
        super().__init__()
        self._conn = conn
        self.path = path
        self._store_id = store_id

    @property
    def store_id(self) -> str:
        return self._store_id

    @classmethod
    async def open(cls, path: str | os.PathLike[str], *, create: bool = True) -> SQLiteKeyRing:
        """Open (or, with ``create``, create) the ring file ``path``.

        Raises:
            StoreUnavailable: it cannot be opened, or does not exist and
                ``create`` is False.

        Cancellation: the file is opened on a worker thread; a cancelled
        call may still have created it (empty, with its store id).
        """
        p = Path(path)

        def run() -> SQLiteKeyRing:
            if not create and not p.exists():
                raise StoreUnavailable(f"no key ring at {os.fspath(p)!r}")
            try:
                conn = sqlite3.connect(p, isolation_level=None, check_same_thread=False)
                conn.execute("PRAGMA secure_delete=ON")
                conn.execute("PRAGMA journal_mode=DELETE")
                conn.execute("PRAGMA synchronous=FULL")
                conn.execute("PRAGMA busy_timeout=10000")
                conn.execute("BEGIN IMMEDIATE")
                conn.execute("CREATE TABLE IF NOT EXISTS meta(k TEXT PRIMARY KEY, v TEXT NOT NULL)")
                conn.execute(
                    "CREATE TABLE IF NOT EXISTS data_keys(session_id TEXT PRIMARY KEY,"
                    " kek_id TEXT NOT NULL, wrapped BLOB NOT NULL)"
                )
                conn.execute("CREATE TABLE IF NOT EXISTS erasing(session_id TEXT PRIMARY KEY)")
                conn.execute(
                    "INSERT OR IGNORE INTO meta VALUES ('store_id', ?)", (uuid.uuid4().hex,)
                )
                (store_id,) = conn.execute("SELECT v FROM meta WHERE k='store_id'").fetchone()
                conn.execute("COMMIT")
            except sqlite3.Error as exc:
                raise StoreUnavailable(f"cannot open the key ring {os.fspath(p)!r}: {exc}") from exc
            return cls(conn, p, store_id)

        return await trio.to_thread.run_sync(run)

    def _get_many(self, ids: list[str]) -> dict[str, WrappedKey]:
        out: dict[str, WrappedKey] = {}
        for i in range(0, len(ids), 500):
            chunk = ids[i : i + 500]
            marks = ",".join("?" * len(chunk))
            for sid, kid, blob in self._conn.execute(
                f"SELECT session_id, kek_id, wrapped FROM data_keys WHERE session_id IN ({marks})",
                chunk,
            ):
                out[sid] = WrappedKey(kid, bytes(blob))
        return out

    async def get_many(self, session_ids: Sequence[str]) -> dict[str, WrappedKey]:
        """Cancellation: reads only; a cancelled call changed nothing."""
        ids = list(dict.fromkeys(session_ids))
        return await self._run(lambda: self._get_many(ids))

    def get_many_blocking(self, session_ids: Sequence[str]) -> dict[str, WrappedKey]:
        """:meth:`get_many` on the calling thread (a worker thread: the
        event store's I/O thread reads a session's key with its rows, saving
        a thread hop per session).

        Raises:
            StoreUnavailable: the ring file cannot be read.
        """
        ids = list(dict.fromkeys(session_ids))
        where = f"cannot read the key ring {self.path}"
        return self._here(lambda: self._get_many(ids), sqlite3.Error, where)

    async def add(self, session_id: str, wrapped: WrappedKey) -> WrappedKey:
        """Cancellation: the work runs on a worker thread, which a cancellation does not stop: a
        cancelled call may still have done it."""

        def run() -> WrappedKey:
            self._conn.execute(
                "INSERT OR IGNORE INTO data_keys VALUES (?, ?, ?)",
                (session_id, wrapped.kek_id, wrapped.blob),
            )
            kid, blob = self._conn.execute(
                "SELECT kek_id, wrapped FROM data_keys WHERE session_id=?", (session_id,)
            ).fetchone()
            return WrappedKey(kid, bytes(blob))

        return await self._run(run)

    async def replace(self, session_id: str, old: WrappedKey, new: WrappedKey) -> bool:
        """Cancellation: the work runs on a worker thread, which a cancellation does not stop: a
        cancelled call may still have done it."""

        def run() -> bool:
            cur = self._conn.execute(
                "UPDATE data_keys SET kek_id=?, wrapped=? "
                "WHERE session_id=? AND kek_id=? AND wrapped=?",
                (new.kek_id, new.blob, session_id, old.kek_id, old.blob),
            )
            return cur.rowcount == 1

        return await self._run(run)

    async def forget(self, session_id: str) -> bool:
        """Cancellation: the work runs on a worker thread, which a cancellation does not stop: a
        cancelled call may still have done it."""

        def run() -> bool:
            cur = self._conn.execute("DELETE FROM data_keys WHERE session_id=?", (session_id,))
            return cur.rowcount == 1

        return await self._run(run)

    async def begin_erasure(self, session_id: str) -> bool:
        """Cancellation: the work runs on a worker thread, which a cancellation does not stop: a
        cancelled call may still have done it."""

        def run() -> bool:
            conn = self._conn
            conn.execute("BEGIN IMMEDIATE")
            try:
                conn.execute("INSERT OR IGNORE INTO erasing VALUES (?)", (session_id,))
                cur = conn.execute("DELETE FROM data_keys WHERE session_id=?", (session_id,))
                had = cur.rowcount == 1
            except BaseException:
                conn.execute("ROLLBACK")
                raise
            conn.execute("COMMIT")
            return had

        return await self._run(run)

    async def pending_erasures(self) -> list[str]:
        """Cancellation: reads only; a cancelled call changed nothing."""

        def run() -> list[str]:
            rows = self._conn.execute("SELECT session_id FROM erasing ORDER BY session_id")
            return [sid for (sid,) in rows]

        return await self._run(run)

    async def end_erasure(self, session_id: str) -> None:
        """Cancellation: the work runs on a worker thread, which a cancellation does not stop: a
        cancelled call may still have done it."""

        def run() -> None:
            self._conn.execute("DELETE FROM erasing WHERE session_id=?", (session_id,))

        await self._run(run)

    async def all(self) -> list[tuple[str, WrappedKey]]:
        """Cancellation: reads only; a cancelled call changed nothing."""

        def run() -> list[tuple[str, WrappedKey]]:
            rows = self._conn.execute(
                "SELECT session_id, kek_id, wrapped FROM data_keys ORDER BY session_id"
            ).fetchall()
            return [(sid, WrappedKey(kid, bytes(blob))) for sid, kid, blob in rows]

        return await self._run(run)

    async def one_of(self, kek_id: str) -> tuple[str, WrappedKey] | None:
        """Cancellation: reads only; a cancelled call changed nothing."""

        def run() -> tuple[str, WrappedKey] | None:
            row = self._conn.execute(
                "SELECT session_id, wrapped FROM data_keys WHERE kek_id=? LIMIT 1", (kek_id,)
            ).fetchone()
            return None if row is None else (row[0], WrappedKey(kek_id, bytes(row[1])))

        return await self._run(run)

    async def aclose(self) -> None:
        """Cancellation: the work runs on a worker thread, which a cancellation does not stop: a
        cancelled call may still have done it."""
        await self._run(self._conn.close)


class PostgresKeyRing(_Threaded):
    """Wrapped data keys in a PostgreSQL table (``<table>`` and ``<table>_meta``).

    Kept in the events' database by default; give another DSN to keep keys
    apart from the events' backups (see docs/encryption.md).
    """

    def __init__(self, conn: Any, table: str, store_id: str, erasing: str = "") -> None:
        super().__init__()
        self._conn = conn
        self._table = table
        self._store_id = store_id
        self._erasing = erasing

    @property
    def store_id(self) -> str:
        return self._store_id

    @classmethod
    async def open(
        cls, dsn: str, *, schema: str | None = None, table: str = "turnledger_data_keys"
    ) -> PostgresKeyRing:
        """Connect and create the ring's tables if needed.

        Raises:
            StoreUnavailable: psycopg is missing or the server cannot be reached.

        Cancellation: the connection is made on a worker thread; a cancelled
        call may still have created the tables.
        """
        try:
            import psycopg
            from psycopg import sql
        except ImportError as exc:  # pragma: no cover - the postgres extra
            raise StoreUnavailable("the PostgreSQL key ring needs psycopg") from exc

        def run() -> PostgresKeyRing:
            try:
                conn = psycopg.connect(dsn, autocommit=True)
            except psycopg.Error as exc:
                raise StoreUnavailable(f"cannot reach PostgreSQL for the key ring: {exc}") from exc
            name = sql.Identifier(schema, table) if schema else sql.Identifier(table)
            meta = (
                sql.Identifier(schema, table + "_meta")
                if schema
                else sql.Identifier(table + "_meta")
            )
            erasing = (
                sql.Identifier(schema, table + "_erasing")
                if schema
                else sql.Identifier(table + "_erasing")
            )
            with conn.transaction():
                conn.execute(
                    sql.SQL(
                        "CREATE TABLE IF NOT EXISTS {} (session_id text PRIMARY KEY,"
                        " kek_id text NOT NULL, wrapped bytea NOT NULL)"
                    ).format(name)
                )
                conn.execute(
                    sql.SQL(
                        "CREATE TABLE IF NOT EXISTS {} (k text PRIMARY KEY, v text NOT NULL)"
                    ).format(meta)
                )
                conn.execute(
                    sql.SQL("CREATE TABLE IF NOT EXISTS {} (session_id text PRIMARY KEY)").format(
                        erasing
                    )
                )
                conn.execute(
                    sql.SQL("INSERT INTO {} VALUES ('store_id', %s) ON CONFLICT DO NOTHING").format(
                        meta
                    ),
                    (uuid.uuid4().hex,),
                )
                row = conn.execute(
                    sql.SQL("SELECT v FROM {} WHERE k = 'store_id'").format(meta)
                ).fetchone()
            assert row is not None  # inserted above if missing
            ring = cls(conn, name.as_string(conn), row[0], erasing.as_string(conn))
            return ring

        return await trio.to_thread.run_sync(run)

    def _get_many(self, ids: list[str]) -> dict[str, WrappedKey]:
        rows = self._conn.execute(
            f"SELECT session_id, kek_id, wrapped FROM {self._table} WHERE session_id = ANY(%s)",
            (ids,),
        ).fetchall()
        return {sid: WrappedKey(kid, bytes(blob)) for sid, kid, blob in rows}

    async def get_many(self, session_ids: Sequence[str]) -> dict[str, WrappedKey]:
        """Cancellation: reads only; a cancelled call changed nothing."""
        ids = list(dict.fromkeys(session_ids))
        return await self._run(lambda: self._get_many(ids))

    def get_many_blocking(self, session_ids: Sequence[str]) -> dict[str, WrappedKey]:
        """:meth:`get_many` on the calling thread (a worker thread).

        Raises:
            StoreUnavailable: the server cannot be reached.
        """
        import psycopg

        ids = list(dict.fromkeys(session_ids))
        where = "cannot read the key ring"
        return self._here(lambda: self._get_many(ids), psycopg.Error, where)

    async def add(self, session_id: str, wrapped: WrappedKey) -> WrappedKey:
        """Cancellation: the work runs on a worker thread, which a cancellation does not stop: a
        cancelled call may still have done it."""

        def run() -> WrappedKey:
            self._conn.execute(
                f"INSERT INTO {self._table} VALUES (%s, %s, %s) ON CONFLICT DO NOTHING",
                (session_id, wrapped.kek_id, wrapped.blob),
            )
            kid, blob = self._conn.execute(
                f"SELECT kek_id, wrapped FROM {self._table} WHERE session_id = %s",
                (session_id,),
            ).fetchone()
            return WrappedKey(kid, bytes(blob))

        return await self._run(run)

    async def replace(self, session_id: str, old: WrappedKey, new: WrappedKey) -> bool:
        """Cancellation: the work runs on a worker thread, which a cancellation does not stop: a
        cancelled call may still have done it."""

        def run() -> bool:
            cur = self._conn.execute(
                f"UPDATE {self._table} SET kek_id = %s, wrapped = %s"
                " WHERE session_id = %s AND kek_id = %s AND wrapped = %s",
                (new.kek_id, new.blob, session_id, old.kek_id, old.blob),
            )
            return bool(cur.rowcount == 1)

        return await self._run(run)

    async def forget(self, session_id: str) -> bool:
        """Cancellation: the work runs on a worker thread, which a cancellation does not stop: a
        cancelled call may still have done it."""

        def run() -> bool:
            cur = self._conn.execute(
                f"DELETE FROM {self._table} WHERE session_id = %s", (session_id,)
            )
            return bool(cur.rowcount == 1)

        return await self._run(run)

    async def begin_erasure(self, session_id: str) -> bool:
        """Cancellation: the work runs on a worker thread, which a cancellation does not stop: a
        cancelled call may still have done it."""

        def run() -> bool:
            with self._conn.transaction():
                self._conn.execute(
                    f"INSERT INTO {self._erasing} VALUES (%s) ON CONFLICT DO NOTHING",
                    (session_id,),
                )
                cur = self._conn.execute(
                    f"DELETE FROM {self._table} WHERE session_id = %s", (session_id,)
                )
            return bool(cur.rowcount == 1)

        return await self._run(run)

    async def pending_erasures(self) -> list[str]:
        """Cancellation: reads only; a cancelled call changed nothing."""

        def run() -> list[str]:
            rows = self._conn.execute(
                f"SELECT session_id FROM {self._erasing} ORDER BY session_id"
            ).fetchall()
            return [sid for (sid,) in rows]

        return await self._run(run)

    async def end_erasure(self, session_id: str) -> None:
        """Cancellation: the work runs on a worker thread, which a cancellation does not stop: a
        cancelled call may still have done it."""

        def run() -> None:
            self._conn.execute(f"DELETE FROM {self._erasing} WHERE session_id = %s", (session_id,))

        await self._run(run)

    async def all(self) -> list[tuple[str, WrappedKey]]:
        """Cancellation: reads only; a cancelled call changed nothing."""

        def run() -> list[tuple[str, WrappedKey]]:
            rows = self._conn.execute(
                f"SELECT session_id, kek_id, wrapped FROM {self._table} ORDER BY session_id"
            ).fetchall()
            return [(sid, WrappedKey(kid, bytes(blob))) for sid, kid, blob in rows]

        return await self._run(run)

    async def aclose(self) -> None:
        """Cancellation: the work runs on a worker thread, which a cancellation does not stop: a
        cancelled call may still have done it."""
        await self._run(self._conn.close)

    async def one_of(self, kek_id: str) -> tuple[str, WrappedKey] | None:
        """Cancellation: reads only; a cancelled call changed nothing."""

        def run() -> tuple[str, WrappedKey] | None:
            row = self._conn.execute(
                f"SELECT session_id, wrapped FROM {self._table} WHERE kek_id = %s LIMIT 1",
                (kek_id,),
            ).fetchone()
            return None if row is None else (row[0], WrappedKey(kek_id, bytes(row[1])))

        return await self._run(run)
