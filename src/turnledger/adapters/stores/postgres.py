"""The store for more than one machine: PostgreSQL through psycopg 3.

psycopg's async API runs on asyncio only, so every call runs off the trio
thread: appends on the store's writer thread (one connection), the replay
reads of :meth:`PostgresStore.read_decoded` on its reader thread (one
connection; the reads waiting together are one statement, so a hub opening
a thousand sessions at once reads them in a few round trips, not a thousand),
other reads on a worker thread (``trio.to_thread.run_sync``, never abandoned)
with a connection from a ``psycopg_pool.ConnectionPool``. Needs the
``postgres`` extra.

Table. One table (``turnledger_events`` by default, in a schema you choose):
``UNIQUE (session_id, seq)`` is the optimistic-concurrency guard and
``position`` the global feed order. No lock is held around appends: writers
of different sessions, in one process or many, commit side by side.

The feed without a lock. A position is the writing transaction's id shifted
left by 20 bits plus the row's index in that transaction
(``pg_current_xact_id() << 20 | i``). The feed is ordered by transaction id,
and :meth:`PostgresStore.read_all` reads only rows below
``pg_snapshot_xmin(pg_current_snapshot()) << 20``: every transaction with a
smaller id has ended, so nothing can commit later below a position a reader
has passed, and a tailing reader never reads a gap that fills in. A plain
sequence would not do (positions are taken before commit, so a later position
can commit first), and the other known answer, one sequencer assigning
positions after commit, costs a second write of every row. The trade-off:
the feed shows a commit only once every write transaction older than it, in
the whole cluster, has ended; a transaction left open holds the feed back (the
writer's connection sets ``idle_in_transaction_session_timeout`` to the lease
length, and every round trip inside its transactions ends with a Sync, so a
writer stalled between round trips has its transaction ended by the server).
Positions are increasing but not dense.

Group commit. The writer thread takes every append waiting in its queue (up to
``max_group``) and writes them in ONE transaction, in two round trips
(pipelined): one query for the leases of the owned sessions and the versions
of the others (a version this writer committed last is trusted when the
caller expects it), then one INSERT of all accepted rows and the COMMIT (one
WAL flush). A stale or fenced-off append is refused on its own; the others
still commit. If the transaction fails as a whole (a unique violation from a
racing writer, the server gone), every append of the group is retried in its
own transaction, so each caller learns its own fate; a batch is always all
or nothing. Acquires and releases that wait together are grouped the same
way (one upsert, one UPDATE). The INSERT's columns go as arrays in binary
form: in text form every JSON payload would be quoted and escaped as an array
element, which cost more than the rest of the writer's work together.

Payloads. ``payload`` is ``jsonb`` (queryable: ``payload->>'request_id'``).
``jsonb`` cannot hold U+0000 nor a lone surrogate; for the rare payload that
does, ``payload`` holds a copy with each such character replaced by U+FFFD and
``payload_text`` holds the exact JSON text. Readers take ``payload_text`` when
it is set, so every payload reads back exactly.

Ownership: fenced leases. :meth:`PostgresStore.acquire` takes the session's
row in ``<table>_leases`` (owner host and pid, expiry, epoch) and bumps its
epoch; the store's renewal thread extends the expiry of every owned session
each ``renew_every`` seconds. Another store gets
:class:`~turnledger.SessionOwnedElsewhere` naming the holder while the lease
is live: unexpired, and the holder's connection still open (a process that
died frees its sessions at once). After expiry another store may take the
session over, bumping the epoch. Every append to an owned session checks, in
its transaction, that the epoch is still the one it acquired (it locks the
lease row FOR KEY SHARE until commit, and a takeover locks it FOR UPDATE
first, so the takeover waits for the append or the append sees the
takeover; renewals do not wait), and is refused with
:class:`~turnledger.LeaseLost` otherwise: a stalled owner that wakes up
after losing the session never writes to it.

A stalled append. An owner may stall in the middle of an append, its lease
rows key-share-locked, at a point the server's idle timeout does not cover:
PostgreSQL arms ``idle_in_transaction_session_timeout`` only after a Sync, so
not while it waits for the rest of a half-sent message, nor (without the Sync
above) between pipelined statements; ``statement_timeout`` does not run while
the server waits for the client either, and ``transaction_timeout`` needs
PostgreSQL 17. So the takeover ends such an owner itself: every append
transaction that locks lease rows first takes a shared advisory lock keyed by
its store's token; a takeover whose row lock times out looks, for each
session whose lease has EXPIRED and is held by another store, for the
backends holding that owner's key (``pg_locks``), ends them with
``pg_terminate_backend`` (their transactions roll back: nothing is written)
and tries once more. A stalled owner thus keeps a session at most its lease
plus one lock wait. Fencing is unchanged: the epoch is bumped only under the
row lock, so a transaction that committed before being ended wrote under the
epoch it held, and the owner's next append, on a new connection, finds the
new epoch and is refused. Ending another backend needs the same role as its
owner (or ``pg_signal_backend``); without it the takeover waits as before
(``SessionOwnedElsewhere``, "try again") until the owner's transaction ends.
Expiries use the server's clock, so hosts' clocks need not agree.

Nodes. A store opened with ``node_id`` (``serve --node-id``) is a node of a
cluster: its row in ``<table>_nodes`` is heartbeated by the renewal thread
and live while its ``expires_at`` (the server's clock) lies ahead; every
lease it takes names it, and a lease naming a node that is not live, or
that the table does not know, is a dead owner's whatever its own expiry.
Nodes hand calls to each other through ``<table>_inbox`` (see
``_pg_cluster`` and docs/cluster.md).

Where the code is. This module is the store and its public methods;
``_pg_sql`` holds the tables, every statement and what the server's errors
mean; ``_pg_threads`` the writer and reader threads; ``_pg_leases`` what the
store owns and the renewal thread; ``_pg_cluster`` the nodes and their inbox.

Schema. ``<table>_meta`` holds the schema version (:data:`SCHEMA_VERSION`).
Version 1 (an identity column and a table-wide advisory lock per append) is
migrated in place on open: the identity goes (old positions are all smaller
than the new ones) and the leases table is created; old rows replay as they
were. A release that only knows version 1 refuses the migrated table.
"""

