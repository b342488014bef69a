"""Reading conversations back from a freshly opened SQLite file, against the
OpenAI Agents SDK's ``SQLiteSession.get_items``.

    python benchmarks/readback.py [--sessions N] [--turns N] [--rounds N]

The same conversations (``--sessions`` sessions, default 100, of ``--turns``
turns, default 30: a 100-character question and a 600-character answer,
mixed scripts) are written once by each contender to a file of its own,
both with WAL and ``synchronous=FULL``. Each timed run then opens the file
afresh and reads every session back:

- ``replay_sessions``  ``SQLiteStore.open`` then ``turnledger.sessions.
  replay_sessions`` of all the ids: each session's whole state (history,
  outcomes, the state machine's phase), then ``aclose``;
- ``one by one``       the same store, ``read_decoded`` + ``replay`` per
  session (how a hub recovers one session);
- ``agents``           per session, ``SQLiteSession(sid, path)`` and
  ``await session.get_items()`` (its items as dicts: a user message and the
  assistant's output message per turn, as ``Runner.run`` saves them), then
  ``close()``, in one ``asyncio.run``.

Rounds alternate the contenders in a shuffled order (``--rounds``, default
9); printed are sessions/s (medians), CPU per session and the ratios of
the medians against ``agents``.
"""

from __future__ import annotations

import argparse
import asyncio
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
from typing import Any

sys.path.insert(0, "src")

import trio

from turnledger.adapters.stores import SQLiteStore
from turnledger.events import (
    DEFAULT_CODEC,
    Event,
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
ANSWER = "回答 {i}: " + "the answer is committed only when complete. " * 13
SYSTEM = "你是一个简洁的助手。Answer briefly."


def session_events(sid: str, turns: int) -> list[StoredEvent]:
    events: list[Event] = [SessionStarted(SYSTEM, "bench-model", Ledger())]
    for i in range(turns):
        rid = RequestId(f"{sid}/r{i}")
        events += [
            TurnSubmitted(rid, QUESTION.format(i=i), i, 0, 900 + i),
            StreamStarted(rid),
            TurnCommitted(rid, ANSWER.format(i=i), "stop", Usage(120, 160, 280)),
        ]
    return [
        DEFAULT_CODEC.encode(ev, session_id=sid, seq=k, recorded_at=time.time())
        for k, ev in enumerate(events, 1)
    ]


def agents_items(sid: str, turns: int) -> list[dict[str, Any]]:
    items: list[dict[str, Any]] = []
    for i in range(turns):
        items.append({"role": "user", "content": QUESTION.format(i=i)})
        items.append(
            {
                "id": f"msg_{sid}_{i}",
                "type": "message",
                "role": "assistant",
                "status": "completed",
                "content": [{"type": "output_text", "text": ANSWER.format(i=i), "annotations": []}],
            }
        )
    return items


async def _fill_turnledger(path: Path, sids: list[str], turns: int) -> None:
    store = await SQLiteStore.open(path)  # WAL, synchronous=FULL
    try:
        for sid in sids:
            await store.append(sid, session_events(sid, turns), 0)
    finally:
        await store.aclose()


async def _fill_agents(path: Path, sids: list[str], turns: int) -> None:
    from agents.memory import SQLiteSession

    for sid in sids:
        session = SQLiteSession(sid, path)
        # The SDK types items as its own TypedDicts; these are plain dicts of
        # the same shape (Any: the check is the same with or without the SDK).
        items: Any = agents_items(sid, turns)
        await session.add_items(items)
        session.close()


def _synchronous(path: Path) -> str:
    conn = sqlite3.connect(path)
    try:
        mode = conn.execute("PRAGMA journal_mode").fetchone()[0]
        sync = conn.execute("PRAGMA synchronous").fetchone()[0]
    finally:
        conn.close()
    return f"{mode}, synchronous={({0: 'OFF', 1: 'NORMAL', 2: 'FULL', 3: 'EXTRA'})[sync]}"


Times = tuple[float, float]


def _timed(fn: Callable[[], Any], check: Callable[[Any], None]) -> Times:
    t0, c0 = time.perf_counter(), time.process_time()
    result = fn()
    times = time.perf_counter() - t0, time.process_time() - c0
    check(result)
    return times


def bulk(path: Path, sids: list[str]) -> Any:
    async def run() -> Any:
        store = await SQLiteStore.open(path)
        try:
            return await replay_sessions(store, sids)
        finally:
            await store.aclose()

    return trio.run(run)


def one_by_one(path: Path, sids: list[str]) -> Any:
    async def run() -> Any:
        store = await SQLiteStore.open(path)
        try:
            return {sid: replay(await store.read_decoded(sid, DEFAULT_CODEC)) for sid in sids}
        finally:
            await store.aclose()

    return trio.run(run)


def agents(path: Path, sids: list[str]) -> Any:
    from agents.memory import SQLiteSession

    async def run() -> Any:
        out = {}
        for sid in sids:
            session = SQLiteSession(sid, path)
            try:
                out[sid] = await session.get_items()
            finally:
                session.close()
        return out

    return asyncio.run(run())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--sessions", type=int, default=100)
    parser.add_argument("--turns", type=int, default=30)
    parser.add_argument("--rounds", type=int, default=9)
    args = parser.parse_args()
    import agents as agents_sdk

    n, turns = args.sessions, args.turns
    sids = [f"session-{i:05d}" for i in range(n)]
    print(
        f"python {platform.python_version()}, sqlite {sqlite3.sqlite_version}, "
        f"{os.cpu_count()} cpus, openai-agents {agents_sdk.__version__}"
    )
    with tempfile.TemporaryDirectory(dir=os.environ.get("BENCH_DIR")) as d:
        ours, theirs = Path(d) / "turnledger.db", Path(d) / "agents.db"
        trio.run(_fill_turnledger, ours, sids, turns)
        asyncio.run(_fill_agents(theirs, sids, turns))
        print(f"{n} sessions x {turns} turns; turnledger: {_synchronous(ours)}", end="")
        print(f"; agents: {_synchronous(theirs)} (its default)")

        def check_states(states: Any) -> None:
            assert len(states) == n and all(len(s.turns) == turns for s in states.values())

        def check_items(items: Any) -> None:
            assert len(items) == n and all(len(v) == 2 * turns for v in items.values())

        contenders: dict[str, Callable[[], Times]] = {
            "replay_sessions": lambda: _timed(lambda: bulk(ours, sids), check_states),
            "one by one": lambda: _timed(lambda: one_by_one(ours, sids), check_states),
            "agents": lambda: _timed(lambda: agents(theirs, sids), check_items),
        }
        runs: dict[str, list[Times]] = {k: [] for k in contenders}
        order = list(contenders)
        shuffle = random.Random(2026).shuffle
        for _ in range(args.rounds):
            shuffle(order)
            for name in order:
                runs[name].append(contenders[name]())

    def med(name: str, k: int) -> float:
        return statistics.median(r[k] for r in runs[name])

    print(f"  {'':16s} {'sessions/s':>11s} {'CPU µs/session':>15s}   ({args.rounds} rounds)")
    for name in contenders:
        print(f"  {name:16s} {n / med(name, 0):11,.0f} {med(name, 1) * 1e6 / n:15,.0f}")
    for name in ("replay_sessions", "one by one"):
        wall = med("agents", 0) / med(name, 0)
        cpu = med("agents", 1) / med(name, 1)
        print(f"  {name} / agents: {wall:5.2f}x wall, {cpu:5.2f}x CPU   (goal >= 1.5x)")


if __name__ == "__main__":
    main()
