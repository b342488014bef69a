"""How long ``turnledger --help`` takes, as a whole process, against bare Python.

    python benchmarks/cli_startup.py [--runs N] [--baseline PYTHON] [--python PYTHON]

Each contender is a fresh process, run ``--runs`` times (default 21) in turn
with the others, so a busy moment of a shared machine falls on every
contender alike; the median of each is printed, with its ratio to
``python -c pass`` of the same interpreter:

- ``python -c pass``       the interpreter's own start: the floor
- ``import turnledger``    the top-level package (its names load lazily)
- ``import turnledger.cli``  the command line's module, before any command runs
- ``turnledger --help``    ``python -m turnledger --help``: what a user waits for

``--baseline PYTHON`` measures the same rows with another interpreter in the
same run, for example the virtual environment of another checkout
(``--baseline /path/to/main/.venv/bin/python``), and prints the ratio of each
row to the baseline's. ``--python`` defaults to this interpreter.

Measured on the shared 2-core machine under a load average of about 9.7,
three runs of ``--runs 11`` against the checkout before the commands were
loaded lazily (``--baseline``): ``turnledger --help`` took 120, 140 and
120 ms (2.8-3.7x ``python -c pass``) against 1,244, 1,460 and 1,211 ms
before (37-40x), 0.10x in each run; ``import turnledger.cli`` 0.06-0.10x.
The load inflates every row, ``python -c pass`` too (31-43 ms here,
14 ms on a quieter moment).
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import time

ROWS: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("python -c pass", ("-c", "pass")),
    ("import turnledger", ("-c", "import turnledger")),
    ("import turnledger.cli", ("-c", "import turnledger.cli")),
    ("turnledger --help", ("-m", "turnledger", "--help")),
)


def _once(python: str, args: tuple[str, ...]) -> float:
    started = time.perf_counter()
    subprocess.run(
        [python, *args], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, check=True
    )
    return time.perf_counter() - started


def measure(pythons: dict[str, str], runs: int) -> dict[tuple[str, str], float]:
    """The median seconds of every row for every interpreter, interleaved."""
    times: dict[tuple[str, str], list[float]] = {
        (who, row): [] for who in pythons for row, _ in ROWS
    }
    for python in pythons.values():  # warm the file cache before measuring
        for _, args in ROWS:
            _once(python, args)
    for _ in range(runs):
        for who, python in pythons.items():
            for row, args in ROWS:
                times[who, row].append(_once(python, args))
    return {key: statistics.median(values) for key, values in times.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.partition("\n")[0])
    parser.add_argument("--runs", type=int, default=21)
    parser.add_argument("--python", default=sys.executable)
    parser.add_argument("--baseline", default=None, metavar="PYTHON")
    args = parser.parse_args()
    pythons = {"this": args.python}
    if args.baseline:
        pythons["baseline"] = args.baseline
    medians = measure(pythons, args.runs)
    print(f"median of {args.runs} runs per row, whole processes")
    for who, python in pythons.items():
        print(f"\n{who}: {python}")
        floor = medians[who, "python -c pass"]
        for row, _ in ROWS:
            value = medians[who, row]
            print(f"  {row:24} {value * 1000:8.1f} ms  {value / floor:5.1f}x python -c pass")
    if args.baseline:
        print("\nthis vs baseline")
        for row, _ in ROWS:
            ratio = medians["this", row] / medians["baseline", row]
            print(f"  {row:24} {ratio:5.2f}x")


if __name__ == "__main__":
    main()
