"""Bulk replay: many sessions' states rebuilt from a store in one go.

Why a fold of its own. :func:`~turnledger.sessions.replay` folds typed
events with :func:`~turnledger.sessions.evolve`, which builds an event per
row and a new phase object per event. When only the final state is wanted,
most of that is thrown away: a turn's ``TurnSubmitted``, ``StreamStarted``
and ``TurnCommitted`` leave behind one :class:`Turn` and one :class:`Ending`.
So ``replay_sessions`` (in ``_forks``) reads rows through :class:`StateDecoder`,
which turns the payloads of those three events (current schema version, exactly
the shape the codec's strict structurer accepts) into plain tuples, and
everything else into typed events through the codec; :func:`fold_items`
then applies the three common events to local variables, and hands any
other event, and any common event that does not fit the happy path, to
:func:`evolve` itself on a state built from those variables. The result is
the state ``replay`` gives, and an event ``replay`` refuses raises the same
:class:`~turnledger.ReplayError` (tests compare both over random histories).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any, Final, TypeAlias

import attrs

from ..events import (
    DEFAULT_CODEC,
    BranchId,
    Event,
    EventCodec,
    PinAdded,
    RequestId,
    SessionForked,
    StoredEvent,
    StreamStarted,
    SummaryRecorded,
    TurnCommitted,
    TurnSubmitted,
    Usage,
    Window,
)
from ..events._exact_json import fast_loads
from ._branches import Branch
from ._budgets import calibration_after
from ._history import Ending, Turn
from ._machine import EVENT_TRANSITIONS, evolve
from ._phases import (
    IN_FLIGHT,
    Committed,
    InFlight,
    Pending,
    SessionState,
    Streaming,
    initial_state,
)

__all__ = ["Item", "StateDecoder", "fold_items"]

#: A row as the fast fold holds it: a typed event, or one of the tuples below.
#: ``(_SUBMITTED, request_id, question, turns_sent, turns_dropped,
#: request_bytes, estimated_prompt_tokens)``, ``(_STARTED, request_id)``,
#: ``(_COMMITTED, request_id, answer, finish_reason, usage)`` with ``usage``
#: the payload's dict (all three keys) or ``None``.
Item: TypeAlias = "Event | tuple[Any, ...]"

_SUBMITTED: Final = 1
_STARTED: Final = 2
_COMMITTED: Final = 3

#: The schema version each tuple form was written for; a codec whose current
#: version differs decodes those tags itself.
_FAST_TAGS: Final = {
    "turn_submitted": (2, _SUBMITTED),
    "stream_started": (1, _STARTED),
    "turn_committed": (1, _COMMITTED),
}
_USAGE_KEYS: Final = ("prompt_tokens", "completion_tokens", "total_tokens")
_NO_USAGE: Final = object()  # a key absent (None is a value)


def _slot_setters(cls: type[Any]) -> tuple[Any, ...]:
    # The slot of each field, in order. Turn and Ending have no validator,
    # converter, default factory or __attrs_post_init__
    # (tests/core/test_replay_fold.py checks), so storing the values through
    # the slots builds the same object as their __init__, without its
    # object.__setattr__ per field (a frozen class's way in).
    return tuple(cls.__dict__[f.name].__set__ for f in attrs.fields(cls))


_turn_request_id, _turn_question, _turn_answer, _turn_rounds = _slot_setters(Turn)
_ending_kind, _ending_reason, _ending_detail, _ending_answer = _slot_setters(Ending)
_new = object.__new__


def _committed_turn(rid: Any, question: str, answer: str, rounds: tuple[Any, ...]) -> Turn:
    """``Turn(rid, question, answer, rounds)``, through its slots."""
    turn: Turn = _new(Turn)
    _turn_request_id(turn, rid)
    _turn_question(turn, question)
    _turn_answer(turn, answer)
    _turn_rounds(turn, rounds)
    return turn


def _committed_ending(answer: str) -> Ending:
    """``Ending("committed", "", "", answer)``, through its slots."""
    ending: Ending = _new(Ending)
    _ending_kind(ending, "committed")
    _ending_reason(ending, "")
    _ending_detail(ending, "")
    _ending_answer(ending, answer)
    return ending


def _phases_where(event: type[Any], target: type[Any]) -> frozenset[type[Any]]:
    # From the machine's own table: the phases in which ``event`` leads to
    # ``target`` (the only transitions the fast fold applies by itself).
    return frozenset(p for p, row in EVENT_TRANSITIONS.items() if row.get(event) is target)


_SUBMIT_FROM: Final = _phases_where(TurnSubmitted, Pending)
_START_FROM: Final = _phases_where(StreamStarted, Streaming)
_COMMIT_FROM: Final = _phases_where(TurnCommitted, Committed)


def _light(code: int, p: Any) -> tuple[Any, ...] | None:
    """The tuple of a parsed payload, or ``None`` if it is not exactly the
    shape (keys and JSON types) the codec's structurer accepts for it."""
    if type(p) is not dict:
        return None
    try:
        if code == _STARTED:
            rid = p["request_id"]
            if len(p) == 1 and type(rid) is str:
                return (_STARTED, rid)
            return None
        if code == _SUBMITTED:
            submitted = (
                _SUBMITTED,
                p["request_id"],
                p["question"],
                p["turns_sent"],
                p["turns_dropped"],
                p["request_bytes"],
                p["estimated_prompt_tokens"],
            )
            est = submitted[6]
            if (
                len(p) == 6
                and type(submitted[1]) is str
                and type(submitted[2]) is str
                and type(submitted[3]) is int
                and type(submitted[4]) is int
                and type(submitted[5]) is int
                and (est is None or type(est) is int)
            ):
                return submitted
            return None
        usage = p["usage"]
        item: tuple[Any, ...] = (
            _COMMITTED,
            p["request_id"],
            p["answer"],
            p["finish_reason"],
            usage,
        )
        if not (
            len(p) == 4 and type(item[1]) is str and type(item[2]) is str and type(item[3]) is str
        ):
            return None
        if usage is None:
            return item
        if type(usage) is not dict or len(usage) != 3:
            return None
        for key in _USAGE_KEYS:
            v = usage[key]
            if v is not None and type(v) is not int:
                return None
        return item
    except KeyError:
        return None


