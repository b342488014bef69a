"""The two threads of the SQLite store, each owning one sqlite3 connection,
and the writer's group commit (see :mod:`.sqlite` for the design). The queue
and wake-up machinery they stand on is :mod:`._io_thread`, shared with the
PostgreSQL store."""

from __future__ import annotations

import contextlib
import queue
import sqlite3
from pathlib import Path
from typing import Any, Final

import outcome

from ..._errors import (
    ConcurrencyConflict,
    StoreCorrupted,
    StoreError,
    StoreFull,
    StoreUnavailable,
)
from ._common import WriterLock
from ._io_thread import Append, Request, Thread, deliver, each_alone

__all__ = ["Reader", "Writer", "map_error"]

_INSERT: Final = (
    "INSERT INTO events (session_id, seq, tag, schema_version, payload, recorded_at)"
    " VALUES (?, ?, ?, ?, ?, ?)"
)
_VERSION: Final = "SELECT coalesce(max(seq), 0) FROM events WHERE session_id = ?"
_LAST: Final = "SELECT max(position) FROM events"
_TOP: Final = "SELECT coalesce(max(position), 0) FROM events"
_INSERT_AT: Final = (
    "INSERT INTO events (position, session_id, seq, tag, schema_version, payload, recorded_at)"
    " VALUES (?, ?, ?, ?, ?, ?, ?)"
)

# sqlite3 primary result codes (https://www.sqlite.org/rescode.html).
_SQLITE_PERM, _SQLITE_BUSY, _SQLITE_LOCKED, _SQLITE_READONLY = 3, 5, 6, 8
_SQLITE_IOERR, _SQLITE_CORRUPT, _SQLITE_FULL, _SQLITE_CANTOPEN = 10, 11, 13, 14
_SQLITE_CONSTRAINT, _SQLITE_NOTADB = 19, 26
_SQLITE_CONSTRAINT_UNIQUE = 2067

#: Above this many cached stream versions the cache starts over.
_VERSION_CACHE_LIMIT: Final = 100_000


def map_error(exc: sqlite3.Error, where: str) -> StoreError:
    """The store error for ``exc``, with ``exc`` as its cause (it names
    SQLite's result code: ``SQLITE_FULL``, ``SQLITE_IOERR_FSYNC``, ...)."""
    code = getattr(exc, "sqlite_errorcode", None)
    primary = code & 0xFF if isinstance(code, int) else None
    msg = f"{where}: {exc}"
    error: StoreError
    if primary == _SQLITE_FULL:
        error = StoreFull(msg)
    elif primary in (_SQLITE_CORRUPT, _SQLITE_NOTADB):
        error = StoreCorrupted(msg)
    elif primary in (
        _SQLITE_BUSY,
        _SQLITE_LOCKED,
        _SQLITE_CANTOPEN,
        _SQLITE_IOERR,
        _SQLITE_PERM,
        _SQLITE_READONLY,
    ) or isinstance(exc, sqlite3.OperationalError):
        error = StoreUnavailable(msg)
    else:
        error = StoreError(msg)
    error.__cause__ = exc
    return error


