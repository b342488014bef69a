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

Schema. ``<table>_meta`` holds the schema version (:data:`SCHEMA_VERSION`).
Version 1 (an identity column and a table-wide advisory lock per append) is
migrated in place on open: the identity goes (old positions are all smaller
than the new ones) and the leases table is created; old rows replay as they
were. A release that only knows version 1 refuses the migrated table.
"""

from __future__ import annotations

import contextlib
import datetime
import hashlib
import json
import os
import re
import socket
import threading
import uuid
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any, Final, TypeVar

import attrs
import outcome
import trio

from ..._errors import (
    ConcurrencyConflict,
    LeaseLost,
    SessionOwnedElsewhere,
    StoreError,
    StoreFull,
    StoreUnavailable,
)
from ...events import EventDecoder, StoredEvent
from ._common import check_batch, rows_to_events
from ._io_thread import Append as _Append
from ._io_thread import Call as _Call
from ._io_thread import Request as _Request
from ._io_thread import Thread as _Thread
from ._io_thread import deliver as _deliver
from ._io_thread import each_alone as _each_alone
from ._payloads import check_envelope, decode_rows, dumps_payload

if TYPE_CHECKING:
    import psycopg
    from psycopg import sql
    from psycopg_pool import ConnectionPool

__all__ = ["SCHEMA_VERSION", "PostgresStore", "SessionLease"]

#: Schema version this release writes (the ``<table>_meta`` table).
SCHEMA_VERSION: Final = 2

_T = TypeVar("_T")
_R = TypeVar("_R")

# Advisory lock class of the two-int form, taken only while creating or
# migrating the schema.
_DDL_CLASS: Final = 0x544C0001

#: A position is ``transaction id << _SHIFT | index of the row in it``.
_SHIFT: Final = 20
_MAX_ROWS: Final = 1 << _SHIFT

_VERSION_CACHE_LIMIT: Final = 100_000

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
    error: StoreError
    if isinstance(exc, errors.DiskFull):
        error = StoreFull(f"{msg}: {exc}")
    elif isinstance(exc, psycopg.OperationalError):  # includes the pool's timeouts
        error = StoreUnavailable(f"{msg}: {exc}")
    else:
        error = StoreError(f"{msg}: {exc}")
    error.__cause__ = exc  # the server's own words, for describe_store_error
    return error


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
    #: False once ``expires_at`` has passed: another store may take it over.
    live: bool


class _Acquire(_Request):
    __slots__ = ("session_id",)

    def __init__(self, session_id: str) -> None:
        self.session_id = session_id


class _Release(_Acquire):
    __slots__ = ()


class _Read(_Request):
    __slots__ = ("after", "decoder", "session_id")

    def __init__(self, session_id: str, after: int, decoder: EventDecoder[Any]) -> None:
        self.session_id = session_id
        self.after = after
        self.decoder = decoder


class _Reader(_Thread[Any]):
    """The store's replay reads: the sessions whose reads wait together are
    read in one statement (a hub opening many sessions at once would
    otherwise spend a thread hop, a pooled connection and a round trip on
    each)."""

    def __init__(self, store: PostgresStore, max_group: int) -> None:
        self.store = store
        self.max_group = max_group
        self.pg: psycopg.Connection[Any] | None = None
        #: statements run, one per group of reads
        self.statements = 0
        super().__init__(f"turnledger-postgres-reader:{store.schema}.{store.table}")

    def handle(self, req: _Request) -> _Request | None:
        assert isinstance(req, _Read)
        group, carry = self.gather(req, lambda nxt: isinstance(nxt, _Read), self.max_group)
        try:
            done = self.read_group(group)
        except BaseException as exc:  # pragma: no cover - a bug; never strand callers
            done = [(r, outcome.Error(exc)) for r in group]
        _deliver(done)
        return carry

    def select(self, args: tuple[Any, ...]) -> list[tuple[Any, ...]]:
        import psycopg

        for attempt in (1, 2):
            conn = self.pg
            try:
                if conn is None or conn.closed or conn.broken:
                    if conn is not None:
                        conn.close()
                    conn = self.pg = self.store._connect(autocommit=True)
                self.statements += 1
                # Binary results: the payloads come as their bytes, not as hex.
                rows: list[tuple[Any, ...]] = conn.execute(
                    self.store._q_read_json_many, args, binary=True
                ).fetchall()
                return rows
            except psycopg.Error as exc:
                # A read is safe to repeat: once more on a new connection
                # after this one was lost (a restarted server, an idle
                # connection cut by a proxy).
                if attempt == 1 and self.pg is not None and (self.pg.broken or self.pg.closed):
                    continue
                raise _map_error(exc, "read failed") from exc
        raise AssertionError("unreachable")  # pragma: no cover

    def read_group(self, group: list[_Read]) -> list[tuple[_Request, outcome.Outcome[Any]]]:
        try:
            rows = self.select(([r.session_id for r in group], [r.after for r in group]))
        except StoreError as exc:
            return [(r, outcome.Error(exc)) for r in group]
        each: list[list[tuple[Any, ...]]] = [[] for _ in group]
        for row in rows:
            each[row[0] - 1].append(row[1:])
        return [
            (r, outcome.capture(decode_rows, "", r.session_id, mine, r.decoder))
            for r, mine in zip(group, each, strict=True)
        ]

    def close(self) -> None:
        if self.pg is not None:
            self.pg.close()
            self.pg = None


class _Writer(_Thread[Any]):
    """The store's one writing connection, committing appends in groups."""

    def __init__(self, store: PostgresStore, max_group: int) -> None:
        self.store = store
        self.max_group = max_group
        self.pg: psycopg.Connection[Any] | None = None
        self.transactions = 0
        #: session id -> the version this writer last committed
        self.versions: dict[str, int] = {}
        super().__init__(f"turnledger-postgres-writer:{store.schema}.{store.table}")

    def connection(self) -> psycopg.Connection[Any]:
        conn = self.pg
        if conn is None or conn.closed or conn.broken:
            if conn is not None:
                conn.close()
            conn = self.pg = self.store._connect(autocommit=False)
            idle_ms = max(1000, round(self.store._lease * 1000))
            conn.execute(f"SET idle_in_transaction_session_timeout = {idle_ms}")
            conn.commit()
        return conn

    def handle(self, req: _Request) -> _Request | None:
        kind = type(req)
        assert kind in (_Append, _Acquire, _Release)
        rows = len(req.rows) if isinstance(req, _Append) else 0

        def fits(nxt: _Request) -> bool:
            nonlocal rows
            more = len(nxt.rows) if isinstance(nxt, _Append) else 0
            if type(nxt) is not kind or rows + more >= _MAX_ROWS:
                return False
            rows += more
            return True

        group: list[Any]
        group, carry = self.gather(req, fits, self.max_group)
        try:
            if kind is _Append:
                done = self.commit_group(group)
            elif kind is _Acquire:
                done = self.acquire_group(group)
            else:
                try:
                    self.store._release_sync([r.session_id for r in group])
                    done = [(r, outcome.Value(None)) for r in group]
                except StoreError as exc:
                    done = [(r, outcome.Error(exc)) for r in group]
        except BaseException as exc:  # pragma: no cover - a bug; never strand callers
            done = [(r, outcome.Error(exc)) for r in group]
        _deliver(done)
        return carry

    def acquire_group(
        self, group: list[_Acquire], retried: bool = False, broke: bool = False
    ) -> list[tuple[_Request, outcome.Outcome[Any]]]:
        """Take the leases of every session in ``group`` that no other store
        holds live, in one statement."""
        import psycopg

        store = self.store
        ids = list(dict.fromkeys(r.session_id for r in group if r.session_id not in store._leases))
        failed: dict[str, StoreError] = {}
        if ids:
            try:
                conn = self.connection()
                with conn.transaction():
                    # A writer mid-append key-share-locks the row: wait for it,
                    # but not for long (its transaction may be stalled, and
                    # this thread's appends wait meanwhile).
                    conn.execute(store._q_lock_wait)
                    # FOR UPDATE waits for appends that key-share-locked the
                    # rows (renewals, plain updates, do not).
                    conn.execute(store._q_lock_leases, (ids,))
                    args = (store._token, store._host, store._pid, store._lease, ids)
                    taken = dict(conn.execute(store._q_take, args).fetchall())
                    refused = [sid for sid in ids if sid not in taken]
                    if refused:
                        for row in conn.execute(store._q_holders, (refused,)).fetchall():
                            failed[row[0]] = _owned_elsewhere(row)
                        for sid in refused:
                            failed.setdefault(sid, SessionOwnedElsewhere(sid, "try again"))
            except Exception as exc:
                if not retried and _not_committed(exc, False, self.pg):
                    return self.acquire_group(group, retried=True, broke=broke)
                if (
                    not broke
                    and isinstance(exc, psycopg.errors.LockNotAvailable)
                    and self.break_stalled(ids)
                ):
                    return self.acquire_group(group, retried=retried, broke=True)
                if len(ids) > 1:
                    return _each_alone(group, lambda one: self.acquire_group(one, broke=True))
                sid = ids[0]
                if isinstance(exc, psycopg.errors.LockNotAvailable):
                    err: StoreError = SessionOwnedElsewhere(
                        sid, "its owner is in the middle of an append; try again"
                    )
                elif isinstance(exc, psycopg.Error | StoreError):
                    err = _map_error(exc, f"cannot acquire {sid!r}")
                else:
                    err = StoreError(f"cannot acquire {sid!r}: {type(exc).__name__}")
                    err.__cause__ = exc
                return [(r, outcome.Error(err)) for r in group]
            with store._lease_lock:
                store._leases.update(taken)
                for sid in taken:
                    store._lost.pop(sid, None)
            if taken:
                store._start_renewer()
        return [
            (r, outcome.Error(failed[r.session_id]))
            if r.session_id in failed
            else (r, outcome.Value(None))
            for r in group
        ]

    def break_stalled(self, ids: list[str]) -> bool:
        """End the transactions that keep expired leases of ``ids`` locked:
        their owners stalled in the middle of an append (stopped, frozen, cut
        off) and renewed nothing for a whole lease. Whether any was ended."""
        import psycopg

        store = self.store
        try:
            conn = self.connection()
            with conn.transaction():
                rows = conn.execute(store._q_break, (ids, store._token)).fetchall()
        except psycopg.Error:
            return False  # e.g. not allowed to signal the owner's backend
        return any(ended for (ended,) in rows)

    def commit_group(
        self, group: list[_Append], retried: bool = False
    ) -> list[tuple[_Request, outcome.Outcome[Any]]]:
        import psycopg

        store = self.store
        done: list[tuple[_Request, outcome.Outcome[Any]]] = []
        accepted: list[_Append] = []
        committing = False
        xid: int | None = None
        try:
            conn = self.connection()
            sids = list(dict.fromkeys(r.session_id for r in group))
            with store._lease_lock:
                held = {sid: store._leases[sid] for sid in sids if sid in store._leases}
                # Found taken over (by a renewal) since the append was queued:
                # refused as stale, never written unfenced.
                gone = {sid: store._lost[sid] for sid in sids if sid in store._lost}
            # Versions this writer committed last are trusted when the caller
            # expects them (had another writer moved the stream, the unique
            # key refuses the rows); others are looked up.
            known = self.versions
            first: dict[str, int] = {}
            for req in group:
                first.setdefault(req.session_id, req.expected)
            ask = [sid for sid, exp in first.items() if known.get(sid) != exp]
            seen = {sid: first[sid] for sid in sids if sid not in ask}
            seen.update(dict.fromkeys(ask, 0))
            epochs: dict[str, int] = {}
            # Pipelined: BEGIN and the check go in one round trip, the INSERT
            # and COMMIT in another (each round trip also waits for the GIL).
            # The first ends with a Sync, not a mere flush: the server then
            # waits "idle in transaction", under its timeout, while this
            # thread builds the INSERT.
            with conn.pipeline() as pipe, conn.transaction(), conn.cursor() as cur:
                # The transaction's id, to learn its fate if the connection
                # is lost around COMMIT; and, when it locks lease rows, the
                # mark of this store's appends for a takeover (break_stalled).
                if held:
                    mark = conn.execute(store._q_mark, (store._token,))
                else:
                    mark = conn.execute(store._q_xid)
                cur.execute(store._q_check, (list(held), ask))
                pipe.sync()
                xid = mark.fetchall()[0][0]
                for kind, sid, value in cur.fetchall():
                    (epochs if kind == "f" else seen)[sid] = value
                rows: list[tuple[Any, ...]] = []
                for req in group:
                    sid = req.session_id
                    mine = held.get(sid)
                    if mine is None and sid in gone:
                        was = gone[sid]
                        done.append(
                            (req, outcome.Error(LeaseLost(sid, was.epoch, was.current_epoch)))
                        )
                        continue
                    if mine is not None and epochs.get(sid) != mine:
                        lost = LeaseLost(sid, mine, epochs.get(sid))
                        store._forget(lost)
                        done.append((req, outcome.Error(lost)))
                        continue
                    current = seen[sid]
                    if current != req.expected:
                        conflict = ConcurrencyConflict(sid, req.expected, current)
                        done.append((req, outcome.Error(conflict)))
                        continue
                    seen[sid] = req.expected + len(req.rows)
                    rows.extend(req.rows)
                    accepted.append(req)
                if rows:
                    cur.execute(store._q_insert, [list(c) for c in zip(*rows, strict=True)])
                committing = True
            # leaving the transaction block committed it
        except Exception as exc:
            self.versions.clear()
            fate = None if xid is None else self.fate(xid, exc)
            if fate == "committed":  # only the answer to COMMIT was lost
                return self.committed(done, accepted, seen)
            if not retried and (fate == "aborted" or _not_committed(exc, committing, self.pg)):
                # The connection was lost (the server ended it, or this
                # process was stopped past idle_in_transaction_session_timeout):
                # nothing of this transaction was written; again, reconnected.
                return self.commit_group(group, retried=True)
            if len(group) > 1:
                return _each_alone(group, self.commit_group)
            req = group[0]
            failure: StoreError
            if isinstance(exc, psycopg.errors.UniqueViolation):
                failure = ConcurrencyConflict(req.session_id, req.expected, None)
            elif isinstance(exc, psycopg.Error | StoreError):
                failure = _map_error(exc, f"append to {req.session_id!r} failed")
            else:
                failure = StoreError(f"append to {req.session_id!r} failed: {type(exc).__name__}")
                failure.__cause__ = exc
            return [(req, outcome.Error(failure))]
        return self.committed(done, accepted, seen)

    def fate(self, xid: int, exc: Exception) -> str | None:
        """Whether the transaction ``xid`` of a lost connection committed
        (``"committed"``, ``"aborted"``; ``None`` when it cannot be told),
        asked on a new connection."""
        import psycopg

        if not isinstance(exc, psycopg.OperationalError):
            return None  # the server answered: the error is the outcome
        conn = self.pg
        if conn is not None and not (conn.closed or conn.broken):
            if not isinstance(exc, psycopg.errors.AdminShutdown):
                return None
            conn.close()  # ended by a takeover, not yet seen as broken
        try:
            conn = self.connection()
            with conn.transaction():
                row = conn.execute("SELECT pg_xact_status(%s::text::xid8)", (str(xid),)).fetchone()
        except psycopg.Error:
            return None
        return None if row is None or row[0] not in ("committed", "aborted") else str(row[0])

    def committed(
        self,
        done: list[tuple[_Request, outcome.Outcome[Any]]],
        accepted: list[_Append],
        seen: dict[str, int],
    ) -> list[tuple[_Request, outcome.Outcome[Any]]]:
        self.transactions += 1
        if len(self.versions) > _VERSION_CACHE_LIMIT:
            self.versions.clear()
        for req in accepted:
            self.versions[req.session_id] = seen[req.session_id]
        for req in accepted:
            done.append((req, outcome.Value(req.expected + len(req.rows))))
        return done

    def close(self) -> None:
        if self.pg is not None:
            self.pg.close()
            self.pg = None


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
        *,
        lease: float = 10.0,
        renew_every: float | None = None,
        max_group: int = 256,
        read_only: bool = False,
    ) -> None:
        # Private: use ``await PostgresStore.open(dsn)``.
        from psycopg import sql

        self._pool = pool
        self._dsn = dsn
        self._schema = schema
        self._table = table
        self._timeout = timeout
        self._lease = lease
        self._renew_every = renew_every if renew_every is not None else lease / 3
        self._read_only = read_only
        self._closed = False
        self._host = socket.gethostname()
        self._pid = os.getpid()
        self._token = uuid.uuid4().hex
        #: session id -> the epoch of the lease this store holds on it
        self._leases: dict[str, int] = {}
        #: sessions whose lease was found taken over: refused until acquired
        self._lost: dict[str, LeaseLost] = {}
        self._lease_conn: psycopg.Connection[Any] | None = None
        self._lease_lock = threading.Lock()
        self._stop = threading.Event()
        self._renewer: threading.Thread | None = None
        t = sql.Identifier(schema, table)
        self._l = lt = sql.Identifier(schema, f"{table}_leases")
        # The leases of the owned sessions (key-share-locked until commit:
        # a takeover waits) and the versions of the sessions asked for.
        self._q_check = sql.SQL(
            "WITH f AS (SELECT session_id, epoch FROM {} WHERE session_id = ANY(%b::text[])"
            " FOR KEY SHARE) SELECT 'f', session_id, epoch FROM f UNION ALL"
            " SELECT 'v', session_id, max(seq) FROM {} WHERE session_id = ANY(%b::text[])"
            " GROUP BY session_id"
        ).format(lt, t)
        # One statement for the whole group, a column of values each; the
        # position is this transaction's id << 20 plus the row's index.
        self._q_insert = sql.SQL(
            "INSERT INTO {} (position, session_id, seq, tag, schema_version, payload,"
            " payload_text, recorded_at) SELECT (pg_current_xact_id()::text::int8 << {})"
            " + n - 1, s, q, t, v, j::jsonb, x, r FROM unnest(%b::text[], %b::int4[],"
            " %b::text[], %b::int4[], %b::text[], %b::text[], %b::float8[])"
            " WITH ORDINALITY AS u(s, q, t, v, j, x, r, n)"
        ).format(t, sql.Literal(_SHIFT))
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
        # The same for many (session, after) pairs, each row tagged with the
        # pair's place (from 1), in that order.
        self._q_read_json_many = sql.SQL(
            "SELECT r.i, e.seq, e.tag, e.schema_version,"
            " convert_to(coalesce(e.payload_text, e.payload::text), 'UTF8')"
            " FROM unnest(%b::text[], %b::int4[]) WITH ORDINALITY AS r(s, a, i)"
            " JOIN {} AS e ON e.session_id = r.s AND e.seq > r.a ORDER BY r.i, e.seq"
        ).format(t)
        self._q_read_all = sql.SQL(
            "{} WHERE position > %s"
            " AND position < (pg_snapshot_xmin(pg_current_snapshot())::text::int8 << {})"
            " ORDER BY position LIMIT %s"
        ).format(cols, sql.Literal(_SHIFT))
        self._q_sessions = sql.SQL(
            "SELECT session_id FROM {} WHERE seq = 1 ORDER BY position"
        ).format(t)
        lock_wait = max(100, round(self._renew_every * 500))
        self._q_lock_wait = sql.SQL("SET LOCAL lock_timeout = {}").format(lock_wait)
        self._q_take = sql.SQL(_TAKE).format(lt)
        self._q_lock_leases = sql.SQL(
            "SELECT 1 FROM {} WHERE session_id = ANY(%s) FOR UPDATE"
        ).format(lt)
        # Every append transaction that locks lease rows first takes this
        # store's shared advisory lock, so that a takeover can tell which
        # backend holds the rows of an expired lease, and end it.
        self._q_xid = sql.SQL("SELECT pg_current_xact_id()::text::int8")
        self._q_mark = sql.SQL(
            "SELECT pg_current_xact_id()::text::int8,"
            " pg_advisory_xact_lock_shared(hashtextextended(%s, 0))"
        )
        self._q_break = sql.SQL(_BREAK).format(lt)
        self._q_holders = sql.SQL(_LEASE_STATE + " WHERE l.session_id = ANY(%s)").format(lt)
        self._writer = None if read_only else _Writer(self, max_group)
        self._reader = _Reader(self, max_group)

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

        Raises:
            StoreUnavailable: the server cannot be reached, psycopg is not
                installed, or the table was created by a newer release.
            ValueError: ``lease``, ``renew_every`` or ``max_group`` is out of
                range (``0 < renew_every < lease``, ``max_group >= 1``).
        """
        renew = renew_every if renew_every is not None else lease / 3
        if not (lease > 0 and 0 < renew < lease):
            raise ValueError("need 0 < renew_every < lease (seconds)")
        if max_group < 1:
            raise ValueError("max_group must be at least 1")
        store: PostgresStore = await trio.to_thread.run_sync(
            lambda: cls._open_sync(
                dsn, schema, table, min_size, max_size, timeout, read_only, lease, renew, max_group
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
        return cls(
            pool,
            dsn,
            schema,
            table,
            timeout,
            lease=lease,
            renew_every=renew_every,
            max_group=max_group,
            read_only=read_only,
        )

    @property
    def schema(self) -> str:
        """The schema of the table."""
        return self._schema

    @property
    def table(self) -> str:
        """The events table."""
        return self._table

    @property
    def lease(self) -> float:
        """Seconds an owned session's lease lasts without renewal."""
        return self._lease

    @property
    def renew_every(self) -> float:
        """Seconds between renewals of the owned leases."""
        return self._renew_every

    def _check_open(self) -> None:
        if self._closed:
            raise StoreError("the store is closed")

    async def _run(self, fn: Callable[..., _T], *args: Any) -> _T:
        await trio.lowlevel.checkpoint_if_cancelled()
        self._check_open()
        return await trio.to_thread.run_sync(fn, *args)

    def _connect(self, *, autocommit: bool) -> psycopg.Connection[Any]:
        import psycopg

        return psycopg.connect(
            self._dsn,
            autocommit=autocommit,
            connect_timeout=max(1, round(self._timeout)),
            application_name=_application_name(),
        )

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
        lost = self._lost.get(session_id)
        if lost is not None:
            raise LeaseLost(session_id, lost.epoch, lost.current_epoch)
        if len(events) >= _MAX_ROWS:
            raise StoreError(f"a batch holds at most {_MAX_ROWS - 1} events")
        rows = []
        for ev in events:
            jsonb, exact = _payload_columns(ev.payload)
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
            raise _map_error(exc, "read failed") from exc

    def _read_events(self, query: sql.Composable, args: tuple[Any, ...]) -> list[StoredEvent]:
        # payload_text is not checked by the server: rows_to_events parses it.
        return rows_to_events("cannot read", self._select(query, args))

    async def read(self, session_id: str, after: int = 0) -> list[StoredEvent]:
        """Events of ``session_id`` with ``seq > after``, in order."""
        return await self._run(self._read_events, self._q_read, (session_id, after))

    async def read_decoded(
        self, session_id: str, decoder: EventDecoder[_T], after: int = 0
    ) -> list[_T]:
        """:meth:`read` through ``decoder.decode_rows``, on the store's reader
        thread; reads of several sessions waiting together share one
        statement."""
        await trio.lowlevel.checkpoint_if_cancelled()
        self._check_open()
        result: list[_T] = await self._reader.call(_Read(session_id, after, decoder))
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
                        rows = conn.execute(self._q_read_json, (sid, 0)).fetchall()
                        out[sid] = fold(sid, decode_rows("", sid, rows, decoder))
            except psycopg.Error as exc:
                raise _map_error(exc, "read failed") from exc
            return out

        return await self._run(run)

    async def read_all(self, after: int = 0, limit: int | None = None) -> list[StoredEvent]:
        """The global feed: events with ``position > after``, in order.

        Only events whose transaction, and every write transaction older
        than it, has ended (see the module's notes): reading on from the last
        position returned never skips an event that commits later.
        """
        return await self._run(self._read_events, self._q_read_all, (after, limit))

    async def session_ids(self) -> list[str]:
        """Every session with at least one event, in order of first event."""
        rows = await self._run(self._select, self._q_sessions, ())
        return [r[0] for r in rows]

    # -- ownership -----------------------------------------------------------

    def _lease_connection(self) -> psycopg.Connection[Any]:
        conn = self._lease_conn
        if conn is None or conn.closed or conn.broken:
            if conn is not None:
                conn.close()
            conn = self._lease_conn = self._connect(autocommit=True)
        return conn

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
        if session_id not in self._leases:
            await self._writer.call(_Acquire(session_id))

    def _start_renewer(self) -> None:
        if self._renewer is None:
            self._renewer = threading.Thread(
                target=self._renew_loop,
                name=f"turnledger-postgres-leases:{self._table}",
                daemon=True,
            )
            self._renewer.start()

    def _renew_loop(self) -> None:
        while not self._stop.wait(self._renew_every):
            with contextlib.suppress(Exception):  # the next round tries again
                self._renew_sync()

    async def renew(self) -> list[str]:
        """Extend every owned lease now (the renewal thread does this each
        ``renew_every`` seconds); returns the sessions found taken over,
        whose appends will be refused with ``LeaseLost``."""
        return await self._run(self._renew_sync)

    def _renew_sync(self) -> list[str]:
        import psycopg
        from psycopg import sql

        with self._lease_lock:
            if not self._leases or self._closed:
                return []
            ids = list(self._leases)
            epochs = [self._leases[sid] for sid in ids]
            try:
                rows = (
                    self._lease_connection()
                    .execute(
                        sql.SQL(
                            "UPDATE {} AS l SET expires_at = now() + make_interval(secs => %s),"
                            + _MY_BACKEND
                            + " FROM unnest(%s::text[], %s::int8[]) AS m(session_id, epoch)"
                            " WHERE l.session_id = m.session_id AND l.epoch = m.epoch"
                            " AND l.owner = %s RETURNING l.session_id"
                        ).format(self._l),
                        (self._lease, ids, epochs, self._token),
                    )
                    .fetchall()
                )
            except psycopg.Error as exc:
                raise _map_error(exc, "cannot renew the leases") from exc
            kept = {r[0] for r in rows}
            gone = [sid for sid in ids if sid not in kept]
        held = dict(zip(ids, epochs, strict=True))
        for sid in gone:
            self._forget(LeaseLost(sid, held[sid], None))
        return gone

    def _forget(self, lost: LeaseLost) -> None:
        """Another store took the session over: stop renewing it, and refuse
        appends to it until it is acquired again."""
        with self._lease_lock:
            if self._leases.get(lost.session_id) == lost.epoch:
                del self._leases[lost.session_id]
                self._lost[lost.session_id] = lost

    async def release(self, session_id: str) -> None:
        """Give up ownership taken with :meth:`acquire` (no-op if not owned,
        or if the lease was taken over meanwhile)."""
        await trio.lowlevel.checkpoint_if_cancelled()
        if self._closed or session_id not in self._leases:
            return
        if self._writer is not None:  # with other releases waiting: one UPDATE
            await self._writer.call(_Release(session_id))

    def _release_sync(self, session_ids: list[str]) -> None:
        import psycopg
        from psycopg import sql

        with self._lease_lock:
            mine = [(sid, self._leases.pop(sid)) for sid in session_ids if sid in self._leases]
            if not mine:
                return
            try:
                self._lease_connection().execute(
                    sql.SQL(
                        "UPDATE {} AS l SET owner = NULL, expires_at = now()"
                        " FROM unnest(%s::text[], %s::int8[]) AS m(session_id, epoch)"
                        " WHERE l.session_id = m.session_id AND l.epoch = m.epoch"
                        " AND l.owner = %s"
                    ).format(self._l),
                    ([s for s, _ in mine], [e for _, e in mine], self._token),
                )
            except psycopg.Error as exc:
                raise _map_error(exc, "cannot release sessions") from exc

    async def owners(self) -> list[SessionLease]:
        """Who owns each session that has an owner: host, pid, epoch and
        lease expiry, live or expired (a dead owner's lease shows as not
        live at once), in session order."""
        from psycopg import sql

        query = sql.SQL(_LEASE_STATE + " WHERE l.owner IS NOT NULL ORDER BY l.session_id").format(
            self._l
        )

        def run() -> list[SessionLease]:
            import psycopg

            try:
                with self._pool.connection() as conn:
                    rows = conn.execute(query).fetchall()
            except psycopg.errors.UndefinedTable:
                return []  # a version-1 table opened read-only: no leases
            except psycopg.Error as exc:
                raise _map_error(exc, "read failed") from exc
            return [SessionLease(r[0], r[1], r[2], r[3], r[4], bool(r[5])) for r in rows]

        return await self._run(run)

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
        self._stop.set()
        if self._renewer is not None:
            self._renewer.join()
        with contextlib.suppress(Exception):  # the leases run out by themselves
            self._release_sync(list(self._leases))
        with self._lease_lock:
            self._leases.clear()
            if self._lease_conn is not None:
                self._lease_conn.close()
                self._lease_conn = None
        self._pool.close()

    async def __aenter__(self) -> PostgresStore:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.aclose()


