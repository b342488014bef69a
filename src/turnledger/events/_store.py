"""The ``EventStore`` port: what the session runtime needs from a store."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol, runtime_checkable

from ._envelope import StoredEvent

__all__ = ["EventStore"]


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
