"""An in-memory event store: for tests, demos and single-process services
that do not need history to survive a restart."""

from __future__ import annotations

import json
import time
from collections.abc import Sequence
from typing import Any, Final

import trio

from ..._errors import ConcurrencyConflict, StoreError, UnknownSession
from ...events import Erasure, StoredEvent, session_hash
from ...events._envelope import envelope

# Re-exported for the PostgreSQL store until it imports it from ._common.
from ._common import HeldEvents, check_batch, renumbered
from ._payloads import loads_payload

__all__ = ["MemoryStore"]

#: ``json.dumps(payload, allow_nan=False)`` without building an encoder per call.
_dumps = json.JSONEncoder(allow_nan=False).encode
#: ``json.loads``, exactly, through orjson.
_loads = loads_payload
#: Nesting beyond this takes the JSON round trip (which also finds cycles).
_MAX_DEPTH: Final = 32
#: Integers this large or larger take the round trip: writing one may exceed
#: ``sys.get_int_max_str_digits()`` (never below 640 digits; this is 603).
_BIG: Final = 1 << 2000


class _NotPlain(Exception):
    """The value is outside the plain subset: take the JSON round trip."""


def json_copy(payload: Any) -> Any:
    """``loads(dumps(payload, allow_nan=False))``: what a JSON store gives back.

    Plain values (dicts with ``str`` keys, lists, ``str``, ``bool``, ``None``,
    ``int`` below 2**2000 and finite floats, all of exactly these types) come
    back from the round trip equal and of the same types, so they are copied
    directly, several times faster; anything else (a tuple, a subclass, a key
    that is not a string, NaN, a cycle) takes the round trip itself, which
    converts it or raises ``TypeError``/``ValueError`` exactly as before.
    """
    try:
        # (A dict first: every payload the codec writes is one.)
        return _plain_dict(payload, 0) if type(payload) is dict else _plain(payload, 0)
    except _NotPlain:
        return _loads(_dumps(payload))


def _plain(value: Any, depth: int) -> Any:
    t = type(value)
    if t is str or t is bool or value is None:
        return value
    if t is int:
        if -_BIG < value < _BIG:
            return value
        raise _NotPlain
    if t is float:
        # NaN and the infinities are not JSON (inf - inf is NaN).
        if value - value == 0.0:
            return value
        raise _NotPlain
    if depth >= _MAX_DEPTH:
        raise _NotPlain
    if t is dict:
        return _plain_dict(value, depth)
    if t is list:
        return [_plain(v, depth + 1) for v in value]
    raise _NotPlain


def _plain_dict(value: dict[Any, Any], depth: int) -> dict[str, Any]:
    out = {}
    for k, v in value.items():
        if type(k) is not str:
            raise _NotPlain
        tv = type(v)
        if tv is str or tv is bool or v is None or (tv is int and -_BIG < v < _BIG):
            out[k] = v  # the usual field: no call
        else:
            out[k] = _plain(v, depth + 1)
    return out


def _held(session_id: str, ev: StoredEvent, seq: int, position: int) -> StoredEvent:
    """The envelope the store keeps for ``ev``: a JSON copy of its payload."""
    try:
        payload = json_copy(ev.payload)
    except (TypeError, ValueError) as exc:
        raise StoreError(f"payload is not JSON-able: {exc}") from exc
    return envelope(session_id, seq, ev.tag, ev.schema_version, payload, ev.recorded_at, position)


class MemoryStore(HeldEvents):
    """Keeps every stream in a dict. Payloads are copied through JSON on the
    way in, so the store behaves like a durable one: what you read back is
    what a JSON store would give, and a payload that is not JSON-able is
    refused with the whole batch."""

    def __init__(self) -> None:
        self._streams: dict[str, list[StoredEvent]] = {}
        self._feed: list[StoredEvent] = []
        self._erasures: list[Erasure] = []
        self._closed = False

    def _check_open(self) -> None:
        if self._closed:
            raise StoreError("the store is closed")

    async def append(
        self, session_id: str, events: Sequence[StoredEvent], expected_version: int
    ) -> int:
        await trio.lowlevel.checkpoint()
        if self._closed:
            raise StoreError("the store is closed")
        if not events:
            return expected_version
        check_batch(session_id, events, expected_version)
        stream = self._streams.get(session_id)
        if (0 if stream is None else len(stream)) != expected_version:
            raise ConcurrencyConflict(session_id, expected_version, len(stream or ()))
        # One JSON copy per payload (the round trip through the standard
        # library's writer and the exact reader, or its plain equivalent)
        # and one new envelope per event, built directly; all of them before
        # any is kept. Every event passed check_batch: its session id and
        # seq are the ones given. (Walked by index, and a batch of one, the
        # most common, without a list of its own: each object not made is
        # one the cyclic collector does not count.)
        feed = self._feed
        position = len(feed)
        n = len(events)
        if n == 1:
            held = _held(session_id, events[0], expected_version + 1, position + 1)
            if stream is None:
                self._streams[session_id] = [held]
            else:
                stream.append(held)
            feed.append(held)
            return expected_version + 1
        stored: list[StoredEvent] = []
        i = 0
        while i < n:
            ev = events[i]
            i += 1
            stored.append(_held(session_id, ev, expected_version + i, position + i))
        if stream is None:
            self._streams[session_id] = stored
        else:
            stream += stored
        feed += stored
        return expected_version + n

    async def erase(self, session_id: str, keep: Sequence[StoredEvent] = ()) -> Erasure:
        """Drop the session's events (``keep`` takes their place); the
        feed's positions are numbered anew.

        Cancellation: all or nothing (nothing awaits once it starts).
        """
        await trio.lowlevel.checkpoint()
        self._check_open()
        stream = self._streams.get(session_id)
        if not stream:
            raise UnknownSession(session_id)
        check_batch(session_id, keep, 0)
        held = [_held(session_id, ev, ev.seq, 0) for ev in keep]
        self._reindex(renumbered(self._feed, session_id, held))
        record = Erasure(session_hash(session_id), time.time(), len(stream), len(held))
        self._erasures.append(record)
        return record

    async def erasures(self) -> list[Erasure]:
        """The erasure records, oldest first.

        Cancellation: only reads; a cancelled call changed nothing.
        """
        await trio.lowlevel.checkpoint()
        return list(self._erasures)

    async def acquire(self, session_id: str) -> None:
        await trio.lowlevel.checkpoint()

    async def release(self, session_id: str) -> None:
        await trio.lowlevel.checkpoint()

    async def aclose(self) -> None:
        self._closed = True