def _application_name() -> str:
    return f"turnledger pid={os.getpid()} host={socket.gethostname()}"[:63]


# Which connection holds a lease: while it is open, the lease is live.
_MY_BACKEND: Final = (
    " backend = pg_backend_pid(), backend_start = ("
    "SELECT backend_start FROM pg_stat_activity WHERE pid = pg_backend_pid())"
)

# Take the leases of sessions (an array) that no other store holds live:
# new rows at epoch 1, expired or released ones bumped. Returns those taken.
_TAKE: Final = (
    "INSERT INTO {0} AS l (session_id, epoch, owner, host, pid, backend, backend_start,"
    " expires_at) SELECT s, 1, %s, %s, %s, pg_backend_pid(), (SELECT backend_start"
    " FROM pg_stat_activity WHERE pid = pg_backend_pid()),"
    " now() + make_interval(secs => %s) FROM unnest(%s::text[]) AS s"
    " ON CONFLICT (session_id) DO UPDATE SET epoch = l.epoch + 1, owner = excluded.owner,"
    " host = excluded.host, pid = excluded.pid, backend = excluded.backend,"
    " backend_start = excluded.backend_start, expires_at = excluded.expires_at"
    " WHERE l.owner IS NULL OR l.expires_at <= now() OR NOT EXISTS ("
    "SELECT 1 FROM pg_stat_activity a WHERE a.pid = l.backend"
    " AND a.backend_start = l.backend_start)"
    " RETURNING session_id, epoch"
)

