"""The ``EventStore`` port: what the session runtime needs from a store."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from typing import Protocol, TypeVar, runtime_checkable

from ._envelope import StoredEvent

__all__ = ["EventDecoder", "EventStore", "PayloadNotJSON"]

_T = TypeVar("_T")
_R = TypeVar("_R")


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
