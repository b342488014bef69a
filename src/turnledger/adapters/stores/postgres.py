"""The store for more than one machine: PostgreSQL through psycopg 3.

psycopg's async API runs on asyncio only, so every call runs in a worker
thread (``trio.to_thread.run_sync``, never abandoned) on a connection from a
``psycopg_pool.ConnectionPool``. Needs the ``postgres`` extra.

Table. One table (``turnledger_events`` by default, in a schema you choose):
``position bigint GENERATED ALWAYS AS IDENTITY`` is the global feed order,
``UNIQUE (session_id, seq)`` the optimistic-concurrency guard. Every append
checks the stream's version and inserts inside one transaction that first
takes a transaction-level advisory lock on the table, so appends commit in
``position`` order and a reader tailing the feed never skips an event that
commits late.

Payloads. ``payload`` is ``jsonb`` (queryable: ``payload->>'request_id'``).
``jsonb`` cannot hold U+0000 nor a lone surrogate; for the rare payload that
does, ``payload`` holds a copy with each such character replaced by U+FFFD and
``payload_text`` holds the exact JSON text. Readers take ``payload_text`` when
it is set, so every payload reads back exactly.

Ownership. :meth:`PostgresStore.acquire` takes a session-level advisory lock
(``pg_try_advisory_lock`` on a 64-bit hash of schema, table and session id) on
one dedicated connection that the store keeps for its owned sessions; another
process gets :class:`~turnledger.SessionOwnedElsewhere` naming the holder.
The lock goes when the session is released, the store closed, or the process
dies (PostgreSQL drops the connection). An append to an owned session also
checks, in its transaction, that the lock is still held, so a store whose lock
connection was lost cannot keep writing a session another process took over.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import socket
import threading
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any, Final, TypeVar

import trio

from ..._errors import (
    ConcurrencyConflict,
    SessionOwnedElsewhere,
    StoreCorrupted,
    StoreError,
    StoreFull,
    StoreUnavailable,
)
from ...events import EventDecoder, StoredEvent
from ._payloads import check_envelope, decode_rows, dumps_payload, loads_payload
from .memory import check_batch

if TYPE_CHECKING:
    import psycopg
    from psycopg import sql
    from psycopg_pool import ConnectionPool

__all__ = ["SCHEMA_VERSION", "PostgresStore"]

#: Schema version this release writes (the ``<table>_meta`` table).
SCHEMA_VERSION: Final = 1

_T = TypeVar("_T")
_R = TypeVar("_R")

# Advisory lock classes of the two-int form (a key space apart from the
# one-bigint form used for session ownership).
_DDL_CLASS: Final = 0x544C0001
_FEED_CLASS: Final = 0x544C0002

_UNSAFE_FOR_JSONB: Final = re.compile("[\x00\ud800-\udfff]")


def _hash(text: str, size: int) -> int:
    digest = hashlib.blake2b(text.encode("utf-8", "surrogatepass"), digest_size=size).digest()
    return int.from_bytes(digest, "big", signed=True)


def _jsonb_safe(value: Any) -> Any:
    if type(value) is str:
        return _UNSAFE_FOR_JSONB.sub("\ufffd", value)
    if type(value) is dict:
        return {_jsonb_safe(k): _jsonb_safe(v) for k, v in value.items()}
    if type(value) is list:
        return [_jsonb_safe(v) for v in value]
    return value


def _payload_columns(payload: Any) -> tuple[str, str | None]:
    """The ``jsonb`` text and, when that had to differ, the exact text."""
    text = dumps_payload(payload)
    if "\\u0000" not in text and "\\ud" not in text:
        return text, None
    safe = dumps_payload(_jsonb_safe(json.loads(text)))
    return safe, (None if safe == text else text)


def _map_error(exc: Exception, msg: str) -> StoreError:
    import psycopg
    from psycopg import errors

    if isinstance(exc, StoreError):
        return exc
    if isinstance(exc, errors.DiskFull):
        return StoreFull(f"{msg}: {exc}")
    if isinstance(exc, psycopg.OperationalError):  # includes the pool's timeouts
        return StoreUnavailable(f"{msg}: {exc}")
    return StoreError(f"{msg}: {exc}")


class PostgresStore:
    """An :class:`~turnledger.events.EventStore` in a PostgreSQL table.

    Open it with :meth:`open`; close it with :meth:`aclose` (or ``async with``).
    """

    def __init__(
        self,
        pool: ConnectionPool[Any],
        dsn: str,
        schema: str,
        table: str,
        timeout: float,
    ) -> None:
        # Private: use ``await PostgresStore.open(dsn)``.
        from psycopg import sql

        self._pool = pool
        self._dsn = dsn
        self._schema = schema
        self._table = table
        self._timeout = timeout
        self._read_only = False
        self._closed = False
        self._owner: psycopg.Connection[Any] | None = None
        self._owner_lock = threading.Lock()
        #: session id -> (lock key, backend pid of the connection holding it)
        self._owned: dict[str, tuple[int, int]] = {}
        qualified = f"{schema}.{table}"
        self._feed_key = _hash(f"feed:{qualified}", 4)
        t = sql.Identifier(schema, table)
        self._q_lock_feed = sql.SQL("SELECT pg_advisory_xact_lock(%s::int4, %s::int4)")
        self._q_version = sql.SQL(
            "SELECT coalesce(max(seq), 0) FROM {} WHERE session_id = %s"
        ).format(t)
        self._q_insert = sql.SQL(
            "INSERT INTO {} (session_id, seq, tag, schema_version, payload, payload_text,"
            " recorded_at) VALUES (%s, %s, %s, %s, %s::jsonb, %s, %s)"
        ).format(t)
        cols = sql.SQL(
            "SELECT position, session_id, seq, tag, schema_version,"
            " coalesce(payload_text, payload::text), recorded_at FROM {}"
        ).format(t)
        self._q_read = sql.SQL("{} WHERE session_id = %s AND seq > %s ORDER BY seq").format(cols)
        # The replay path: payload text as UTF-8 bytes, for the JSON parser.
        self._q_read_json = sql.SQL(
            "SELECT seq, tag, schema_version,"
            " convert_to(coalesce(payload_text, payload::text), 'UTF8') FROM {}"
            " WHERE session_id = %s AND seq > %s ORDER BY seq"
        ).format(t)
        self._q_read_all = sql.SQL("{} WHERE position > %s ORDER BY position LIMIT %s").format(cols)
        self._q_sessions = sql.SQL(
            "SELECT session_id FROM {} WHERE seq = 1 ORDER BY position"
        ).format(t)

    @classmethod
    async def open(
        cls,
        dsn: str,
        *,
        schema: str | None = None,
        table: str = "turnledger_events",
        min_size: int = 1,
        max_size: int = 10,
        timeout: float = 30.0,
        read_only: bool = False,
    ) -> PostgresStore:
        """Connect, and create the table (and schema) if they are missing.

        Args:
            dsn: a libpq connection string or ``postgresql://`` URL.
            schema: the schema of the table; default: the connection's
                ``current_schema()`` (the first of its ``search_path``).
            table: the events table (``<table>_meta`` holds the schema version).
            min_size, max_size: bounds of the connection pool.
            timeout: seconds to wait for a connection.
            read_only: only read: create nothing (the table must exist);
                appends raise ``StoreError``.

        Raises:
            StoreUnavailable: the server cannot be reached, psycopg is not
                installed, or the table was created by a newer release.
        """
        store: PostgresStore = await trio.to_thread.run_sync(
            cls._open_sync, dsn, schema, table, min_size, max_size, timeout, read_only
        )
        return store

    @classmethod
    def _open_sync(
        cls,
        dsn: str,
        schema: str | None,
        table: str,
        min_size: int,
        max_size: int,
        timeout: float,
        read_only: bool = False,
    ) -> PostgresStore:
        try:
            import psycopg
            from psycopg_pool import ConnectionPool
        except ImportError as exc:
            raise StoreUnavailable(
                "PostgresStore needs psycopg 3 and psycopg_pool: pip install 'turnledger[postgres]'"
            ) from exc
        try:
            # One direct attempt first: it fails fast, with the server's reason.
            psycopg.connect(dsn, connect_timeout=max(1, round(timeout))).close()
        except psycopg.Error as exc:
            raise StoreUnavailable(f"cannot connect to PostgreSQL: {exc}") from exc
        pool: ConnectionPool[Any] = ConnectionPool(
            dsn,
            min_size=min_size,
            max_size=max_size,
            timeout=timeout,
            open=False,
            name="turnledger",
            kwargs={"application_name": _application_name()},
        )
        try:
            try:
                pool.open(wait=True, timeout=timeout)
            except Exception as exc:
                raise StoreUnavailable(f"cannot connect to PostgreSQL: {exc}") from exc
            try:
                with pool.connection() as conn:
                    if schema is None:
                        row = conn.execute("SELECT current_schema()").fetchone()
                        if row is None or row[0] is None:
                            raise StoreUnavailable("the search_path names no existing schema")
                        schema = str(row[0])
                    if read_only:
                        _check_schema(conn, schema, table)
                    else:
                        _create_schema(conn, schema, table)
            except psycopg.Error as exc:
                raise _map_error(exc, "cannot create the turnledger table") from exc
        except BaseException:
            pool.close()
            raise
        store = cls(pool, dsn, schema, table, timeout)
        store._read_only = read_only
        return store

    @property
    def schema(self) -> str:
        """The schema of the table."""
        return self._schema

    @property
    def table(self) -> str:
        """The events table."""
        return self._table

    def _check_open(self) -> None:
        if self._closed:
            raise StoreError("the store is closed")

    async def _run(self, fn: Callable[..., _T], *args: Any) -> _T:
        await trio.lowlevel.checkpoint_if_cancelled()
        self._check_open()
        return await trio.to_thread.run_sync(fn, *args)

    # -- appends -------------------------------------------------------------

    async def append(
        self, session_id: str, events: Sequence[StoredEvent], expected_version: int
    ) -> int:
        """Append ``events`` after ``expected_version`` in one transaction.

        Raises:
            ConcurrencyConflict: the stream is not at ``expected_version``.
            SessionOwnedElsewhere: this store acquired the session but no
                longer holds its lock (its lock connection was lost).
            StoreUnavailable: the server cannot be reached. StoreFull: its
                disk is full. StoreError: a payload is not JSON-able; nothing
                was written.

        Cancellation: the transaction is never abandoned; a cancelled append
        either committed the whole batch or nothing.
        """
        await trio.lowlevel.checkpoint_if_cancelled()
        self._check_open()
        if not events:
            return expected_version
        if self._read_only:
            raise StoreError("the PostgreSQL store was opened read-only")
        check_batch(session_id, events, expected_version)
        rows = []
        for ev in events:
            jsonb, exact = _payload_columns(ev.payload)
            recorded_at = check_envelope(ev)
            rows.append((session_id, ev.seq, ev.tag, ev.schema_version, jsonb, exact, recorded_at))
        return await self._run(self._append_sync, session_id, expected_version, rows)

    def _append_sync(self, session_id: str, expected: int, rows: list[tuple[Any, ...]]) -> int:
        import psycopg

        owned = self._owned.get(session_id)
        try:
            with self._pool.connection() as conn, conn.cursor() as cur:
                cur.execute(self._q_lock_feed, (_FEED_CLASS, self._feed_key))
                if owned is not None:
                    key, pid = owned
                    if not _holds(cur, key, pid):
                        raise SessionOwnedElsewhere(
                            session_id,
                            "this store lost its lock (its lock connection closed); "
                            "acquire the session again",
                        )
                row = cur.execute(self._q_version, (session_id,)).fetchone()
                current = row[0] if row else 0
                if current != expected:
                    raise ConcurrencyConflict(session_id, expected, current)
                cur.executemany(self._q_insert, rows)
            # leaving the connection block committed the transaction
        except psycopg.errors.UniqueViolation as exc:
            raise ConcurrencyConflict(session_id, expected, None) from exc
        except psycopg.Error as exc:
            raise _map_error(exc, f"append to {session_id!r} failed") from exc
        return expected + len(rows)

    # -- reads ---------------------------------------------------------------

    def _select(self, query: sql.Composable, args: tuple[Any, ...]) -> list[tuple[Any, ...]]:
        import psycopg

        try:
            with self._pool.connection() as conn:
                rows: list[tuple[Any, ...]] = conn.execute(query, args).fetchall()
                return rows
        except psycopg.Error as exc:
            raise _map_error(exc, "read failed") from exc

    def _read_events(self, query: sql.Composable, args: tuple[Any, ...]) -> list[StoredEvent]:
        out = []
        for position, session_id, seq, tag, version, text, recorded_at in self._select(query, args):
            try:
                payload = loads_payload(text)
            except ValueError as exc:  # payload_text is not checked by the server
                raise StoreCorrupted(f"the payload at position {position} is not JSON") from exc
            if type(payload) is not dict:
                raise StoreCorrupted(f"the payload at position {position} is not a JSON object")
            out.append(StoredEvent(session_id, seq, tag, version, payload, recorded_at, position))
        return out

    async def read(self, session_id: str, after: int = 0) -> list[StoredEvent]:
        """Events of ``session_id`` with ``seq > after``, in order."""
        return await self._run(self._read_events, self._q_read, (session_id, after))

    async def read_decoded(
        self, session_id: str, decoder: EventDecoder[_T], after: int = 0
    ) -> list[_T]:
        """:meth:`read` through ``decoder.decode_rows``, on the worker thread."""

        def run() -> list[_T]:
            rows = self._select(self._q_read_json, (session_id, after))
            return decode_rows("", session_id, rows, decoder)

        return await self._run(run)

    async def read_decoded_many(
        self,
        session_ids: Sequence[str],
        decoder: EventDecoder[_T],
        fold: Callable[[str, list[_T]], _R],
    ) -> dict[str, _R]:
        """``fold`` of each session's :meth:`read_decoded`, in one trip to a
        worker thread (``fold`` runs there) and one repeatable-read
        transaction (a consistent snapshot)."""
        ids = list(dict.fromkeys(session_ids))

        def run() -> dict[str, _R]:
            import psycopg

            out: dict[str, _R] = {}
            try:
                with self._pool.connection() as conn, conn.transaction():
                    conn.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ, READ ONLY")
                    for sid in ids:
                        rows = conn.execute(self._q_read_json, (sid, 0)).fetchall()
                        out[sid] = fold(sid, decode_rows("", sid, rows, decoder))
            except psycopg.Error as exc:
                raise _map_error(exc, "read failed") from exc
            return out

        return await self._run(run)

    async def read_all(self, after: int = 0, limit: int | None = None) -> list[StoredEvent]:
        """The global feed: events with ``position > after``, in order."""
        return await self._run(self._read_events, self._q_read_all, (after, limit))

    async def session_ids(self) -> list[str]:
        """Every session with at least one event, in order of first event."""
        rows = await self._run(self._select, self._q_sessions, ())
        return [r[0] for r in rows]

    # -- ownership -----------------------------------------------------------

    def _session_key(self, session_id: str) -> int:
        return _hash(f"session:{self._schema}.{self._table}\x00{session_id}", 8)

    def _owner_conn(self) -> psycopg.Connection[Any]:
        import psycopg

        conn = self._owner
        if conn is None or conn.closed or conn.broken:
            if conn is not None:
                conn.close()
            conn = self._owner = psycopg.connect(
                self._dsn,
                autocommit=True,
                connect_timeout=max(1, round(self._timeout)),
                application_name=_application_name(),
            )
        return conn

    async def acquire(self, session_id: str) -> None:
        """Become the only writer of ``session_id`` across processes.

        Re-acquiring an owned session is a no-op.

        Raises:
            SessionOwnedElsewhere: another store (usually another process)
                holds it; the message names the holder.
            StoreUnavailable: the server cannot be reached.
        """
        await self._run(self._acquire_sync, session_id)

    def _acquire_sync(self, session_id: str) -> None:
        import psycopg

        key = self._session_key(session_id)
        with self._owner_lock:
            try:
                conn = self._owner_conn()
                pid = conn.info.backend_pid
                if self._owned.get(session_id) == (key, pid):
                    return
                row = conn.execute("SELECT pg_try_advisory_lock(%s::int8)", (key,)).fetchone()
                if not (row and row[0]):
                    raise SessionOwnedElsewhere(session_id, _holder(conn, key))
            except psycopg.Error as exc:
                raise _map_error(exc, f"cannot acquire {session_id!r}") from exc
            self._owned[session_id] = (key, pid)

    async def release(self, session_id: str) -> None:
        """Give up ownership taken with :meth:`acquire` (no-op if not owned)."""
        await trio.lowlevel.checkpoint_if_cancelled()
        if self._closed or session_id not in self._owned:
            return
        await trio.to_thread.run_sync(self._release_sync, session_id)

    def _release_sync(self, session_id: str) -> None:
        import psycopg

        with self._owner_lock:
            owned = self._owned.pop(session_id, None)
            conn = self._owner
            if owned is None or conn is None or conn.closed or conn.broken:
                return
            if conn.info.backend_pid != owned[1]:
                return  # that connection, and the lock with it, is gone
            try:
                conn.execute("SELECT pg_advisory_unlock(%s::int8)", (owned[0],))
            except psycopg.Error as exc:
                raise _map_error(exc, f"cannot release {session_id!r}") from exc

    async def aclose(self) -> None:
        """Release every owned session and close all connections. Idempotent."""
        if self._closed:
            await trio.lowlevel.checkpoint()
            return
        self._closed = True
        with trio.CancelScope(shield=True):
            await trio.to_thread.run_sync(self._close_sync)

    def _close_sync(self) -> None:
        with self._owner_lock:
            self._owned.clear()
            if self._owner is not None:
                self._owner.close()  # ends the PostgreSQL session: its locks go
                self._owner = None
        self._pool.close()

    async def __aenter__(self) -> PostgresStore:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.aclose()


def _application_name() -> str:
    return f"turnledger pid={os.getpid()} host={socket.gethostname()}"[:63]


def _split_key(key: int) -> tuple[int, int]:
    # pg_locks shows a bigint advisory key as classid (high half), objid (low
    # half), objsubid 1.
    unsigned = key & 0xFFFF_FFFF_FFFF_FFFF
    return unsigned >> 32, unsigned & 0xFFFF_FFFF


_HOLDS: Final = (
    "SELECT 1 FROM pg_locks WHERE locktype = 'advisory' AND pid = %s"
    " AND database = (SELECT oid FROM pg_database WHERE datname = current_database())"
    " AND classid = %s::int8::oid AND objid = %s::int8::oid AND objsubid = 1 AND granted"
)


def _holds(cur: psycopg.Cursor[Any], key: int, pid: int) -> bool:
    hi, lo = _split_key(key)
    return cur.execute(_HOLDS, (pid, hi, lo)).fetchone() is not None


def _holder(conn: psycopg.Connection[Any], key: int) -> str:
    hi, lo = _split_key(key)
    row = conn.execute(
        "SELECT l.pid, a.application_name, a.client_addr::text FROM pg_locks l"
        " LEFT JOIN pg_stat_activity a ON a.pid = l.pid"
        " WHERE l.locktype = 'advisory' AND l.classid = %s::int8::oid"
        " AND l.objid = %s::int8::oid AND l.objsubid = 1 AND l.granted",
        (hi, lo),
    ).fetchone()
    if row is None:
        return "the holder just let go; try again"
    backend, app, addr = row
    who = app or "an unnamed client"
    return f"held by {who} (PostgreSQL backend pid {backend}{', from ' + addr if addr else ''})"


def _check_schema(conn: psycopg.Connection[Any], schema: str, table: str) -> None:
    from psycopg import sql

    meta = sql.Identifier(schema, f"{table}_meta")
    row = conn.execute("SELECT to_regclass(%s)", (f'"{schema}"."{table}_meta"',)).fetchone()
    if row is None or row[0] is None:
        raise StoreUnavailable(f"{schema}.{table}: no turnledger events table here")
    row = conn.execute(
        sql.SQL("SELECT value FROM {} WHERE key = 'schema_version'").format(meta)
    ).fetchone()
    version = int(row[0]) if row else 0
    if version != SCHEMA_VERSION:
        raise StoreUnavailable(
            f"{schema}.{table}: schema version {version}; this release reads {SCHEMA_VERSION}"
        )
    conn.rollback()


def _create_schema(conn: psycopg.Connection[Any], schema: str, table: str) -> None:
    from psycopg import sql

    t = sql.Identifier(schema, table)
    meta = sql.Identifier(schema, f"{table}_meta")
    with conn.transaction():
        # Two processes creating the same table at once would race in the
        # catalogs; serialize them.
        conn.execute(
            "SELECT pg_advisory_xact_lock(%s::int4, %s::int4)",
            (_DDL_CLASS, _hash(f"ddl:{schema}.{table}", 4)),
        )
        conn.execute(sql.SQL("CREATE SCHEMA IF NOT EXISTS {}").format(sql.Identifier(schema)))
        conn.execute(
            sql.SQL(
                "CREATE TABLE IF NOT EXISTS {} (key text PRIMARY KEY, value text NOT NULL)"
            ).format(meta)
        )
        row = conn.execute(
            sql.SQL("SELECT value FROM {} WHERE key = 'schema_version'").format(meta)
        ).fetchone()
        version = int(row[0]) if row else 0
        if version > SCHEMA_VERSION:
            raise StoreUnavailable(
                f"{schema}.{table}: schema version {version} was written by a newer "
                f"turnledger; this release knows versions up to {SCHEMA_VERSION}"
            )
        if version == SCHEMA_VERSION:
            return
        conn.execute(
            sql.SQL(
                """
                CREATE TABLE IF NOT EXISTS {} (
                    position       bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
                    session_id     text             NOT NULL,
                    seq            integer          NOT NULL CHECK (seq >= 1),
                    tag            text             NOT NULL,
                    schema_version integer          NOT NULL,
                    payload        jsonb            NOT NULL,
                    payload_text   text,
                    recorded_at    double precision NOT NULL,
                    UNIQUE (session_id, seq)
                )
                """
            ).format(t)
        )
        conn.execute(
            sql.SQL("CREATE INDEX IF NOT EXISTS {} ON {} (position) WHERE seq = 1").format(
                sql.Identifier(f"{table}_first"), t
            )
        )
        conn.execute(
            sql.SQL(
                "INSERT INTO {} (key, value) VALUES ('schema_version', %s)"
                " ON CONFLICT (key) DO UPDATE SET value = excluded.value"
            ).format(meta),
            (str(SCHEMA_VERSION),),
        )
