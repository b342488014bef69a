"""A streamed turn through ``turnledger.aio`` against the trio hub, in one run.

The loopback server runs in another process and streams the same answer as
benchmarks/streaming.py (mixed CJK/emoji text, OpenAI SSE). Each round opens
a hub on a fresh loop, warms it with one turn, then times ``--turns`` turns,
each submitted, its preview read to the end and its outcome awaited (the
in-memory store): once under ``trio.run`` with ``turnledger.sessions.open_hub``
and once under ``asyncio.run`` with ``turnledger.aio.open_hub`` (trio as a
guest on the asyncio loop). Rounds alternate (trio, asyncio, trio, ...) and
medians per turn are reported: wall time and this process's CPU time (all
threads, so guest mode's I/O thread counts). Goal: asyncio within 1.3x the
trio hub's client CPU.

    python benchmarks/aio.py [--rounds N] [--turns N] [--chunks N] [--quick]
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import multiprocessing
import statistics
import sys
import time
from typing import Any

import trio

# benchmarks/ is on sys.path when this file is run as a script.
from streaming import _serve, make_stream

from turnledger import aio
from turnledger.adapters.providers import OpenAIChat
from turnledger.sessions import open_hub
from turnledger.testing import MemoryStore

Figures = tuple[list[float], list[float]]


async def _turns(hub: Any, turns: int, answer: str, out: Figures) -> None:
    async def one(i: int) -> None:
        handle = await hub.submit(f"s{i}", "Stream, please.")
        text = [delta async for delta in handle.preview()]
        result = await handle.outcome()
        assert result.kind == "committed" and "".join(text) == answer, result

    await one(-1)  # warm: connection, caches
    for i in range(turns):
        gc.collect()
        w0, c0 = time.perf_counter(), time.process_time()
        await one(i)
        out[0].append(time.perf_counter() - w0)
        out[1].append(time.process_time() - c0)


def _provider(base: str) -> OpenAIChat:
    return OpenAIChat(base_url=base, api_key="sk-bench", timeout=30.0, trust_env=False)


def trio_round(base: str, turns: int, answer: str, out: Figures) -> None:
    async def main() -> None:
        async with (
            _provider(base) as provider,
            open_hub(MemoryStore(), provider, model="bench", idle_timeout=None) as hub,
        ):
            await _turns(hub, turns, answer, out)

    trio.run(main)


def asyncio_round(base: str, turns: int, answer: str, out: Figures) -> None:
    async def main() -> None:
        async with aio.open_hub(
            MemoryStore(), lambda: _provider(base), model="bench", idle_timeout=None
        ) as hub:
            await _turns(hub, turns, answer, out)

    asyncio.run(main())


def bench(chunks: int, gap: float, rounds: int, turns: int) -> None:
    how = f"a {gap * 1e3:g} ms pause after each chunk" if gap else "written back to back"
    print(f"\nA streamed turn of {chunks:,} chunks, {how}")
    _, answer = make_stream(chunks)
    ctx = multiprocessing.get_context("spawn")
    parent, child = ctx.Pipe()
    proc = ctx.Process(target=_serve, args=(child, chunks, gap), daemon=True)
    proc.start()
    figures: dict[str, Figures] = {"trio hub": ([], []), "turnledger.aio": ([], [])}
    try:
        base = f"http://127.0.0.1:{parent.recv()}/v1"
        for _ in range(rounds):
            trio_round(base, turns, answer, figures["trio hub"])
            asyncio_round(base, turns, answer, figures["turnledger.aio"])
    finally:
        parent.send("stop")
        proc.join(10)
    base_w = statistics.median(figures["trio hub"][0])
    base_c = statistics.median(figures["trio hub"][1])
    print(f"   median of {rounds} x {turns} turns, alternating rounds:")
    for name, (wall, cpu) in figures.items():
        w, c = statistics.median(wall), statistics.median(cpu)
        print(
            f"     {name:16s} wall {w * 1e3:7.2f} ms ({w / base_w:4.2f}x)"
            f"  client CPU {c * 1e3:7.2f} ms ({c / base_c:4.2f}x)"
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--turns", type=int, default=10)
    parser.add_argument("--chunks", type=int, default=2_000)
    parser.add_argument("--quick", action="store_true", help="fewer rounds and turns")
    args = parser.parse_args()
    if args.quick:
        args.rounds, args.turns, args.chunks = 2, 5, 500
    print(f"python {sys.version.split()[0]}, trio {trio.__version__}")
    # Back to back: a read carries many chunks.
    bench(args.chunks, 0.0, args.rounds, args.turns)
    # Paced: each chunk arrives on its own, as from a model generating tokens.
    bench(max(args.chunks // 10, 50), 0.0005, args.rounds, args.turns)


if __name__ == "__main__":
    main()
