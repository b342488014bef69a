"""The same conversations through turnledger, the OpenAI Agents SDK and
LangGraph, every one of them on SQLite with WAL and ``synchronous=FULL``.

    python benchmarks/peers.py [--quick] [--sizes 1000x3,100x30] [--rounds N]

Needs the ``bench`` extra (``pip install -e '.[bench]'``: ``openai-agents``,
``langgraph``, ``langgraph-checkpoint-sqlite``, ``aiosqlite``).

The work: ``S`` sessions of ``T`` turns each (a 100-character question, a
600-character answer, mixed scripts), one conversation after another, each
turn awaited before the next, as one client talking to one service. The
model answers at once and locally for everyone, so what is measured is the
storage and the runtime around it, not a model:

- ``turnledger``     ``open_hub`` over ``SQLiteStore`` with
  ``ScriptedProvider.instant(answer)`` (an ``AnswersAtOnce`` provider):
  ``await (await hub.submit(sid, question)).outcome()`` per turn;
- ``agents save``    the Agents SDK's ``SQLiteSession``, one
  ``add_items([question, answer])`` per turn (the least it can do);
- ``agents Runner``  ``Runner.run(agent, question, session=session)`` with a
  local ``Model`` that returns the answer at once (tracing disabled): the
  session as the SDK's runner uses it (history read, input and output saved);
- ``langgraph``      a ``StateGraph(MessagesState)`` with one node calling
  LangChain's ``FakeMessagesListChatModel``, compiled with
  ``AsyncSqliteSaver``, ``graph.ainvoke(...)`` per turn, default durability
  (``"async"``);
- ``langgraph exit`` the same with ``durability="exit"`` (one checkpoint at
  the end of each run of the graph).

How each gets WAL and ``synchronous=FULL``: ``SQLiteStore.open`` sets both
on its connections itself (``synchronous="FULL"`` is its default, read back
from ``store.synchronous``); ``SQLiteSession`` sets WAL on every connection
it opens, and a subclass adds ``PRAGMA synchronous=FULL`` in the same hook
(``_configure_connection``); ``AsyncSqliteSaver`` is given an ``aiosqlite``
connection on which both pragmas were run first. Every contender's setting
is read back from its own connection and printed.

Printed per size, medians of ``--rounds`` rounds (contenders in a shuffled
order each round, each on a file of its own in a fresh directory):

- turns/s           wall clock over all the turns (opening and closing
  included);
- CPU µs/turn       ``time.process_time`` of the same (every thread), and
  of it, in brackets, the kernel's share (``os.times().system``: the
  writes and fsyncs of each commit, the same floor for everyone);
- read sessions/s   a freshly opened file, every session read back:
  turnledger ``replay_sessions`` (each session's whole state), the SDK's
  ``get_items()`` per session, LangGraph's ``graph.aget_state`` per thread
  (wall clock, opening and closing included; and the CPU per session read);
- bytes/turn        the database file after a WAL checkpoint, divided by
  the turns.

and the ratios of turnledger's medians against each other contender's
(above 1: turnledger is ahead).
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
from turnledger.sessions import open_hub, replay_sessions
from turnledger.testing import ScriptedProvider

QUESTION = "问题 {i}: how does the ledger keep “turn {i}” whole? 🌱 " + "x" * 50
ANSWER = "回答: " + "the answer is committed only when complete. " * 13
SYSTEM = "你是一个简洁的助手。Answer briefly."
MODEL = "bench-model"
SYNC_NAMES = {0: "OFF", 1: "NORMAL", 2: "FULL", 3: "EXTRA"}

Pragmas = dict[str, str]


def _pragmas(conn: sqlite3.Connection) -> Pragmas:
    mode = conn.execute("PRAGMA journal_mode").fetchone()[0]
    sync = conn.execute("PRAGMA synchronous").fetchone()[0]
    return {"journal_mode": str(mode), "synchronous": SYNC_NAMES[int(sync)]}


# --- turnledger -----------------------------------------------------------------


def tl_write(path: Path, sids: list[str], turns: int) -> Pragmas:
    async def run() -> Pragmas:
        store = await SQLiteStore.open(path)  # WAL, synchronous=FULL (its default)
        try:
            provider = ScriptedProvider.instant(ANSWER)
            async with open_hub(store, provider, model=MODEL, system=SYSTEM) as hub:
                for sid in sids:
                    for i in range(turns):
                        outcome = await (await hub.submit(sid, QUESTION.format(i=i))).outcome()
                        assert outcome.kind == "committed", outcome
                    # The provider keeps every request for tests; a service's would not.
                    provider.requests.clear()
                    provider.closed.clear()
            return {"journal_mode": "wal", "synchronous": store.synchronous}
        finally:
            await store.aclose()

    return trio.run(run)


def tl_read(path: Path, sids: list[str], turns: int) -> None:
    async def run() -> Any:
        store = await SQLiteStore.open(path)
        try:
            return await replay_sessions(store, sids)
        finally:
            await store.aclose()

    states = trio.run(run)
    assert len(states) == len(sids) and all(len(s.turns) == turns for s in states.values())


# --- the OpenAI Agents SDK ------------------------------------------------------


def _full_sync_session_class() -> Any:
    """``SQLiteSession`` whose every connection also runs ``synchronous=FULL``.

    Built with ``type()`` so that the check (``mypy --strict``) is the same
    with and without the SDK installed (without it, its classes are ``Any``).
    """
    from agents.memory import SQLiteSession

    def configure(conn: sqlite3.Connection) -> None:
        SQLiteSession._configure_connection(conn)  # WAL, as the SDK does
        conn.execute("PRAGMA synchronous=FULL")

    return type(
        "FullSyncSQLiteSession",
        (SQLiteSession,),
        {"_configure_connection": staticmethod(configure)},
    )


def _session_pragmas(session: Any) -> Pragmas:
    with session._locked_connection() as conn:
        return _pragmas(conn)


def _answer_item(sid: str, i: int) -> dict[str, Any]:
    return {
        "id": f"msg_{sid}_{i}",
        "type": "message",
        "role": "assistant",
        "status": "completed",
        "content": [{"type": "output_text", "text": ANSWER, "annotations": []}],
    }


def agents_save_write(path: Path, sids: list[str], turns: int) -> Pragmas:
    session_class = _full_sync_session_class()

    async def run() -> Pragmas:
        pragmas: Pragmas = {}
        for sid in sids:
            session = session_class(sid, path)
            try:
                for i in range(turns):
                    user = {"role": "user", "content": QUESTION.format(i=i)}
                    await session.add_items([user, _answer_item(sid, i)])
                pragmas = await asyncio.to_thread(_session_pragmas, session)
            finally:
                session.close()
        return pragmas

    return asyncio.run(run())


def _instant_model() -> Any:
    """An Agents SDK ``Model`` answering ``ANSWER`` at once, with no network."""
    from agents import ModelResponse, Usage
    from agents.models.interface import Model
    from openai.types.responses import ResponseOutputMessage, ResponseOutputText

    async def get_response(self: Any, *args: Any, **kwargs: Any) -> Any:
        self.calls += 1
        text = ResponseOutputText(type="output_text", text=ANSWER, annotations=[])
        message = ResponseOutputMessage(
            id=f"msg_{self.calls}",
            type="message",
            role="assistant",
            status="completed",
            content=[text],
        )
        return ModelResponse(output=[message], usage=Usage(), response_id=None)

    def stream_response(self: Any, *args: Any, **kwargs: Any) -> Any:
        raise NotImplementedError("the benchmark does not stream")

    cls = type(
        "InstantModel",
        (Model,),
        {"calls": 0, "get_response": get_response, "stream_response": stream_response},
    )
    return cls()


def agents_runner_write(path: Path, sids: list[str], turns: int) -> Pragmas:
    from agents import Agent, RunConfig, Runner, set_tracing_disabled

    set_tracing_disabled(True)
    session_class = _full_sync_session_class()
    agent = Agent(name="bench", instructions=SYSTEM, model=_instant_model())
    config = RunConfig(tracing_disabled=True)

    async def run() -> Pragmas:
        pragmas: Pragmas = {}
        for sid in sids:
            session = session_class(sid, path)
            try:
                for i in range(turns):
                    result = await Runner.run(
                        agent, QUESTION.format(i=i), session=session, run_config=config
                    )
                    assert result.final_output == ANSWER
                pragmas = await asyncio.to_thread(_session_pragmas, session)
            finally:
                session.close()
        return pragmas

    return asyncio.run(run())


def agents_read(path: Path, sids: list[str], turns: int) -> None:
    from agents.memory import SQLiteSession

    async def run() -> dict[str, Any]:
        out = {}
        for sid in sids:
            session = SQLiteSession(sid, path)
            try:
                out[sid] = await session.get_items()
            finally:
                session.close()
        return out

    items = asyncio.run(run())
    assert len(items) == len(sids) and all(len(v) == 2 * turns for v in items.values())


# --- LangGraph --------------------------------------------------------------------


async def _lg_open(path: Path) -> tuple[Any, Any, Pragmas]:
    """A compiled graph over an ``AsyncSqliteSaver`` on a connection with
    WAL and ``synchronous=FULL``; and the pragmas read back from it."""
    import aiosqlite
    from langchain_core.language_models.fake_chat_models import FakeMessagesListChatModel
    from langchain_core.messages import AIMessage
    from langgraph.checkpoint.sqlite.aio import AsyncSqliteSaver
    from langgraph.graph import START, MessagesState, StateGraph

    conn = await aiosqlite.connect(path)
    await conn.execute("PRAGMA journal_mode=WAL")
    await conn.execute("PRAGMA synchronous=FULL")
    async with conn.execute("PRAGMA journal_mode") as cur:
        row = await cur.fetchone()
        assert row is not None
        mode = row[0]
    async with conn.execute("PRAGMA synchronous") as cur:
        row = await cur.fetchone()
        assert row is not None
        sync = row[0]
    saver = AsyncSqliteSaver(conn)
    await saver.setup()
    model = FakeMessagesListChatModel(responses=[AIMessage(content=ANSWER)])

    async def chat(state: Any) -> dict[str, Any]:
        reply = await model.ainvoke(state["messages"])
        # The fake model hands out the same message object every time, and
        # the messages reducer gives it an id in place: without a copy each
        # answer would replace the one before it.
        return {"messages": [reply.model_copy(update={"id": None})]}

    builder: Any = StateGraph(MessagesState)
    builder.add_node("chat", chat)
    builder.add_edge(START, "chat")
    graph = builder.compile(checkpointer=saver)
    return graph, conn, {"journal_mode": str(mode), "synchronous": SYNC_NAMES[int(sync)]}


def lg_write(durability: str | None) -> Callable[[Path, list[str], int], Pragmas]:
    def write(path: Path, sids: list[str], turns: int) -> Pragmas:
        extra = {} if durability is None else {"durability": durability}

        async def run() -> Pragmas:
            graph, conn, pragmas = await _lg_open(path)
            try:
                for sid in sids:
                    config = {"configurable": {"thread_id": sid}}
                    for i in range(turns):
                        message = {"role": "user", "content": QUESTION.format(i=i)}
                        if i == 0:
                            first = {"role": "system", "content": SYSTEM}
                            inputs = {"messages": [first, message]}
                        else:
                            inputs = {"messages": [message]}
                        await graph.ainvoke(inputs, config, **extra)
            finally:
                await conn.close()
            return pragmas

        return asyncio.run(run())

    return write


def lg_read(path: Path, sids: list[str], turns: int) -> None:
    async def run() -> dict[str, Any]:
        graph, conn, _ = await _lg_open(path)
        try:
            out = {}
            for sid in sids:
                state = await graph.aget_state({"configurable": {"thread_id": sid}})
                out[sid] = state.values["messages"]
            return out
        finally:
            await conn.close()

    messages = asyncio.run(run())
    # the system message, then a question and an answer per turn
    assert len(messages) == len(sids)
    assert all(len(v) == 1 + 2 * turns for v in messages.values())


# --- the runs -------------------------------------------------------------------

Writer = Callable[[Path, list[str], int], Pragmas]
Reader = Callable[[Path, list[str], int], None]

CONTENDERS: dict[str, tuple[Writer, Reader]] = {
    "turnledger": (tl_write, tl_read),
    "agents save": (agents_save_write, agents_read),
    "agents Runner": (agents_runner_write, agents_read),
    "langgraph": (lg_write(None), lg_read),
    "langgraph exit": (lg_write("exit"), lg_read),
}


def file_bytes(path: Path) -> int:
    """The database's size once its WAL is checkpointed into it."""
    conn = sqlite3.connect(path)
    try:
        conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    finally:
        conn.close()
    wal = path.with_name(path.name + "-wal")
    return path.stat().st_size + (wal.stat().st_size if wal.exists() else 0)


