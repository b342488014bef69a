"""The PostgreSQL store's two I/O threads, each with a connection of its own:
the writer, which commits appends in groups (two round trips a group) and
takes leases, and the reader, which reads the replays that wait together in
one statement. Their rules (group commit, fencing, a stalled owner ended by
a takeover) are in the ``postgres`` module's notes.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Final

import outcome

from ..._errors import ConcurrencyConflict, LeaseLost, SessionOwnedElsewhere, StoreError
from ...events import EventDecoder
from ._io_thread import Append as _Append
from ._io_thread import Request as _Request
from ._io_thread import Thread as _Thread
from ._io_thread import deliver as _deliver
from ._io_thread import each_alone as _each_alone
from ._payloads import decode_rows
from ._pg_leases import Leases
from ._pg_sql import MAX_ROWS, Statements, map_error, not_committed, owned_elsewhere

if TYPE_CHECKING:
    import psycopg

__all__ = ["Acquire", "Read", "Reader", "Release", "Writer"]

#: The versions a writer remembers before it starts again from none.
_VERSION_CACHE_LIMIT: Final = 100_000

#: Opens a connection of the thread's own (``autocommit`` as given).
Connect = Callable[..., "psycopg.Connection[Any]"]


class Acquire(_Request):
    __slots__ = ("session_id",)

    def __init__(self, session_id: str) -> None:
        self.session_id = session_id


class Release(Acquire):
    __slots__ = ()


class Read(_Request):
    __slots__ = ("after", "decoder", "session_id")

    def __init__(self, session_id: str, after: int, decoder: EventDecoder[Any]) -> None:
        self.session_id = session_id
        self.after = after
        self.decoder = decoder


class Reader(_Thread[Any]):
    """The store's replay reads: the sessions whose reads wait together are
    read in one statement (a hub opening many sessions at once would
    otherwise spend a thread hop, a pooled connection and a round trip on
    each)."""

    def __init__(self, where: str, connect: Connect, sql: Statements, max_group: int) -> None:
        self.connect = connect
        self.sql = sql
        self.max_group = max_group
        self.pg: psycopg.Connection[Any] | None = None
        #: statements run, one per group of reads
        self.statements = 0
        super().__init__(f"turnledger-postgres-reader:{where}")

    def handle(self, req: _Request) -> _Request | None:
        assert isinstance(req, Read)
        group, carry = self.gather(req, lambda nxt: isinstance(nxt, Read), self.max_group)
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
                    conn = self.pg = self.connect(autocommit=True)
                self.statements += 1
                # Binary results: the payloads come as their bytes, not as hex.
                rows: list[tuple[Any, ...]] = conn.execute(
                    self.sql.read_json_many, args, binary=True
                ).fetchall()
                return rows
            except psycopg.Error as exc:
                # A read is safe to repeat: once more on a new connection
                # after this one was lost (a restarted server, an idle
                # connection cut by a proxy).
                if attempt == 1 and self.pg is not None and (self.pg.broken or self.pg.closed):
                    continue
                raise map_error(exc, "read failed") from exc
        raise AssertionError("unreachable")  # pragma: no cover

    def read_group(self, group: list[Read]) -> list[tuple[_Request, outcome.Outcome[Any]]]:
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


class Writer(_Thread[Any]):
    """The store's one writing connection, committing appends in groups."""

    def __init__(
        self, where: str, connect: Connect, sql: Statements, leases: Leases, max_group: int
    ) -> None:
        self.connect = connect
        self.sql = sql
        self.leases = leases
        self.max_group = max_group
        self.pg: psycopg.Connection[Any] | None = None
        self.transactions = 0
        #: session id -> the version this writer last committed
        self.versions: dict[str, int] = {}
        super().__init__(f"turnledger-postgres-writer:{where}")

    def connection(self) -> psycopg.Connection[Any]:
        conn = self.pg
        if conn is None or conn.closed or conn.broken:
            if conn is not None:
                conn.close()
            conn = self.pg = self.connect(autocommit=False)
            idle_ms = max(1000, round(self.leases.seconds * 1000))
            conn.execute(f"SET idle_in_transaction_session_timeout = {idle_ms}")
            conn.commit()
        return conn

    def handle(self, req: _Request) -> _Request | None:
        kind = type(req)
        assert kind in (_Append, Acquire, Release)
        rows = len(req.rows) if isinstance(req, _Append) else 0

        def fits(nxt: _Request) -> bool:
            nonlocal rows
            more = len(nxt.rows) if isinstance(nxt, _Append) else 0
            if type(nxt) is not kind or rows + more >= MAX_ROWS:
                return False
            rows += more
            return True

        group: list[Any]
        group, carry = self.gather(req, fits, self.max_group)
        try:
            if kind is _Append:
                done = self.commit_group(group)
            elif kind is Acquire:
                done = self.acquire_group(group)
            else:
                try:
                    self.leases.release([r.session_id for r in group])
                    done = [(r, outcome.Value(None)) for r in group]
                except StoreError as exc:
                    done = [(r, outcome.Error(exc)) for r in group]
        except BaseException as exc:  # pragma: no cover - a bug; never strand callers
            done = [(r, outcome.Error(exc)) for r in group]
        _deliver(done)
        return carry

    def acquire_group(
        self, group: list[Acquire], retried: bool = False, broke: bool = False
    ) -> list[tuple[_Request, outcome.Outcome[Any]]]:
        """Take the leases of every session in ``group`` that no other store
        holds live, in one statement."""
        import psycopg

        leases, sql = self.leases, self.sql
        ids = list(dict.fromkeys(r.session_id for r in group if r.session_id not in leases.held))
        failed: dict[str, StoreError] = {}
        if ids:
            try:
                conn = self.connection()
                with conn.transaction():
                    # A writer mid-append key-share-locks the row: wait for it,
                    # but not for long (its transaction may be stalled, and
                    # this thread's appends wait meanwhile).
                    conn.execute(sql.lock_wait)
                    # FOR UPDATE waits for appends that key-share-locked the
                    # rows (renewals, plain updates, do not).
                    conn.execute(sql.lock_leases, (ids,))
                    args = (leases.token, leases.host, leases.pid, leases.seconds, leases.node, ids)
                    taken = dict(conn.execute(sql.take, args).fetchall())
                    refused = [sid for sid in ids if sid not in taken]
                    if refused:
                        for row in conn.execute(sql.holders, (refused,)).fetchall():
                            failed[row[0]] = owned_elsewhere(row)
                        for sid in refused:
                            failed.setdefault(sid, SessionOwnedElsewhere(sid, "try again"))
            except Exception as exc:
                if not retried and not_committed(exc, False, self.pg):
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
                    err = map_error(exc, f"cannot acquire {sid!r}")
                else:
                    err = StoreError(f"cannot acquire {sid!r}: {type(exc).__name__}")
                    err.__cause__ = exc
                return [(r, outcome.Error(err)) for r in group]
            with leases.lock:
                leases.held.update(taken)
                for sid in taken:
                    leases.lost.pop(sid, None)
            if taken:
                leases.start_renewing()
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

        try:
            conn = self.connection()
            with conn.transaction():
                rows = conn.execute(self.sql.break_, (ids, self.leases.token)).fetchall()
        except psycopg.Error:
            return False  # e.g. not allowed to signal the owner's backend
        return any(ended for (ended,) in rows)

    def commit_group(
        self, group: list[_Append], retried: bool = False
    ) -> list[tuple[_Request, outcome.Outcome[Any]]]:
        import psycopg

        leases, sql = self.leases, self.sql
        done: list[tuple[_Request, outcome.Outcome[Any]]] = []
        accepted: list[_Append] = []
        committing = False
        xid: int | None = None
        try:
            conn = self.connection()
            sids = list(dict.fromkeys(r.session_id for r in group))
            with leases.lock:
                held = {sid: leases.held[sid] for sid in sids if sid in leases.held}
                # Found taken over (by a renewal) since the append was queued:
                # refused as stale, never written unfenced.
                gone = {sid: leases.lost[sid] for sid in sids if sid in leases.lost}
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
                mark = conn.execute(sql.mark, (leases.token,)) if held else conn.execute(sql.xid)
                cur.execute(sql.check, (list(held), ask))
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
                        leases.forget(lost)
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
                    cur.execute(sql.insert, [list(c) for c in zip(*rows, strict=True)])
                committing = True
            # leaving the transaction block committed it
        except Exception as exc:
            self.versions.clear()
            fate = None if xid is None else self.fate(xid, exc)
            if fate == "committed":  # only the answer to COMMIT was lost
                return self.committed(done, accepted, seen)
            if not retried and (fate == "aborted" or not_committed(exc, committing, self.pg)):
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
                failure = map_error(exc, f"append to {req.session_id!r} failed")
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
