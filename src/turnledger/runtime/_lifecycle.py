"""Erasure and retention over a store: finding a subject's sessions, and
applying a :class:`~turnledger.sessions.RetentionPolicy` (what
``turnledger prune`` runs on a store no hub holds, and what
:meth:`Hub.prune` runs with its actors stopped first)."""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable, Iterable, Sequence
from typing import Any

from .._errors import UnknownSession
from ..events import Erasure, EventStore, PayloadNotJSON, StoredEvent
from ..sessions._retention import RetentionPolicy, RetentionStep, plan_retention, subject_of
from ._log import get_logger

__all__ = [
    "apply_step",
    "erase_sessions",
    "forks_of",
    "log_step",
    "plan_store",
    "prune_store",
    "sessions_of_subject",
    "with_forks",
]

#: Sessions read per trip when a whole store is scanned.
_SLICE = 256


class _Subjects:
    """A decoder that parses only a session's first event (its subject),
    for a scan over every session of a store."""

    def decode(self, stored: StoredEvent) -> str | None:
        return subject_of([stored]) if stored.seq == 1 else None

    def decode_rows(
        self, session_id: str, rows: Iterable[tuple[int, str, int, str | bytes]]
    ) -> list[str | None]:
        out: list[str | None] = []
        for seq, tag, _version, text in rows:
            if seq != 1 or tag != "session_started":
                out.append(None)
                continue
            try:
                payload: Any = json.loads(text)
            except ValueError as exc:
                raise PayloadNotJSON(f"the payload is not JSON: {exc}") from exc
            if type(payload) is not dict:
                raise PayloadNotJSON("the payload is not a JSON object")
            subject = payload.get("subject")
            out.append(subject if isinstance(subject, str) else None)
        return out


def _first(_sid: str, subjects: list[str | None]) -> str | None:
    return subjects[0] if subjects else None


class _Sources:
    """A decoder that parses only a session's second event: the source it
    names if it is a fork (``session_forked``), else ``None``."""

    def decode(self, stored: StoredEvent) -> str | None:
        if stored.seq != 2 or stored.tag != "session_forked":
            return None
        source = stored.payload.get("source")
        return source if isinstance(source, str) else None

    def decode_rows(
        self, session_id: str, rows: Iterable[tuple[int, str, int, str | bytes]]
    ) -> list[str | None]:
        out: list[str | None] = []
        for seq, tag, _version, text in rows:
            if seq != 2 or tag != "session_forked":
                out.append(None)
                continue
            try:
                payload: Any = json.loads(text)
            except ValueError as exc:
                raise PayloadNotJSON(f"the payload is not JSON: {exc}") from exc
            source = payload.get("source") if type(payload) is dict else None
            out.append(source if isinstance(source, str) else None)
        return out


def _second(_sid: str, sources: list[str | None]) -> str | None:
    return sources[1] if len(sources) > 1 else None


async def forks_of(store: EventStore, session_id: str) -> list[str]:
    """Every fork of ``session_id`` in ``store``, and every fork of those,
    the deepest first (the order to erase them in: a fork never outlives
    the session it shares turns with).

    Cancellation: only reads; a cancelled scan changed nothing.
    """
    ids = await store.session_ids()
    decoder = _Sources()
    children: dict[str, list[str]] = {}  # source -> its forks
    for i in range(0, len(ids), _SLICE):
        got = await store.read_decoded_many(ids[i : i + _SLICE], decoder, _second)
        for sid, source in got.items():
            if source is not None:
                children.setdefault(source, []).append(sid)
    out: list[str] = []
    seen = {session_id}

    def walk(parent: str) -> None:
        for child in children.get(parent, ()):
            if child not in seen:
                seen.add(child)
                walk(child)
                out.append(child)

    walk(session_id)
    return out


async def _sources(store: EventStore) -> set[str]:
    ids = await store.session_ids()
    found: set[str] = set()
    for i in range(0, len(ids), _SLICE):
        got = await store.read_decoded_many(ids[i : i + _SLICE], _Sources(), _second)
        found.update(source for source in got.values() if source is not None)
    return found


async def with_forks(store: EventStore, session_ids: Sequence[str]) -> list[str]:
    """``session_ids`` with the forks of each (:func:`forks_of`) before it:
    the sessions an erasure of ``session_ids`` erases, in its order.

    Cancellation: only reads; a cancelled scan changed nothing.
    """
    out: list[str] = []
    for sid in session_ids:
        for one in (*await forks_of(store, sid), sid):
            if one not in out:
                out.append(one)
    return out


