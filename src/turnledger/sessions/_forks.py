"""Forks: a new session that starts with another session's turns, shared by
reference.

A fork's log begins with two events: its ``SessionStarted`` (the source's
settings) and :class:`~turnledger.events.SessionForked`, which names the
source, the source's version when it was forked, the branch and how many of
its turns the fork starts with. Nothing of those turns is copied: two rows,
whatever the length of the history, and the source's events are never
touched. Reading a fork resolves its first turns from the source's events
(up to that version, so what the source did later never shows), the
source's from its own source if it is a fork too, and so on.

:func:`fork_events` decides a fork (pure); :func:`fork_seed` is the state a
fork's events fold from, given its source's state; :func:`replay_stored` and
:func:`replay_resolved` read what a seed needs through the
:class:`~turnledger.events.EventStore` port (no I/O library of their own).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Final

from .._errors import ReplayError, UnknownBranch, UnknownSession, UnknownTurn
from ..events import (
    DEFAULT_CODEC,
    Event,
    EventCodec,
    EventStore,
    SessionForked,
    SessionId,
    SessionStarted,
    StoredEvent,
)
from ._branches import branch_records, find_branch
from ._history import Ending, Endings
from ._phases import Idle, SessionState
from ._replay import Item, StateDecoder, fold_items

__all__ = [
    "MAX_FORK_DEPTH",
    "fork_events",
    "fork_of",
    "fork_seed",
    "replay_resolved",
    "replay_sessions",
    "replay_stored",
    "resolve_seed",
    "seed_of",
]

#: Forks of forks a read follows at most (a longer chain is refused as damage).
MAX_FORK_DEPTH: Final = 64


def fork_events(
    source: SessionState, source_id: str, at_turn: int | None = None
) -> tuple[SessionStarted, SessionForked]:
    """The two events that start a fork of ``source`` (the state of session
    ``source_id``) sharing the first ``at_turn`` turns of its active branch
    (``None``: all of them).

    Raises:
        UnknownSession: ``source`` has no events.
        UnknownTurn: ``at_turn`` is not between 0 and the branch's length.
    """
    if source.config is None:
        raise UnknownSession(source_id, f"no session {source_id!r} to fork")
    n = len(source.turns)
    at = n if at_turn is None else at_turn
    if type(at) is not int or not 0 <= at <= n:
        raise UnknownTurn(
            f"no fork point {at_turn!r}: branch {source.active_branch} of {source_id!r} "
            f"has {n} turns (a fork keeps 0 to {n} of them)"
        )
    return source.config, SessionForked(
        SessionId(source_id), source.version, source.active_branch, at
    )


def fork_of(events: Sequence[Event | Item]) -> SessionForked | None:
    """The ``SessionForked`` of a fork's events (``None``: not a fork)."""
    if len(events) > 1:
        second = events[1]
        if isinstance(second, SessionForked):
            return second
    return None


def fork_seed(source: SessionState, forked: SessionForked) -> Idle:
    """The state a fork's events fold from: ``source`` (its source as it
    stood at ``forked.source_seq``)'s first ``forked.at_turn`` turns of
    ``forked.branch``, each request id of them known as committed.

    Raises:
        ReplayError: the source does not have that branch or those turns.
    """
    if source.version != forked.source_seq:
        raise ReplayError(
            f"the source {forked.source!r} is at version {source.version}, "
            f"the fork was made at {forked.source_seq}"
        )
    records = branch_records(
        source.branches, source.active_branch, source.turns, source.context_start
    )
    try:
        record = find_branch(records, forked.branch)
    except UnknownBranch as exc:
        raise ReplayError(f"the fork's source has no such branch: {exc}") from None
    if len(record.turns) < forked.at_turn:
        raise ReplayError(
            f"the fork keeps {forked.at_turn} turns of {forked.source!r}'s branch "
            f"{forked.branch}, which has {len(record.turns)}"
        )
    prefix = record.turns.upto(forked.at_turn)
    endings = Endings().record_all(
        [(t.request_id, Ending("committed", "", "", t.answer)) for t in prefix]
    )
    return Idle(
        turns=prefix,
        context_start=min(record.context_start, forked.at_turn),
        endings=endings,
    )


