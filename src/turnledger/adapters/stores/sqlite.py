"""The embedded default store: one SQLite file in WAL mode.

Durability. A turn reported as committed survives power loss: the store runs
WAL with ``PRAGMA synchronous=FULL`` by default, so every COMMIT fsyncs the
write-ahead log before the caller is told. (With ``NORMAL``, WAL commits are
not synced and the last transactions may be lost on power loss, though never
torn; pass ``synchronous="NORMAL"`` if that trade is acceptable.)

Threads. Every sqlite3 call runs on one of two dedicated threads, each owning
its connection: a *writer* and a *reader* (WAL lets reads run beside a
commit). Callers hand a request to a thread through a queue and park their
trio task; the thread wakes it through the trio token when the request is
done. A request is never abandoned halfway: a caller cancelled while its
request is queued or running still waits for it and gets its result, and the
cancellation takes effect at its next checkpoint (the semantics of
``trio.to_thread.run_sync(..., abandon_on_cancel=False)``, without a thread
hop per call).

Group commit. The writer takes every append waiting in its queue (up to
``max_group``) and writes them in ONE transaction: ``BEGIN IMMEDIATE``, a
version check per append (against the versions it already knows, or one
indexed lookup), one ``executemany`` for all the accepted rows, ``COMMIT``.
A stale append is refused on its own, the others in the group still commit.
Each caller is woken only after the COMMIT that holds its events returned. If
the group's transaction fails as a whole (disk full, I/O error), it is rolled
back and every append of the group is retried in its own transaction, so each
caller learns its own fate; a batch is always all or nothing.

The known stream versions are cached between transactions; ``PRAGMA
data_version`` tells when another connection (another process) wrote to the
file, and the cache is dropped then.

Schema. ``PRAGMA application_id`` marks the file as turnledger's and
``PRAGMA user_version`` holds the schema version (see :data:`SCHEMA_VERSION`).
Opening creates the schema in an empty file, migrates an older one, and
refuses a file written by a newer release or by something else.
"""

from __future__ import annotations

import contextlib
import os
import queue
import sqlite3
import threading
import urllib.parse
from abc import ABC, abstractmethod
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, Final, Literal, TypeVar

import attrs
import outcome
import trio

from ..._errors import (
    ConcurrencyConflict,
    StoreCorrupted,
    StoreError,
    StoreFull,
    StoreUnavailable,
)
from ...events import EventDecoder, StoredEvent
from ._payloads import check_envelope, decode_rows, dumps_payload, loads_payload
from .memory import check_batch

__all__ = ["SCHEMA_VERSION", "SQLiteStats", "SQLiteStore", "Synchronous"]

#: Schema version this release writes (``PRAGMA user_version``).
SCHEMA_VERSION: Final = 1
#: ``PRAGMA application_id`` of a turnledger file ("TLDG").
APPLICATION_ID: Final = 0x544C4447

Synchronous = Literal["OFF", "NORMAL", "FULL", "EXTRA"]

_T = TypeVar("_T")
_R = TypeVar("_R")

_SCHEMA_V1: Final = (
    """
    CREATE TABLE events (
        position       INTEGER PRIMARY KEY,
        session_id     TEXT    NOT NULL,
        seq            INTEGER NOT NULL CHECK (seq >= 1),
        tag            TEXT    NOT NULL,
        schema_version INTEGER NOT NULL,
        payload        TEXT    NOT NULL,
        recorded_at    REAL    NOT NULL,
        UNIQUE (session_id, seq)
    )
    """,
    # session_ids(): every stream's first event, in feed order.
    "CREATE INDEX events_first ON events (position) WHERE seq = 1",
)

# Steps from version N to N + 1, applied in one transaction on open.
_MIGRATIONS: Final[dict[int, tuple[str, ...]]] = {}

