"""Reopening a session from its latest snapshot, and writing snapshots off
the turn's critical path (see :mod:`turnledger.sessions._snapshot`).

An actor reopens from the snapshot's head: the older part is read when an
older turn is first needed (by the store's loader, on the thread that needs
it). If it is then found missing or damaged, that operation fails with
:class:`SnapshotInvalid`, a ``snapshot_ignored`` warning says why, and the
snapshot is dropped, so the session's next open replays in full.
"""

from __future__ import annotations

import contextlib
from typing import Any, Final

import trio

from .._errors import ReplayError
from ..events import DEFAULT_CODEC, EventStore
from ..sessions._forks import replay_stored
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

#: Heads at least this large are checked and parsed on a worker thread (a
#: 10,000-turn session's head is about 250 kB: about 2 ms of work, less than a
#: worker thread's round trip on a busy machine).
_THREAD_BYTES: Final = 1024 * 1024
#: Rows to fold_items() items (pure, shared: it keeps no state between reads).
_DECODER: Final = StateDecoder(DEFAULT_CODEC)


def _on_damage(snapshots: SnapshotStore, snap: Snapshot, log: Any) -> Any:
    """What to do when the older part of ``snap`` is found damaged, from
    whichever thread needed it: log why and drop the snapshot."""
    token = trio.lowlevel.current_trio_token()
    session_id, version = snap.session_id, snap.version

    async def drop() -> None:
        try:
            await snapshots.drop(session_id)
        except Exception as exc:  # the next open finds it damaged again
            log.warning("snapshot_drop_failed", version=version, error=type(exc).__name__)

    def damaged(exc: SnapshotInvalid) -> None:
        log.warning("snapshot_ignored", version=version, reason=str(exc))
        with contextlib.suppress(trio.RunFinishedError):
            token.run_sync_soon(trio.lowlevel.spawn_system_task, drop)

    return damaged


async def _from_snapshot(
    store: EventStore, snap: Snapshot, snapshots: SnapshotStore, log: Any, lazy: bool
) -> SessionState:
    """The state of ``snap`` with the events after it folded in (its older
    part still unread if ``lazy``).

    Raises:
        SnapshotInvalid: the snapshot is unusable (and why).
    """
    damaged = _on_damage(snapshots, snap, log) if lazy else None
    if len(snap.body) >= _THREAD_BYTES:
        state = await trio.to_thread.run_sync(load_snapshot, snap, damaged)
    else:
        state = load_snapshot(snap, damaged)
    if not lazy:
        await trio.to_thread.run_sync(_settle, state)
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


def _settle(state: SessionState) -> None:
    """Read the older part of a state reopened from a snapshot, if any."""
    for _ in state.turns:
        break
    for _ in state.endings:
        break


async def recover_state(
    store: EventStore,
    session_id: str,
    snapshots: SnapshotStore | None,
    log: Any,
    *,
    lazy: bool = True,
) -> tuple[SessionState, int]:
    """The session's state, from its latest usable snapshot plus the events
    after it, or by full replay; and the version of the snapshot used (0
    for none).

    A snapshot that is damaged, outdated or not this session's is ignored:
    the session replays in full, and a ``snapshot_ignored`` warning says why.
    With ``lazy`` (an actor's reopen) the snapshot's older part is read only
    when first needed (see the module); without, it is read and checked
    here, and a damaged one means a full replay too.

    Cancellation: reads only; a cancelled call changed nothing.
    """
    if snapshots is not None:
        snap = await snapshots.latest(session_id)
        if snap is not None:
            try:
                state = await _from_snapshot(store, snap, snapshots, log, lazy)
            except SnapshotInvalid as exc:
                log.warning("snapshot_ignored", version=snap.version, reason=str(exc))
            else:
                log.debug("snapshot_used", version=snap.version, bytes=len(snap.body))
                return state, snap.version
    return await replay_stored(store, session_id), 0


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
    snapshot taken before the session branched, if any). Nor is a fork: its
    snapshot would hold a copy of the turns it shares with its source,
    which the source's erasure could not reach. Nor is one with pinned items
    or summaries: they are rebuilt from their events too.

    Cancellation: a cancelled call saved the snapshot or did not.
    """
    if state.branches or state.fork is not None or state.pins or state.summaries:
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
