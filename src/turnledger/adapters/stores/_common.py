"""What the stores share: in-memory reads, rows to events, exact line
parsing, path checks, directory fsync and the writer lock file (and, from
the port, the batch check)."""

from __future__ import annotations

import contextlib
import errno
import fcntl
import os
import stat
from abc import abstractmethod
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, Final, TypeVar

import trio

from ..._errors import StoreCorrupted, StoreUnavailable
from ...events import BaseEventStore, EventDecoder, StoredEvent
from ...events._envelope import envelope
from ...events._exact_json import fast_loads, has_float, loads_exact
from ...events._store import check_batch, decode_events
from ...events.codec import ENCRYPTED_FIELD
from ._payloads import SEALED_BLOB

__all__ = [
    "HeldEvents",
    "WriterLock",
    "check_batch",
    "check_path",
    "fsync_dir",
    "loads_utf8",
    "renumbered",
    "rows_to_events",
]

_T = TypeVar("_T")
_R = TypeVar("_R")


class HeldEvents(BaseEventStore):
    """The reads of a store that holds every event in memory, parsed: the
    memory store, and the journal (which loads its file on open). A
    subclass fills ``_streams`` (session id -> its events, in order) and
    ``_feed`` (every event in position order) and says when it is closed."""

    _streams: dict[str, list[StoredEvent]]
    _feed: list[StoredEvent]

    @abstractmethod
    def _check_open(self) -> None:
        """Raise ``StoreError`` once the store is closed."""

    async def read(self, session_id: str, after: int = 0) -> list[StoredEvent]:
        """Events of ``session_id`` with ``seq > after``, in order."""
        await trio.lowlevel.checkpoint()
        self._check_open()
        return self._streams.get(session_id, [])[max(after, 0) :]

    async def read_decoded(
        self, session_id: str, decoder: EventDecoder[_T], after: int = 0
    ) -> list[_T]:
        """:meth:`read` through ``decoder.decode``: payloads are held parsed."""
        await trio.lowlevel.checkpoint()
        self._check_open()
        return self._decode(session_id, decoder, after)

    async def read_decoded_many(
        self,
        session_ids: Sequence[str],
        decoder: EventDecoder[_T],
        fold: Callable[[str, list[_T]], _R],
    ) -> dict[str, _R]:
        """``fold`` of each session's :meth:`read_decoded`."""
        await trio.lowlevel.checkpoint()
        self._check_open()
        out: dict[str, _R] = {}
        for sid in session_ids:
            if sid not in out:
                out[sid] = fold(sid, self._decode(sid, decoder, 0))
        return out

    def _decode(self, session_id: str, decoder: EventDecoder[_T], after: int) -> list[_T]:
        return decode_events(
            session_id, self._streams.get(session_id, [])[max(after, 0) :], decoder
        )

    async def read_all(self, after: int = 0, limit: int | None = None) -> list[StoredEvent]:
        """The global feed: events with ``position > after``, in order."""
        await trio.lowlevel.checkpoint()
        self._check_open()
        start = max(after, 0)
        return self._feed[start:] if limit is None else self._feed[start : start + limit]

    async def session_ids(self) -> list[str]:
        """Every session with at least one event, in order of first event."""
        await trio.lowlevel.checkpoint()
        self._check_open()
        return list(self._streams)

    def _reindex(self, feed: list[StoredEvent]) -> None:
        """Hold ``feed`` (renumbered) in place of the current events."""
        streams: dict[str, list[StoredEvent]] = {}
        for ev in feed:
            streams.setdefault(ev.session_id, []).append(ev)
        self._streams = streams  # in order of first event, as the feed has them
        self._feed = feed


def renumbered(
    feed: Sequence[StoredEvent], session_id: str, keep: Sequence[StoredEvent]
) -> list[StoredEvent]:
    """The feed of a held store after erasing ``session_id``: every other
    event in its order, then ``keep`` (a trim's events, written anew), all
    renumbered from position 1 (the held stores read the feed by index, and
    a journal's position is its line number)."""
    out: list[StoredEvent] = []
    position = 0
    for ev in feed:
        if ev.session_id != session_id:
            position += 1
            out.append(
                ev
                if ev.position == position
                else envelope(
                    ev.session_id,
                    ev.seq,
                    ev.tag,
                    ev.schema_version,
                    ev.payload,
                    ev.recorded_at,
                    position,
                )
            )
    for ev in keep:
        position += 1
        out.append(
            envelope(
                session_id, ev.seq, ev.tag, ev.schema_version, ev.payload, ev.recorded_at, position
            )
        )
    return out


def rows_to_events(where: str, rows: Sequence[Sequence[Any]]) -> list[StoredEvent]:
    """``StoredEvent`` s of ``(position, session_id, seq, tag, schema_version,
    payload, recorded_at)`` rows, the payload as JSON text (``str``, or UTF-8
    ``bytes``). A payload that is not a JSON object is ``StoreCorrupted``
    naming its position (``where`` prefixes the message). Runs once per event
    read: keep it lean."""
    out: list[StoredEvent] = []
    append = out.append
    loads = loads_exact
    for position, session_id, seq, tag, version, payload, recorded_at in rows:
        try:
            data = loads(payload if type(payload) is str else payload.decode("utf-8"))
        except (ValueError, TypeError) as exc:
            if type(payload) is not bytes or not payload.startswith(SEALED_BLOB):
                raise _bad_payload(where, position, exc) from exc
            # Sealed bytes: the envelope holds their format 1 form.
            data = {ENCRYPTED_FIELD: payload[1:].hex()}
        if type(data) is not dict:
            raise _bad_payload(where, position, None)
        append(StoredEvent(session_id, seq, tag, version, data, recorded_at, position))
    return out