_INSERT: Final = (
    "INSERT INTO events (session_id, seq, tag, schema_version, payload, recorded_at)"
    " VALUES (?, ?, ?, ?, ?, ?)"
)
_VERSION: Final = "SELECT coalesce(max(seq), 0) FROM events WHERE session_id = ?"
# Payloads are fetched as their bytes (CAST to BLOB gives the text's bytes in
# the database's encoding: UTF-8 in every file this store creates) and decoded
# here, strictly: text that is not UTF-8 is damage (StoreCorrupted), not a
# failure to read. A UTF-16 database (made elsewhere) is read as TEXT.
_PAYLOAD_UTF8: Final = "CAST(payload AS BLOB)"
_COLUMNS: Final = "position, session_id, seq, tag, schema_version, {payload}, recorded_at"
# The replay path: no envelope columns, and the payload as its UTF-8 bytes.
_READ_JSON: Final = (
    "SELECT seq, tag, schema_version, {payload} FROM events"
    " WHERE session_id = ? AND seq > ? ORDER BY seq"
)

# sqlite3 primary result codes (https://www.sqlite.org/rescode.html).
_SQLITE_PERM, _SQLITE_BUSY, _SQLITE_LOCKED, _SQLITE_READONLY = 3, 5, 6, 8
_SQLITE_IOERR, _SQLITE_CORRUPT, _SQLITE_FULL, _SQLITE_CANTOPEN = 10, 11, 13, 14
_SQLITE_CONSTRAINT, _SQLITE_NOTADB = 19, 26
_SQLITE_CONSTRAINT_UNIQUE = 2067

#: Above this many cached stream versions the cache starts over.
_VERSION_CACHE_LIMIT: Final = 100_000


def _map_error(exc: sqlite3.Error, where: str) -> StoreError:
    code = getattr(exc, "sqlite_errorcode", None)
    primary = code & 0xFF if isinstance(code, int) else None
    msg = f"{where}: {exc}"
    if primary == _SQLITE_FULL:
        return StoreFull(msg)
    if primary in (_SQLITE_CORRUPT, _SQLITE_NOTADB):
        return StoreCorrupted(msg)
    if primary in (
        _SQLITE_BUSY,
        _SQLITE_LOCKED,
        _SQLITE_CANTOPEN,
        _SQLITE_IOERR,
        _SQLITE_PERM,
        _SQLITE_READONLY,
    ) or isinstance(exc, sqlite3.OperationalError):
        return StoreUnavailable(msg)
    return StoreError(msg)


@attrs.frozen
class SQLiteStats:
    """Counters of an :class:`SQLiteStore` since it was opened."""

    #: Write transactions committed (one per group).
    transactions: int
    #: Appends written.
    appends: int
    #: Events written.
    events: int
    #: Appends refused with ConcurrencyConflict.
    conflicts: int
    #: The most appends committed in one transaction.
    largest_group: int


# --- requests handed to the threads ------------------------------------------


class _Request:
    __slots__ = ("task", "token")

    task: trio.lowlevel.Task
    token: trio.lowlevel.TrioToken


class _Append(_Request):
    __slots__ = ("expected", "rows", "session_id")

    def __init__(self, session_id: str, expected: int, rows: list[tuple[Any, ...]]) -> None:
        self.session_id = session_id
        self.expected = expected
        self.rows = rows


class _Call(_Request):
    __slots__ = ("fn", "last")

    def __init__(self, fn: Callable[[sqlite3.Connection | None], Any], last: bool = False) -> None:
        self.fn = fn
        self.last = last


def _wake(items: list[tuple[trio.lowlevel.Task, outcome.Outcome[Any]]]) -> None:
    for task, result in items:
        trio.lowlevel.reschedule(task, result)


def _deliver(done: Sequence[tuple[_Request, outcome.Outcome[Any]]]) -> None:
    # One wake-up per trio run for the whole group, not one per caller.
    by_token: dict[trio.lowlevel.TrioToken, list[tuple[trio.lowlevel.Task, Any]]] = {}
    for req, result in done:
        by_token.setdefault(req.token, []).append((req.task, result))
    for token, items in by_token.items():
        # Callers wait until woken, so their runs are alive.
        with contextlib.suppress(trio.RunFinishedError):
            token.run_sync_soon(_wake, items)


