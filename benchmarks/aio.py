"""A streamed turn through ``turnledger.aio`` against the trio hub, in one run.

The loopback server runs in another process and streams the same answer as
benchmarks/streaming.py (mixed CJK/emoji text, OpenAI SSE). Each round opens
a hub on a fresh loop, warms it with one turn, then times ``--turns`` turns,
each submitted, its preview read to the end and its outcome awaited (the
in-memory store). Rows, rounds alternating and medians per turn reported
(wall time and this process's CPU time, all threads, so guest mode's I/O
thread counts):

- ``trio hub``: ``turnledger.sessions.open_hub`` under ``trio.run``; the
  baseline of the hub rows.
- ``trio hub, guest``: the same trio code run as a trio guest on an asyncio
  loop (``trio.lowlevel.start_guest_run``), nothing of ``turnledger.aio``:
  what guest mode alone costs the hub.
- ``turnledger.aio``: the asyncio API (``turnledger.aio.open_hub``), the
  consumer an asyncio task; minus the row above, what the bridge costs.
- ``httpx, trio`` / ``httpx, guest``: no turnledger at all, the same response
  read with httpx's ``aiter_bytes()`` under ``trio.run`` and as a trio guest:
  the floor, guest mode's own price for this stream.
- ``hub, guest, no thread*`` (Linux): an experiment, not something
  ``turnledger.aio`` does. It patches trio's private internals so that the
  asyncio loop waits on trio's epoll fd itself and runs the next guest tick,
  instead of trio waiting in a helper thread and hopping back with
  ``call_soon_threadsafe``: what the thread hop costs, and what a host-side
  wait in trio's guest mode (not offered by its public API) would save.

``hops`` counts the I/O waits that guest mode ran in its helper thread per
turn (each one a wakeup crossing threads back to the asyncio loop); ``reads``
is the number of reads the response arrived in. Goal: ``turnledger.aio``
within 1.3x the trio hub's client CPU.

    python benchmarks/aio.py [--rounds N] [--turns N] [--chunks N] [--quick]
"""

from __future__ import annotations

import argparse
import asyncio
import functools
import gc
import multiprocessing
import statistics
import sys
import time
from collections.abc import Awaitable, Callable
from typing import Any

import httpx
import outcome
import trio

# benchmarks/ is on sys.path when this file is run as a script.
from streaming import _serve, make_stream

from turnledger import aio
from turnledger.adapters.providers import OpenAIChat
from turnledger.aio._hub import start_guest
from turnledger.events import RequestId
from turnledger.sessions import ChatMessage, ChatRequest, open_hub
from turnledger.testing import MemoryStore


class Figures:
    """Per-turn wall and CPU seconds, and per-turn counts, of one row."""

    def __init__(self) -> None:
        self.wall: list[float] = []
        self.cpu: list[float] = []
        self.hops: list[int] = []
        self.reads: list[int] = []


class _Hops:
    """Counts the guest run's wakeups from its I/O thread (one per wait there)."""

    def __init__(self) -> None:
        self.count = 0

    def wrap(self, loop: asyncio.AbstractEventLoop) -> None:
        threadsafe = loop.call_soon_threadsafe

        def counted(callback: Callable[..., object], *args: Any, **kw: Any) -> Any:
            self.count += 1
            return threadsafe(callback, *args, **kw)

        loop.call_soon_threadsafe = counted  # type: ignore[method-assign, assignment]


async def _timed(
    one: Callable[[int], Awaitable[int]], turns: int, hops: _Hops, out: Figures
) -> None:
    await one(-1)  # warm: connection, caches
    for i in range(turns):
        gc.collect()
        h0 = hops.count
        w0, c0 = time.perf_counter(), time.process_time()
        reads = await one(i)
        out.wall.append(time.perf_counter() - w0)
        out.cpu.append(time.process_time() - c0)
        out.hops.append(hops.count - h0)
        out.reads.append(reads)


async def _turns(hub: Any, turns: int, answer: str, hops: _Hops, out: Figures) -> None:
    async def one(i: int) -> int:
        handle = await hub.submit(f"s{i}", "Stream, please.")
        text = [delta async for delta in handle.preview()]
        result = await handle.outcome()
        assert result.kind == "committed" and "".join(text) == answer, result
        return 0

    await _timed(one, turns, hops, out)


def _provider(base: str) -> OpenAIChat:
    return OpenAIChat(base_url=base, api_key="sk-bench", timeout=30.0, trust_env=False)


async def _trio_hub(base: str, turns: int, answer: str, out: Figures, hops: _Hops) -> None:
    async with (
        _provider(base) as provider,
        open_hub(MemoryStore(), provider, model="bench", idle_timeout=None) as hub,
    ):
        await _turns(hub, turns, answer, hops, out)


async def _httpx(base: str, turns: int, answer: str, out: Figures, hops: _Hops) -> None:
    provider = _provider(base)
    request = ChatRequest(RequestId("bench"), "bench", (ChatMessage("user", "Stream, please."),))
    body = provider.encoder.encode(request.model, request.messages)
    async with httpx.AsyncClient(timeout=30.0, trust_env=False) as client:

        async def one(i: int) -> int:
            reads = 0
            async with client.stream("POST", base + "/chat/completions", content=body) as r:
                async for _ in r.aiter_bytes():
                    reads += 1
            return reads

        await _timed(one, turns, hops, out)


