"""The stored envelope: the only thing an event store ever sees."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import attrs

__all__ = ["StoredEvent"]


@attrs.frozen
class StoredEvent:
    """One event as stored: domain-agnostic, JSON-able payload.

    Stores never import event classes; they keep and return these records.
    """

    session_id: str
    #: 1-based position of the event within its session's stream.
    seq: int
    #: Stable wire tag (see :data:`turnledger.events.codec.WIRE_TAGS`).
    tag: str
    #: Schema version of the payload under ``tag``.
    schema_version: int
    #: JSON-able mapping produced by the codec.
    payload: Mapping[str, Any] = attrs.field(eq=True)
    #: Unix time (seconds) at which the event was recorded.
    recorded_at: float
    #: Global position in the store's ordered feed; assigned by the store.
    position: int | None = attrs.field(default=None, eq=False)


def _setters() -> tuple[Any, ...]:
    # The slot of each field, in order. StoredEvent has no validator,
    # converter or __attrs_post_init__ (tests/core/test_codec.py checks),
    # so storing the values through the slots builds the same object as
    # its __init__.
    names = [f.name for f in attrs.fields(StoredEvent)]
    return tuple(StoredEvent.__dict__[name].__set__ for name in names)


(_s0, _s1, _s2, _s3, _s4, _s5, _s6) = _setters()
_new = object.__new__


def envelope(
    session_id: str,
    seq: int,
    tag: str,
    schema_version: int,
    payload: Mapping[str, Any],
    recorded_at: float,
    position: int | None = None,
) -> StoredEvent:
    """``StoredEvent(session_id, seq, tag, ...)``, built through the slots.

    The frozen class's ``__init__`` sets each field through a bound
    ``object.__setattr__`` made per instance: ~40% slower, and one more
    object for the cyclic collector. Every event appended to a store is
    built twice (encoded, then held by the store), about six per turn.
    """
    ev: StoredEvent = _new(StoredEvent)
    _s0(ev, session_id)
    _s1(ev, seq)
    _s2(ev, tag)
    _s3(ev, schema_version)
    _s4(ev, payload)
    _s5(ev, recorded_at)
    _s6(ev, position)
    return ev
