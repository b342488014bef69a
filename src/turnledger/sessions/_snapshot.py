"""Snapshots of a session's state (pure): what lets a long session reopen
from its latest snapshot plus the events after it instead of its first event.

A snapshot is the state's fields as JSON (the settings through the event
codec, so an old ``SessionStarted`` is upcast like any other), with a schema
version, the SHA-256 of its body and an *anchor*: the tag and recorded time
of the event it was taken after, so a snapshot of a session that was since
erased and recreated under the same id is not mistaken for the new one's.
Loading checks all three; a snapshot that fails any check raises
:class:`SnapshotInvalid` and the caller replays in full. The property that
matters (tests/core/test_snapshots.py): ``load(take(replay(e[:k]))) +
e[k:]`` folds to exactly ``replay(e)``.
"""

from __future__ import annotations

import gc
import hashlib
import json
from typing import Any, Final, Protocol

import attrs
import orjson

from ..events import DEFAULT_CODEC, RequestId, SessionStarted, ToolCall
from ._history import Ending, Endings, History, ToolResult, ToolRound, Turn
from ._phases import (
    AwaitingTools,
    Committed,
    Discarded,
    Idle,
    InFlight,
    Pending,
    SessionState,
    Streaming,
)

__all__ = [
    "SNAPSHOT_SCHEMA",
    "Snapshot",
    "SnapshotInvalid",
    "SnapshotStore",
    "load_snapshot",
    "take_snapshot",
]

#: The layout of a snapshot's body. Bump it whenever a field of the
#: session's state changes meaning: older snapshots are then ignored (the
#: session replays in full once, and the next snapshot is current).
SNAPSHOT_SCHEMA: Final = 1

_PHASES: Final[dict[str, type[Any]]] = {
    cls.__name__: cls for cls in (Idle, Pending, Streaming, AwaitingTools, Committed, Discarded)
}


class SnapshotInvalid(ValueError):
    """A snapshot cannot be used: damaged, outdated or not this session's.
    The message says which; the caller replays the session in full."""


@attrs.frozen
class Snapshot:
    """A session's state after event ``version``, as a store keeps it."""

    session_id: str
    #: The seq of the last event folded into it.
    version: int
    #: :data:`SNAPSHOT_SCHEMA` when it was taken.
    schema: int
    #: SHA-256 (hex) of ``body``.
    checksum: str
    #: Tag and recorded time of event ``version``: the session it belongs to.
    anchor_tag: str
    anchor_at: float
    body: bytes = attrs.field(repr=False)


class SnapshotStore(Protocol):
    """Where a store's snapshots are kept: the latest one of each session.

    Bundled: :class:`~turnledger.adapters.stores.SQLiteSnapshots` (a file
    of its own, beside a SQLite database or a journal),
    :class:`~turnledger.adapters.stores.PostgresSnapshots` and
    :class:`~turnledger.adapters.stores.MemorySnapshots`. A snapshot holds a
    session's content: an erasure drops it (:meth:`drop`) with the events.
    """

    async def save(self, snapshot: Snapshot) -> None:
        """Keep ``snapshot`` as its session's latest unless a later one is kept.

        Cancellation: either kept or not; the previous one stays otherwise.
        """
        ...

    async def latest(self, session_id: str) -> Snapshot | None:
        """The session's latest snapshot, or ``None``.

        Cancellation: an implementation says; the bundled ones run on a worker thread, so a
        cancelled call may still have done it.
        """
        ...

    async def drop(self, session_id: str) -> None:
        """Remove every snapshot of the session (an erasure calls it).

        Cancellation: an implementation says; the bundled ones run on a worker thread, so a
        cancelled call may still have done it.
        """
        ...

    async def aclose(self) -> None:
        """Release what the store holds.

        Cancellation: an implementation says; the bundled ones run on a worker thread, so a
        cancelled call may still have done it.
        """
        ...


# --- to JSON --------------------------------------------------------------------


def _round(r: ToolRound) -> list[Any]:
    return [
        [[c.call_id, c.name, c.arguments] for c in r.calls],
        r.content,
        [[x.call_id, x.content, x.is_error] for x in r.results],
    ]