def _abort_never(_: Any) -> trio.lowlevel.Abort:
    return trio.lowlevel.Abort.FAILED


class _Thread(ABC):
    """A thread owning one sqlite3 connection, fed by a queue."""

    def __init__(self, name: str) -> None:
        self.queue: queue.SimpleQueue[_Request] = queue.SimpleQueue()
        self.conn: sqlite3.Connection | None = None
        self.thread = threading.Thread(target=self._main, name=name, daemon=True)
        self.thread.start()

    async def call(self, request: _Request) -> Any:
        request.task = trio.lowlevel.current_task()
        request.token = trio.lowlevel.current_trio_token()
        self.queue.put(request)
        return await trio.lowlevel.wait_task_rescheduled(_abort_never)

    def _main(self) -> None:
        carry: _Request | None = None
        while True:
            req = carry if carry is not None else self.queue.get()
            carry = None
            if isinstance(req, _Call):
                _deliver([(req, outcome.capture(req.fn, self.conn))])
                if req.last:
                    return
            else:
                carry = self.handle(req)

    @abstractmethod
    def handle(self, req: _Request) -> _Request | None: ...


class _Writer(_Thread):
    def __init__(self, path: Path, max_group: int) -> None:
        self.path = path
        self.max_group = max_group
        self.versions: dict[str, int] = {}
        self.data_version: int | None = None
        self.transactions = self.appends = self.events = self.conflicts = self.largest = 0
        super().__init__(f"turnledger-sqlite-writer:{path.name}")

    def handle(self, req: _Request) -> _Request | None:
        assert isinstance(req, _Append)
        group = [req]
        carry: _Request | None = None
        while len(group) < self.max_group:
            try:
                nxt = self.queue.get_nowait()
            except queue.Empty:
                break
            if not isinstance(nxt, _Append):
                carry = nxt  # keep FIFO order with calls such as close
                break
            group.append(nxt)
        try:
            done = self.commit_group(group)
        except BaseException as exc:  # pragma: no cover - a bug; never strand callers
            if self.conn is not None:
                self._rollback()
            done = [(r, outcome.Error(exc)) for r in group]
        _deliver(done)
        return carry

    def commit_group(self, group: list[_Append]) -> list[tuple[_Request, outcome.Outcome[Any]]]:
        conn = self.conn
        if conn is None:
            err = StoreError("the store is closed")
            return [(r, outcome.Error(err)) for r in group]
        done: list[tuple[_Request, outcome.Outcome[Any]]] = []
        accepted: list[_Append] = []
        try:
            conn.execute("BEGIN IMMEDIATE")
        except sqlite3.Error as exc:
            err = _map_error(exc, f"{self.path}: cannot start a write transaction")
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
            if rows:
                conn.executemany(_INSERT, rows)
            conn.execute("COMMIT")
        except Exception as exc:
            # sqlite3 errors, and anything else one append's rows may raise
            # (text SQLite cannot bind): never let one append fail the group.
            self._rollback()
            if len(group) > 1:
                # Let each append find its own fate in its own transaction.
                out: list[tuple[_Request, outcome.Outcome[Any]]] = []
                for req in group:
                    out.extend(self.commit_group([req]))
                return out
            req = group[0]
            failure: StoreError
            if getattr(exc, "sqlite_errorcode", None) == _SQLITE_CONSTRAINT_UNIQUE and isinstance(
                exc, sqlite3.IntegrityError
            ):
                failure = ConcurrencyConflict(req.session_id, req.expected, None)
            elif isinstance(exc, sqlite3.Error):
                failure = _map_error(exc, f"{self.path}: append to {req.session_id!r} failed")
            else:
                failure = StoreError(
                    f"{self.path}: append to {req.session_id!r} failed: {type(exc).__name__}"
                )
                failure.__cause__ = exc
            return [(req, outcome.Error(failure))]
        self.versions.update(seen)
        self.transactions += 1
        self.conflicts += len(group) - len(accepted)
        self.appends += len(accepted)
        self.events += sum(len(r.rows) for r in accepted)
        self.largest = max(self.largest, len(accepted))
        for req in accepted:
            done.append((req, outcome.Value(req.expected + len(req.rows))))
        return done

    def _rollback(self) -> None:
        self.versions.clear()
        self.data_version = None
        assert self.conn is not None
        if self.conn.in_transaction:
            with contextlib.suppress(sqlite3.Error):  # sqlite may have rolled back
                self.conn.execute("ROLLBACK")