# End (waiting up to 2 s for each) the backends of other stores that hold the
# append mark of an expired lease's owner among the sessions (an array).
_BREAK: Final = (
    "SELECT pg_terminate_backend(k.pid, 2000) FROM {} AS l JOIN pg_locks AS k"
    " ON k.locktype = 'advisory' AND k.granted AND k.objsubid = 1"
    " AND k.database = (SELECT oid FROM pg_database WHERE datname = current_database())"
    " AND k.classid::text::int8 = (hashtextextended(l.owner, 0) >> 32) & 4294967295"
    " AND k.objid::text::int8 = hashtextextended(l.owner, 0) & 4294967295"
    " WHERE l.session_id = ANY(%s) AND l.owner IS NOT NULL AND l.owner <> %s"
    " AND l.expires_at <= now() AND k.pid <> pg_backend_pid()"
)

# A lease row and whether it is live: unexpired, and its holder's connection
# still open (the same backend pid started at the same time).
_LEASE_STATE: Final = (
    "SELECT l.session_id, l.host, l.pid, l.epoch, l.expires_at,"
    " l.owner IS NOT NULL AND l.expires_at > now() AND EXISTS ("
    "SELECT 1 FROM pg_stat_activity a WHERE a.pid = l.backend"
    " AND a.backend_start = l.backend_start), l.owner FROM {} AS l"
)