async def resolve_seed(
    store: EventStore,
    forked: SessionForked,
    codec: EventCodec = DEFAULT_CODEC,
    _chain: tuple[str, ...] = (),
) -> Idle:
    """:func:`fork_seed` of the source ``forked`` names, read from ``store``.

    Raises:
        ReplayError: the source is gone (erased) or shorter than the fork
            point, or the chain of forks loops or is too long.

    Cancellation: reads only; a cancelled call changed nothing.
    """
    source = forked.source
    if source in _chain or len(_chain) >= MAX_FORK_DEPTH:
        raise ReplayError(f"the chain of forks through {source!r} loops or is too long")
    events = await store.read_decoded(source, StateDecoder(codec))
    if len(events) < forked.source_seq:
        raise ReplayError(
            f"the source {source!r} of this fork holds {len(events)} events, not the "
            f"{forked.source_seq} it was forked at (it was erased)"
        )
    state = await replay_resolved(store, events[: forked.source_seq], codec, (*_chain, source))
    return fork_seed(state, forked)


async def replay_resolved(
    store: EventStore,
    events: Sequence[Event | Item],
    codec: EventCodec = DEFAULT_CODEC,
    _chain: tuple[str, ...] = (),
) -> SessionState:
    """``replay(events)``, with a fork's shared turns resolved from its
    source's events in ``store``. ``events`` may be typed events or the
    items of :class:`~turnledger.sessions._replay.StateDecoder` (folded by
    ``fold_items``, to the same state).

    Raises:
        ReplayError: the log does not fold, or a fork's source is gone.

    Cancellation: reads only; a cancelled call changed nothing.
    """
    forked = fork_of(events)
    if forked is None:
        return fold_items(events)
    return fold_items(events, await resolve_seed(store, forked, codec, _chain))


async def replay_stored(
    store: EventStore, session_id: str, codec: EventCodec = DEFAULT_CODEC
) -> SessionState:
    """The state of ``session_id`` replayed from ``store``, a fork's shared
    turns included (the initial state for a session with no events).

    Raises:
        ReplayError: the log does not fold, or a fork's source is gone.

    Cancellation: reads only; a cancelled call changed nothing.
    """
    items = await store.read_decoded(session_id, StateDecoder(codec))
    return await replay_resolved(store, items, codec)


async def seed_of(
    store: EventStore, stored: Sequence[StoredEvent], codec: EventCodec = DEFAULT_CODEC
) -> Idle | None:
    """The state a session's stored events fold from: ``None`` unless it
    is a fork (then :func:`resolve_seed` of its ``session_forked``).

    Raises:
        ReplayError: a fork whose source is gone.

    Cancellation: reads only; a cancelled call changed nothing.
    """
    if len(stored) < 2 or stored[1].tag != "session_forked":
        return None
    forked = codec.decode(stored[1])
    if not isinstance(forked, SessionForked):
        raise ReplayError("the second event is not a fork's")
    return await resolve_seed(store, forked, codec)


def _fold_or_defer(session_id: str, items: list[Item]) -> SessionState | list[Item]:
    # A fork's items are folded once its shared turns are resolved (that
    # reads its source's events: not here, on a store's I/O thread).
    if fork_of(items) is not None:
        return items
    return fold_items(items)


async def replay_sessions(
    store: EventStore, session_ids: Sequence[str], *, codec: EventCodec = DEFAULT_CODEC
) -> dict[str, SessionState]:
    """The state of each session in ``session_ids``, replayed from ``store``.

    One :meth:`~turnledger.events.EventStore.read_decoded_many`: stores that
    read on an I/O thread make one trip, from one snapshot, and fold each
    session there, so only one session's events are held at a time. A
    session without events has the initial state. For very many sessions,
    call it once per slice of ids to bound the memory of the result.

    The fold is :func:`~turnledger.sessions._replay.fold_items` over
    :class:`~turnledger.sessions._replay.StateDecoder`'s items: the state
    :func:`~turnledger.sessions.replay` would give, without building the
    events of common turns. A fork's shared turns are resolved from its
    source's events, after the bulk read.

    Cancellation: a cancelled call returns nothing and changes nothing; a
    store that reads on a thread may finish the read there and drop it.
    """
    got = await store.read_decoded_many(session_ids, StateDecoder(codec), _fold_or_defer)
    out: dict[str, SessionState] = {}
    for sid, value in got.items():
        if isinstance(value, list):
            forked = fork_of(value)
            assert forked is not None
            value = fold_items(value, await resolve_seed(store, forked, codec))
        out[sid] = value
    return out