class _Reader(_Thread):
    def handle(self, req: _Request) -> _Request | None:  # pragma: no cover - calls only
        raise AssertionError("the reader takes calls only")


# --- work done on the threads ------------------------------------------------


def _connect(path: Path, busy_timeout: float) -> sqlite3.Connection:
    # isolation_level=None: the store issues BEGIN/COMMIT itself.
    conn = sqlite3.connect(path, timeout=busy_timeout, isolation_level=None, check_same_thread=True)
    try:
        (mode,) = conn.execute("PRAGMA journal_mode=WAL").fetchone()
        if str(mode).lower() != "wal":
            raise StoreUnavailable(f"{path}: cannot use WAL mode (journal_mode is {mode})")
    except BaseException:
        conn.close()
        raise
    return conn


def _open_writer(path: Path, synchronous: str, busy_timeout: float) -> sqlite3.Connection:
    created = not path.exists()
    conn = _connect(path, busy_timeout)
    try:
        conn.execute(f"PRAGMA synchronous={synchronous}")
        conn.execute("BEGIN IMMEDIATE")
        (app_id,) = conn.execute("PRAGMA application_id").fetchone()
        (version,) = conn.execute("PRAGMA user_version").fetchone()
        if version > SCHEMA_VERSION:
            raise StoreUnavailable(
                f"{path}: schema version {version} was written by a newer turnledger; "
                f"this release knows versions up to {SCHEMA_VERSION}. Upgrade turnledger "
                "to open it."
            )
        if app_id != APPLICATION_ID:
            (objects,) = conn.execute("SELECT count(*) FROM sqlite_master").fetchone()
            if app_id != 0 or version != 0 or objects:
                raise StoreUnavailable(f"{path}: not a turnledger database")
            for statement in _SCHEMA_V1:
                conn.execute(statement)
            conn.execute(f"PRAGMA application_id={APPLICATION_ID}")
            conn.execute(f"PRAGMA user_version={SCHEMA_VERSION}")
        else:
            for step in range(version, SCHEMA_VERSION):
                for statement in _MIGRATIONS[step]:
                    conn.execute(statement)
            if version != SCHEMA_VERSION:
                conn.execute(f"PRAGMA user_version={SCHEMA_VERSION}")
        conn.execute("COMMIT")
        if created:
            _fsync_dir(path.parent)
    except BaseException:
        conn.close()
        raise
    return conn


def _fsync_dir(folder: Path) -> None:
    # The new file's directory entry must survive power loss too.
    try:
        fd = os.open(folder, os.O_RDONLY)
    except OSError:  # pragma: no cover - e.g. platforms without directory fds
        return
    try:
        os.fsync(fd)
    except OSError:  # pragma: no cover
        pass
    finally:
        os.close(fd)


def _open_reader(path: Path, busy_timeout: float) -> sqlite3.Connection:
    conn = _connect(path, busy_timeout)
    conn.execute("PRAGMA query_only=ON")
    return conn