def _not_committed(exc: Exception, committing: bool, conn: psycopg.Connection[Any] | None) -> bool:
    """Whether a failed transaction surely wrote nothing and its connection
    is to be replaced: the connection broke before COMMIT was sent, or the
    server ended it for idling in the transaction."""
    from psycopg import errors

    if isinstance(exc, errors.IdleInTransactionSessionTimeout):
        return True
    lost = conn is None or conn.broken or conn.closed
    return lost and isinstance(exc, errors.OperationalError) and not committing


def _owned_elsewhere(row: tuple[Any, ...]) -> SessionOwnedElsewhere:
    sid, host, pid, epoch, expires_at, live, _ = row
    if not live:
        return SessionOwnedElsewhere(sid, "its owner just let go; try again")
    return SessionOwnedElsewhere(
        sid,
        f"held by turnledger pid={pid} host={host} (lease epoch {epoch},"
        f" expires {expires_at.isoformat(timespec='seconds')})",
    )


def _read_version(conn: psycopg.Connection[Any], meta: sql.Identifier) -> int:
    from psycopg import sql

    row = conn.execute(
        sql.SQL("SELECT value FROM {} WHERE key = 'schema_version'").format(meta)
    ).fetchone()
    return int(row[0]) if row else 0


def _check_schema(conn: psycopg.Connection[Any], schema: str, table: str) -> None:
    from psycopg import sql

    meta = sql.Identifier(schema, f"{table}_meta")
    row = conn.execute("SELECT to_regclass(%s)", (f'"{schema}"."{table}_meta"',)).fetchone()
    if row is None or row[0] is None:
        raise StoreUnavailable(f"{schema}.{table}: no turnledger events table here")
    version = _read_version(conn, meta)
    # Version 1 reads the same; only the way positions are given changed.
    if version not in (1, SCHEMA_VERSION):
        raise StoreUnavailable(
            f"{schema}.{table}: schema version {version}; this release reads 1 and {SCHEMA_VERSION}"
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
        version = _read_version(conn, meta)
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
                    position       bigint           PRIMARY KEY,
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
        if version == 1:
            _migrate_from_1(conn, t)
        conn.execute(
            sql.SQL("CREATE INDEX IF NOT EXISTS {} ON {} (position) WHERE seq = 1").format(
                sql.Identifier(f"{table}_first"), t
            )
        )
        conn.execute(
            sql.SQL(
                """
                CREATE TABLE IF NOT EXISTS {} (
                    session_id    text        PRIMARY KEY,
                    epoch         bigint      NOT NULL DEFAULT 0,
                    owner         text,
                    host          text,
                    pid           integer,
                    backend       integer,
                    backend_start timestamptz,
                    expires_at    timestamptz NOT NULL DEFAULT now()
                )
                """
            ).format(sql.Identifier(schema, f"{table}_leases"))
        )
        conn.execute(
            sql.SQL(
                "INSERT INTO {} (key, value) VALUES ('schema_version', %s)"
                " ON CONFLICT (key) DO UPDATE SET value = excluded.value"
            ).format(meta),
            (str(SCHEMA_VERSION),),
        )


def _migrate_from_1(conn: psycopg.Connection[Any], t: sql.Identifier) -> None:
    """Version 1 gave positions from an identity column. Drop the identity
    (positions are given by the writer now); every old position must lie
    below the new ones, which start at this transaction's id << 20."""
    from psycopg import sql

    conn.execute(sql.SQL("LOCK TABLE {} IN ACCESS EXCLUSIVE MODE").format(t))
    conn.execute(sql.SQL("ALTER TABLE {} ALTER COLUMN position DROP IDENTITY IF EXISTS").format(t))
    row = conn.execute(
        sql.SQL(
            "SELECT coalesce(max(position), 0), pg_current_xact_id()::text::int8 << {} FROM {}"
        ).format(sql.Literal(_SHIFT), t)
    ).fetchone()
    assert row is not None
    if row[0] >= row[1]:
        raise StoreUnavailable(
            f"cannot migrate: the highest position {row[0]} is not below the first new one"
            f" ({row[1]}); this table needs renumbering first"
        )