class StateDecoder:
    """An :class:`~turnledger.events.EventDecoder` whose items feed
    :func:`fold_items`: tuples for the common events, typed events (from
    ``codec``) for the rest. Pure, so stores may call it on their I/O thread.
    """

    __slots__ = ("_codec", "_fast")

    def __init__(self, codec: EventCodec = DEFAULT_CODEC) -> None:
        self._codec = codec
        # Only the tags whose current version in this codec is the one the
        # tuples were written for: any other version is the codec's to decode
        # (and upcast).
        self._fast = {
            tag: (version, code)
            for tag, (version, code) in _FAST_TAGS.items()
            if codec.versions.get(tag) == version
        }

    def decode(self, stored: StoredEvent) -> Item:
        """The item of an envelope whose payload is already parsed."""
        entry = self._fast.get(stored.tag)
        if entry is not None and stored.schema_version == entry[0]:
            item = _light(entry[1], stored.payload)
            if item is not None:
                return item
        return self._codec.decode(stored)

    def decode_rows(
        self, session_id: str, rows: Iterable[tuple[int, str, int, str | bytes]]
    ) -> list[Item]:
        """The item of each ``(seq, tag, schema_version, text)`` row.

        Raises:
            PayloadNotJSON: a text is not a JSON object in UTF-8 (from the
                codec, which decodes every row the tuples do not take).
            UnknownEventTag, CodecError: as the codec's ``decode_rows``.
        """
        # _light inlined, and the common order of checks: this loop runs
        # once per event of every session replayed.
        fast = self._fast
        loads = fast_loads
        decode_rows = self._codec.decode_rows
        out: list[Item] = []
        append = out.append
        for row in rows:
            entry = fast.get(row[1])
            if entry is not None and entry[0] == row[2]:
                try:
                    p = loads(row[3])
                except ValueError:
                    p = None  # not JSON to orjson: the codec decides
                if type(p) is dict:
                    code = entry[1]
                    get = p.get
                    rid = get("request_id")
                    if type(rid) is not str:
                        pass
                    elif code == _COMMITTED:
                        answer = get("answer")
                        finish = get("finish_reason")
                        usage = get("usage", _NO_USAGE)
                        if (
                            len(p) == 4
                            and type(answer) is str
                            and type(finish) is str
                            and (usage is None or _usage_ok(usage))
                        ):
                            append((_COMMITTED, rid, answer, finish, usage))
                            continue
                    elif code == _STARTED:
                        if len(p) == 1:
                            append((_STARTED, rid))
                            continue
                    else:
                        question = get("question")
                        sent = get("turns_sent")
                        dropped = get("turns_dropped")
                        size = get("request_bytes")
                        est = get("estimated_prompt_tokens", _NO_USAGE)
                        if (
                            len(p) == 6
                            and type(question) is str
                            and type(sent) is int
                            and type(dropped) is int
                            and type(size) is int
                            and (est is None or type(est) is int)
                        ):
                            append((_SUBMITTED, rid, question, sent, dropped, size, est))
                            continue
            append(decode_rows(session_id, [row])[0])
        return out


