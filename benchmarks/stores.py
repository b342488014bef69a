"""Store throughput: group commit against its baselines, and replay speed.

    python benchmarks/stores.py [--big] [--only appends|replay] [--sessions N]
        [--turns N] [--repeat N] [--replay-sessions N] [--replay-batch N]
        [--structurers]

Appends. A *turn* is one append of 3 events (TurnSubmitted, StreamStarted,
TurnCommitted; a 100-character question and a 600-character answer, mixed
scripts). ``--sessions`` sessions (default 1,000) each append ``--turns``
turns one after the other (each session already holds its SessionStarted),
all sessions at once. Every contender writes the same turns to a fresh file,
with WAL and the same ``synchronous`` setting (FULL unless ``--synchronous``):

- ``group``      SQLiteStore, 1,000 trio tasks, group commit (the default)
- ``per-append`` SQLiteStore with ``group_commit=False``: one transaction each
- ``per-append, no mark``  the same without writing the acknowledged position
                 into the lock file after each commit (the store's check
                 against a damaged WAL): what that one ``pwrite`` costs
- ``bare``       a plain sqlite3 loop on one thread: per turn BEGIN, one
                 executemany of the 3 rows (json.dumps'd), COMMIT. No version
                 check, no threads: the ceiling for one transaction per turn.
- ``eventsourcing``  the eventsourcing library's SQLiteApplicationRecorder
                 (global notification ids, like our feed), ``insert_events``
                 per turn in a plain loop (its best case: no thread hops).

Replay. ``--replay-sessions`` sessions of ``--replay-turns`` turns each
(SessionStarted + 3 events per turn), each bare session read with its own
SELECT:

Every contender ends in the same fold: question/answer pairs, a counter and
the system prompt (``dict_fold`` on parsed dicts, ``pairs_fold`` on typed
events), except the two that fold into the state machine's real state.

- ``typed``       ``SQLiteStore.read_decoded(sid, DEFAULT_CODEC)`` session by
                  session: how the hub opens one session (typed events, no
                  envelopes). Each read is a trip to the reader thread and
                  back, which costs about 100 µs of CPU on this kind of
                  machine (mostly trio's wake-up), about 1 µs per event here
- ``typed+fold``  the same, folded by ``turnledger.sessions.replay`` into a
                  ``SessionState`` (the state machine, history and outcomes)
- ``typed bulk``  ``SQLiteStore.read_decoded_many`` of ``--replay-batch``
                  sessions at a time, ``pairs_fold`` applied to each session on
                  the reader thread (one trip per batch, still one SELECT per
                  session): the path ``turnledger replay DB`` takes
- ``bulk+fold``   the same with ``turnledger.sessions.replay_sessions``: each
                  session folded into its ``SessionState`` on the reader thread
- ``envelopes``   ``SQLiteStore.read`` (``StoredEvent`` envelopes with exact
                  parsed payloads) + ``DEFAULT_CODEC.decode`` of each
- ``codec alone`` the same SELECT on the calling thread, orjson and
                  ``DEFAULT_CODEC.from_payload``: the typing without the
                  store's envelope and thread hop
- ``bare``        ``SELECT tag, payload`` + ``json.loads`` + a dict fold
                  (question/answer pairs): the baseline the goal names
- ``bare orjson`` the same with orjson's parser: how much of the typed path's
                  speed is orjson's (the goal expects the faster parser to
                  pay for the typing; this row shows what typing costs)
- ``eventsourcing``  ``select_events`` + ``json.loads`` + the same dict fold

With ``--structurers``, ``typed bulk`` and ``codec alone`` also run with
codecs that build events another way (``bulk [x]``, ``alone [x]``; see
``structurer_codecs``), and a last table gives the default codec's speed
against each.

Figures are medians over ``--repeat`` runs; ratios are taken between medians
of the same run. Replay runs are short and this kind of machine drifts, so
the replay contenders take turns (one run of each per round, in a shuffled
order, ``--replay-rounds`` rounds) and each ratio is also given as the median
of its per-round ratios.
Replay also shows the CPU time of the whole process (every thread): where it
matches the wall time, a gap is work, not waiting.
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import platform
import random
import sqlite3
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, cast

sys.path.insert(0, "src")

import orjson
import trio

from turnledger.adapters.stores import SQLiteStore
from turnledger.adapters.stores.sqlite import Synchronous
from turnledger.events import (
    DEFAULT_CODEC,
    Event,
    EventCodec,
    Ledger,
    RequestId,
    SessionStarted,
    StoredEvent,
    StreamStarted,
    TurnCommitted,
    TurnSubmitted,
    Usage,
)
from turnledger.sessions import replay, replay_sessions

QUESTION = "问题 {i}: how does the ledger keep “turn {i}” whole? 🌱 " + "x" * 50
ANSWER_TEXT = "the answer is committed only when complete. "
ANSWER = "回答 {i}: " + ANSWER_TEXT * 13  # about 600 characters; see --answer-chars


def session_started(sid: str) -> StoredEvent:
    ev = SessionStarted("你是一个简洁的助手。Answer briefly.", "bench-model", Ledger())
    return DEFAULT_CODEC.encode(ev, session_id=sid, seq=1, recorded_at=time.time())


def turn(sid: str, i: int) -> list[StoredEvent]:
    """Turn ``i`` (0-based) of session ``sid``: seq 2 + 3i .. 4 + 3i."""
    rid = RequestId(f"{sid}/r{i}")
    events: list[Event] = [
        TurnSubmitted(rid, QUESTION.format(i=i), i, 0, 900 + i),
        StreamStarted(rid),
        TurnCommitted(rid, ANSWER.format(i=i), "stop", Usage(120, 160, 280)),
    ]
    now = time.time()
    return [
        DEFAULT_CODEC.encode(ev, session_id=sid, seq=2 + 3 * i + k, recorded_at=now)
        for k, ev in enumerate(events)
    ]


def dataset(sessions: int, turns: int) -> tuple[list[str], list[list[list[StoredEvent]]]]:
    sids = [f"session-{n:05d}" for n in range(sessions)]
    return sids, [[turn(sid, i) for i in range(turns)] for sid in sids]


# --- appends ------------------------------------------------------------------


async def _store_appends(
    path: Path,
    sids: list[str],
    turns: list[list[list[StoredEvent]]],
    group: bool,
    sync: str,
    mark: bool = True,
) -> tuple[float, Any]:
    store = await SQLiteStore.open(path, group_commit=group, synchronous=cast(Synchronous, sync))
    if not mark:
        store._writer.mark_commits = False
    try:
        for sid in sids:
            await store.append(sid, [session_started(sid)], 0)
        before = store.stats

        async def session(n: int) -> None:
            sid = sids[n]
            version = 1
            for batch in turns[n]:
                version = await store.append(sid, batch, version)

        t0 = time.perf_counter()
        async with trio.open_nursery() as nursery:
            for n in range(len(sids)):
                nursery.start_soon(session, n)
        elapsed = time.perf_counter() - t0
        after = store.stats
        return elapsed, (after.transactions - before.transactions, after.appends - before.appends)
    finally:
        await store.aclose()


def store_appends(*args: Any) -> tuple[float, Any]:
    """:func:`_store_appends` in a trio run of its own."""
    return trio.run(_store_appends, *args)


_DUMPS = json.JSONEncoder(ensure_ascii=False, allow_nan=False, separators=(",", ":")).encode


def bare_appends(
    path: Path, sids: list[str], turns: list[list[list[StoredEvent]]], sync: str
) -> float:
    conn = sqlite3.connect(path, isolation_level=None)
    conn.execute("PRAGMA journal_mode=WAL")
    conn.execute(f"PRAGMA synchronous={sync}")
    conn.execute(
        "CREATE TABLE events (position INTEGER PRIMARY KEY, session_id TEXT NOT NULL,"
        " seq INTEGER NOT NULL, tag TEXT NOT NULL, schema_version INTEGER NOT NULL,"
        " payload TEXT NOT NULL, recorded_at REAL NOT NULL, UNIQUE (session_id, seq))"
    )
    insert = (
        "INSERT INTO events (session_id, seq, tag, schema_version, payload, recorded_at)"
        " VALUES (?, ?, ?, ?, ?, ?)"
    )
    for sid in sids:
        ev = session_started(sid)
        conn.execute(insert, (sid, 1, ev.tag, ev.schema_version, _DUMPS(ev.payload), 0.0))
    t0 = time.perf_counter()
    for i in range(len(turns[0])):
        for n in range(len(sids)):
            conn.execute("BEGIN")
            conn.executemany(
                insert,
                [
                    (e.session_id, e.seq, e.tag, e.schema_version, _DUMPS(e.payload), e.recorded_at)
                    for e in turns[n][i]
                ],
            )
            conn.execute("COMMIT")
    elapsed = time.perf_counter() - t0
    conn.close()
    return elapsed


def _es_recorder(path: Path) -> Any:
    from eventsourcing.sqlite import SQLiteApplicationRecorder, SQLiteDatastore

    datastore = SQLiteDatastore(str(path), originator_id_type="text")
    recorder = SQLiteApplicationRecorder(datastore)
    recorder.create_table()
    return datastore, recorder


def es_synchronous(path: Path) -> str:
    datastore, _ = _es_recorder(path)
    with datastore.transaction(commit=False) as c:
        c.execute("PRAGMA synchronous")
        (value,) = c.fetchone()
    datastore.close()
    return {0: "OFF", 1: "NORMAL", 2: "FULL", 3: "EXTRA"}[int(value)]


def es_appends(path: Path, sids: list[str], turns: list[list[list[StoredEvent]]]) -> float:
    from eventsourcing.persistence import StoredEvent as ESEvent

    datastore, recorder = _es_recorder(path)

    def es(ev: StoredEvent) -> Any:
        return ESEvent(ev.session_id, ev.seq, ev.tag, _DUMPS(ev.payload).encode())

    recorder.insert_events([es(session_started(sid)) for sid in sids])
    t0 = time.perf_counter()
    for i in range(len(turns[0])):
        for n in range(len(sids)):
            recorder.insert_events([es(e) for e in turns[n][i]])
    elapsed = time.perf_counter() - t0
    datastore.close()
    return elapsed


# --- replay -------------------------------------------------------------------


def dict_fold(session_id: str, parsed: list[tuple[str, dict[str, Any]]]) -> dict[str, Any]:
    """The baselines' fold: question/answer pairs from ``(tag, payload)`` items."""
    state: dict[str, Any] = {"turns": [], "pending": None, "version": 0}
    for tag, payload in parsed:
        if tag == "turn_submitted":
            state["pending"] = payload["question"]
        elif tag == "turn_committed":
            state["turns"].append((state["pending"], payload["answer"]))
            state["pending"] = None
        elif tag == "session_started":
            state["system"] = payload["system"]
        state["version"] += 1
    return state