async def sessions_of_subject(store: EventStore, subject: str) -> list[str]:
    """Every session of ``store`` whose ``SessionStarted`` names ``subject``,
    in order of first event.

    Cancellation: only reads; a cancelled scan changed nothing.
    """
    ids = await store.session_ids()
    found: list[str] = []
    decoder = _Subjects()
    for i in range(0, len(ids), _SLICE):
        got = await store.read_decoded_many(ids[i : i + _SLICE], decoder, _first)
        found += [sid for sid, named in got.items() if named == subject]
    return found


async def plan_store(
    store: EventStore, policy: RetentionPolicy, now: float, *, skip: Sequence[str] = ()
) -> list[RetentionStep]:
    """What ``policy`` (with each session's own) does to every session of
    ``store`` at time ``now``, sessions in ``skip`` left out.

    Cancellation: only reads; a cancelled plan changed nothing.
    """
    steps: list[RetentionStep] = []
    # A session that forks share turns with is neither trimmed (their
    # turns are counted on its events) nor erased for idleness while they
    # are kept: a fork holds its source; an explicit erasure takes both.
    left_out = set(skip) | await _sources(store)
    for sid in await store.session_ids():
        if sid in left_out:
            continue
        step = plan_retention(sid, await store.read(sid), policy, now)
        if step is not None:
            steps.append(step)
    return steps


async def apply_step(store: EventStore, step: RetentionStep) -> Erasure:
    """Erase the session (or cut its oldest turns) as ``step`` says.

    Raises:
        UnknownSession: it is gone already.

    Cancellation: as the store's :meth:`~turnledger.events.EventStore.erase`:
    it happened or it did not.
    """
    record = await store.erase(step.session_id, step.keep)
    log_step(step.session_id, record, "trim" if step.keep else "erase", step.turns)
    return record


def log_step(session_id: str, record: Erasure, action: str, turns: int | None = None) -> None:
    """One ``session_erased`` or ``session_trimmed`` line (counts and the
    id's hash only: no content)."""
    fields: dict[str, Any] = {
        "session_id": session_id,
        "session_hash": record.session_hash,
        "events": record.events,
        "kept": record.kept,
    }
    if turns is not None:
        fields["turns"] = turns
    name = "session_trimmed" if action == "trim" else "session_erased"
    get_logger().info(name, **fields)


async def erase_all(
    store: EventStore, session_ids: Sequence[str], erase: Callable[[str], Awaitable[Erasure]]
) -> list[Erasure]:
    """``erase`` each of ``session_ids``; one gone meanwhile is skipped."""
    out = []
    for sid in session_ids:
        try:
            out.append(await erase(sid))
        except UnknownSession:
            continue
    return out


async def erase_sessions(store: EventStore, session_ids: Sequence[str]) -> list[Erasure]:
    """Erase each of ``session_ids`` from a store no hub is running on (the
    ``turnledger erase`` command), logging each (``session_erased``). The
    forks of each (:func:`forks_of`) are erased before it, as
    :meth:`Hub.erase` erases them; their records come first in the result.

    Raises:
        UnknownSession: one of them is not in the store; the ones before it
            are erased, nothing else changed.
        StoreError, SessionOwnedElsewhere: the store refused one.

    Cancellation: each erasure happened or did not; the ones done stay done.
    """
    out = []
    for sid in session_ids:
        for fork in await forks_of(store, sid):
            record = await store.erase(fork)
            log_step(fork, record, "erase")
            out.append(record)
        record = await store.erase(sid)
        log_step(sid, record, "erase")
        out.append(record)
    return out


async def prune_store(
    store: EventStore,
    policy: RetentionPolicy,
    *,
    now: float,
    dry_run: bool = False,
    on_step: Callable[[RetentionStep, Erasure | None], object] | None = None,
) -> list[RetentionStep]:
    """Apply ``policy`` (with each session's own) to a store no hub is
    running on (the ``turnledger prune`` command): erase the sessions idle
    since before ``now - max_idle``, trim the ones with too many turns. Each
    step is logged; ``on_step(step, record)`` hears of each as it is done
    (``record`` ``None`` with ``dry_run``, which changes nothing).

    Returns:
        The steps taken (or, with ``dry_run``, that would be).

    Raises:
        StoreError, SessionOwnedElsewhere: the store refused a step; the
            ones before it are done.

    Cancellation: each step happened or did not; the ones done stay done.
    """
    steps = await plan_store(store, policy, now)
    done = []
    for step in steps:
        record = None
        if not dry_run:
            try:
                record = await apply_step(store, step)
            except UnknownSession:
                continue  # gone meanwhile
        done.append(step)
        if on_step is not None:
            on_step(step, record)
    return done
