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