from __future__ import annotations

import datetime
import functools
import time
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any, TypeVar

import attrs
import trio

from ..._errors import LeaseLost, StoreError, StoreUnavailable, UnknownSession
from ...events import BaseEventStore, Erasure, EventDecoder, StoredEvent, session_hash
from ._common import check_batch, rows_to_events
from ._io_thread import Append as _Append
from ._io_thread import Call as _Call
from ._payloads import check_envelope, decode_rows
from ._pg_cluster import Inbox, NodeInfo
from ._pg_leases import Leases
from ._pg_sql import (
    MAX_ROWS,
    SCHEMA_VERSION,
    Statements,
    application_name,
    check_schema,
    connect,
    create_schema,
    map_error,
    payload_columns,
)
from ._pg_threads import Acquire, Read, Reader, Release, Writer

if TYPE_CHECKING:
    from psycopg import sql
    from psycopg_pool import ConnectionPool

__all__ = ["SCHEMA_VERSION", "NodeInfo", "PostgresStore", "SessionLease", "check_node_id"]

_T = TypeVar("_T")
_R = TypeVar("_R")


@attrs.frozen
class SessionLease:
    """Who owns a session, from :meth:`PostgresStore.owners`."""

    session_id: str
    #: Host name and process id of the owning store.
    host: str
    pid: int
    #: Bumped by every acquire; appends carrying an older one are refused.
    epoch: int
    #: When the lease runs out unless renewed (the server's clock, UTC).
    expires_at: datetime.datetime
    #: False once ``expires_at`` has passed, or its node is not live:
    #: another store may take it over.
    live: bool
    #: The node the owner runs as (``serve --node-id``); ``None``: none.
    node: str | None = None


def _lease(r: tuple[Any, ...]) -> SessionLease:
    return SessionLease(r[0], r[1], r[2], r[3], r[4], bool(r[5]), r[7])


def check_node_id(node_id: str) -> str:
    """``node_id`` if a node may be called so, else ValueError saying why."""
    if not node_id.strip() or node_id != node_id.strip():
        raise ValueError("a node id is not blank and has no surrounding spaces")
    if len(node_id) > 200 or not node_id.isprintable():
        raise ValueError("a node id has at most 200 printable characters")
    return node_id


