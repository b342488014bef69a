"""Snapshots of a session's state (pure): what lets a long session reopen
from its latest snapshot plus the events after it instead of its first event.

A snapshot is in two parts. The *head* (``Snapshot.body``) holds the state
with only its newest turns and endings (:data:`NEWEST` of each), the
request ids of every older ending, and the size and SHA-256 of the *older
part* (``Snapshot.older``), which holds the older turns and endings.
Reopening reads and checks the head only; the older part is read, checked
and built the first time something needs an older turn or ending (a
projection that sends the whole history, an edit of an old turn, the next
snapshot), through a loader the snapshot store gives
(``Snapshot.load_older``). An older part found missing or damaged then
raises :class:`SnapshotInvalid` there, and calls the ``on_damage`` hook
given to :func:`load_snapshot` (the runtime logs it and drops the
snapshot, so the next open replays in full).

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
from collections.abc import Callable
from typing import Any, Final, Protocol

import attrs
import orjson

from ..events import DEFAULT_CODEC, RequestId, SessionStarted, ToolCall
from ._history import Ending, Endings, History, Older, ToolResult, ToolRound, Turn
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
SNAPSHOT_SCHEMA: Final = 2

#: Turns (and endings) a snapshot's head holds; the older ones are in its
#: older part, loaded when first needed.
NEWEST: Final = 64

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
    #: The older part (empty if there is none, or if the store left it to
    #: ``load_older``).
    older: bytes = attrs.field(default=b"", repr=False)
    #: Reads the older part when it is first needed (``None``: it is gone);
    #: given by a store whose ``latest`` does not read it.
    load_older: Callable[[], bytes | None] | None = attrs.field(default=None, repr=False, eq=False)


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


def _endings(
    endings: list[tuple[RequestId, Ending]],
    turns: list[Turn],
    lo: int,
    where: dict[RequestId, int],
) -> list[Any]:
    # A committed turn's ending holds its request id and answer again: the
    # usual one is written as its turn's index alone, any other with the
    # index where the answer goes. That halves a long session's snapshot.
    # Indexes count from turn ``lo`` (the first turn of the same part); an
    # ending of a turn outside ``turns`` is written whole.
    out: list[Any] = []
    for rid, e in endings:
        answer: Any = e.answer
        i = where.get(rid)
        if i is not None:
            i -= lo
            if not 0 <= i < len(turns):
                i = None
        if i is not None and answer is not None and turns[i].answer == answer:
            if e.kind == "committed" and not e.reason and not e.detail:
                out.append(i)  # the usual ending: just its turn's index
                continue
            answer = i
        out.append([rid, e.kind, e.reason, e.detail, answer])
    return out


def _older(turns: list[Turn], endings: list[tuple[RequestId, Ending]]) -> dict[str, Any]:
    where = {t.request_id: i for i, t in enumerate(turns)}
    return {"turns": [_turn(t) for t in turns], "endings": _endings(endings, turns, 0, where)}


def _body(state: SessionState, older: bytes, n_turns: int, n_endings: int) -> dict[str, Any]:
    config = None
    if state.config is not None:
        config = list(DEFAULT_CODEC.to_payload(state.config))
    turns = list(state.turns)
    endings = list(state.endings)
    newest = turns[n_turns:]
    where = {t.request_id: i for i, t in enumerate(newest, n_turns)}
    return {
        "phase": type(state).__name__,
        "config": config,
        "turns": [_turn(t) for t in newest],
        "older": [
            n_turns,
            n_endings,
            len(older),
            hashlib.sha256(older).hexdigest(),
            [rid for rid, _ in endings[:n_endings]],
        ]
        if older
        else None,
        "context_start": state.context_start,
        "endings": _endings(endings[n_endings:], newest, n_turns, where),
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
    session_id: str,
    state: SessionState,
    anchor_tag: str,
    anchor_at: float,
    *,
    newest: int = NEWEST,
) -> Snapshot:
    """The snapshot of ``state`` (after event ``state.version``, whose tag
    and recorded time are the anchor): its newest :data:`NEWEST` turns and
    endings (``newest``) in the head, the others in the older part."""
    n_turns = max(0, len(state.turns) - newest)
    n_endings = max(0, len(state.endings) - newest)
    older = b""
    if n_turns or n_endings:
        items = list(state.endings)
        older = _dumps(_older(list(state.turns)[:n_turns], items[:n_endings]))
    body = _dumps(_body(state, older, n_turns, n_endings))
    return Snapshot(
        session_id,
        state.version,
        SNAPSHOT_SCHEMA,
        hashlib.sha256(body).hexdigest(),
        anchor_tag,
        anchor_at,
        body,
        older,
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


def _ending_items(
    rows: list[Any], turns: list[Turn], index: dict[RequestId, int], start: int
) -> list[tuple[RequestId, Ending]]:
    """The endings of ``rows`` (an int refers to ``turns``), each request id
    put in ``index`` at its position from ``start``; a request id already
    there is an error."""
    items: list[tuple[RequestId, Ending]] = []
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
        index[rid] = start + len(items)
        items.append((rid, e))
    return items


def _endings_of(rows: list[Any], turns: list[Turn]) -> Endings:
    """The Endings of ``rows``, built in one go (as ``record`` one by one
    would, each request id once)."""
    index: dict[RequestId, int] = {}
    items = _ending_items(rows, turns, index, 0)
    endings: Endings = _new(Endings)
    endings._items = items
    endings._n = len(items)
    endings._index = index
    endings._older = None
    return endings


class _OlderPart:
    """A snapshot's older part, read, checked and built once, when first
    needed (see the module)."""

    def __init__(
        self,
        snapshot: Snapshot,
        meta: list[Any],
        on_damage: Callable[[SnapshotInvalid], None] | None,
    ) -> None:
        self._snapshot = snapshot
        self.turns_n, self.endings_n, self._size, self._sha, self.rids = meta
        self._on_damage = on_damage
        self._built: tuple[list[Turn], list[tuple[RequestId, Ending]]] | None = None

    def _damaged(self, why: str) -> SnapshotInvalid:
        exc = SnapshotInvalid(f"damaged: the older part {why}")
        if self._on_damage is not None:
            self._on_damage(exc)
        return exc

    def build(self) -> tuple[list[Turn], list[tuple[RequestId, Ending]]]:
        if self._built is not None:
            return self._built
        snap = self._snapshot
        raw = snap.older or (snap.load_older() if snap.load_older is not None else None)
        if not raw:
            raise self._damaged("is gone")
        if len(raw) != self._size or hashlib.sha256(raw).hexdigest() != self._sha:
            raise self._damaged("does not match its checksum")
        collecting = gc.isenabled()
        gc.disable()
        try:
            try:
                doc = orjson.loads(raw)
            except orjson.JSONDecodeError:
                doc = json.loads(raw)
            turns = _turns(doc["turns"])
            index: dict[RequestId, int] = {}
            endings = _ending_items(doc["endings"], turns, index, 0)
        except Exception as exc:
            raise self._damaged(f"does not parse: {type(exc).__name__}: {exc}") from exc
        finally:
            if collecting:
                gc.enable()
        if (
            len(turns) != self.turns_n
            or len(endings) != self.endings_n
            or [rid for rid, _ in endings] != self.rids
        ):
            raise self._damaged("does not match its head")
        self._built = turns, endings
        return self._built


def _state(
    doc: dict[str, Any],
    snapshot: Snapshot,
    on_damage: Callable[[SnapshotInvalid], None] | None,
) -> SessionState:
    cls = _PHASES[doc["phase"]]
    config = doc["config"]
    turns = _turns(doc["turns"])
    history: History
    endings: Endings
    if doc["older"] is None:
        history, endings = History(turns), _endings_of(doc["endings"], turns)
    else:
        part = _OlderPart(snapshot, doc["older"], on_damage)
        if type(part.rids) is not list or len(part.rids) != part.endings_n:
            raise TypeError("the older request ids do not match their count")
        index = {rid: i for i, rid in enumerate(part.rids)}
        if len(index) != part.endings_n:
            raise ValueError("an older request id repeats")
        newest = _ending_items(doc["endings"], turns, index, part.endings_n)
        history = History.lazy(turns, Older(part.turns_n, lambda: part.build()[0]))
        endings = Endings.lazy(newest, Older(part.endings_n, lambda: part.build()[1]), index)
    fields: dict[str, Any] = {
        "config": None if config is None else DEFAULT_CODEC.from_payload(*config),
        "turns": history,
        "context_start": doc["context_start"],
        "endings": endings,
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


def load_snapshot(
    snapshot: Snapshot, on_damage: Callable[[SnapshotInvalid], None] | None = None
) -> SessionState:
    """The state inside ``snapshot``, after checking its schema and the
    checksum of its head. Its older turns and endings are read, checked and
    built when first needed; an older part found damaged then raises
    :class:`SnapshotInvalid` where it was needed, after calling
    ``on_damage`` with it.

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
        state = _state(doc, snapshot, on_damage)
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