def _usage_ok(usage: Any) -> bool:
    """A usage dict of exactly the three keys, each an integer or null."""
    if type(usage) is not dict or len(usage) != 3:
        return False
    for key in _USAGE_KEYS:
        v = usage.get(key, _NO_USAGE)
        if v is not None and type(v) is not int:
            return False
    return True


def _event(item: Item) -> Event:
    """The typed event a tuple stands for (what the codec would build)."""
    if type(item) is not tuple:
        return item  # type: ignore[return-value]
    code = item[0]
    if code == _SUBMITTED:
        return TurnSubmitted(
            RequestId(item[1]), item[2], item[3], item[4], item[5], estimated_prompt_tokens=item[6]
        )
    if code == _STARTED:
        return StreamStarted(RequestId(item[1]))
    u = item[4]
    usage = None if u is None else Usage(*(u[k] for k in _USAGE_KEYS))
    return TurnCommitted(RequestId(item[1]), item[2], item[3], usage)


def fold_items(items: Iterable[Item], state: SessionState | None = None) -> SessionState:
    """``replay`` of the events ``items`` stand for, from ``state`` or the
    initial state: the same state, or the same ``ReplayError``.

    The common turn (submitted, started, committed) is applied to local
    variables; the phase objects of the turns between are never built.
    """
    s: SessionState = initial_state() if state is None else state
    # The state as local variables (s is stale while `dirty`).
    phase: type[Any] = type(s)
    dirty = False
    config = s.config
    turns = s.turns
    context_start = s.context_start
    endings = s.endings
    version = s.version
    last_rid = s.last_request_id
    calibration = s.calibration
    largest_ok = s.largest_ok
    overflow_cap = s.overflow_cap
    active_branch = s.active_branch
    branches = s.branches
    fork = s.fork
    pins = s.pins
    summaries = s.summaries
    request: InFlight | None = getattr(s, "request", None)
    # The request in flight when the fold's own Submitted started it: its
    # tuple (its InFlight is built only if a state is).
    submitted: tuple[Any, ...] | None = None
    current = None if request is None else request.request_id
    # Turns and endings committed by the fast path, not yet in `turns` and
    # `endings` (added at once when a state is built).
    new_turns: list[Turn] = []
    new_endings: list[tuple[RequestId, Ending]] = []
    new_ids: set[str] = set()
    window = config.policy.max_turns if config and isinstance(config.policy, Window) else 0
    for item in items:
        if type(item) is tuple:
            code = item[0]
            if code == _COMMITTED:
                if phase in _COMMIT_FROM and item[1] == current:
                    if submitted is not None:
                        _, _, question, turns_sent, _, _, est = submitted
                        rounds: tuple[Any, ...] = ()
                    else:
                        assert request is not None
                        question, turns_sent = request.question, request.turns_sent
                        est, rounds = request.estimated_prompt_tokens, request.rounds
                    n = len(turns) + len(new_turns)
                    answer = item[2]
                    rid: Any = current
                    new_turns.append(_committed_turn(rid, question, answer, rounds))
                    if window:
                        context_start = max(n - turns_sent, n + 1 - window)
                    new_endings.append((rid, _committed_ending(answer)))
                    new_ids.add(rid)
                    u = item[4]
                    if u is not None and est:
                        calibration = calibration_after(calibration, est, u["prompt_tokens"])
                    largest_ok = max(largest_ok, est or 0)
                    request = submitted = current = None
                    phase = Committed
                    version += 1
                    dirty = True
                    continue
            elif code == _SUBMITTED:
                if (
                    phase in _SUBMIT_FROM
                    and config is not None
                    and item[1] not in endings
                    and item[1] not in new_ids
                ):
                    submitted = item
                    request = None
                    last_rid = current = item[1]
                    phase = Pending
                    version += 1
                    dirty = True
                    continue
            elif phase in _START_FROM and item[1] == current:
                phase = Streaming
                version += 1
                dirty = True
                continue
        # Anything else: the machine's own evolve, on the state as it stands.
        if dirty:
            if submitted is not None:
                request = _in_flight(submitted)
                submitted = None
            if new_turns:
                turns, endings = turns.extend(new_turns), endings.record_all(new_endings)
                new_turns, new_endings, new_ids = [], [], set()
            s = _build(
                phase,
                config,
                turns,
                context_start,
                endings,
                version,
                last_rid,
                calibration,
                largest_ok,
                overflow_cap,
                request,
                active_branch,
                branches,
                fork,
                pins,
                summaries,
            )
            dirty = False
        s = evolve(s, _event(item))
        phase = type(s)
        config = s.config
        turns = s.turns
        context_start = s.context_start
        endings = s.endings
        version = s.version
        last_rid = s.last_request_id
        calibration = s.calibration
        largest_ok = s.largest_ok
        overflow_cap = s.overflow_cap
        active_branch = s.active_branch
        branches = s.branches
        fork = s.fork
        pins = s.pins
        summaries = s.summaries
        request = getattr(s, "request", None)
        current = None if request is None else request.request_id
        window = config.policy.max_turns if config and isinstance(config.policy, Window) else 0
    if dirty:
        if submitted is not None:
            request = _in_flight(submitted)
        if new_turns:
            turns, endings = turns.extend(new_turns), endings.record_all(new_endings)
        s = _build(
            phase,
            config,
            turns,
            context_start,
            endings,
            version,
            last_rid,
            calibration,
            largest_ok,
            overflow_cap,
            request,
            active_branch,
            branches,
            fork,
            pins,
            summaries,
        )
    return s