def pairs_fold(session_id: str, events: list[Event]) -> dict[str, Any]:
    """``dict_fold``'s work on typed events, in the same shape (a list built
    per session, then one loop over it): every typed contender does it, so
    each compares like with like against bare's parse + dict fold."""
    state: dict[str, Any] = {"turns": [], "pending": None, "version": 0}
    for event in events:
        if isinstance(event, TurnSubmitted):
            state["pending"] = event.question
        elif isinstance(event, TurnCommitted):
            state["turns"].append((state["pending"], event.answer))
            state["pending"] = None
        elif isinstance(event, SessionStarted):
            state["system"] = event.system
        state["version"] += 1
    return state


def session_events(sid: str, turns: int) -> list[StoredEvent]:
    # Made afresh for each session, so the harness keeps no copy of the data
    # set alive while the contenders run (their GC would walk it).
    return [session_started(sid)] + [e for i in range(turns) for e in turn(sid, i)]


async def _fill(path: Path, sids: list[str], turns: int) -> None:
    store = await SQLiteStore.open(path, synchronous="NORMAL")
    try:
        for sid in sids:
            await store.append(sid, session_events(sid, turns), 0)
    finally:
        await store.aclose()


Times = tuple[float, float]  # (wall seconds, CPU seconds of the whole process)