class PostgresStore(BaseEventStore):
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
        *,
        lease: float = 10.0,
        renew_every: float | None = None,
        max_group: int = 256,
        read_only: bool = False,
        node_id: str | None = None,
        advertise: str | None = None,
    ) -> None:
        # Private: use ``await PostgresStore.open(dsn)``.
        self._pool = pool
        self._schema = schema
        self._table = table
        self._closed = False
        renew_every = renew_every if renew_every is not None else lease / 3
        self._connect = functools.partial(connect, dsn, timeout)
        self._sql = Statements(schema, table, lock_wait_ms=max(100, round(renew_every * 500)))
        self._leases = Leases(
            functools.partial(self._connect, autocommit=True),
            self._sql,
            lease,
            renew_every,
            table,
            node=node_id,
            address=advertise,
        )
        self._inbox = (
            None
            if node_id is None
            else Inbox(
                pool,
                functools.partial(self._connect, autocommit=True),
                self._sql.cluster,
                schema,
                table,
                node_id,
            )
        )
        where = f"{schema}.{table}"
        self._writer = (
            None if read_only else Writer(where, self._connect, self._sql, self._leases, max_group)
        )
        self._reader = Reader(where, self._connect, self._sql, max_group)

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
        lease: float = 10.0,
        renew_every: float | None = None,
        max_group: int = 256,
        node_id: str | None = None,
        advertise: str | None = None,
    ) -> PostgresStore:
        """Connect, and create (or migrate) the tables if needed.

        Args:
            dsn: a libpq connection string or ``postgresql://`` URL.
            schema: the schema of the table; default: the connection's
                ``current_schema()`` (the first of its ``search_path``).
            table: the events table (``<table>_meta`` holds the schema
                version, ``<table>_leases`` the owners of sessions).
            min_size, max_size: bounds of the pool of reading connections.
            timeout: seconds to wait for a connection.
            read_only: only read: create nothing (the table must exist);
                appends raise ``StoreError``.
            lease: seconds a session stays owned without renewal. The
                trade-off: a stalled owner (SIGSTOP, a long GC pause, a VM
                freeze, a partition that keeps its connection open) blocks
                its sessions this long before another process may take them
                over; a shorter lease needs renewals to get through sooner
                and makes a healthy but slow owner lose its sessions more
                easily. An owner that dies frees them at once either way.
            renew_every: seconds between renewals of every owned lease (one
                UPDATE); default ``lease / 3``, so two renewals in a row may
                fail before a lease runs out.
            max_group: the most appends written in one transaction.
            node_id: run as this node of a cluster (``serve --node-id``, see
                docs/cluster.md): the node is registered in ``<table>_nodes``
                and heartbeated with every renewal, live for ``lease``
                seconds after each (the server's clock); every lease taken
                names it, and is judged dead once the node is.
            advertise: the address shown for the node (``GET /v1/nodes``).

        Raises:
            StoreUnavailable: the server cannot be reached, psycopg is not
                installed, or the table was created by a newer release.
            StoreError: ``node_id`` is held by another live process.
            ValueError: ``lease``, ``renew_every`` or ``max_group`` is out of
                range (``0 < renew_every < lease``, ``max_group >= 1``), or
                ``node_id`` is blank, longer than 200 characters or has
                control characters; or ``node_id`` with ``read_only``.
        """
        renew = renew_every if renew_every is not None else lease / 3
        if not (lease > 0 and 0 < renew < lease):
            raise ValueError("need 0 < renew_every < lease (seconds)")
        if max_group < 1:
            raise ValueError("max_group must be at least 1")
        if node_id is not None:
            check_node_id(node_id)
            if read_only:
                raise ValueError("a read-only store cannot be a node")
        store: PostgresStore = await trio.to_thread.run_sync(
            lambda: cls._open_sync(
                dsn,
                schema,
                table,
                min_size,
                max_size,
                timeout,
                read_only,
                lease,
                renew,
                max_group,
                node_id,
                advertise,
            )
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
        lease: float = 10.0,
        renew_every: float | None = None,
        max_group: int = 256,
        node_id: str | None = None,
        advertise: str | None = None,
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
            kwargs={"application_name": application_name()},
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
                        check_schema(conn, schema, table)
                    else:
                        create_schema(conn, schema, table)
            except psycopg.Error as exc:
                raise map_error(exc, "cannot create the turnledger table") from exc
        except BaseException:
            pool.close()
            raise
        store = cls(
            pool,
            dsn,
            schema,
            table,
            timeout,
            lease=lease,
            renew_every=renew_every,
            max_group=max_group,
            read_only=read_only,
            node_id=node_id,
            advertise=advertise,
        )
        if node_id is not None:
            try:
                store._leases.beat()  # registered, or the id is in use
            except BaseException:
                store._close_sync()
                raise
            store._leases.start_renewing()
        return store

    @property
    def schema(self) -> str:
        """The schema of the table."""
        return self._schema

    @property
    def table(self) -> str:
        """The events table."""
        return self._table

    @property
    def node_id(self) -> str | None:
        """The node this store runs as (``None``: not a node)."""
        return self._leases.node

    @property
    def inbox(self) -> Inbox | None:
        """The node's inbox (``None``: not a node); its methods block."""
        return self._inbox

    @property
    def lease(self) -> float:
        """Seconds an owned session's lease lasts without renewal."""
        return self._leases.seconds

    @property
    def renew_every(self) -> float:
        """Seconds between renewals of the owned leases."""
        return self._leases.renew_every

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
        """Append ``events`` after ``expected_version`` in one transaction,
        possibly shared with appends to other sessions (group commit).

        Raises:
            ConcurrencyConflict: the stream is not at ``expected_version``.
            LeaseLost: this store acquired the session but another store has
                taken it over since (its lease ran out); nothing was written.
            StoreUnavailable: the server cannot be reached. StoreFull: its
                disk is full. StoreError: a payload is not JSON-able; nothing
                was written.

        Cancellation: the append is never interrupted. A caller cancelled
        while waiting still waits for the outcome (the whole batch committed,
        or nothing); the cancellation is raised at its next checkpoint.
        """
        await trio.lowlevel.checkpoint_if_cancelled()
        self._check_open()
        if not events:
            return expected_version
        if self._writer is None:
            raise StoreError("the PostgreSQL store was opened read-only")
        check_batch(session_id, events, expected_version)
        lost = self._leases.lost.get(session_id)
        if lost is not None:
            raise LeaseLost(session_id, lost.epoch, lost.current_epoch)
        if len(events) >= MAX_ROWS:
            raise StoreError(f"a batch holds at most {MAX_ROWS - 1} events")
        rows = []
        for ev in events:
            jsonb, exact = payload_columns(ev.payload)
            recorded_at = check_envelope(ev)
            rows.append((session_id, ev.seq, ev.tag, ev.schema_version, jsonb, exact, recorded_at))
        result: int = await self._writer.call(_Append(session_id, expected_version, rows))
        return result

    # -- reads ---------------------------------------------------------------

    def _select(self, query: sql.Composable, args: tuple[Any, ...]) -> list[tuple[Any, ...]]:
        import psycopg

        try:
            with self._pool.connection() as conn:
                rows: list[tuple[Any, ...]] = conn.execute(query, args).fetchall()
                return rows
        except psycopg.Error as exc:
            raise map_error(exc, "read failed") from exc

    def _read_events(self, query: sql.Composable, args: tuple[Any, ...]) -> list[StoredEvent]:
        # payload_text is not checked by the server: rows_to_events parses it.
        return rows_to_events("cannot read", self._select(query, args))

    async def read(self, session_id: str, after: int = 0) -> list[StoredEvent]:
        """Events of ``session_id`` with ``seq > after``, in order."""
        return await self._run(self._read_events, self._sql.read, (session_id, after))

    async def read_decoded(
        self, session_id: str, decoder: EventDecoder[_T], after: int = 0
    ) -> list[_T]:
        """:meth:`read` through ``decoder.decode_rows``, on the store's reader
        thread; reads of several sessions waiting together share one
        statement."""
        await trio.lowlevel.checkpoint_if_cancelled()
        self._check_open()
        result: list[_T] = await self._reader.call(Read(session_id, after, decoder))
        return result

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
                        rows = conn.execute(self._sql.read_json, (sid, 0)).fetchall()
                        out[sid] = fold(sid, decode_rows("", sid, rows, decoder))
            except psycopg.Error as exc:
                raise map_error(exc, "read failed") from exc
            return out

        return await self._run(run)

    async def read_all(self, after: int = 0, limit: int | None = None) -> list[StoredEvent]:
        """The global feed: events with ``position > after``, in order.

        Only events whose transaction, and every write transaction older
        than it, has ended (see the module's notes): reading on from the last
        position returned never skips an event that commits later.
        """
        return await self._run(self._read_events, self._sql.read_all, (after, limit))

    async def session_ids(self) -> list[str]:
        """Every session with at least one event, in order of first event."""
        rows = await self._run(self._select, self._sql.sessions, ())
        return [r[0] for r in rows]

    # -- ownership -----------------------------------------------------------

    async def acquire(self, session_id: str) -> None:
        """Become the only writer of ``session_id`` across processes.

        Takes the session's lease (bumping its epoch) unless another store
        holds it live. Re-acquiring an owned session is a no-op. The store's
        renewal thread keeps the lease alive until :meth:`release`.

        Raises:
            SessionOwnedElsewhere: another store (usually another process)
                holds a live lease; the message names the holder.
            StoreUnavailable: the server cannot be reached.
        """
        await trio.lowlevel.checkpoint_if_cancelled()
        self._check_open()
        if self._writer is None:
            raise StoreError("the PostgreSQL store was opened read-only")
        if session_id not in self._leases.held:
            await self._writer.call(Acquire(session_id))

    async def renew(self) -> list[str]:
        """Extend every owned lease now (the renewal thread does this each
        ``renew_every`` seconds); returns the sessions found taken over,
        whose appends will be refused with ``LeaseLost``."""
        return await self._run(self._leases.renew)

    async def release(self, session_id: str) -> None:
        """Give up ownership taken with :meth:`acquire` (no-op if not owned,
        or if the lease was taken over meanwhile)."""
        await trio.lowlevel.checkpoint_if_cancelled()
        if self._closed or session_id not in self._leases.held:
            return
        if self._writer is not None:  # with other releases waiting: one UPDATE
            await self._writer.call(Release(session_id))

    # -- erasure -------------------------------------------------------------

    async def erase(self, session_id: str, keep: Sequence[StoredEvent] = ()) -> Erasure:
        """Delete the session's rows (and its lease row; ``keep`` written in
        their place) and record the erasure, in one transaction, holding the
        session's lease (taken here, so a live owner elsewhere refuses it).

        What the server still holds afterwards: the deleted tuples stay in
        the table's pages until VACUUM reclaims them (and even then until the
        pages are reused), and in the write-ahead log and every backup or
        replica until they are rotated out. The rows are unreadable through
        SQL at once; their bytes on the server's disks are the server's.

        Raises:
            UnknownSession: no row of it; nothing changed.
            SessionOwnedElsewhere: another store holds its lease live.
            StoreUnavailable: the server failed; nothing was erased.

        Cancellation: never interrupted; a cancelled caller still waits for
        the transaction's outcome.
        """
        await trio.lowlevel.checkpoint_if_cancelled()
        self._check_open()
        if self._writer is None:
            raise StoreError("the PostgreSQL store was opened read-only")
        if keep:
            check_batch(session_id, keep, 0)
        rows = []
        for ev in keep:
            jsonb, exact = payload_columns(ev.payload)
            rows.append(
                (session_id, ev.seq, ev.tag, ev.schema_version, jsonb, exact, check_envelope(ev))
            )
        (count,) = (await self._run(self._select, self._sql.count, (session_id,)))[0]
        if not count:
            raise UnknownSession(session_id)
        owned = session_id in self._leases.held
        await self.acquire(session_id)
        try:
            with trio.CancelScope(shield=True):
                record = await trio.to_thread.run_sync(self._erase_sync, session_id, rows)
        finally:
            if (keep or session_id in self._leases.held) and not owned:
                await self.release(session_id)
        self._writer.versions.pop(session_id, None)
        return record

    def _erase_sync(self, session_id: str, rows: list[tuple[Any, ...]]) -> Erasure:
        import psycopg

        q = self._sql
        leases = self._leases
        try:
            with self._pool.connection() as conn, conn.transaction():
                held = conn.execute(q.lock_lease, (session_id, leases.token)).fetchall()
                if not held:
                    raise LeaseLost(session_id, leases.held.get(session_id, 0), None)
                (count,) = conn.execute(q.count, (session_id,)).fetchall()[0]
                if not count:
                    raise UnknownSession(session_id)
                conn.execute(q.delete, (session_id,))
                if rows:
                    conn.execute(q.insert, [list(c) for c in zip(*rows, strict=True)])
                else:
                    conn.execute(q.delete_lease, (session_id,))
                record = Erasure(session_hash(session_id), time.time(), int(count), len(rows))
                conn.execute(
                    q.record_erasure,
                    (record.session_hash, record.erased_at, record.events, record.kept),
                )
        except psycopg.Error as exc:
            raise map_error(exc, f"cannot erase {session_id!r}") from exc
        if not rows:
            with leases.lock:
                leases.held.pop(session_id, None)
        return record

    async def erasures(self) -> list[Erasure]:
        """The erasure records, oldest first.

        Cancellation: only reads; a cancelled call changed nothing.
        """
        query = self._sql.erasures

        def run() -> list[Erasure]:
            import psycopg

            try:
                with self._pool.connection() as conn:
                    rows = conn.execute(query).fetchall()
            except psycopg.errors.UndefinedTable:
                return []  # a table opened read-only that never erased
            except psycopg.Error as exc:
                raise map_error(exc, "read failed") from exc
            return [Erasure(r[0], r[1], r[2], r[3]) for r in rows]

        return await self._run(run)

    async def owners(self) -> list[SessionLease]:
        """Who owns each session that has an owner: host, pid, epoch and
        lease expiry, live or expired (a dead owner's lease shows as not
        live at once), in session order."""
        query = self._sql.owners

        def run() -> list[SessionLease]:
            import psycopg

            try:
                with self._pool.connection() as conn:
                    rows = conn.execute(query).fetchall()
            except psycopg.errors.UndefinedTable:
                return []  # a version-1 table opened read-only: no leases
            except psycopg.Error as exc:
                raise map_error(exc, "read failed") from exc
            return [_lease(r) for r in rows]

        return await self._run(run)

    async def owner(self, session_id: str) -> SessionLease | None:
        """Who owns ``session_id`` (live or not); ``None``: no lease row.

        Cancellation: only reads; a cancelled call changed nothing.
        """
        query = self._sql.holders

        def run() -> SessionLease | None:
            rows = self._select(query, ([session_id],))
            return _lease(rows[0]) if rows else None

        return await self._run(run)

    async def nodes(self, *, dead: bool = False, sessions: int = 1000) -> list[NodeInfo]:
        """The live nodes (with ``dead``, also those whose heartbeat ran out
        and that did not leave), each with its sessions (the first
        ``sessions`` of them), heartbeats and lag, in node id order.

        Cancellation: only reads; a cancelled call changed nothing.
        """
        query = self._sql.cluster.nodes

        def run() -> list[NodeInfo]:
            import psycopg

            try:
                with self._pool.connection() as conn:
                    rows = conn.execute(query, (sessions, dead)).fetchall()
            except psycopg.errors.UndefinedTable:
                return []  # opened read-only on a table no node ever used
            except psycopg.Error as exc:
                raise map_error(exc, "read failed") from exc
            return [
                NodeInfo(
                    node_id=r[0],
                    host=r[1],
                    pid=r[2],
                    address=r[3],
                    started_at=r[4],
                    heartbeat_at=r[5],
                    expires_at=r[6],
                    renewals=r[7],
                    lag_ms=float(r[8]),
                    stopping=bool(r[9]),
                    live=bool(r[10]),
                    age_ms=float(r[11]),
                    session_count=int(r[12]),
                    sessions=tuple(r[13]),
                )
                for r in rows
            ]

        return await self._run(run)

    def lost_sessions(self) -> list[str]:
        """Sessions this store held whose lease another store took over
        (their appends are refused until acquired again)."""
        with self._leases.lock:
            return list(self._leases.lost)

    def holds(self, session_id: str) -> bool:
        """Whether this store holds the session's lease, as far as it knows
        (its renewals and appends find a takeover; see :meth:`lost_sessions`)."""
        return session_id in self._leases.held

    def held_sessions(self) -> list[str]:
        """Sessions whose lease this store holds."""
        with self._leases.lock:
            return list(self._leases.held)

    async def mark_stopping(self) -> None:
        """Show this node as stopping in :meth:`nodes` (it stays live).

        Cancellation: the mark is written or not; nothing else changes.
        """
        await self._run(self._leases.mark_stopping)

    async def aclose(self) -> None:
        """Release every owned session and close all connections. Idempotent."""
        if self._closed:
            await trio.lowlevel.checkpoint()
            return
        # No append can be queued after this (the check and the queueing
        # happen without a checkpoint between them), so the writer ends
        # after the appends already queued.
        self._closed = True
        writer = self._writer
        with trio.CancelScope(shield=True):
            if writer is not None:
                await writer.call(_Call(lambda _: writer.close(), last=True))
            reader = self._reader
            await reader.call(_Call(lambda _: reader.close(), last=True))
            await trio.to_thread.run_sync(self._close_sync)

    def _close_sync(self) -> None:
        if self._inbox is not None:
            self._inbox.close()
        self._leases.close()
        self._pool.close()

    async def __aenter__(self) -> PostgresStore:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.aclose()