def _turn(t: Turn) -> list[Any]:
    if t.rounds:
        return [t.request_id, t.question, t.answer, [_round(r) for r in t.rounds]]
    return [t.request_id, t.question, t.answer]


def _in_flight(r: InFlight) -> list[Any]:
    return [
        r.request_id,
        r.question,
        r.turns_sent,
        r.turns_dropped,
        r.request_bytes,
        r.round,
        [_round(x) for x in r.rounds],
        r.estimated_prompt_tokens,
        r.attempt,
    ]


def _endings(state: SessionState) -> list[Any]:
    # A committed turn's ending holds its request id and answer again: the
    # usual one is written as its turn's index alone, any other with the
    # index where the answer goes. That halves a long session's snapshot.
    where = {t.request_id: i for i, t in enumerate(state.turns)}
    turns = state.turns
    out: list[Any] = []
    for rid, e in state.endings:
        answer: Any = e.answer
        i = where.get(rid)
        if i is not None and answer is not None and turns[i].answer == answer:
            if e.kind == "committed" and not e.reason and not e.detail:
                out.append(i)  # the usual ending: just its turn's index
                continue
            answer = i
        out.append([rid, e.kind, e.reason, e.detail, answer])
    return out


def _body(state: SessionState) -> dict[str, Any]:
    config = None
    if state.config is not None:
        config = list(DEFAULT_CODEC.to_payload(state.config))
    return {
        "phase": type(state).__name__,
        "config": config,
        "turns": [_turn(t) for t in state.turns],
        "context_start": state.context_start,
        "endings": _endings(state),
        "version": state.version,
        "last_request_id": state.last_request_id,
        "calibration": list(state.calibration) if state.calibration is not None else None,
        "largest_ok": state.largest_ok,
        "overflow_cap": state.overflow_cap,
        "request": _in_flight(state.request) if hasattr(state, "request") else None,
        "reason": getattr(state, "reason", None),
    }


def _dumps(body: dict[str, Any]) -> bytes:
    try:
        return orjson.dumps(body)
    except TypeError:  # a lone surrogate (or an integer beyond 64 bits): exact escapes
        return json.dumps(body, ensure_ascii=True, allow_nan=False).encode("ascii")


def take_snapshot(
    session_id: str, state: SessionState, anchor_tag: str, anchor_at: float
) -> Snapshot:
    """The snapshot of ``state`` (after event ``state.version``, whose tag
    and recorded time are the anchor)."""
    body = _dumps(_body(state))
    return Snapshot(
        session_id,
        state.version,
        SNAPSHOT_SCHEMA,
        hashlib.sha256(body).hexdigest(),
        anchor_tag,
        anchor_at,
        body,
    )


# --- from JSON ------------------------------------------------------------------

_new = object.__new__


def _slots(cls: type[Any]) -> tuple[Any, ...]:
    # The slot setter of each field, in order. Turn and Ending have no
    # validator, converter or __attrs_post_init__ (their definitions in
    # _history), so setting the slots builds the same object as __init__,
    # without its per-field object.__setattr__: a 10,000-turn session
    # builds 20,000 of them.
    return tuple(cls.__dict__[f.name].__set__ for f in attrs.fields(cls))


_TURN = _slots(Turn)
_ENDING = _slots(Ending)


def _fast_turn(rid: str, q: str, a: str) -> Turn:
    t: Turn = _new(Turn)
    s0, s1, s2, s3 = _TURN
    s0(t, rid)
    s1(t, q)
    s2(t, a)
    s3(t, ())
    return t


def _round_of(r: list[Any]) -> ToolRound:
    calls, content, results = r
    return ToolRound(
        tuple(ToolCall(*c) for c in calls), content, tuple(ToolResult(*x) for x in results)
    )


def _turns(items: list[list[Any]]) -> list[Turn]:
    out: list[Turn] = []
    append = out.append
    for item in items:
        if len(item) == 3:
            rid, q, a = item
            if type(rid) is not str or type(q) is not str or type(a) is not str:
                raise TypeError("a turn's fields are not text")
            append(_fast_turn(rid, q, a))
        else:
            rid, q, a, rounds = item
            append(Turn(rid, q, a, tuple(_round_of(r) for r in rounds)))
    return out