def _now() -> Times:
    return time.perf_counter(), time.process_time()


def _since(t0: Times) -> Times:
    return time.perf_counter() - t0[0], time.process_time() - t0[1]


async def _typed_replay(path: Path, sids: list[str], fold: bool) -> Times:
    store = await SQLiteStore.open(path)
    try:
        t0 = _now()
        for sid in sids:
            events = await store.read_decoded(sid, DEFAULT_CODEC)
            replay(events) if fold else pairs_fold(sid, events)
        return _since(t0)
    finally:
        await store.aclose()


def typed_replay(path: Path, sids: list[str], fold: bool) -> Times:
    return trio.run(_typed_replay, path, sids, fold)


async def _bulk_replay(
    path: Path, sids: list[str], batch: int, fold: bool, codec: EventCodec = DEFAULT_CODEC
) -> Times:
    store = await SQLiteStore.open(path)
    try:
        t0 = _now()
        for i in range(0, len(sids), batch):
            if fold:
                await replay_sessions(store, sids[i : i + batch])
            else:
                await store.read_decoded_many(sids[i : i + batch], codec, pairs_fold)
        return _since(t0)
    finally:
        await store.aclose()


async def _envelope_replay(path: Path, sids: list[str]) -> Times:
    store = await SQLiteStore.open(path)
    try:
        decode = DEFAULT_CODEC.decode
        t0 = _now()
        for sid in sids:
            pairs_fold(sid, [decode(e) for e in await store.read(sid)])
        return _since(t0)
    finally:
        await store.aclose()


