#!/usr/bin/env python3
"""Run the deterministic simulation over many seeds (turnledger.testing.simulate).

    python scripts/simulate.py                      # seeds 0-1999
    python scripts/simulate.py --seeds 100000 --jobs 2
    python scripts/simulate.py --seed 1234          # replay one seed, verbosely

Each seed runs the real hub and actors under a mock clock with faulty stores
and providers and a workload of callers, and checks the invariants after
every step (see turnledger/testing/_simulation.py). A failing seed prints
what broke and the one-line command that replays it exactly; the run goes
on to the next seed and exits 1 at the end.
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Sequence
from concurrent.futures import ProcessPoolExecutor
from multiprocessing import get_context

from turnledger.testing import SimulationFailure, simulate

#: Totals of a slice: seeds, failures, submits, committed results, crashes,
#: stalls, store faults, events.
Totals = list[int]


def run_slice(seeds: Sequence[int]) -> tuple[Totals, list[str]]:
    totals = [0] * 8
    failures = []
    for seed in seeds:
        try:
            r = simulate(seed)
        except SimulationFailure as exc:
            totals[0] += 1
            totals[1] += 1
            failures.append(str(exc))
            continue
        counts = (1, 0, r.submits, r.committed, r.crashes, r.stalls, r.store_faults, r.events)
        totals = [a + b for a, b in zip(totals, counts, strict=True)]
    return totals, failures


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--seeds", type=int, default=2000, help="how many seeds (default 2000)")
    parser.add_argument("--start", type=int, default=0, help="the first seed (default 0)")
    parser.add_argument("--seed", type=int, default=None, help="run this one seed and tell")
    parser.add_argument("--jobs", type=int, default=1, help="processes (default 1)")
    parser.add_argument("--chunk", type=int, default=500, help="seeds per progress line")
    args = parser.parse_args()
    if args.seed is not None:
        try:
            print(simulate(args.seed, on_problem=lambda p: print(f"broken: {p}", flush=True)))
        except SimulationFailure as exc:
            print(exc)
            return 1
        return 0
    t0 = time.monotonic()
    end = args.start + args.seeds
    chunks = [range(s, min(s + args.chunk, end)) for s in range(args.start, end, args.chunk)]
    totals = [0] * 8
    with ProcessPoolExecutor(args.jobs, mp_context=get_context("fork")) as pool:
        for chunk, (counts, failures) in zip(chunks, pool.map(run_slice, chunks), strict=True):
            totals = [a + b for a, b in zip(totals, counts, strict=True)]
            for failure in failures:
                print(failure, flush=True)
            print(
                f"seeds {args.start}-{chunk.stop - 1}: {totals[0]} run, {totals[1]} failed; "
                f"{totals[2]} submits, {totals[3]} committed results, {totals[4]} crashes, "
                f"{totals[5]} stalls, {totals[6]} store faults, {totals[7]} events  "
                f"{time.monotonic() - t0:.1f}s",
                flush=True,
            )
    return 1 if totals[1] else 0


if __name__ == "__main__":
    sys.exit(main())