# wall, CPU (write), wall (read), bytes, kernel CPU (write), CPU (read)
Figures = tuple[float, float, float, float, float, float]


def one_run(name: str, sessions: int, turns: int) -> tuple[Figures, Pragmas]:
    write, read = CONTENDERS[name]
    sids = [f"session-{i:05d}" for i in range(sessions)]
    with tempfile.TemporaryDirectory(dir=os.environ.get("BENCH_DIR")) as d:
        path = Path(d) / "peer.db"
        t0, c0, k0 = time.perf_counter(), time.process_time(), os.times().system
        pragmas = write(path, sids, turns)
        wall, cpu = time.perf_counter() - t0, time.process_time() - c0
        kernel = os.times().system - k0
        size = file_bytes(path)
        t0, c0 = time.perf_counter(), time.process_time()
        read(path, sids, turns)
        read_wall, read_cpu = time.perf_counter() - t0, time.process_time() - c0
    return (wall, cpu, read_wall, size, kernel, read_cpu), pragmas


def versions() -> str:
    from importlib.metadata import version

    names = ("openai-agents", "langgraph", "langgraph-checkpoint-sqlite", "aiosqlite")
    return ", ".join(f"{n} {version(n)}" for n in names)


def run_size(sessions: int, turns: int, rounds: int, only: list[str]) -> None:
    n = sessions * turns
    runs: dict[str, list[Figures]] = {k: [] for k in only}
    pragmas: dict[str, Pragmas] = {}
    order = list(only)
    shuffle = random.Random(2026).shuffle
    for _ in range(rounds):
        shuffle(order)
        for name in order:
            figures, pragmas[name] = one_run(name, sessions, turns)
            runs[name].append(figures)

    def med(name: str, k: int) -> float:
        return statistics.median(r[k] for r in runs[name])

    print(f"\n{sessions} sessions x {turns} turns, medians of {rounds} rounds")
    for name in only:
        p = pragmas[name]
        print(f"  {name:15s} journal_mode={p['journal_mode']}, synchronous={p['synchronous']}")
    head = f"  {'':15s} {'turns/s':>9s} {'CPU µs/turn (kernel)':>20s} {'read sessions/s':>16s}"
    print(head + f" {'CPU µs/read':>12s} {'bytes/turn':>11s}")
    for name in only:
        print(
            f"  {name:15s} {n / med(name, 0):9,.0f} {med(name, 1) * 1e6 / n:12,.0f}"
            f" ({med(name, 4) * 1e6 / n:5,.0f})"
            f" {sessions / med(name, 2):16,.0f} {med(name, 5) * 1e6 / sessions:12,.0f}"
            f" {med(name, 3) / n:11,.0f}"
        )
    if "turnledger" in only:
        print("  turnledger against each (above 1: turnledger ahead)")
        print(
            f"  {'':15s} "
            + " ".join(f"{h:>9s}" for h in ("turns/s", "CPU", "reads/s", "read CPU", "bytes"))
        )
        for name in only:
            if name == "turnledger":
                continue
            ratios = (
                med(name, 0) / med("turnledger", 0),
                med(name, 1) / med("turnledger", 1),
                med(name, 2) / med("turnledger", 2),
                med(name, 5) / med("turnledger", 5),
                med(name, 3) / med("turnledger", 3),
            )
            print(f"  {name:15s} " + " ".join(f"{r:8.2f}x" for r in ratios))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="100 x 3 and 10 x 30, 3 rounds")
    parser.add_argument("--sizes", default=None, help="SESSIONSxTURNS,... (default 1000x3,100x30)")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--only", default=",".join(CONTENDERS), help="contenders, comma-separated")
    args = parser.parse_args()
    sizes = args.sizes or ("100x3,10x30" if args.quick else "1000x3,100x30")
    only = [name.strip() for name in args.only.split(",")]
    unknown = [name for name in only if name not in CONTENDERS]
    if unknown:
        parser.error(f"unknown contenders {unknown}; choose from {list(CONTENDERS)}")
    print(
        f"python {platform.python_version()}, sqlite {sqlite3.sqlite_version}, "
        f"{os.cpu_count()} cpus, load {os.getloadavg()[0]:.1f}; {versions()}"
    )
    # Imports and first-use work (schemas, caches) are no contender's turns.
    for name in only:
        one_run(name, 2, 2)
    for size in sizes.split(","):
        sessions, turns = (int(x) for x in size.lower().split("x"))
        run_size(sessions, turns, args.rounds, only)


if __name__ == "__main__":
    main()