def direct_replay(path: Path, sids: list[str], codec: EventCodec = DEFAULT_CODEC) -> Times:
    # The typing alone, without the store: the same SELECT on this thread,
    # orjson, then the codec's typed decode of each payload; no envelope, no
    # thread hop. Shows what the store's envelope and hop cost on top.

    conn = sqlite3.connect(path)
    from_payload = codec.from_payload
    loads = orjson.loads
    t0 = _now()
    for sid in sids:
        rows = conn.execute(
            "SELECT tag, schema_version, payload FROM events WHERE session_id = ? ORDER BY seq",
            (sid,),
        )
        pairs_fold(sid, [from_payload(tag, version, loads(text)) for tag, version, text in rows])
    elapsed = _since(t0)
    conn.close()
    return elapsed


def structurer_codecs() -> dict[str, EventCodec]:
    """Codecs that differ from DEFAULT_CODEC only in their current-version
    structurers: cattrs' own generated ones instead of the codec's (``cattrs``:
    the codec's strict hooks on a ``Converter(detailed_validation=False)``;
    ``cattrs+``: exact-type hooks, a closure per Optional and Literal instead
    of cattrs' dispatching ones, and the NewType registered directly). Only
    for valid payloads: they raise other errors than the codec expects."""
    import types
    from typing import Union, get_args, get_origin

    import cattrs
    from cattrs._compat import is_literal
    from cattrs.strategies import configure_tagged_union

    from turnledger.events import HistoryPolicy, RequestId
    from turnledger.events import codec as codec_module

    def converter(hook: Callable[[type[Any]], Any]) -> cattrs.Converter:
        conv = cattrs.Converter(forbid_extra_keys=True, detailed_validation=False)
        for t in (str, int, bool):
            conv.register_structure_hook(t, hook(t))
        configure_tagged_union(
            HistoryPolicy,
            conv,
            tag_generator=lambda cls: codec_module._POLICY_TAGS[cls],
            tag_name="kind",
        )
        return conv

    def exact(t: type[Any]) -> Any:
        def structure(v: Any, _: Any) -> Any:
            if type(v) is not t:
                raise TypeError(t)
            return v

        return structure

    def optional(tp: Any) -> Any:
        inner_t = next(a for a in get_args(tp) if a is not type(None))
        inner = tuned.get_structure_hook(inner_t)
        return lambda v, _: None if v is None else inner(v, inner_t)

    def is_optional(tp: Any) -> bool:
        origin: object = get_origin(tp)
        args = get_args(tp)
        return origin in (Union, types.UnionType) and len(args) == 2 and type(None) in args

    def literal(tp: Any) -> Any:
        allowed = frozenset(get_args(tp))

        def structure(v: Any, _: Any) -> Any:
            if type(v) is not str or v not in allowed:
                raise ValueError(v)
            return v

        return structure

    tuned = converter(exact)
    tuned.register_structure_hook(RequestId, exact(str))
    tuned.register_structure_hook_factory(
        is_optional,
        optional,
    )
    tuned.register_structure_hook_factory(is_literal, literal)
    out = {}
    for name, conv in (("cattrs", converter(codec_module._strict)), ("cattrs+", tuned)):
        codec = out[name] = EventCodec()
        # every tag, SessionStarted's tagged policy union included
        codec._current = {
            # cattrs' generated structurers take the type as an optional second argument
            tag: (
                codec_module.SCHEMA_VERSIONS[tag],
                cast(Callable[[Any], Any], conv.get_structure_hook(cls)),
            )
            for cls, tag in codec_module.WIRE_TAGS.items()
        }
        for ev in session_events("s", 1):  # the same events as the codec's
            assert codec.decode(ev) == DEFAULT_CODEC.decode(ev), name
    return out