def _under_trio(main: Callable[..., Awaitable[None]], *args: Any) -> None:
    trio.run(functools.partial(main, *args, _Hops()))


def _as_guest(main: Callable[..., Awaitable[None]], *args: Any) -> None:
    async def host() -> None:
        loop = asyncio.get_running_loop()
        hops = _Hops()
        hops.wrap(loop)
        done: asyncio.Future[outcome.Outcome[None]] = loop.create_future()
        start_guest(loop, done.set_result, main, *args, hops)
        (await done).unwrap()

    asyncio.run(host())


def _aio(base: str, turns: int, answer: str, out: Figures) -> None:
    async def main() -> None:
        hops = _Hops()
        hops.wrap(asyncio.get_running_loop())
        async with aio.open_hub(
            MemoryStore(), lambda: _provider(base), model="bench", idle_timeout=None
        ) as hub:
            await _turns(hub, turns, answer, hops, out)

    asyncio.run(main())


def _host_waits(get_events: Callable[[], Any], deliver: Callable[[Any], None]) -> None:
    """Stands in for the helper thread of a guest run's I/O wait: the asyncio
    loop watches trio's epoll fd (readable when any fd trio waits on is) and
    runs the next guest tick itself. An experiment on trio's private
    internals (trio 0.35, Linux), to show what the thread hop costs."""
    del deliver
    cells = get_events.__closure__ or ()
    free = dict(zip(get_events.__code__.co_freevars, (c.cell_contents for c in cells), strict=True))
    guest, timeout = free["self"], free["timeout"]
    io = guest.runner.io_manager
    loop = asyncio.get_running_loop()
    fd = io._epoll.fileno()
    timer: list[asyncio.TimerHandle] = []

    def tick() -> None:
        loop.remove_reader(fd)
        for handle in timer:
            handle.cancel()
        guest.unrolled_run_next_send = outcome.capture(io.get_events, 0)
        guest.runner.guest_tick_scheduled = True
        guest.guest_tick()

    loop.add_reader(fd, tick)
    if timeout != float("inf"):
        timer.append(loop.call_later(timeout, tick))


def _as_guest_no_thread(main: Callable[..., Awaitable[None]], *args: Any) -> None:
    run_module: Any = trio._core._run
    thread_soon = run_module.start_thread_soon
    run_module.start_thread_soon = _host_waits
    try:
        _as_guest(main, *args)
    finally:
        run_module.start_thread_soon = thread_soon


def _experiment_works() -> bool:
    run_module = getattr(trio._core, "_run", None)
    return sys.platform == "linux" and all(
        hasattr(run_module, name) for name in ("start_thread_soon", "GuestState")
    )


NO_THREAD = "hub, guest, no thread*"
ROWS: dict[str, Callable[[str, int, str, Figures], None]] = {
    "trio hub": lambda *a: _under_trio(_trio_hub, *a),
    "trio hub, guest": lambda *a: _as_guest(_trio_hub, *a),
    NO_THREAD: lambda *a: _as_guest_no_thread(_trio_hub, *a),
    "turnledger.aio": _aio,
    "httpx, trio": lambda *a: _under_trio(_httpx, *a),
    "httpx, guest": lambda *a: _as_guest(_httpx, *a),
}
if not _experiment_works():
    del ROWS[NO_THREAD]
#: The row each row's ratios are against.
BASELINE = {name: "httpx, trio" if name.startswith("httpx") else "trio hub" for name in ROWS}


def bench(chunks: int, gap: float, rounds: int, turns: int) -> None:
    how = f"a {gap * 1e3:g} ms pause after each chunk" if gap else "written back to back"
    print(f"\nA streamed turn of {chunks:,} chunks, {how}")
    _, answer = make_stream(chunks)
    ctx = multiprocessing.get_context("spawn")
    parent, child = ctx.Pipe()
    proc = ctx.Process(target=_serve, args=(child, chunks, gap), daemon=True)
    proc.start()
    figures = {name: Figures() for name in ROWS}
    try:
        base = f"http://127.0.0.1:{parent.recv()}/v1"
        for _ in range(rounds):
            for name, row in ROWS.items():
                row(base, turns, answer, figures[name])
    finally:
        parent.send("stop")
        proc.join(10)
    print(f"   median of {rounds} x {turns} turns, alternating rounds:")
    for name, f in figures.items():
        base_f = figures[BASELINE[name]]
        w, c = statistics.median(f.wall), statistics.median(f.cpu)
        bw, bc = statistics.median(base_f.wall), statistics.median(base_f.cpu)
        counts = f"hops {statistics.median(f.hops):5g}"
        if name.startswith("httpx"):
            counts += f"  reads {statistics.median(f.reads):5g}"
        print(
            f"     {name:22s} wall {w * 1e3:7.2f} ms ({w / bw:4.2f}x)"
            f"  client CPU {c * 1e3:7.2f} ms ({c / bc:4.2f}x)  {counts}"
        )
    if NO_THREAD in figures:
        print(
            "     * an experiment on trio's private internals, not what turnledger.aio does:"
            " the asyncio\n       loop waits on trio's epoll fd instead of a helper thread."
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
