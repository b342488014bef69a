"""Where a hub turn's time goes: the profile behind ``benchmarks/actors.py``.

    python benchmarks/profile_turn.py [--sessions 200] [--turns 10]

Runs the throughput workload of ``actors.py`` (concurrent sessions, instant
provider, MemoryStore, logs filtered) and prints, per turn:

- trio task steps (a trio ``Instrument`` counting ``before_task_step``), by
  task name;
- CPU time (``time.process_time``) against ``decide``/``evolve`` alone, and
  the share of it the cyclic GC took (``gc.callbacks``), by generation;
- a deterministic profile (``cProfile``) of one run, its own time grouped by
  where the code lives: the pure core, the runtime, the store, trio. The
  GC's time cannot be told apart there (cProfile bills a collection to
  whichever function allocated), so the GC figure above is the one to read
  for it.

cProfile slows Python calls down unevenly; its shares are a map, the CPU
figures above it are the measure. ``benchmarks/profile_turn.md`` keeps the
summary of the last run that mattered, so the next change starts from it.
"""

from __future__ import annotations

import argparse
import collections
import cProfile
import gc
import pstats
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import trio

sys.path.insert(0, str(Path(__file__).parent))

import actors

from turnledger.events import Window
from turnledger.sessions import open_hub
from turnledger.testing import MemoryStore, ScriptedProvider


class StepCounter(trio.abc.Instrument):
    """Counts task steps by task name."""

    def __init__(self) -> None:
        self.steps: collections.Counter[str] = collections.Counter()

    def before_task_step(self, task: trio.lowlevel.Task) -> None:
        self.steps[task.name.rsplit(".", 1)[-1]] += 1


class GcTimer:
    """CPU time of the cyclic GC, by generation, while installed."""

    def __init__(self) -> None:
        self.seconds: collections.defaultdict[int, float] = collections.defaultdict(float)
        self.runs: collections.Counter[int] = collections.Counter()
        self._t0 = 0.0

    def __call__(self, phase: str, info: dict[str, Any]) -> None:
        if phase == "start":
            self._t0 = time.process_time()
        else:
            generation = info["generation"]
            self.seconds[generation] += time.process_time() - self._t0
            self.runs[generation] += 1


def counted_steps(sessions: int, turns: int) -> collections.Counter[str]:
    counter = StepCounter()

    async def main() -> None:
        async with open_hub(MemoryStore(), ScriptedProvider.instant(), model="m") as hub:
            for i in range(sessions):
                await hub.open_session(f"s{i}")

            async def caller(sid: str) -> None:
                for t in range(turns):
                    await (await hub.submit(sid, f"question {t}")).outcome()

            trio.lowlevel.add_instrument(counter)
            try:
                async with trio.open_nursery() as nursery:
                    for i in range(sessions):
                        nursery.start_soon(caller, f"s{i}")
            finally:
                trio.lowlevel.remove_instrument(counter)

    trio.run(main)
    return counter.steps


#: Task names (their last part) as the summary names them.
_TASKS = {"run": "session actors", "caller": "callers", "request": "request tasks"}

_AREAS = (
    ("turnledger/sessions/", "pure core (decide, evolve, projection)"),
    ("turnledger/events/", "codec (events to envelopes)"),
    ("turnledger/runtime/", "runtime (actor, hub, mailbox, tickets)"),
    ("turnledger/adapters/stores/", "store (MemoryStore)"),
    ("turnledger/testing/", "provider (ScriptedProvider.instant)"),
    ("/trio/", "trio (scheduler, checkpoints)"),
    ("benchmarks/", "callers (the benchmark's tasks)"),
)


def profile_areas(sessions: int, turns: int) -> list[tuple[str, float]]:
    profiler = cProfile.Profile()
    profiler.enable()
    actors.hub_turns(sessions, turns)
    profiler.disable()
    stats: Any = getattr(pstats.Stats(profiler), "stats")  # noqa: B009 (untyped)
    areas: collections.defaultdict[str, float] = collections.defaultdict(float)
    for (filename, _, _), (_, _, tottime, _, _) in stats.items():
        for marker, area in _AREAS:
            if marker in filename:
                areas[area] += tottime
                break
        else:
            areas["other (builtins, attrs, the GC billed to allocations)"] += tottime
    total = sum(areas.values())
    ranked = sorted(areas.items(), key=lambda item: -item[1])
    return [(area, seconds / total) for area, seconds in ranked]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sessions", type=int, default=200)
    parser.add_argument("--turns", type=int, default=10)
    parser.add_argument("--runs", type=int, default=3)
    args = parser.parse_args()
    sessions, turns, runs = args.sessions, args.turns, args.runs
    total = sessions * turns
    actors.quiet_logs()
    print(f"a hub turn -- Python {sys.version.split()[0]}, trio {trio.__version__}")
    print(f"{sessions} sessions x {turns} turns, instant provider, MemoryStore,", end=" ")
    print(f"medians of {runs}\n")

    steps = counted_steps(sessions, turns)
    print(f"trio task steps per turn: {sum(steps.values()) / total:.2f}")
    for name, n in steps.most_common():
        print(f"  {_TASKS.get(name, name):28} {n / total:5.2f}")

    actors.hub_turns(sessions, turns)  # warm up
    timer = GcTimer()
    gc.callbacks.append(timer)
    try:
        cpu = []
        gc_share = []
        by_generation: list[dict[int, float]] = []
        for _ in range(runs):
            timer.seconds.clear()
            timer.runs.clear()
            _, c, _ = actors.hub_turns(sessions, turns)
            cpu.append(c)
            gc_share.append(sum(timer.seconds.values()))
            by_generation.append(dict(timer.seconds))
    finally:
        gc.callbacks.remove(timer)
    hub = statistics.median(cpu) / total
    in_gc = statistics.median(gc_share) / total
    pure = statistics.median(actors.pure_turns(20_000, Window(8)) for _ in range(runs)) / 20_000
    print(f"\nCPU per turn: hub {hub * 1e6:.1f} us, decide/evolve alone {pure * 1e6:.1f} us,")
    print(f"  ratio {hub / pure:.2f}x; without the GC's share {(hub - in_gc) / pure:.2f}x")
    print(f"  cyclic GC {in_gc * 1e6:.1f} us per turn ({in_gc / hub:.0%} of the hub's CPU):")
    for generation in (0, 1, 2):
        seconds = statistics.median(g.get(generation, 0.0) for g in by_generation)
        print(f"    generation {generation}: {seconds / total * 1e6:5.1f} us per turn")

    print("\nown time by area (cProfile, one run):")
    for area, share in profile_areas(sessions, turns):
        print(f"  {share:6.1%}  {area}")


if __name__ == "__main__":
    main()