def _in_flight(submitted: tuple[Any, ...]) -> InFlight:
    """The request a Submitted tuple put in flight (as ``evolve`` builds it)."""
    _, rid, question, turns_sent, turns_dropped, request_bytes, est = submitted
    return InFlight(
        rid, question, turns_sent, turns_dropped, request_bytes, estimated_prompt_tokens=est
    )


def _build(
    phase: type[Any],
    config: Any,
    turns: Any,
    context_start: int,
    endings: Any,
    version: int,
    last_rid: RequestId | None,
    calibration: tuple[int, int] | None,
    largest_ok: int,
    overflow_cap: int | None,
    request: InFlight | None,
    active_branch: BranchId,
    branches: tuple[Branch, ...],
    fork: SessionForked | None,
    pins: tuple[PinAdded, ...],
    summaries: tuple[SummaryRecorded, ...],
) -> SessionState:
    """The phase object of the fold's local variables. Only the fast paths
    leave them dirty, and those lead to Pending, Streaming or Committed."""
    base: dict[str, Any] = {
        "config": config,
        "turns": turns,
        "context_start": context_start,
        "endings": endings,
        "version": version,
        "last_request_id": last_rid,
        "calibration": calibration,
        "largest_ok": largest_ok,
        "overflow_cap": overflow_cap,
        "active_branch": active_branch,
        "branches": branches,
        "fork": fork,
        "pins": pins,
        "summaries": summaries,
    }
    if phase in IN_FLIGHT:
        base["request"] = request
    state: SessionState = phase(**base)
    return state
