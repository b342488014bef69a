"""A file journal: one JSON object per line, checksummed, locked, capped.

Each line is one event, readable by people and by ``jq``::

    {"position":1,"session_id":"s-1","seq":1,"batch_end":1,"tag":"session_started",
     "schema_version":2,"recorded_at":1700000000.0,"payload":{...},"crc32":"6f1d0c2a"}

- ``position`` is the line number (the global feed order).
- ``batch_end`` is the ``seq`` of the last event of the append the line came
  from: an append is written as consecutive lines, and it is complete when the
  line whose ``seq`` equals ``batch_end`` is there.
- ``crc32`` is the CRC-32 (zlib) of the line's UTF-8 bytes with the
  ``,"crc32":"…"`` member removed, as 8 lowercase hex digits; it is always the
  last member, so the line without it is ``line[:-20] + "}"``.

Writing. An append is one ``write`` of all its lines followed by
``fdatasync`` (``fsync`` where that is missing); the caller is told only
after it returned. A write or sync that fails (a full disk lands part of a
batch, then refuses the rest) is cut back off the file, so a store error
never leaves half a batch. Should that cut fail too, the part stays until
the next append cuts it first (nothing is written after it meanwhile), or
until the next open finds it as a torn tail, saves it aside and cuts it:
damage repaired, never events lost or invented. A size cap (``max_bytes``)
refuses an append that would grow the file beyond it, before anything is
written (:class:`~turnledger.StoreCapReached`); an append that starts a
session or a turn must leave a reserve under the cap free (an eighth of it,
at most 64 KiB), so that the turns already started can always end. Room is
made by erasing: a hub with a retention policy applies it when the cap
refuses an append (the journal is rewritten smaller) and tries once more;
a question that still does not fit is rejected as ``limit``.

Locking. The writer holds ``fcntl.flock`` on ``<journal>.lock`` (which holds
its pid) for as long as the store is open; a second opener, in this process or
another, gets :class:`~turnledger.StoreUnavailable` naming that pid. The lock
dies with the process. The lock file is left in place on close (removing it
would race with the next opener).

Recovery on open. A crash can leave the end of the file torn: a last line
without its newline, zeros where a write never reached the disk, or the lines
of an append that was not written whole. That tail was never reported as
written: its bytes are saved to a side file ``<journal>.torn-<offset>-<time>``
(synced) and then cut off, with a warning on the structlog logger that names
the side file; if the side file cannot be written (a full disk), the open is
refused and nothing is changed. A complete line (newline present) that fails its checks (a bad
checksum, a flipped bit, a byte that is not UTF-8), the last one included, is
damage, not a torn write: :class:`~turnledger.StoreCorrupted`, naming the line,
and nothing is changed.

Erasure. :meth:`JournalStore.erase` rewrites the journal without the
session: the kept lines (positions numbered anew, each its own complete
append) go to ``<journal>.compact``, which is synced, renamed over the
journal (atomic), and the directory synced. A SIGKILL before the rename
leaves the journal whole (the next open removes the stale ``.compact``),
after it the session is gone: never half of it. Torn side files that hold
the session's lines are removed too, and a content-free record (the id's
SHA-256, the time, the event counts) is appended to ``<journal>.erasures``.
The old file's blocks are freed by the file system, not overwritten: what a
raw scan of the device may still find is the file system's business (use
full-disk encryption), no file beside the journal holds it.

Only a regular file is a journal: a directory, a device or a pipe (or a
symbolic link to one) is refused on open, and no read goes past the size cap.
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import stat
import time
import zlib
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, Final

import attrs
import trio

from ..._errors import (
    ConcurrencyConflict,
    StoreCapReached,
    StoreCorrupted,
    StoreError,
    StoreFull,
    StoreUnavailable,
    UnknownSession,
)
from ..._logging import library_logger
from ...events import Erasure, StoredEvent, session_hash
from ._common import (
    HeldEvents,
    WriterLock,
    check_batch,
    check_path,
    fsync_dir,
    loads_utf8,
    renumbered,
)
from ._payloads import check_envelope, dumps_payload, loads_payload

__all__ = ["DEFAULT_MAX_BYTES", "JournalStore"]


#: Default size cap of a journal file (64 MiB).
DEFAULT_MAX_BYTES: Final = 64 * 1024 * 1024

_KEYS: Final = frozenset(
    {
        "position",
        "session_id",
        "seq",
        "batch_end",
        "tag",
        "schema_version",
        "recorded_at",
        "payload",
    }
)
_CRC_PREFIX: Final = b',"crc32":"'
_CRC_LEN: Final = 20  # len(',"crc32":"xxxxxxxx"}')
_HEX: Final = frozenset(b"0123456789abcdef")
_FULL_ERRNOS: Final = frozenset({errno.ENOSPC, errno.EDQUOT, errno.EFBIG})
#: A run of NUL bytes this long in a complete last line makes it torn, not
#: damaged (one flipped bit makes at most one NUL).
_ZEROS: Final = b"\x00" * 16

_sync = getattr(os, "fdatasync", os.fsync)
_dumps_str = json.JSONEncoder(ensure_ascii=False).encode
_dumps_str_ascii = json.JSONEncoder(ensure_ascii=True).encode


class _Damaged(Exception):
    pass


@attrs.frozen
class _Scan:
    events: list[StoredEvent]
    #: Bytes of the file that hold whole, valid appends.
    good_bytes: int
    #: Why the tail beyond ``good_bytes`` is cut, if there is one.
    torn: str | None
    #: First line number of the torn tail.
    torn_line: int


def _parse_line(line: bytes) -> tuple[dict[str, Any], int]:
    if len(line) <= _CRC_LEN or line[-_CRC_LEN:-10] != _CRC_PREFIX or line[-2:] != b'"}':
        raise _Damaged("no crc32 member at the end")
    crc_hex = line[-10:-2]
    if not set(crc_hex) <= _HEX:
        raise _Damaged("crc32 is not 8 lowercase hex digits")
    body = line[:-_CRC_LEN] + b"}"
    if zlib.crc32(body) != int(crc_hex, 16):
        raise _Damaged("checksum mismatch")
    try:
        obj: Any = loads_utf8(body)
    except ValueError as exc:
        raise _Damaged(f"not JSON: {exc}") from exc
    if type(obj) is not dict or obj.keys() != _KEYS:
        raise _Damaged("not an event record")
    for key in ("position", "seq", "batch_end", "schema_version"):
        if type(obj[key]) is not int:
            raise _Damaged(f"{key} is not an integer")
    for key in ("session_id", "tag"):
        if type(obj[key]) is not str:
            raise _Damaged(f"{key} is not a string")
    if type(obj["recorded_at"]) not in (int, float):
        raise _Damaged("recorded_at is not a number")
    if type(obj["payload"]) is not dict:
        raise _Damaged("payload is not an object")
    return obj, obj["batch_end"]


def _scan(path: Path, data: bytes) -> _Scan:
    """Check every line; find the torn tail. Raises StoreCorrupted for damage
    anywhere else."""
    lines = data.split(b"\n")
    complete, rest = lines[:-1], lines[-1]
    events: list[StoredEvent] = []
    versions: dict[str, int] = {}
    offset = 0
    good_bytes = 0  # end of the last complete append
    good_count = 0
    batch_start_line = 0  # first line of the append being read (0: none open)
    batch_end = 0
    torn: str | None = None

    def corrupted(lineno: int, why: str) -> StoreCorrupted:
        return StoreCorrupted(
            f"{path}: line {lineno} is damaged ({why}); nothing was changed. "
            "Restore the file from a backup or repair that line by hand."
        )

    for lineno, line in enumerate(complete, start=1):
        try:
            obj, end = _parse_line(line)
        except _Damaged as exc:
            if lineno == len(complete) and not rest and _ZEROS in line:
                # A complete line is damage, unless it holds a run of zeros
                # (no JSON text holds a NUL byte): what a file system leaves
                # where part of the last write never reached the disk.
                torn = f"the last line holds zeros where a write did not land ({exc})"
                break
            raise corrupted(lineno, str(exc)) from None
        sid, seq = obj["session_id"], obj["seq"]
        if obj["position"] != lineno:
            raise corrupted(lineno, f"position {obj['position']} on line {lineno}")
        if batch_start_line:
            if sid != events[-1].session_id or end != batch_end:
                raise corrupted(lineno, "an append starts before the previous one ended")
        elif not 1 <= seq <= end:
            raise corrupted(lineno, f"seq {seq} does not fit batch_end {end}")
        if seq != versions.get(sid, 0) + 1:
            raise corrupted(lineno, f"seq {seq} of {sid!r} follows {versions.get(sid, 0)}")
        versions[sid] = seq
        events.append(
            StoredEvent(
                sid,
                seq,
                obj["tag"],
                obj["schema_version"],
                obj["payload"],
                float(obj["recorded_at"]),
                lineno,
            )
        )
        offset += len(line) + 1
        if seq == end:
            batch_start_line = 0
            good_bytes = offset
            good_count = len(events)
        else:
            if not batch_start_line:
                batch_start_line = lineno
            batch_end = end
    else:
        if rest:
            torn = "the last line has no newline"
    if batch_start_line and torn is None:
        torn = f"the append starting on line {batch_start_line} is incomplete"
    torn_line = good_count + 1
    if torn is not None:
        # Only what an interrupted append of ours leaves may be cut: the start
        # of the next record, or the zeros a file system may leave where a
        # write never reached the disk. Anything else (a file that is not a
        # journal, damage by another hand) is refused and left as it is.
        tail = data[good_bytes:]
        expected = f'{{"position":{torn_line},'.encode()
        ours = tail.startswith(expected) or expected.startswith(tail)
        if not ours and tail.strip(b"\x00\n"):
            raise corrupted(torn_line, "not a journal record; is this a turnledger journal?")
    return _Scan(events[:good_count], good_bytes, torn, torn_line)


def _read_all(path: Path, fd: int, cap: int | None) -> bytes:
    # Never more than the cap (and one byte to tell), whatever the file is.
    chunks: list[bytes] = []
    offset = 0
    limit = None if cap is None else cap + 1
    while True:
        want = 1 << 20 if limit is None else min(1 << 20, limit - offset)
        chunk = os.pread(fd, want, offset) if want > 0 else b""
        if not chunk:
            break
        chunks.append(chunk)
        offset += len(chunk)
    if cap is not None and offset > cap:
        raise StoreFull(
            f"{path} is larger than its cap of {cap} bytes; nothing was read. "
            "Open it with a larger max_bytes (or none)."
        )
    return b"".join(chunks)


def _save_torn(path: Path, tail: bytes, offset: int) -> Path:
    # The cut bytes go to a side file first, synced, so nothing is lost; a
    # side file that could not be written whole is removed again, and the
    # journal is left as it was.
    side = path.with_name(f"{path.name}.torn-{offset}-{time.time_ns()}")
    try:
        fd = os.open(side, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o644)
        try:
            view = memoryview(tail)
            while view:
                view = view[os.write(fd, view) :]
            os.fsync(fd)
        finally:
            os.close(fd)
    except OSError as exc:
        with contextlib.suppress(OSError):
            os.unlink(side)
        raise _map_os_error(
            exc,
            f"{path}: its torn tail ({len(tail)} bytes from offset {offset}) could not be "
            "saved aside before it is cut; nothing was changed. Free space and open it again",
        ) from exc
    fsync_dir(path.parent)
    return side


def _record(
    ev: StoredEvent,
    position: int,
    batch_end: int,
    recorded_at: str,
    payload_text: str,
    dumps: Callable[[str], str],
) -> bytes:
    return (
        f'{{"position":{position},"session_id":{dumps(ev.session_id)},"seq":{ev.seq},'
        f'"batch_end":{batch_end},"tag":{dumps(ev.tag)},"schema_version":{ev.schema_version},'
        f'"recorded_at":{recorded_at},"payload":{payload_text}}}'
    ).encode()


def _map_os_error(exc: OSError, msg: str) -> StoreError:
    if exc.errno in _FULL_ERRNOS:
        return StoreFull(f"{msg}: {exc}")
    return StoreUnavailable(f"{msg}: {exc}")


#: Tags of the events that start something (a session, a turn): an append
#: holding one must leave the cap's reserve free.
_STARTING: Final = frozenset({"session_started", "turn_submitted"})


def _reserve(cap: int) -> int:
    """Bytes under the cap kept for the appends that end what was started
    (answers, discards): so a full journal refuses new turns (``limit``),
    never the end of a turn in flight."""
    return min(64 * 1024, cap // 8)


def _starts_something(events: Sequence[StoredEvent]) -> bool:
    return any(ev.tag in _STARTING for ev in events)


def _compact_path(path: Path) -> Path:
    return path.with_name(path.name + ".compact")


def _erasures_path(path: Path) -> Path:
    return path.with_name(path.name + ".erasures")


def _torn_files(path: Path) -> list[Path]:
    prefix = path.name + ".torn-"
    try:
        return [p for p in path.parent.iterdir() if p.name.startswith(prefix)]
    except OSError:
        return []


def _erasure_line(record: Erasure) -> bytes:
    return (
        json.dumps(
            {
                "session_sha256": record.session_hash,
                "erased_at": record.erased_at,
                "events": record.events,
                "kept": record.kept,
            }
        )
        + "\n"
    ).encode()


def _read_erasures(path: Path) -> list[Erasure]:
    try:
        data = _erasures_path(path).read_bytes()
    except FileNotFoundError:
        return []
    out = []
    for line in data.split(b"\n"):
        try:
            obj = json.loads(line)
            out.append(
                Erasure(obj["session_sha256"], float(obj["erased_at"]), obj["events"], obj["kept"])
            )
        except (ValueError, KeyError, TypeError):
            continue  # an empty line, or a record torn by a crash
    return out


@attrs.define
class _Opened:
    fd: int
    lock: WriterLock | None
    size: int
    scan: _Scan
    saved: Path | None


def _open_files(path: Path, read_only: bool, cap: int | None) -> _Opened:
    # The journal is opened (and checked) before its lock file is made, so
    # a journal that cannot be opened leaves no lock file behind.
    existed = check_path(path, "journal")
    flags = os.O_RDONLY if read_only else os.O_RDWR | os.O_CREAT | os.O_APPEND
    try:
        fd = os.open(path, flags | os.O_CLOEXEC | os.O_NONBLOCK, 0o644)
    except OSError as exc:
        raise StoreUnavailable(f"{path}: cannot open the journal: {exc}") from exc
    lock: WriterLock | None = None
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):  # replaced since check_path
            raise StoreUnavailable(f"{path} is not a regular file; a journal must be one")
        if not read_only:
            lock = WriterLock.take(path)
            # An erasure killed before its rename: the journal is whole.
            with contextlib.suppress(FileNotFoundError):
                os.unlink(_compact_path(path))
        if not existed:
            fsync_dir(path.parent)
        data = _read_all(path, fd, cap)
        scan = _scan(path, data)
        saved = None
        if scan.torn is not None and not read_only:
            saved = _save_torn(path, data[scan.good_bytes :], scan.good_bytes)
            os.ftruncate(fd, scan.good_bytes)
            os.fsync(fd)
    except BaseException as exc:
        os.close(fd)
        if lock is not None:
            lock.release(failed=True)
        if isinstance(exc, OSError):
            raise StoreUnavailable(f"{path}: cannot read the journal: {exc}") from exc
        raise
    return _Opened(fd, lock, scan.good_bytes, scan, saved)


class JournalStore(HeldEvents):
    """An :class:`~turnledger.events.EventStore` in one JSON-lines file.

    Meant for a single process that wants a log people can read with ``jq``,
    grep and diff. Everything read is served from memory (loaded on open), so
    the size cap also bounds memory; SQLite is the store for large logs.
    """

    def __init__(
        self, path: Path, opened: _Opened, max_bytes: int | None, fsync: bool, read_only: bool
    ) -> None:
        # Private: use ``await JournalStore.open(path)``.
        self._path = path
        self._fd: int | None = opened.fd
        self._lock = opened.lock
        self._size = opened.size
        self._max_bytes = max_bytes
        self._fsync = fsync
        self._read_only = read_only
        self._feed: list[StoredEvent] = []
        self._streams: dict[str, list[StoredEvent]] = {}
        self._write_lock = trio.Lock()
        self._broken: str | None = None
        for ev in opened.scan.events:
            self._index(ev)

    @classmethod
    async def open(
        cls,
        path: str | os.PathLike[str],
        *,
        max_bytes: int | None = DEFAULT_MAX_BYTES,
        fsync: bool = True,
        read_only: bool = False,
    ) -> JournalStore:
        """Open (creating if needed) the journal ``path`` and load it.

        Args:
            max_bytes: size cap of the file; ``None`` for none.
            fsync: sync every append to disk before returning (turn off only
                for tests and throwaway logs).
            read_only: neither lock nor change the file: a snapshot of it as
                it is now (a torn tail is skipped, not cut). Appends raise.

        Raises:
            StoreUnavailable: the file cannot be opened, or another writer
                holds its lock (the message names its pid).
            StoreCorrupted: a line before the end is damaged; the message
                names it and the file was not changed.
        """
        if max_bytes is not None and max_bytes < 0:
            raise ValueError("max_bytes must be positive or None")
        p = Path(path)
        opened = await trio.to_thread.run_sync(_open_files, p, read_only, max_bytes)
        scan = opened.scan
        if scan.torn is not None:
            saved = {} if opened.saved is None else {"saved_to": str(opened.saved)}
            library_logger(__name__).warning(
                "journal_torn_tail_cut" if not read_only else "journal_torn_tail_skipped",
                path=str(p),
                line=scan.torn_line,
                reason=scan.torn,
                kept_bytes=scan.good_bytes,
                kept_events=len(scan.events),
                **saved,
            )
        return cls(p, opened, max_bytes, fsync, read_only)

    @property
    def path(self) -> Path:
        """The journal file."""
        return self._path

    @property
    def size(self) -> int:
        """Bytes in the journal file."""
        return self._size

    def _index(self, ev: StoredEvent) -> None:
        self._feed.append(ev)
        self._streams.setdefault(ev.session_id, []).append(ev)

    def _check_open(self) -> None:
        if self._fd is None:
            raise StoreError(f"{self._path}: the store is closed")

    def _encode(self, ev: StoredEvent, position: int, batch_end: int) -> tuple[bytes, Any]:
        payload_text = dumps_payload(ev.payload)
        recorded_at = float.__repr__(check_envelope(ev))
        try:
            body = _record(ev, position, batch_end, recorded_at, payload_text, _dumps_str)
        except UnicodeEncodeError:  # a lone surrogate in the session id or tag
            body = _record(ev, position, batch_end, recorded_at, payload_text, _dumps_str_ascii)
        line = body[:-1] + b',"crc32":"%08x"}\n' % zlib.crc32(body)
        return line, loads_payload(payload_text)

    async def append(
        self, session_id: str, events: Sequence[StoredEvent], expected_version: int
    ) -> int:
        """Append ``events`` after ``expected_version``: one write, one sync.

        Raises:
            ConcurrencyConflict: the stream is not at ``expected_version``.
            StoreFull: the size cap (or the disk) refuses the append; the file
                is byte for byte as before.
            StoreUnavailable: writing or syncing failed (what was written was
                cut off again), or the store is read-only.
            StoreError: a payload is not JSON-able; nothing was written.

        Cancellation: once the write started it is not interrupted; a
        cancelled append either wrote the whole batch or nothing.
        """
        await trio.lowlevel.checkpoint_if_cancelled()
        self._check_open()
        if self._read_only:
            raise StoreUnavailable(f"{self._path}: opened read-only")
        if not events:
            return expected_version
        check_batch(session_id, events, expected_version)
        async with self._write_lock:
            self._check_open()
            if self._broken is not None:
                await trio.to_thread.run_sync(self._cut_back)
            current = len(self._streams.get(session_id, ()))
            if current != expected_version:
                raise ConcurrencyConflict(session_id, expected_version, current)
            position = len(self._feed)
            end = expected_version + len(events)
            encoded = [self._encode(ev, position + i, end) for i, ev in enumerate(events, 1)]
            data = b"".join(line for line, _ in encoded)
            cap = self._max_bytes
            if cap is not None and _starts_something(events):
                cap -= _reserve(cap)
            if cap is not None and self._size + len(data) > cap:
                raise StoreCapReached(
                    f"{self._path}: appending {len(data)} bytes would grow the journal to "
                    f"{self._size + len(data)} bytes, over its cap of {cap}"
                    + (
                        ""
                        if cap == self._max_bytes
                        else f" ({self._max_bytes} less the reserve "
                        "kept for ending the turns already started)"
                    )
                    + "; nothing was written"
                )
            await trio.to_thread.run_sync(self._write, data)
            for (_, payload), ev, pos in zip(
                encoded, events, range(position + 1, position + 1 + len(events)), strict=True
            ):
                self._index(
                    StoredEvent(
                        session_id,
                        ev.seq,
                        ev.tag,
                        ev.schema_version,
                        payload,
                        float(ev.recorded_at),
                        pos,
                    )
                )
            return end

    def _write(self, data: bytes) -> None:
        fd = self._fd
        assert fd is not None
        start = self._size
        try:
            view = memoryview(data)
            while view:
                view = view[os.write(fd, view) :]
            if self._fsync:
                _sync(fd)
        except OSError as exc:
            # If the cut fails, the next append cuts it first, or the next open does.
            with contextlib.suppress(StoreUnavailable):
                self._cut_back()
            raise _map_os_error(exc, f"{self._path}: the append was not written") from exc
        self._size = start + len(data)

    def _cut_back(self) -> None:
        # Cut what a failed append left after the last whole one: before the
        # caller hears of the failure, and before any later write (a write
        # after part of a batch would turn a torn tail into damage).
        fd = self._fd
        assert fd is not None
        try:
            os.ftruncate(fd, self._size)
            os.fsync(fd)
        except OSError as exc:
            self._broken = f"part of a failed append could not be cut off ({exc})"
            raise StoreUnavailable(
                f"{self._path}: {self._broken}; nothing is written after it until it is "
                "(the next append tries again; reopening the store cuts it too)"
            ) from exc
        self._broken = None

    async def erase(self, session_id: str, keep: Sequence[StoredEvent] = ()) -> Erasure:
        """Rewrite the journal without ``session_id`` (``keep`` in its
        place): see the module's docstring.

        Raises:
            UnknownSession: the journal holds no event of it; nothing changed.
            StoreUnavailable, StoreFull: the rewrite failed; the journal is
                as it was.

        Cancellation: once the rewrite started it is not interrupted; a
        cancelled erasure either happened or did not.
        """
        await trio.lowlevel.checkpoint_if_cancelled()
        self._check_open()
        if self._read_only:
            raise StoreUnavailable(f"{self._path}: opened read-only")
        if keep:
            check_batch(session_id, keep, 0)
        async with self._write_lock:
            self._check_open()
            stream = self._streams.get(session_id)
            if not stream:
                raise UnknownSession(session_id)
            kept = [
                StoredEvent(
                    session_id,
                    ev.seq,
                    ev.tag,
                    ev.schema_version,
                    self._encode(ev, 0, ev.seq)[1],
                    float(ev.recorded_at),
                )
                for ev in keep
            ]
            feed = renumbered(self._feed, session_id, kept)
            data = b"".join(self._encode(ev, ev.position or 0, ev.seq)[0] for ev in feed)
            record = Erasure(session_hash(session_id), time.time(), len(stream), len(kept))
            with trio.CancelScope(shield=True):
                await trio.to_thread.run_sync(self._rewrite, data, session_id, record)
            self._reindex(feed)
            self._size = len(data)
            self._broken = None
            return record

    def _rewrite(self, data: bytes, session_id: str, record: Erasure) -> None:
        path = self._path
        tmp = _compact_path(path)
        try:
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o644)
            try:
                view = memoryview(data)
                while view:
                    view = view[os.write(fd, view) :]
                os.fsync(fd)
            finally:
                os.close(fd)
            os.replace(tmp, path)
        except OSError as exc:
            with contextlib.suppress(OSError):
                os.unlink(tmp)
            raise _map_os_error(
                exc, f"{path}: the journal could not be rewritten; nothing was erased"
            ) from exc
        # The session is gone from here on: what follows cannot undo that.
        fsync_dir(path.parent)
        new_fd = os.open(path, os.O_RDWR | os.O_APPEND | os.O_CLOEXEC | os.O_NONBLOCK)
        old, self._fd = self._fd, new_fd
        if old is not None:
            os.close(old)
        needle = b'"session_id":' + _dumps_str(session_id).encode("utf-8", "surrogatepass")
        for side in _torn_files(path):
            with contextlib.suppress(OSError):
                if needle in side.read_bytes():
                    os.unlink(side)
        with contextlib.suppress(OSError):
            fd = os.open(
                _erasures_path(path), os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_CLOEXEC, 0o644
            )
            try:
                os.write(fd, _erasure_line(record))
                os.fsync(fd)
            finally:
                os.close(fd)
        fsync_dir(path.parent)

    async def erasures(self) -> list[Erasure]:
        """The records of ``<journal>.erasures``, oldest first.

        Cancellation: only reads; a cancelled call changed nothing.
        """
        await trio.lowlevel.checkpoint()
        return _read_erasures(self._path)

    async def acquire(self, session_id: str) -> None:
        """No-op: the file lock already makes this process the only writer."""
        await trio.lowlevel.checkpoint()
        self._check_open()

    async def release(self, session_id: str) -> None:
        """No-op (see :meth:`acquire`)."""
        await trio.lowlevel.checkpoint()

    async def aclose(self) -> None:
        """Close the file and release the lock. Idempotent."""
        with trio.CancelScope(shield=True):
            async with self._write_lock:  # let a write in progress finish
                self._close_files()

    def _close_files(self) -> None:
        fd, self._fd = self._fd, None
        lock, self._lock = self._lock, None
        if fd is not None:
            os.close(fd)
        if lock is not None:
            lock.release()  # releases the flock

    async def __aenter__(self) -> JournalStore:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.aclose()