def _open_read_only(path: Path, busy_timeout: float) -> sqlite3.Connection:
    # For tools that only look: never create the file, set WAL mode or write
    # the schema, and refuse what is not a turnledger database of a version
    # this release reads.
    if not path.exists():
        raise StoreUnavailable(f"{path}: no such file")
    uri = "file:" + urllib.parse.quote(str(path.resolve())) + "?mode=ro"
    conn = sqlite3.connect(
        uri, uri=True, timeout=busy_timeout, isolation_level=None, check_same_thread=True
    )
    try:
        (app_id,) = conn.execute("PRAGMA application_id").fetchone()
        (version,) = conn.execute("PRAGMA user_version").fetchone()
        if app_id != APPLICATION_ID:
            raise StoreUnavailable(f"{path}: not a turnledger database")
        if version > SCHEMA_VERSION:
            raise StoreUnavailable(
                f"{path}: schema version {version} was written by a newer turnledger"
            )
    except BaseException:
        conn.close()
        raise
    return conn


def _bad_payload(path: Path, position: int, exc: Exception | None) -> StoreCorrupted:
    why = f"is not JSON: {exc}" if exc is not None else "is not a JSON object"
    return StoreCorrupted(f"{path}: the payload at position {position} {why}")


def _rows_to_events(path: Path, rows: list[tuple[Any, ...]]) -> list[StoredEvent]:
    # Rows of _COLUMNS (the feed, and one session's stream). Runs on the
    # reader thread, once per event read: keep it lean.
    out: list[StoredEvent] = []
    append = out.append
    loads = loads_payload
    for position, session_id, seq, tag, version, payload, recorded_at in rows:
        try:
            data = loads(payload if type(payload) is str else payload.decode("utf-8"))
        except (ValueError, TypeError) as exc:
            raise _bad_payload(path, position, exc) from exc
        if type(data) is not dict:
            raise _bad_payload(path, position, None)
        append(StoredEvent(session_id, seq, tag, version, data, recorded_at, position))
    return out


def _first_column(path: Path, rows: list[tuple[Any, ...]]) -> list[str]:
    return [r[0] for r in rows]


