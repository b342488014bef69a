"""The ``EventStore`` port: what the session runtime needs from a store, and
:class:`BaseEventStore`, which gives every method but ``append`` and ``read``
a default, so that a store of one's own writes those two (and a way to list
its sessions)."""

from __future__ import annotations

import hashlib
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterable, Sequence
from typing import Protocol, TypeVar, runtime_checkable

import attrs

from .._errors import StoreCorrupted, StoreError
from ._envelope import StoredEvent

__all__ = [
    "BaseEventStore",
    "Erasure",
    "EventDecoder",
    "EventStore",
    "PayloadNotJSON",
    "check_batch",
    "damage",
    "decode_events",
    "session_hash",
]

_T = TypeVar("_T")
_R = TypeVar("_R")
_I = TypeVar("_I")


def session_hash(session_id: str) -> str:
    """The SHA-256 (hex) of a session id's UTF-8: how an erasure record names
    the session it erased without keeping the id itself."""
    return hashlib.sha256(session_id.encode("utf-8", "surrogatepass")).hexdigest()


@attrs.frozen
class Erasure:
    """The content-free record a store keeps of an erasure, so an audit can
    show that one happened: never the session id, never any of its text."""

    #: :func:`session_hash` of the erased session's id.
    session_hash: str
    #: Unix time of the erasure.
    erased_at: float
    #: Events removed.
    events: int
    #: Events kept in their place (a trim to the newest turns); 0 for a
    #: whole session.
    kept: int = 0


class PayloadNotJSON(ValueError):
    """A stored payload's text is not a JSON object (raised by
    :meth:`EventDecoder.decode_rows`; stores report it as ``StoreCorrupted``)."""


class EventDecoder(Protocol[_T]):
    """Turns what a store keeps into typed events; :class:`EventCodec` is one.

    A store calls whichever method fits how it keeps payloads (parsed, or as
    JSON text), possibly on its own I/O thread, so both must be pure
    functions of their arguments.
    """

    def decode(self, stored: StoredEvent) -> _T:
        """Decode an envelope whose payload is already parsed."""
        ...

    def decode_rows(
        self, session_id: str, rows: Iterable[tuple[int, str, int, str | bytes]]
    ) -> list[_T]:
        """Decode ``(seq, tag, schema_version, text)`` rows of one session,
        whose payloads are kept as JSON text (UTF-8 bytes or str).

        Raises :class:`PayloadNotJSON` if a text is not a JSON object in
        UTF-8; the store turns that into ``StoreCorrupted`` naming the event.
        Any other exception reaches the store's caller unchanged.
        """
        ...


