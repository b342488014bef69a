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
data_version`` tells when another connection (a tool other than this store)
wrote to the file, and the cache is dropped then.

One writer. A writer holds ``fcntl.flock`` on ``<file>.lock`` while it is
open; a second writer, in this process or another, gets ``StoreUnavailable``
naming the holder's pid (so it cannot close the first one's live turn as
``interrupted``). Read-only stores take no lock.

The acknowledged mark. SQLite stops reading a write-ahead log at its first
bad frame, so a flipped bit there shows a shorter history without an error.
So the lock file also holds the highest feed position ever acknowledged,
rewritten in place (one ``pwrite``) after each commit that was synced before
its callers were told (``synchronous`` FULL or EXTRA), and every open, the
read-only ones included, refuses with ``StoreCorrupted`` a file that shows
less. The mark is not synced: it is only ever written after the commit it
names is on disk, so after a power loss it can only be behind what the file
holds (a check that finds less), never ahead (a sound file refused), and
it costs no second fsync per group commit. It lives outside the database and
its log, where no WAL truncation or checkpoint can touch it. Its limit: a
power loss in the seconds before the kernel wrote it back loses the last
mark, not any event. A new file (none there, or empty with no log) starts
the mark at 0; a restored older copy is refused until its lock file is
removed.

Schema. ``PRAGMA application_id`` marks the file as turnledger's and
``PRAGMA user_version`` holds the schema version (see :data:`SCHEMA_VERSION`).
Opening creates the schema in an empty file with no write-ahead log bytes
beside it (a database that shows no tables next to a non-empty log has lost
it: ``StoreCorrupted``), migrates an older one, and refuses a file written by
a newer release or by something else. Every check runs first through a
read-only connection, whose closing never checkpoints, so a refused file and
its log are left as they were.
"""

from __future__ import annotations

import contextlib
import os
import sqlite3
import time
import urllib.parse
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, ClassVar, Final, Literal, TypeVar

import attrs
import trio

from ..._errors import StoreCorrupted, StoreError, StoreUnavailable, UnknownSession
from ...events import BaseEventStore, Erasure, EventDecoder, StoredEvent, session_hash
from ._common import WriterLock, check_batch, check_path, fsync_dir, read_mark, rows_to_events
from ._io_thread import Append, Call, Thread
from ._payloads import check_envelope, decode_rows, payload_value
from ._sqlite_thread import Reader, Writer, map_error

__all__ = ["SCHEMA_VERSION", "SQLiteStats", "SQLiteStore", "Synchronous"]

#: Schema version this release writes (``PRAGMA user_version``): 2 adds the
#: ``erasures`` table.
SCHEMA_VERSION: Final = 2
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

# Steps from version N to N + 1, applied in one transaction on open (a new
# file gets _SCHEMA_V1 and then every step).
_MIGRATIONS: Final[dict[int, tuple[str, ...]]] = {
    1: (
        # One content-free row per erasure. last_position: the highest feed
        # position when it happened, so that neither the acknowledged mark
        # nor a new event's position ever goes back below an erased one.
        """
        CREATE TABLE erasures (
            id             INTEGER PRIMARY KEY,
            session_sha256 TEXT    NOT NULL,
            erased_at      REAL    NOT NULL,
            events         INTEGER NOT NULL,
            kept           INTEGER NOT NULL,
            last_position  INTEGER NOT NULL
        )
        """,
    ),
}

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


def _wal(path: Path) -> Path:
    return path.with_name(path.name + "-wal")


def _size(path: Path) -> int:
    try:
        return os.stat(path).st_size
    except FileNotFoundError:
        return 0


def _uri(path: Path, query: str) -> str:
    return "file:" + urllib.parse.quote(str(path.resolve())) + "?" + query


def _check_contents(conn: sqlite3.Connection, path: Path, mark: int, *, fresh: bool) -> bool:
    """Refuse what is not a turnledger database this release reads, or one
    that shows fewer events than it acknowledged; whether the schema is to be
    created (an empty database)."""
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
        wal = _size(_wal(path))
        if wal and not fresh:
            # SQLite stops reading the log at its first bad frame: a log
            # that holds bytes beside a file that shows nothing is damage.
            raise StoreCorrupted(
                f"{path} shows no tables but its write-ahead log {_wal(path)} holds {wal} "
                "bytes: the log is damaged; nothing was changed. Keep both files and "
                "restore from a backup."
            )
        if mark and not fresh:
            raise _fewer(path, 0, mark)
        return True
    (last,) = conn.execute("SELECT coalesce(max(position), 0) FROM events").fetchone()
    if version >= 2:
        last = max(last, _erased_floor(conn))
    if last < mark:
        raise _fewer(path, last, mark)
    return False


def _erased_floor(conn: sqlite3.Connection) -> int:
    """The highest feed position any erasure saw (0: none)."""
    (floor,) = conn.execute("SELECT coalesce(max(last_position), 0) FROM erasures").fetchone()
    return int(floor)


def _fewer(path: Path, last: int, mark: int) -> StoreCorrupted:
    return StoreCorrupted(
        f"{path} shows events up to position {last}, but position {mark} was acknowledged "
        f"(lock file {path.name}.lock): the file or its write-ahead log lost committed "
        "events; nothing was changed. Restore from a backup (if you restored an older copy "
        "on purpose, delete the lock file)."
    )


def _open_writer(
    path: Path, synchronous: str, busy_timeout: float
) -> tuple[sqlite3.Connection, WriterLock]:
    existed = check_path(path, "database")
    if existed:
        # A file this process cannot write is refused here, before anything
        # (a lock file, a -wal) is created beside it.
        try:
            os.close(os.open(path, os.O_RDWR | os.O_CLOEXEC))
        except OSError as exc:
            raise StoreUnavailable(f"{path}: cannot open for writing: {exc}") from exc
    lock = WriterLock.take(path, keep_mark=True)
    try:
        fresh = not existed or (_size(path) == 0 and _size(_wal(path)) == 0)
        mark = 0 if fresh else (lock.mark or 0)
        if not fresh:
            # Look first as a reader does: closing a read-only connection
            # never checkpoints, so a refused file and its log stay as they are.
            _open_read_only(path, busy_timeout, mark)[0].close()
        conn = _connect(path, busy_timeout)
        try:
            conn.execute(f"PRAGMA synchronous={synchronous}")
            # Deleted content is overwritten with zeros (an erasure must not
            # leave its text in a free page or a free cell).
            conn.execute("PRAGMA secure_delete=ON")
            conn.execute("BEGIN IMMEDIATE")
            if _check_contents(conn, path, mark, fresh=fresh):
                for statement in _SCHEMA_V1:
                    conn.execute(statement)
                conn.execute(f"PRAGMA application_id={APPLICATION_ID}")
                version = 1
            else:
                (version,) = conn.execute("PRAGMA user_version").fetchone()
            for step in range(version, SCHEMA_VERSION):
                for statement in _MIGRATIONS[step]:
                    conn.execute(statement)
            # Always a real write, so a file this process cannot write is
            # refused here and not at the first append.
            conn.execute(f"PRAGMA user_version={SCHEMA_VERSION}")
            conn.execute("COMMIT")
            if not fresh:
                # An erasure that a crash stopped between its COMMIT and its
                # checkpoint left the log's old frames: copy and truncate now
                # (nobody else has the file open for writing; a reader's
                # snapshot only makes this a partial checkpoint).
                conn.execute("PRAGMA wal_checkpoint(TRUNCATE)").fetchall()
            if not existed:
                fsync_dir(path.parent)
        except BaseException:
            conn.close()
            raise
        if fresh:
            lock.write(0)  # a new file: what an older one acknowledged is gone
    except BaseException:
        lock.release(failed=True)
        raise
    return conn, lock


def _open_reader(path: Path, busy_timeout: float) -> sqlite3.Connection:
    conn = _connect(path, busy_timeout)
    conn.execute("PRAGMA query_only=ON")
    return conn


def _signature(path: Path) -> tuple[int, int, int, bool]:
    st = os.stat(path)
    return st.st_ino, st.st_size, st.st_mtime_ns, os.path.lexists(_wal(path))


def _open_read_only(
    path: Path, busy_timeout: float, mark: int | None = None
) -> tuple[sqlite3.Connection, tuple[int, int, int, bool] | None]:
    # For tools that only look: create and change nothing (no WAL switch, no
    # schema, no -wal or -shm file), and refuse what is not a turnledger
    # database of a version this release reads.
    if not check_path(path, "database"):
        raise StoreUnavailable(f"{path}: no such file")
    if mark is None:
        mark = read_mark(path)  # before the file: a writer only raises it later
    guard: tuple[int, int, int, bool] | None = None
    if os.path.lexists(_wal(path)):
        # A writer has it open (or died with it open): read through its log.
        query = "mode=ro"
    else:
        # No log: no writer has the file open and it holds everything.
        # SQLite would create the -wal and -shm files even for mode=ro, so
        # read it as immutable, and check before and after every read that
        # no writer has changed the file since (see SQLiteStore.open).
        query = "mode=ro&immutable=1"
        guard = _signature(path)
    conn = sqlite3.connect(
        _uri(path, query),
        uri=True,
        timeout=busy_timeout,
        isolation_level=None,
        check_same_thread=True,
    )
    try:
        _check_contents(conn, path, mark, fresh=False)
        if guard is not None and _signature(path)[:3] != guard[:3]:
            raise StoreUnavailable(f"{path}: {_CHANGED}")
    except BaseException:
        conn.close()
        raise
    return conn, guard


_CHANGED: Final = "a writer changed the file while it was read; open it again"


def _first_column(where: str, rows: list[tuple[Any, ...]]) -> list[str]:
    return [r[0] for r in rows]


def _erasure_rows(where: str, rows: list[tuple[Any, ...]]) -> list[Erasure]:
    return [Erasure(r[0], r[1], r[2], r[3]) for r in rows]


def _erase_rows(
    conn: sqlite3.Connection, session_id: str, rows: list[tuple[Any, ...]]
) -> tuple[Erasure, int] | None:
    """One transaction: the session's rows deleted, ``rows`` inserted after
    every position ever used, the erasure recorded. ``None``: no such
    session (nothing written)."""
    conn.execute("BEGIN IMMEDIATE")
    try:
        (count,) = conn.execute(
            "SELECT count(*) FROM events WHERE session_id = ?", (session_id,)
        ).fetchone()
        if not count:
            conn.execute("ROLLBACK")
            return None
        (top,) = conn.execute("SELECT coalesce(max(position), 0) FROM events").fetchone()
        floor = max(int(top), _erased_floor(conn))
        conn.execute("DELETE FROM events WHERE session_id = ?", (session_id,))
        if rows:
            conn.executemany(
                "INSERT INTO events (position, session_id, seq, tag, schema_version, payload,"
                " recorded_at) VALUES (?, ?, ?, ?, ?, ?, ?)",
                [(floor + i, *row) for i, row in enumerate(rows, 1)],
            )
        record = Erasure(session_hash(session_id), time.time(), int(count), len(rows))
        conn.execute(
            "INSERT INTO erasures (session_sha256, erased_at, events, kept, last_position)"
            " VALUES (?, ?, ?, ?, ?)",
            (record.session_hash, record.erased_at, record.events, record.kept, floor + len(rows)),
        )
        conn.execute("COMMIT")
    except BaseException:
        if conn.in_transaction:
            with contextlib.suppress(sqlite3.Error):
                conn.execute("ROLLBACK")
        raise
    return record, floor + len(rows)


def _checkpoint(conn: sqlite3.Connection, path: Path) -> None:
    """Copy the log into the file and truncate it to zero bytes, waiting a
    little for readers that hold an older snapshot."""
    for _ in range(200):
        (busy, _frames, _done) = conn.execute("PRAGMA wal_checkpoint(TRUNCATE)").fetchone()
        if not busy:
            return
        time.sleep(0.01)
    raise StoreUnavailable(
        f"{path}: the session was erased, but readers held the write-ahead log for 2 s, so "
        "its old frames are not yet overwritten; erase again (or close the readers) to finish"
    )


class SQLiteStore(BaseEventStore):
    """An :class:`~turnledger.events.EventStore` in one SQLite file.

    Open it with :meth:`open`; close it with :meth:`aclose` (or ``async with``).
    One process writes a file at a time: a writer holds ``<file>.lock``
    (``fcntl.flock``; it holds the writer's pid and the last acknowledged
    position), and a second writer, in this process or another, is refused
    with :class:`~turnledger.StoreUnavailable` naming that pid. Readers
    (``read_only=True``) take no lock and read beside a writer.
    """

    #: Sealed payloads (:class:`~turnledger.adapters.encryption.EncryptedStore`)
    #: are kept as bytes: nonce and ciphertext, not their hex in JSON text
    #: (half the bytes, and no hex to undo on each replay). Rows sealed as
    #: hex text by earlier versions read as they did.
    sealed_blobs: ClassVar[bool] = True

    def __init__(
        self,
        path: Path,
        writer: Writer,
        reader: Reader,
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
        self._guard: tuple[int, int, int, bool] | None = None

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
            read_only: only read: the file must exist, and nothing is created
                or changed (no lock, no WAL switch, no schema). While a writer
                has the file open, reads go through its write-ahead log and
                see its commits. Otherwise the file is read as it is (SQLite's
                ``immutable``, so that no ``-wal``/``-shm`` file is created):
                a snapshot, and a read after a writer changed the file raises
                ``StoreUnavailable`` (open it again). Appends raise
                ``StoreError``.

        Raises:
            StoreUnavailable: the file cannot be opened or written (for a
                writer), is a directory or a device, is not a turnledger
                database, has a schema newer than this release, or another
                writer holds its lock (the message names its pid).
            StoreCorrupted: the file is damaged, or shows fewer events than
                it acknowledged (a damaged write-ahead log); nothing was
                changed.
        """
        if synchronous not in ("OFF", "NORMAL", "FULL", "EXTRA"):
            raise ValueError(f"synchronous must be OFF, NORMAL, FULL or EXTRA, not {synchronous!r}")
        if max_group < 1:
            raise ValueError("max_group must be at least 1")
        p = Path(path)
        writer = Writer(p, max_group if group_commit else 1)
        reader = Reader(f"turnledger-sqlite-reader:{p.name}")
        threads: list[Thread[sqlite3.Connection]] = [writer, reader]
        guard: list[tuple[int, int, int, bool] | None] = [None]

        def open_writer(_: sqlite3.Connection | None) -> None:
            writer.conn, writer.lock = _open_writer(p, synchronous, busy_timeout)
            writer.floor = _erased_floor(writer.conn)
            # Only a commit that is synced before the caller hears of it may
            # raise the mark: a mark ahead of what survived a power loss
            # would refuse a sound file.
            writer.mark_commits = synchronous in ("FULL", "EXTRA")

        def open_reader(_: sqlite3.Connection | None) -> str:
            if read_only:
                reader.conn, guard[0] = _open_read_only(p, busy_timeout)
            else:
                reader.conn = _open_reader(p, busy_timeout)
            (encoding,) = reader.conn.execute("PRAGMA encoding").fetchone()
            return _PAYLOAD_UTF8 if encoding == "UTF-8" else "payload"

        try:
            try:
                await trio.lowlevel.checkpoint_if_cancelled()
                if not read_only:
                    await writer.call(Call(open_writer))
                payload: str = await reader.call(Call(open_reader))
            except sqlite3.Error as exc:
                raise map_error(exc, f"{p}: cannot open") from exc
        except BaseException:
            with trio.CancelScope(shield=True):
                for t in threads:
                    await t.call(Call(_close_conn(t), last=True))
            if writer.lock is not None:  # the writer opened, the reader did not
                writer.lock.release()
            raise
        store = cls(p, writer, reader, synchronous, payload)
        store._read_only = read_only
        store._guard = guard[0]
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
                payload_value(ev.payload),
                check_envelope(ev),
            )
            for ev in events
        ]
        result: int = await self._writer.call(Append(session_id, expected_version, rows))
        return result

    async def _read(
        self,
        where: str,
        query: str,
        args: tuple[Any, ...],
        convert: Callable[[str, list[tuple[Any, ...]]], _T],
    ) -> _T:
        def run(path: Path, conn: sqlite3.Connection) -> _T:
            return convert(str(path), conn.execute(query, args).fetchall())

        return await self._read_on_thread(where, run)

    async def read(self, session_id: str, after: int = 0) -> list[StoredEvent]:
        """Events of ``session_id`` with ``seq > after``, in order."""
        return await self._read(
            f"cannot read {session_id!r}",
            f"SELECT {self._columns} FROM events WHERE session_id = ? AND seq > ? ORDER BY seq",
            (session_id, after),
            rows_to_events,
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
        guard = self._guard

        def run(conn: sqlite3.Connection | None) -> _T:
            assert conn is not None
            try:
                if guard is None:
                    return fn(path, conn)
                # An immutable read: sound only while the file is as it was.
                if _signature(path)[:3] != guard[:3]:
                    raise StoreUnavailable(f"{path}: {_CHANGED}")
                result = fn(path, conn)
                if _signature(path)[:3] != guard[:3]:
                    raise StoreUnavailable(f"{path}: {_CHANGED}")
                return result
            except sqlite3.Error as exc:
                raise map_error(exc, f"{path}: {where}") from exc
            except OSError as exc:
                raise StoreUnavailable(f"{path}: {where}: {exc}") from exc

        result: _T = await self._reader.call(Call(run))
        return result

    async def read_all(self, after: int = 0, limit: int | None = None) -> list[StoredEvent]:
        """The global feed: events with ``position > after``, in order."""
        return await self._read(
            "cannot read the feed",
            f"SELECT {self._columns} FROM events WHERE position > ? ORDER BY position LIMIT ?",
            (after, -1 if limit is None else limit),
            rows_to_events,
        )

    async def session_ids(self) -> list[str]:
        """Every session with at least one event, in order of first event."""
        return await self._read(
            "cannot list sessions",
            "SELECT session_id FROM events WHERE seq = 1 ORDER BY position",
            (),
            _first_column,
        )

    async def erase(self, session_id: str, keep: Sequence[StoredEvent] = ()) -> Erasure:
        """Delete the session's rows (``keep`` written in their place) and
        record the erasure, in one transaction, then checkpoint the
        write-ahead log and truncate it.

        The writer runs with ``PRAGMA secure_delete=ON``, so the pages and
        cells the rows leave are overwritten with zeros; the checkpoint
        copies those pages over the old ones in the file, and the truncation
        drops every WAL frame that held the text. A SIGKILL before the COMMIT
        leaves the session whole, after it the session is gone; a checkpoint
        that a crash stopped is done by the next open (SQLite recovers the
        log) or the next erasure.

        Raises:
            UnknownSession: the file holds no event of it; nothing changed.
            StoreUnavailable: the write failed (nothing erased), or the
                log could not be checkpointed while readers held it (the
                rows are erased; the message says so).

        Cancellation: the erasure is never interrupted; a cancelled caller
        still waits for it.
        """
        await trio.lowlevel.checkpoint_if_cancelled()
        self._check_open()
        if self._read_only:
            raise StoreError(f"{self._path}: the store was opened read-only")
        if keep:
            check_batch(session_id, keep, 0)
        rows = [
            (
                session_id,
                ev.seq,
                ev.tag,
                ev.schema_version,
                payload_value(ev.payload),
                check_envelope(ev),
            )
            for ev in keep
        ]
        writer = self._writer
        path = self._path

        def run(conn: sqlite3.Connection | None) -> Erasure:
            if conn is None:
                raise StoreError(f"{path}: the store is closed")
            try:
                done = _erase_rows(conn, session_id, rows)
            except sqlite3.Error as exc:
                writer.forget()
                raise map_error(exc, f"{path}: cannot erase {session_id!r}") from exc
            writer.forget()
            if done is None:
                raise UnknownSession(session_id)
            record, floor = done
            writer.floor = max(writer.floor, floor)
            _checkpoint(conn, path)
            return record

        result: Erasure = await writer.call(Call(run))
        return result

    async def erasures(self) -> list[Erasure]:
        """The erasure records of the file, oldest first.

        Cancellation: only reads; a cancelled call changed nothing.
        """
        return await self._read(
            "cannot list erasures",
            "SELECT session_sha256, erased_at, events, kept FROM erasures ORDER BY id",
            (),
            _erasure_rows,
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
                await t.call(Call(_close_conn(t), last=True))
            await trio.to_thread.run_sync(self._join)

    def _join(self) -> None:
        self._writer.thread.join()
        self._reader.thread.join()
        if self._writer.lock is not None:
            self._writer.lock.release()  # after the connection closed

    async def __aenter__(self) -> SQLiteStore:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.aclose()


def _close_conn(t: Thread[sqlite3.Connection]) -> Callable[[sqlite3.Connection | None], None]:
    def close(conn: sqlite3.Connection | None) -> None:
        t.conn = None
        if conn is not None:
            conn.close()

    return close
