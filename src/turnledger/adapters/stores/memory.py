"""An in-memory event store: for tests, demos and single-process services
that do not need history to survive a restart."""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from typing import TypeVar

import attrs
import trio

from ..._errors import ConcurrencyConflict, StoreError
from ...events import EventDecoder, PayloadNotJSON, StoredEvent
from ._payloads import damage

__all__ = ["HeldEvents", "MemoryStore", "check_batch"]

_T = TypeVar("_T")
_R = TypeVar("_R")


def check_batch(session_id: str, events: Sequence[StoredEvent], expected_version: int) -> None:
    """Raise ``ValueError`` unless ``session_id`` is non-empty UTF-8 text, and
    ``events`` belong to it with ``seq`` running ``expected_version + 1, + 2, ...``
    (shared by every store)."""
    if not isinstance(session_id, str) or not session_id:
        raise ValueError("a session id must be a non-empty string")
    try:
        session_id.encode("utf-8")
    except UnicodeEncodeError:
        raise ValueError("a session id must be valid Unicode text") from None
    for i, ev in enumerate(events, start=expected_version + 1):
        if ev.session_id != session_id:
            raise ValueError(f"event for {ev.session_id!r} in a batch for {session_id!r}")
        if ev.seq != i:
            raise ValueError(f"event seq {ev.seq} where {i} was expected")


class HeldEvents:
    """The reads of a store that holds every event in memory, parsed: the
    memory store, and the journal (which loads its file on open). A
    subclass fills ``_streams`` (session id -> its events, in order) and
    ``_feed`` (every event in position order) and says when it is closed."""

    _streams: dict[str, list[StoredEvent]]
    _feed: list[StoredEvent]

    def _check_open(self) -> None:
        raise NotImplementedError

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
        decode = decoder.decode
        events = self._streams.get(session_id, [])[max(after, 0) :]
        try:
            return [decode(ev) for ev in events]
        except PayloadNotJSON:
            error = damage("", session_id, [(ev.seq, ev) for ev in events], decode)
            raise error from error.__cause__

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


class MemoryStore(HeldEvents):
    """Keeps every stream in a dict. Payloads are copied through JSON on the
    way in, so the store behaves like a durable one: what you read back is
    what a JSON store would give, and a payload that is not JSON-able is
    refused with the whole batch."""

    def __init__(self) -> None:
        self._streams: dict[str, list[StoredEvent]] = {}
        self._feed: list[StoredEvent] = []
        self._closed = False

    def _check_open(self) -> None:
        if self._closed:
            raise StoreError("the store is closed")

    async def append(
        self, session_id: str, events: Sequence[StoredEvent], expected_version: int
    ) -> int:
        await trio.lowlevel.checkpoint()
        self._check_open()
        if not events:
            return expected_version
        check_batch(session_id, events, expected_version)
        stream = self._streams.get(session_id, [])
        if len(stream) != expected_version:
            raise ConcurrencyConflict(session_id, expected_version, len(stream))
        try:
            copies = [
                attrs.evolve(
                    ev,
                    payload=json.loads(json.dumps(ev.payload, allow_nan=False)),
                )
                for ev in events
            ]
        except (TypeError, ValueError) as exc:
            raise StoreError(f"payload is not JSON-able: {exc}") from exc
        position = len(self._feed)
        stored = []
        for ev in copies:
            position += 1
            stored.append(attrs.evolve(ev, position=position))
        self._streams.setdefault(session_id, stream).extend(stored)
        self._feed.extend(stored)
        return expected_version + len(events)

    async def acquire(self, session_id: str) -> None:
        await trio.lowlevel.checkpoint()

    async def release(self, session_id: str) -> None:
        await trio.lowlevel.checkpoint()

    async def aclose(self) -> None:
        self._closed = True
