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

- with ``--gc-detail``: what the cyclic GC walks (collections per 1,000
  turns by generation, the tracked objects alive in a generation when it is
  collected, by type, per turn), and CPU per turn under the collector
  settings an application may choose (default, ``gc.freeze()`` after
  warm-up, a first threshold of 10,000, the collector off), interleaved;
- with ``--only-work hub|pure --runs N``: nothing but that work, ``N``
  times, for an instruction count under valgrind (see ``profile_turn.md``:
  the difference between ``N = 3`` and ``N = 1`` is two runs' instructions,
  whatever the machine's load).

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


class YoungObjects:
    """Tracked objects alive in each generation as it is collected, by type
    (while installed; ``gc.get_objects`` is slow, so only for this report)."""

    def __init__(self) -> None:
        self.sizes: collections.defaultdict[int, list[int]] = collections.defaultdict(list)
        self.types: collections.Counter[str] = collections.Counter()

    def __call__(self, phase: str, info: dict[str, Any]) -> None:
        if phase != "start":
            return
        generation = info["generation"]
        objects = gc.get_objects(generation)
        self.sizes[generation].append(len(objects))
        if generation == 0:
            self.types.update(type(o).__qualname__ for o in objects)


def young_objects(sessions: int, turns: int) -> tuple[YoungObjects, list[int]]:
    """What the collector finds alive during ``sessions`` x ``turns`` turns
    (after a warm-up of 2 turns each), and its collections by generation."""
    young = YoungObjects()

    async def main() -> list[int]:
        async with open_hub(MemoryStore(), ScriptedProvider.instant(), model="m") as hub:
            for i in range(sessions):
                await hub.open_session(f"s{i}")

            async def caller(sid: str, n: int) -> None:
                for t in range(n):
                    await (await hub.submit(sid, f"question {t}")).outcome()

            async with trio.open_nursery() as nursery:
                for i in range(sessions):
                    nursery.start_soon(caller, f"s{i}", 2)
            gc.collect()
            before = [g["collections"] for g in gc.get_stats()]
            gc.callbacks.append(young)
            try:
                async with trio.open_nursery() as nursery:
                    for i in range(sessions):
                        nursery.start_soon(caller, f"s{i}", turns)
            finally:
                gc.callbacks.remove(young)
            return [g["collections"] - b for g, b in zip(gc.get_stats(), before, strict=True)]

    return young, trio.run(main)


def _cpu_under(setting: str, sessions: int, turns: int) -> float:
    """CPU seconds per turn with the collector as an application may set it."""
    threshold = gc.get_threshold()
    try:
        if setting == "gc.freeze() after warm-up":
            gc.collect()
            gc.freeze()
        elif setting == "first threshold 10,000":
            gc.set_threshold(10_000, threshold[1], threshold[2])
        elif setting == "collector off":
            gc.disable()
        return actors.hub_turns(sessions, turns)[1] / (sessions * turns)
    finally:
        gc.enable()
        gc.set_threshold(*threshold)
        gc.unfreeze()


def gc_detail(sessions: int, turns: int, runs: int) -> None:
    total = sessions * turns
    young, collections_ = young_objects(sessions, turns)
    print("\ncyclic GC: collections per 1,000 turns (generation 0 / 1 / 2):", end=" ")
    print(" / ".join(f"{n * 1000 / total:.1f}" for n in collections_))
    for generation, sizes in sorted(young.sizes.items()):
        print(
            f"  tracked objects alive when generation {generation} is collected:"
            f" median {statistics.median(sizes):,.0f}"
        )
    n0 = len(young.sizes.get(0, ())) or 1
    per_collection = sum(young.types.values()) / n0
    print(f"  generation 0, by type, per collection ({per_collection:.0f} objects):")
    for name, n in young.types.most_common(12):
        print(f"    {n / n0:7.1f}  {name}")

    settings = (
        "default",
        "gc.freeze() after warm-up",
        "first threshold 10,000",
        "collector off",
    )
    cpu: dict[str, list[float]] = {s: [] for s in settings}
    pure: list[float] = []
    for _ in range(runs):  # interleaved: the machine's load hits each alike
        pure.append(actors.pure_turns(20_000, Window(8)) / 20_000)
        for setting in settings:
            cpu[setting].append(_cpu_under(setting, sessions, turns))
    base = statistics.median(pure)
    print(f"\nCPU per turn by collector setting (the application's choice), medians of {runs}:")
    print(f"  {'decide/evolve alone':28} {base * 1e6:6.1f} us")
    for setting in settings:
        med = statistics.median(cpu[setting])
        print(f"  {setting:28} {med * 1e6:6.1f} us   ratio {med / base:4.2f}x")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sessions", type=int, default=200)
    parser.add_argument("--turns", type=int, default=10)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--gc-detail", action="store_true", help="what the cyclic GC walks")
    parser.add_argument(
        "--only-work", choices=["hub", "pure"], help="only run the work (for valgrind)"
    )
    args = parser.parse_args()
    sessions, turns, runs = args.sessions, args.turns, args.runs
    total = sessions * turns
    actors.quiet_logs()
    if args.only_work is not None:
        for _ in range(runs):
            if args.only_work == "hub":
                actors.hub_turns(sessions, turns)
            else:
                actors.pure_turns(total, Window(8))
        return
    if args.gc_detail:
        gc_detail(sessions, turns, runs)
        return
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
