"""Reopening a session from its latest snapshot, and writing snapshots off
the turn's critical path (see :mod:`turnledger.sessions._snapshot`)."""

from __future__ import annotations

from typing import Any, Final

import trio

from .._errors import ReplayError
from ..events import DEFAULT_CODEC, EventStore
from ..sessions._machine import SessionState
from ..sessions._replay import StateDecoder, fold_items
from ..sessions._snapshot import (
    Snapshot,
    SnapshotInvalid,
    SnapshotStore,
    load_snapshot,
    take_snapshot,
)

__all__ = ["recover_state", "write_snapshot"]

#: Bodies at least this large are checked and parsed on a worker thread.
_THREAD_BYTES: Final = 256 * 1024
#: Rows to fold_items() items (pure, shared: it keeps no state between reads).
_DECODER: Final = StateDecoder(DEFAULT_CODEC)


async def _from_snapshot(store: EventStore, snap: Snapshot) -> SessionState:
    """The state of ``snap`` with the events after it folded in.

    Raises:
        SnapshotInvalid: the snapshot is unusable (and why).
    """
    if len(snap.body) >= _THREAD_BYTES:
        state = await trio.to_thread.run_sync(load_snapshot, snap)
    else:
        state = load_snapshot(snap)
    tail = await store.read(snap.session_id, after=snap.version - 1)
    anchor = tail[0] if tail else None
    if (
        anchor is None
        or anchor.seq != snap.version
        or anchor.tag != snap.anchor_tag
        or anchor.recorded_at != snap.anchor_at
    ):
        raise SnapshotInvalid(
            f"not this session's: event {snap.version} of the store is not the one "
            "the snapshot was taken after (the session was erased or rewritten)"
        )
    try:
        return fold_items([_DECODER.decode(ev) for ev in tail[1:]], state)
    except ReplayError as exc:
        raise SnapshotInvalid(f"the events after it do not follow it: {exc}") from exc


async def recover_state(
    store: EventStore, session_id: str, snapshots: SnapshotStore | None, log: Any
) -> tuple[SessionState, int]:
    """The session's state, from its latest usable snapshot plus the events
    after it, or by full replay; and the version of the snapshot used (0
    for none).

    A snapshot that is damaged, outdated or not this session's is ignored:
    the session replays in full, and a ``snapshot_ignored`` warning says why.

    Cancellation: reads only; a cancelled call changed nothing.
    """
    if snapshots is not None:
        snap = await snapshots.latest(session_id)
        if snap is not None:
            try:
                state = await _from_snapshot(store, snap)
            except SnapshotInvalid as exc:
                log.warning("snapshot_ignored", version=snap.version, reason=str(exc))
            else:
                log.debug("snapshot_used", version=snap.version, bytes=len(snap.body))
                return state, snap.version
    # The fast fold (sessions/_replay.py): the state replay() gives, or the
    # same ReplayError, without building the events of common turns.
    return fold_items(await store.read_decoded(session_id, _DECODER)), 0


async def write_snapshot(
    snapshots: SnapshotStore,
    session_id: str,
    state: SessionState,
    anchor_tag: str,
    anchor_at: float,
    log: Any,
) -> bool:
    """Take ``state``'s snapshot on a worker thread and save it; a failure
    is logged (``snapshot_failed``), never raised: a snapshot is an
    optimisation, the events stay the truth.

    A session that has branched is not snapshotted: a snapshot holds one
    path of turns, and the tree is rebuilt from the events (after the last
    snapshot taken before the session branched, if any).

    Cancellation: a cancelled call saved the snapshot or did not.
    """
    if state.branches:
        return False
    try:
        snap = await trio.to_thread.run_sync(
            take_snapshot, session_id, state, anchor_tag, anchor_at
        )
        await snapshots.save(snap)
    except Exception as exc:
        log.warning("snapshot_failed", version=state.version, error=type(exc).__name__)
        return False
    log.debug("snapshot_written", version=state.version, bytes=len(snap.body))
    return True