def _endings_of(rows: list[Any], turns: list[Turn]) -> Endings:
    """The Endings of ``rows``, built in one go (as ``record`` one by one
    would, each request id once)."""
    items: list[tuple[RequestId, Ending]] = []
    index: dict[RequestId, int] = {}
    e0, e1, e2, e3 = _ENDING
    for row in rows:
        answer: Any
        if type(row) is int:
            turn = turns[row]
            rid, kind, reason, detail, answer = turn.request_id, "committed", "", "", turn.answer
        else:
            rid, kind, reason, detail, answer = row
        if type(answer) is int:
            answer = turns[answer].answer
        elif answer is not None and type(answer) is not str:
            raise TypeError("an ending's answer is not text")
        if rid in index:
            raise ValueError(f"request {rid!r} ended twice")
        e: Ending = _new(Ending)
        e0(e, kind)
        e1(e, reason)
        e2(e, detail)
        e3(e, answer)
        index[rid] = len(items)
        items.append((rid, e))
    endings: Endings = _new(Endings)
    endings._items = items
    endings._n = len(items)
    endings._index = index
    return endings


def _state(doc: dict[str, Any]) -> SessionState:
    cls = _PHASES[doc["phase"]]
    config = doc["config"]
    turns = _turns(doc["turns"])
    fields: dict[str, Any] = {
        "config": None if config is None else DEFAULT_CODEC.from_payload(*config),
        "turns": History(turns),
        "context_start": doc["context_start"],
        "endings": _endings_of(doc["endings"], turns),
        "version": doc["version"],
        "last_request_id": doc["last_request_id"],
        "calibration": tuple(doc["calibration"]) if doc["calibration"] is not None else None,
        "largest_ok": doc["largest_ok"],
        "overflow_cap": doc["overflow_cap"],
    }
    if doc["request"] is not None:
        rid, q, sent, dropped, nbytes, rnd, rounds, est, attempt = doc["request"]
        fields["request"] = InFlight(
            rid, q, sent, dropped, nbytes, rnd, tuple(_round_of(r) for r in rounds), est, attempt
        )
    if doc["reason"] is not None:
        fields["reason"] = doc["reason"]
    state: SessionState = cls(**fields)
    if fields["config"] is not None and not isinstance(fields["config"], SessionStarted):
        raise TypeError("config is not a SessionStarted")
    return state


def load_snapshot(snapshot: Snapshot) -> SessionState:
    """The state inside ``snapshot``, after checking its schema and checksum.

    Raises:
        SnapshotInvalid: the snapshot is outdated (another schema), damaged
            (checksum, JSON or layout) or inconsistent (its state's version
            is not the one it claims).
    """
    if snapshot.schema != SNAPSHOT_SCHEMA:
        raise SnapshotInvalid(
            f"outdated: schema {snapshot.schema!r}, this release reads {SNAPSHOT_SCHEMA}"
        )
    if hashlib.sha256(snapshot.body).hexdigest() != snapshot.checksum:
        raise SnapshotInvalid("damaged: the checksum does not match the body")
    # Tens of thousands of objects are made here and none is garbage: the
    # cyclic collector would only scan them again and again meanwhile.
    collecting = gc.isenabled()
    gc.disable()
    try:
        try:
            doc = orjson.loads(snapshot.body)
        except orjson.JSONDecodeError:
            doc = json.loads(snapshot.body)  # lone surrogates, escaped
        state = _state(doc)
    except Exception as exc:  # any layout error: the snapshot is not usable
        raise SnapshotInvalid(f"damaged: {type(exc).__name__}: {exc}") from exc
    finally:
        if collecting:
            gc.enable()
    if state.version != snapshot.version:
        raise SnapshotInvalid(
            f"inconsistent: the state is at version {state.version}, "
            f"the snapshot claims {snapshot.version}"
        )
    return state