class SQLiteStore:
    """An :class:`~turnledger.events.EventStore` in one SQLite file.

    Open it with :meth:`open`; close it with :meth:`aclose` (or ``async with``).
    Several processes may open the same file; SQLite serializes their writes
    and the version check in every transaction keeps each stream consistent.
    """

    def __init__(
        self,
        path: Path,
        writer: _Writer,
        reader: _Reader,
        synchronous: Synchronous,
        payload: str = _PAYLOAD_UTF8,
    ) -> None:
        # Private: use ``await SQLiteStore.open(path)``.
        self._columns = _COLUMNS.format(payload=payload)
        self._read_json = _READ_JSON.format(payload=payload)
        self._path = path
        self._writer = writer
        self._reader = reader
        self._synchronous: Synchronous = synchronous
        self._closed = False
        self._read_only = False

    @classmethod
    async def open(
        cls,
        path: str | os.PathLike[str],
        *,
        synchronous: Synchronous = "FULL",
        group_commit: bool = True,
        max_group: int = 512,
        busy_timeout: float = 10.0,
        read_only: bool = False,
    ) -> SQLiteStore:
        """Open (creating if needed) the store in the file ``path``.

        Args:
            synchronous: SQLite's ``synchronous`` setting. ``FULL`` (the
                default) fsyncs the WAL on every commit, so a committed turn
                survives power loss; ``NORMAL`` may lose the last commits on
                power loss (never on a process crash).
            group_commit: write appends that wait together in one transaction.
                ``False`` gives every append its own transaction.
            max_group: the most appends in one transaction.
            busy_timeout: seconds to wait for another process's write lock.
            read_only: only read: the file must exist and is never changed
                (no WAL switch, no schema); appends raise ``StoreError``.

        Raises:
            StoreUnavailable: the file cannot be opened, is not a turnledger
                database, or has a schema newer than this release.
            StoreCorrupted: the file is damaged.
        """
        if synchronous not in ("OFF", "NORMAL", "FULL", "EXTRA"):
            raise ValueError(f"synchronous must be OFF, NORMAL, FULL or EXTRA, not {synchronous!r}")
        if max_group < 1:
            raise ValueError("max_group must be at least 1")
        p = Path(path)
        writer = _Writer(p, max_group if group_commit else 1)
        reader = _Reader(f"turnledger-sqlite-reader:{p.name}")
        threads: list[_Thread] = [writer, reader]

        def open_writer(_: sqlite3.Connection | None) -> None:
            writer.conn = _open_writer(p, synchronous, busy_timeout)

        def open_reader(_: sqlite3.Connection | None) -> str:
            if read_only:
                reader.conn = _open_read_only(p, busy_timeout)
            else:
                reader.conn = _open_reader(p, busy_timeout)
            (encoding,) = reader.conn.execute("PRAGMA encoding").fetchone()
            return _PAYLOAD_UTF8 if encoding == "UTF-8" else "payload"

        try:
            try:
                await trio.lowlevel.checkpoint_if_cancelled()
                if not read_only:
                    await writer.call(_Call(open_writer))
                payload: str = await reader.call(_Call(open_reader))
            except sqlite3.Error as exc:
                raise _map_error(exc, f"{p}: cannot open") from exc
        except BaseException:
            with trio.CancelScope(shield=True):
                for t in threads:
                    await t.call(_Call(_close_conn(t), last=True))
            raise
        store = cls(p, writer, reader, synchronous, payload)
        store._read_only = read_only
        return store

    @property
    def path(self) -> Path:
        """The database file."""
        return self._path

    @property
    def synchronous(self) -> Synchronous:
        """The ``synchronous`` setting in force."""
        return self._synchronous

    @property
    def stats(self) -> SQLiteStats:
        """A snapshot of the write counters."""
        w = self._writer
        return SQLiteStats(w.transactions, w.appends, w.events, w.conflicts, w.largest)

    def _check_open(self) -> None:
        if self._closed:
            raise StoreError(f"{self._path}: the store is closed")

    async def append(
        self, session_id: str, events: Sequence[StoredEvent], expected_version: int
    ) -> int:
        """Append ``events`` atomically after ``expected_version``.

        Returns once the transaction holding them committed (fsynced, with
        ``synchronous=FULL``).

        Raises:
            ConcurrencyConflict: the stream is not at ``expected_version``.
            StoreFull: the disk is full. StoreUnavailable: the file cannot be
                written (locked for too long, I/O error).
            StoreError: a payload is not JSON-able; nothing was written.
            ValueError: the events do not run on from ``expected_version``.

        Cancellation: the append is never interrupted. A caller cancelled
        while waiting still waits for the outcome and receives it; the
        cancellation is raised at its next checkpoint.
        """
        await trio.lowlevel.checkpoint_if_cancelled()
        self._check_open()
        if not events:
            return expected_version
        if self._read_only:
            raise StoreError(f"{self._path}: the store was opened read-only")
        check_batch(session_id, events, expected_version)
        rows = [
            (
                session_id,
                ev.seq,
                ev.tag,
                ev.schema_version,
                dumps_payload(ev.payload),
                check_envelope(ev),
            )
            for ev in events
        ]
        result: int = await self._writer.call(_Append(session_id, expected_version, rows))
        return result

    async def _read(
        self,
        where: str,
        query: str,
        args: tuple[Any, ...],
        convert: Callable[[Path, list[tuple[Any, ...]]], _T],
    ) -> _T:
        def run(path: Path, conn: sqlite3.Connection) -> _T:
            return convert(path, conn.execute(query, args).fetchall())

        return await self._read_on_thread(where, run)

    async def read(self, session_id: str, after: int = 0) -> list[StoredEvent]:
        """Events of ``session_id`` with ``seq > after``, in order."""
        return await self._read(
            f"cannot read {session_id!r}",
            f"SELECT {self._columns} FROM events WHERE session_id = ? AND seq > ? ORDER BY seq",
            (session_id, after),
            _rows_to_events,
        )

    async def read_decoded(
        self, session_id: str, decoder: EventDecoder[_T], after: int = 0
    ) -> list[_T]:
        """:meth:`read` through ``decoder.decode_rows``, all on the reader thread.

        The replay path: no envelopes, and payloads come back as their UTF-8
        bytes (``CAST(payload AS BLOB)``), so the text is never decoded into a
        ``str`` only to be encoded again by the JSON parser.
        """

        def run(path: Path, conn: sqlite3.Connection) -> list[_T]:
            rows = conn.execute(self._read_json, (session_id, after)).fetchall()
            return decode_rows(f"{path}: ", session_id, rows, decoder)

        return await self._read_on_thread(f"cannot read {session_id!r}", run)

    async def read_decoded_many(
        self,
        session_ids: Sequence[str],
        decoder: EventDecoder[_T],
        fold: Callable[[str, list[_T]], _R],
    ) -> dict[str, _R]:
        """``fold`` of each session's :meth:`read_decoded`, in one trip to the
        reader thread (``fold`` runs there) and one read transaction (a
        consistent snapshot). The transaction lasts the whole call, folds
        included, and a WAL checkpoint cannot pass it meanwhile: give it a
        slice of sessions at a time (``turnledger replay`` reads 256)."""
        ids = list(dict.fromkeys(session_ids))

        def run(path: Path, conn: sqlite3.Connection) -> dict[str, _R]:
            out: dict[str, _R] = {}
            conn.execute("BEGIN")
            try:
                for sid in ids:
                    rows = conn.execute(self._read_json, (sid, 0)).fetchall()
                    out[sid] = fold(sid, decode_rows(f"{path}: ", sid, rows, decoder))
            finally:
                if conn.in_transaction:  # a read transaction: nothing to keep
                    with contextlib.suppress(sqlite3.Error):
                        conn.execute("ROLLBACK")
            return out

        return await self._read_on_thread(f"cannot read {len(ids)} sessions", run)

    async def _read_on_thread(self, where: str, fn: Callable[[Path, sqlite3.Connection], _T]) -> _T:
        await trio.lowlevel.checkpoint_if_cancelled()
        self._check_open()
        path = self._path

        def run(conn: sqlite3.Connection | None) -> _T:
            assert conn is not None
            try:
                return fn(path, conn)
            except sqlite3.Error as exc:
                raise _map_error(exc, f"{path}: {where}") from exc

        result: _T = await self._reader.call(_Call(run))
        return result

    async def read_all(self, after: int = 0, limit: int | None = None) -> list[StoredEvent]:
        """The global feed: events with ``position > after``, in order."""
        return await self._read(
            "cannot read the feed",
            f"SELECT {self._columns} FROM events WHERE position > ? ORDER BY position LIMIT ?",
            (after, -1 if limit is None else limit),
            _rows_to_events,
        )

    async def session_ids(self) -> list[str]:
        """Every session with at least one event, in order of first event."""
        return await self._read(
            "cannot list sessions",
            "SELECT session_id FROM events WHERE seq = 1 ORDER BY position",
            (),
            _first_column,
        )

    async def acquire(self, session_id: str) -> None:
        """No-op: SQLite serializes writers; optimistic concurrency guards
        every append."""
        await trio.lowlevel.checkpoint()
        self._check_open()

    async def release(self, session_id: str) -> None:
        """No-op (see :meth:`acquire`)."""
        await trio.lowlevel.checkpoint()

    async def aclose(self) -> None:
        """Finish queued work, close both connections and stop the threads.

        Idempotent; later calls on the store raise ``StoreError``.
        """
        if self._closed:
            await trio.lowlevel.checkpoint()
            return
        self._closed = True
        with trio.CancelScope(shield=True):
            for t in (self._writer, self._reader):
                await t.call(_Call(_close_conn(t), last=True))
            await trio.to_thread.run_sync(self._join)

    def _join(self) -> None:
        self._writer.thread.join()
        self._reader.thread.join()

    async def __aenter__(self) -> SQLiteStore:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.aclose()


def _close_conn(t: _Thread) -> Callable[[sqlite3.Connection | None], None]:
    def close(conn: sqlite3.Connection | None) -> None:
        t.conn = None
        if conn is not None:
            conn.close()

    return close
