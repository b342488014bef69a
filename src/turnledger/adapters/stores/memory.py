"""An in-memory event store: for tests, demos and single-process services
that do not need history to survive a restart."""

from __future__ import annotations

import json
from collections.abc import Sequence

import trio

from ..._errors import ConcurrencyConflict, StoreError
from ...events import StoredEvent

# Re-exported for the PostgreSQL store until it imports it from ._common.
from ._common import HeldEvents, check_batch
from ._payloads import loads_payload

__all__ = ["MemoryStore"]

#: ``json.dumps(payload, allow_nan=False)`` without building an encoder per call.
_dumps = json.JSONEncoder(allow_nan=False).encode
#: ``json.loads``, exactly, through orjson.
_loads = loads_payload


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
        # One JSON round trip per payload (the standard library's writer,
        # the exact reader) and one new envelope per event, built directly.
        position = len(self._feed)
        stored: list[StoredEvent] = []
        for ev in events:
            try:
                payload = _loads(_dumps(ev.payload))
            except (TypeError, ValueError) as exc:
                raise StoreError(f"payload is not JSON-able: {exc}") from exc
            position += 1
            stored.append(
                StoredEvent(
                    ev.session_id,
                    ev.seq,
                    ev.tag,
                    ev.schema_version,
                    payload,
                    ev.recorded_at,
                    position,
                )
            )
        self._streams.setdefault(session_id, stream).extend(stored)
        self._feed.extend(stored)
        return expected_version + len(events)

    async def acquire(self, session_id: str) -> None:
        await trio.lowlevel.checkpoint()

    async def release(self, session_id: str) -> None:
        await trio.lowlevel.checkpoint()

    async def aclose(self) -> None:
        self._closed = True