class Writer(Thread[sqlite3.Connection]):
    def __init__(self, path: Path, max_group: int) -> None:
        self.path = path
        self.max_group = max_group
        #: The writer lock; with ``mark_commits``, each commit's last position
        #: is written into it (see :mod:`.sqlite` on the acknowledged mark).
        self.lock: WriterLock | None = None
        self.mark_commits = False
        self.versions: dict[str, int] = {}
        self.data_version: int | None = None
        #: The highest position an erasure saw, while the table holds none
        #: as high (0 then): new rows are numbered after it, never reusing
        #: an erased position.
        self.floor = 0
        self.transactions = self.appends = self.events = self.conflicts = self.largest = 0
        super().__init__(f"turnledger-sqlite-writer:{path.name}")

    def handle(self, req: Request) -> Request | None:
        assert isinstance(req, Append)
        group = [req]
        carry: Request | None = None
        while len(group) < self.max_group:
            try:
                nxt = self.queue.get_nowait()
            except queue.Empty:
                break
            if not isinstance(nxt, Append):
                carry = nxt  # keep FIFO order with calls such as close
                break
            group.append(nxt)
        try:
            done = self.commit_group(group)
        except BaseException as exc:  # pragma: no cover - a bug; never strand callers
            if self.conn is not None:
                self._rollback()
            done = [(r, outcome.Error(exc)) for r in group]
        deliver(done)
        return carry

    def commit_group(self, group: list[Append]) -> list[tuple[Request, outcome.Outcome[Any]]]:
        conn = self.conn
        if conn is None:
            err = StoreError("the store is closed")
            return [(r, outcome.Error(err)) for r in group]
        done: list[tuple[Request, outcome.Outcome[Any]]] = []
        accepted: list[Append] = []
        try:
            conn.execute("BEGIN IMMEDIATE")
        except sqlite3.Error as exc:
            err = map_error(exc, f"{self.path}: cannot start a write transaction")
            return [(r, outcome.Error(err)) for r in group]
        try:
            (data_version,) = conn.execute("PRAGMA data_version").fetchone()
            if data_version != self.data_version or len(self.versions) > _VERSION_CACHE_LIMIT:
                # Another connection wrote since our last transaction.
                self.versions.clear()
                self.data_version = data_version
            seen: dict[str, int] = {}
            rows: list[tuple[Any, ...]] = []
            for req in group:
                sid = req.session_id
                current = seen.get(sid)
                if current is None:
                    current = self.versions.get(sid)
                if current is None:
                    (current,) = conn.execute(_VERSION, (sid,)).fetchone()
                if current != req.expected:
                    seen[sid] = current
                    conflict = ConcurrencyConflict(sid, req.expected, current)
                    done.append((req, outcome.Error(conflict)))
                    continue
                seen[sid] = req.expected + len(req.rows)
                rows.extend(req.rows)
                accepted.append(req)
            last = None
            floor_passed = False
            if rows:
                if self.floor and conn.execute(_TOP).fetchone()[0] < self.floor:
                    # After an erasure of the newest events: number past them.
                    start = self.floor
                    conn.executemany(
                        _INSERT_AT, [(start + i, *row) for i, row in enumerate(rows, 1)]
                    )
                else:
                    conn.executemany(_INSERT, rows)
                floor_passed = True
                if self.mark_commits:
                    (last,) = conn.execute(_LAST).fetchone()
            conn.execute("COMMIT")
        except Exception as exc:
            # sqlite3 errors, and anything else one append's rows may raise
            # (text SQLite cannot bind): never let one append fail the group.
            self._rollback()
            if len(group) > 1:
                return each_alone(group, self.commit_group)
            req = group[0]
            failure: StoreError
            if getattr(exc, "sqlite_errorcode", None) == _SQLITE_CONSTRAINT_UNIQUE and isinstance(
                exc, sqlite3.IntegrityError
            ):
                failure = ConcurrencyConflict(req.session_id, req.expected, None)
            elif isinstance(exc, sqlite3.Error):
                failure = map_error(exc, f"{self.path}: append to {req.session_id!r} failed")
            else:
                failure = StoreError(
                    f"{self.path}: append to {req.session_id!r} failed: {type(exc).__name__}"
                )
                failure.__cause__ = exc
            return [(req, outcome.Error(failure))]
        if floor_passed:
            self.floor = 0
        if last is not None and self.lock is not None:
            self.lock.write(last)  # after the COMMIT (and its fsync) returned
        self.versions.update(seen)
        self.transactions += 1
        self.conflicts += len(group) - len(accepted)
        self.appends += len(accepted)
        self.events += sum(len(r.rows) for r in accepted)
        self.largest = max(self.largest, len(accepted))
        for req in accepted:
            done.append((req, outcome.Value(req.expected + len(req.rows))))
        return done

    def forget(self) -> None:
        """Drop the cached stream versions (an erasure changed them)."""
        self.versions.clear()
        self.data_version = None

    def _rollback(self) -> None:
        self.versions.clear()
        self.data_version = None
        assert self.conn is not None
        if self.conn.in_transaction:
            with contextlib.suppress(sqlite3.Error):  # sqlite may have rolled back
                self.conn.execute("ROLLBACK")


class Reader(Thread[sqlite3.Connection]):
    def handle(self, req: Request) -> Request | None:  # pragma: no cover - calls only
        raise AssertionError("the reader takes calls only")