def bare_replay(path: Path, sids: list[str], loads: Callable[[Any], Any] = json.loads) -> Times:
    conn = sqlite3.connect(path)
    t0 = _now()
    for sid in sids:
        rows = conn.execute(
            "SELECT tag, payload FROM events WHERE session_id = ? ORDER BY seq", (sid,)
        )
        dict_fold(sid, [(tag, loads(payload)) for tag, payload in rows])
    elapsed = _since(t0)
    conn.close()
    return elapsed


def es_replay(path: Path, sids: list[str]) -> Times:
    datastore, recorder = _es_recorder(path)
    t0 = _now()
    for sid in sids:
        dict_fold(sid, [(ev.topic, json.loads(ev.state)) for ev in recorder.select_events(sid)])
    elapsed = _since(t0)
    datastore.close()
    return elapsed


# --- driver -------------------------------------------------------------------


def median_of(repeat: int, run: Callable[[Path], float]) -> float:
    times = []
    for _ in range(repeat):
        with tempfile.TemporaryDirectory(dir=os.environ.get("BENCH_DIR")) as d:
            times.append(run(Path(d) / "events.db"))
    return statistics.median(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--big", action="store_true", help="longer runs: more turns, repeats")
    parser.add_argument("--sessions", type=int, default=1000)
    parser.add_argument("--turns", type=int, help="turns per session (default 3; --big 10)")
    parser.add_argument("--repeat", type=int, help="runs per contender (default 3; --big 5)")
    parser.add_argument("--synchronous", default="FULL", choices=["NORMAL", "FULL"])
    parser.add_argument("--replay-sessions", type=int, help="default 200; --big 1000")
    parser.add_argument("--replay-turns", type=int, default=30)
    parser.add_argument("--only", choices=["appends", "replay"], help="run one half")
    parser.add_argument("--replay-batch", type=int, default=100, help="sessions per bulk read")
    parser.add_argument("--replay-rounds", type=int, help="default 9; --big 15")
    parser.add_argument("--structurers", action="store_true", help="replay: also other structurers")
    parser.add_argument("--answer-chars", type=int, default=600, help="answer length")
    args = parser.parse_args()
    global ANSWER
    ANSWER = "回答 {i}: " + ANSWER_TEXT * max(1, args.answer_chars // len(ANSWER_TEXT))
    turns_per = args.turns or (10 if args.big else 3)
    repeat = args.repeat or (5 if args.big else 3)
    replay_sessions = args.replay_sessions or (1000 if args.big else 200)
    rounds = args.replay_rounds or (15 if args.big else 9)
    sync = args.synchronous

    print(
        f"python {platform.python_version()}, sqlite {sqlite3.sqlite_version}, "
        f"{os.cpu_count()} cpus; tmp dir {os.environ.get('BENCH_DIR') or tempfile.gettempdir()}"
    )
    if args.only != "replay":
        appends(args.sessions, turns_per, repeat, sync)
    if args.only != "appends":
        replays(replay_sessions, args.replay_turns, rounds, args.replay_batch, args.structurers)


def appends(sessions: int, turns_per: int, repeat: int, sync: Synchronous) -> None:
    sids, turns = dataset(sessions, turns_per)
    n_turns = len(sids) * turns_per
    print(
        f"\nappends: {len(sids)} concurrent sessions x {turns_per} turns = {n_turns} turns "
        f"of 3 events (answers of {len(ANSWER)} chars); WAL, synchronous={sync}; "
        f"median of {repeat}"
    )
    with tempfile.TemporaryDirectory() as d:
        es_sync = es_synchronous(Path(d) / "probe.db")

    groups: list[Any] = []

    def group_run(p: Path) -> float:
        elapsed, counts = store_appends(p, sids, turns, True, sync)
        groups.append(counts)
        return elapsed

    results = {
        "group": median_of(repeat, group_run),
        "per-append": median_of(repeat, lambda p: store_appends(p, sids, turns, False, sync)[0]),
        "per-append, no mark": median_of(
            repeat, lambda p: store_appends(p, sids, turns, False, sync, False)[0]
        ),
        "bare": median_of(repeat, lambda p: bare_appends(p, sids, turns, sync)),
        "eventsourcing": median_of(repeat, lambda p: es_appends(p, sids, turns)),
    }
    rate = {k: n_turns / v for k, v in results.items()}
    for name, r in rate.items():
        note = ""
        if name == "group":
            tx, appends = groups[len(groups) // 2]
            note = f"  ({appends} appends in {tx} transactions in the middle run)"
        if name == "eventsourcing":
            note = f"  (its default synchronous: {es_sync})"
        per_turn = results[name] * 1e6 / n_turns
        print(f"  {name:20s} {r:10,.0f} turns/s  {per_turn:8.1f} µs/turn{note}")
    print(f"  group / bare          {rate['group'] / rate['bare']:6.2f}x   (goal >= 0.5x)")
    print(f"  group / per-append    {rate['group'] / rate['per-append']:6.2f}x")
    mark_cost = rate["per-append"] / rate["per-append, no mark"]
    print(f"  per-append / no mark  {mark_cost:6.2f}x   (the acknowledged mark's pwrite)")
    print(f"  group / eventsourcing {rate['group'] / rate['eventsourcing']:6.2f}x   (goal >= 3x)")
    print(f"  eventsourcing / bare  {rate['eventsourcing'] / rate['bare']:6.2f}x")


def replays(
    replay_sessions: int, replay_turns: int, rounds: int, batch_size: int, structurers: bool
) -> None:
    rsids = [f"session-{n:05d}" for n in range(replay_sessions)]
    n_events = replay_sessions * (1 + 3 * replay_turns)
    print(
        f"\nreplay: {replay_sessions} sessions x {1 + 3 * replay_turns} events = "
        f"{n_events} events; {rounds} rounds"
    )
    with tempfile.TemporaryDirectory() as d:
        path = Path(d) / "replay.db"
        trio.run(_fill, path, rsids, replay_turns)
        es_path = Path(d) / "es.db"
        datastore, recorder = _es_recorder(es_path)
        from eventsourcing.persistence import StoredEvent as ESEvent

        for sid in rsids:
            batch = session_events(sid, replay_turns)
            recorder.insert_events(
                [ESEvent(e.session_id, e.seq, e.tag, _DUMPS(e.payload).encode()) for e in batch]
            )
        datastore.close()

        contenders: dict[str, Callable[[], Times]] = {
            "typed": lambda: typed_replay(path, rsids, False),
            "typed+fold": lambda: typed_replay(path, rsids, True),
            "typed bulk": lambda: trio.run(_bulk_replay, path, rsids, batch_size, False),
            "bulk+fold": lambda: trio.run(_bulk_replay, path, rsids, batch_size, True),
            "envelopes": lambda: trio.run(_envelope_replay, path, rsids),
            "codec alone": lambda: direct_replay(path, rsids),
            "bare": lambda: bare_replay(path, rsids),
            "bare orjson": lambda: bare_replay(path, rsids, orjson.loads),
            "eventsourcing": lambda: es_replay(es_path, rsids),
        }
        if structurers:
            for label, codec in structurer_codecs().items():
                contenders[f"bulk [{label}]"] = functools.partial(
                    trio.run, _bulk_replay, path, rsids, batch_size, False, codec
                )
                contenders[f"alone [{label}]"] = functools.partial(
                    direct_replay, path, rsids, codec
                )
        runs: dict[str, list[Times]] = {k: [] for k in contenders}
        order = list(contenders)
        shuffle = random.Random(2026).shuffle  # the same orders on every run
        for _ in range(rounds):
            shuffle(order)  # no contender always runs right after another
            for name in order:
                runs[name].append(contenders[name]())

    def median(name: str, k: int) -> float:
        return statistics.median(r[k] for r in runs[name])

    def per_round(name: str, k: int, base: str = "bare") -> float:
        # base's time / the contender's time in the same round: its speed ratio
        return statistics.median(b[k] / t[k] for b, t in zip(runs[base], runs[name], strict=True))

    print(f"  {'':14s} {'events/s':>10s} {'µs/event':>9s} {'CPU µs/event':>13s}")
    for name in contenders:
        wall, cpu = median(name, 0), median(name, 1)
        print(
            f"  {name:14s} {n_events / wall:10,.0f} {wall * 1e6 / n_events:9.2f}"
            f" {cpu * 1e6 / n_events:13.2f}"
        )
    print("  speed against bare    wall: of medians, per round   CPU: per round")
    for name in contenders:
        if name == "bare":
            continue
        goal = {
            "typed bulk": "   (goal >= 1x: replay into typed events)",
            "typed": "   (one reader-thread trip per session)",
        }.get(name, "")
        print(
            f"  {name + ' / bare':21s} {median('bare', 0) / median(name, 0):6.2f}x"
            f" {per_round(name, 0):6.2f}x          {per_round(name, 1):6.2f}x{goal}"
        )
    if structurers:
        print("  the codec's speed against        wall: of medians, per round   CPU: per round")
        for name in contenders:
            if "[" not in name:
                continue
            base = "typed bulk" if name.startswith("bulk") else "codec alone"
            print(
                f"  {base + ' / ' + name:32s} {median(name, 0) / median(base, 0):6.2f}x"
                f" {per_round(base, 0, name):6.2f}x          {per_round(base, 1, name):6.2f}x"
            )


if __name__ == "__main__":
    main()