@runtime_checkable
class EventStore(Protocol):
    """An append-only log of :class:`StoredEvent`, one stream per session.

    Every method is async so stores can do their I/O off the trio thread.
    :class:`BaseEventStore` implements all but :meth:`append` and
    :meth:`read` over those two.
    """

    async def append(
        self, session_id: str, events: Sequence[StoredEvent], expected_version: int
    ) -> int:
        """Append ``events`` atomically after ``expected_version``.

        The events' ``seq`` must run ``expected_version + 1, + 2, ...``. An
        empty batch is a no-op that returns ``expected_version`` without
        checking it.

        Returns:
            The new version (the ``seq`` of the last event).

        Raises:
            ConcurrencyConflict: the stream is no longer at ``expected_version``;
                nothing was written.
            StoreError: the batch was not written.

        Cancellation: a cancelled append either wrote the whole batch or
        nothing; the caller must re-read the stream to know which.
        """
        ...

    async def read(self, session_id: str, after: int = 0) -> list[StoredEvent]:
        """Events of one session with ``seq > after``, in order."""
        ...

    async def read_decoded(
        self, session_id: str, decoder: EventDecoder[_T], after: int = 0
    ) -> list[_T]:
        """What :meth:`read` returns, each event passed through ``decoder``.

        The replay path: a store that keeps JSON text hands it to
        ``decoder.decode_rows`` without building envelopes, on its I/O thread.
        Decoder errors propagate unchanged, except that a payload that is not
        a JSON object raises ``StoreCorrupted``, as :meth:`read` would.
        """
        ...

    async def read_decoded_many(
        self,
        session_ids: Sequence[str],
        decoder: EventDecoder[_T],
        fold: Callable[[str, list[_T]], _R],
    ) -> dict[str, _R]:
        """``fold(session_id, events)`` of every session in ``session_ids``,
        its events read as :meth:`read_decoded` gives them.

        Bulk replay (rebuilding or auditing many sessions): a store that reads
        on an I/O thread makes one trip for the lot and calls ``fold`` there,
        as each session is decoded, so only one session's events are held at
        a time and only the results come back. ``fold`` must not call the
        store. Every id asked for is a key, in the order asked (a session
        without events folds ``[]``).
        """
        ...

    async def read_all(self, after: int = 0, limit: int | None = None) -> list[StoredEvent]:
        """The global ordered feed: events with ``position > after``."""
        ...

    async def session_ids(self) -> list[str]:
        """Every session that has at least one event, in order of first event."""
        ...

    async def erase(self, session_id: str, keep: Sequence[StoredEvent] = ()) -> Erasure:
        """Remove every event of ``session_id`` so that no byte of it stays
        in the store's files, and keep a content-free :class:`Erasure`.

        ``keep``: events (``seq`` running 1, 2, ...) that take the
        session's place in the same atomic step (a trim to the newest turns);
        empty, the session is gone: every read treats it as unknown.

        Returns:
            The erasure record kept.

        Raises:
            UnknownSession: the store holds no event of ``session_id``;
                nothing was changed.
            StoreError: nothing was erased.

        Cancellation: the erasure is never interrupted halfway: a cancelled
        call either erased the session or left it whole.
        """
        ...

    async def erasures(self) -> list[Erasure]:
        """The erasure records kept, oldest first.

        Cancellation: only reads; a cancelled call changed nothing.
        """
        ...

    async def acquire(self, session_id: str) -> None:
        """Become the single writer of ``session_id`` (no-op for one-process stores).

        Raises:
            SessionOwnedElsewhere: another process holds it.
        """
        ...

    async def release(self, session_id: str) -> None:
        """Give up ownership taken with :meth:`acquire`."""
        ...

    async def aclose(self) -> None:
        """Release every resource; later calls raise ``StoreError``."""
        ...


def check_batch(session_id: str, events: Sequence[StoredEvent], expected_version: int) -> None:
    """Raise ``ValueError`` unless ``session_id`` is non-empty UTF-8 text, and
    ``events`` belong to it with ``seq`` running ``expected_version + 1, + 2, ...``
    (shared by every store)."""
    if not isinstance(session_id, str) or not session_id:
        raise ValueError("a session id must be a non-empty string")
    if not session_id.isascii():  # (ASCII is UTF-8: no bytes to build)
        try:
            session_id.encode("utf-8")
        except UnicodeEncodeError:
            raise ValueError("a session id must be valid Unicode text") from None
    # Walked by index: every append of every store checks its batch here,
    # and an index makes no iterator for the cyclic collector.
    i = 0
    n = len(events)
    while i < n:
        ev = events[i]
        i += 1
        if ev.session_id != session_id:
            raise ValueError(f"event for {ev.session_id!r} in a batch for {session_id!r}")
        if ev.seq != expected_version + i:
            raise ValueError(f"event seq {ev.seq} where {expected_version + i} was expected")


def damage(
    where: str,
    session_id: str,
    items: list[tuple[int, _I]],
    decode_one: Callable[[_I], object],
) -> StoreCorrupted:
    """After a decoder raised ``PayloadNotJSON`` for a batch: decode the
    ``(seq, item)`` pairs again one by one (rare) and name the damaged event."""
    for seq, item in items:
        try:
            decode_one(item)
        except PayloadNotJSON as exc:
            error = StoreCorrupted(f"{where}session {session_id!r} seq {seq}: {exc}")
            error.__cause__ = exc
            return error
    # A decoder that fails only on the whole batch: name the session.
    return StoreCorrupted(f"{where}session {session_id!r}: a payload is not JSON")


def decode_events(
    session_id: str, events: Sequence[StoredEvent], decoder: EventDecoder[_T]
) -> list[_T]:
    """``decoder.decode`` of each of ``events``; a payload the decoder finds
    is not JSON is ``StoreCorrupted`` naming the event."""
    decode = decoder.decode
    try:
        return [decode(ev) for ev in events]
    except PayloadNotJSON:
        error = damage("", session_id, [(ev.seq, ev) for ev in events], decode)
        raise error from error.__cause__


