"""Bulk replay: many sessions' states rebuilt from a store in one go."""

from __future__ import annotations

from collections.abc import Sequence

from ..events import DEFAULT_CODEC, Event, EventCodec, EventStore
from ._machine import SessionState, replay

__all__ = ["replay_sessions"]


def _fold(session_id: str, events: list[Event]) -> SessionState:
    return replay(events)


async def replay_sessions(
    store: EventStore, session_ids: Sequence[str], *, codec: EventCodec = DEFAULT_CODEC
) -> dict[str, SessionState]:
    """The state of each session in ``session_ids``, replayed from ``store``.

    One :meth:`~turnledger.events.EventStore.read_decoded_many`: stores that
    read on an I/O thread make one trip, from one snapshot, and fold each
    session there, so only one session's events are held at a time. A
    session without events has the initial state. For very many sessions,
    call it once per slice of ids to bound the memory of the result.
    """
    return await store.read_decoded_many(session_ids, codec, _fold)