def _bad_payload(where: str, position: int, exc: Exception | None) -> StoreCorrupted:
    why = f"is not JSON: {exc}" if exc is not None else "is not a JSON object"
    return StoreCorrupted(f"{where}: the payload at position {position} {why}")


def loads_utf8(data: bytes) -> Any:
    """Parse JSON ``data`` exactly as :func:`json.loads` parses its text, the
    bytes taken as strict UTF-8 (``json.loads`` of bytes would also take a
    BOM, UTF-16 or encoded surrogates, which orjson and the stores refuse).

    Raises:
        ValueError: not UTF-8, not JSON, or nested too deeply.
    """
    try:
        value = fast_loads(data)  # orjson: strict UTF-8 already
    except ValueError:
        pass
    else:
        if not has_float(value):
            return value
    return loads_exact(data.decode("utf-8"))


def check_path(path: Path, what: str) -> bool:
    """Whether ``path`` exists; raise ``StoreUnavailable`` saying so when it
    is a directory, a device or anything else but a regular file (symbolic
    links are followed)."""
    try:
        st = os.stat(path)
    except FileNotFoundError:
        return False
    except OSError as exc:
        raise StoreUnavailable(f"{path}: cannot open the {what}: {exc}") from exc
    if stat.S_ISREG(st.st_mode):
        return True
    kind = (
        "a directory"
        if stat.S_ISDIR(st.st_mode)
        else "a device"
        if stat.S_ISCHR(st.st_mode) or stat.S_ISBLK(st.st_mode)
        else "not a regular file"
    )
    raise StoreUnavailable(f"{path} is {kind}; the {what} must be a regular file")


def fsync_dir(folder: Path) -> None:
    """Sync ``folder`` so a new file's directory entry survives power loss."""
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


#: Width of the acknowledged-position field of a lock file.
_MARK_WIDTH: Final = 20
_MARK_LABEL: Final = b"acknowledged "


class WriterLock:
    """``fcntl.flock`` on ``<store>.lock``, held by the one writer process.

    The file holds two lines: the holder's pid, and (for a store that keeps
    one) the highest feed position this store ever acknowledged, written in
    place after each commit: ``acknowledged 00000000000000000042``. The lock
    dies with the process; the file is left in place on close (removing it
    would race with the next opener), but one created by an open that then
    failed is removed.
    """

    def __init__(self, fd: int, path: Path, created: bool, mark: int | None) -> None:
        self.fd: int | None = fd
        self.path = path
        self.created = created
        #: The acknowledged position read when the lock was taken (0: none;
        #: ``None``: this store keeps none).
        self.mark = mark
        self._pid = f"{os.getpid()}\n".encode()
        self._trim = True

    @classmethod
    def take(cls, store: Path, *, keep_mark: bool = False) -> WriterLock:
        """Lock ``store``'s lock file (``keep_mark``: with an acknowledged
        position).

        Raises:
            StoreUnavailable: another writer holds it (the message names its
                pid), or it cannot be created.
        """
        path = store.with_name(store.name + ".lock")
        created = not os.path.lexists(path)
        try:
            fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
        except OSError as exc:
            raise StoreUnavailable(f"{store}: cannot open the lock file {path}: {exc}") from exc
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as exc:
            try:
                holder = read_lock_file(fd)[0] or "unknown"
            finally:
                os.close(fd)
            if exc.errno in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES):
                raise StoreUnavailable(
                    f"{store} is locked by another writer (pid {holder}, lock file {path}); "
                    "close that process first, or open the store read-only"
                ) from exc
            raise StoreUnavailable(f"{store}: cannot lock {path}: {exc}") from exc
        lock = cls(fd, path, created, read_lock_file(fd)[1] if keep_mark else None)
        lock.write(lock.mark)
        return lock

    def write(self, mark: int | None) -> None:
        """Write the pid and the acknowledged position ``mark`` in place
        (one ``pwrite``, no sync: see the SQLite store on why none is
        needed)."""
        fd = self.fd
        if fd is None:
            return
        data = self._pid
        if mark is not None:
            data += _MARK_LABEL + b"%0*d\n" % (_MARK_WIDTH, mark)
        try:
            os.pwrite(fd, data, 0)
            if self._trim:  # what an earlier holder wrote may be longer
                os.ftruncate(fd, len(data))
                self._trim = False
        except OSError:  # the mark only helps find damage; the lock is what counts
            pass
        else:
            self.mark = mark

    def release(self, *, failed: bool = False) -> None:
        """Close (releasing the lock); after a failed open, also remove a
        lock file that this open created."""
        fd, self.fd = self.fd, None
        if fd is None:
            return
        if failed and self.created:
            with contextlib.suppress(OSError):
                os.unlink(self.path)
        os.close(fd)


def read_lock_file(fd: int) -> tuple[str, int]:
    """The pid (as text, ``""`` if none) and acknowledged position (0 if
    none) a lock file holds."""
    try:
        data = os.pread(fd, 128, 0)
    except OSError:
        return "", 0
    pid, _, rest = data.partition(b"\n")
    mark = 0
    if rest.startswith(_MARK_LABEL):
        digits = rest[len(_MARK_LABEL) :].partition(b"\n")[0]
        if digits.isdigit():
            mark = int(digits)
    return pid.decode("ascii", "replace").strip(), mark


def read_mark(store: Path) -> int:
    """The acknowledged position in ``store``'s lock file, read without
    creating or locking anything (0 if there is none)."""
    try:
        fd = os.open(store.with_name(store.name + ".lock"), os.O_RDONLY | os.O_CLOEXEC)
    except OSError:
        return 0
    try:
        return read_lock_file(fd)[1]
    finally:
        os.close(fd)