class BaseEventStore(ABC):
    """An :class:`EventStore` whose every method has a default over
    :meth:`read`, except :meth:`append` and :meth:`read` themselves.

    A store of one's own subclasses it and writes:

    - :meth:`append` (:meth:`check_batch` checks the batch) and :meth:`read`;
    - :meth:`session_ids` or :meth:`read_all`, whichever the store keeps
      (each has a default over the other; a store must write one);
    - :meth:`erase` and :meth:`erasures` to support erasure (the defaults
      refuse with ``StoreError``);
    - :meth:`acquire` and :meth:`release` if several processes share it
      (the defaults do nothing: a store for one process needs no owner);
    - :meth:`aclose` if it holds anything (the default holds nothing).

    The defaults read a whole session per call, which suits a store that
    reads a session in one query or holds it in memory; the bundled stores
    replace them with reads on their own I/O threads. Every default is a
    plain ``await`` of the methods above: it checkpoints where they do.
    :class:`~turnledger.testing.EventStoreContract` checks a subclass.
    """

    #: Raise ``ValueError`` unless a batch fits its session and version.
    check_batch = staticmethod(check_batch)

    @abstractmethod
    async def append(
        self, session_id: str, events: Sequence[StoredEvent], expected_version: int
    ) -> int:
        """See :meth:`EventStore.append`. The events' ``position`` is for the
        store to give (it orders the default :meth:`read_all`)."""

    @abstractmethod
    async def read(self, session_id: str, after: int = 0) -> list[StoredEvent]:
        """Events of one session with ``seq > after`` (all of them for
        ``after < 0``), in order; ``[]`` for an unknown session."""

    async def read_decoded(
        self, session_id: str, decoder: EventDecoder[_T], after: int = 0
    ) -> list[_T]:
        """:meth:`read` through ``decoder.decode``; a payload the decoder
        finds is not JSON is ``StoreCorrupted`` naming the event."""
        return decode_events(session_id, await self.read(session_id, after), decoder)

    async def read_decoded_many(
        self,
        session_ids: Sequence[str],
        decoder: EventDecoder[_T],
        fold: Callable[[str, list[_T]], _R],
    ) -> dict[str, _R]:
        """``fold`` of each session's :meth:`read_decoded`, once per id, in
        the order asked."""
        out: dict[str, _R] = {}
        for sid in session_ids:
            if sid not in out:
                out[sid] = fold(sid, await self.read_decoded(sid, decoder))
        return out

    async def session_ids(self) -> list[str]:
        """Every session with at least one event, in order of first event:
        by default, the sessions of :meth:`read_all` in its order."""
        if type(self).read_all is BaseEventStore.read_all:
            raise TypeError(f"{type(self).__name__} must define session_ids() or read_all()")
        return list(dict.fromkeys(ev.session_id for ev in await self.read_all()))

    async def read_all(self, after: int = 0, limit: int | None = None) -> list[StoredEvent]:
        """The global feed: events with ``position > after``, in position
        order, at most ``limit``. By default every session's :meth:`read`,
        merged by ``position``.

        Raises:
            StoreError: an event of :meth:`read` has no position.
        """
        if type(self).session_ids is BaseEventStore.session_ids:
            raise TypeError(f"{type(self).__name__} must define session_ids() or read_all()")
        feed: list[StoredEvent] = []
        for sid in await self.session_ids():
            feed += await self.read(sid)
        if any(type(ev.position) is not int for ev in feed):
            raise StoreError(f"{type(self).__name__}.read() gave an event without a position")
        feed.sort(key=_position)
        feed = [ev for ev in feed if _position(ev) > after]
        return feed if limit is None else feed[:limit]

    async def erase(self, session_id: str, keep: Sequence[StoredEvent] = ()) -> Erasure:
        """Refused: a store of one's own that can remove its bytes writes
        this (see :meth:`EventStore.erase`).

        Raises:
            StoreError: always; nothing was changed.

        Cancellation: nothing to interrupt.
        """
        raise StoreError(f"{type(self).__name__} does not support erasure")

    async def erasures(self) -> list[Erasure]:
        """None kept: a store that does not erase has no erasure records."""
        return []

    async def acquire(self, session_id: str) -> None:  # noqa: B027 (does nothing on purpose)
        """Nothing: a store for one process needs no owner. A store shared
        between processes makes this process the single writer of
        ``session_id`` (see :meth:`EventStore.acquire`)."""

    async def release(self, session_id: str) -> None:  # noqa: B027
        """Nothing (see :meth:`acquire`)."""

    async def aclose(self) -> None:  # noqa: B027
        """Nothing to release."""


def _position(ev: StoredEvent) -> int:
    return ev.position or 0
