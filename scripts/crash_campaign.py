#!/usr/bin/env python3
"""Crash campaign: thousands of SIGKILL trials against SQLite and the journal.

    python scripts/crash_campaign.py --trials 2000 --store sqlite
    python scripts/crash_campaign.py --trials 500 --store journal --max-delay 1.0

Each trial runs sessions in a child process, kills it with SIGKILL at a random
moment, reopens the store and checks it (see turnledger.testing._crash). A
failed check stops the campaign with the assertion and the store left in
place for inspection.
"""

from __future__ import annotations

import argparse
import logging
import random
import tempfile
import time
from pathlib import Path

import structlog

from turnledger.testing._crash import run_trial


def main() -> None:
    # The checks start hubs; their log lines would drown the progress lines.
    structlog.configure(wrapper_class=structlog.make_filtering_bound_logger(logging.WARNING))
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--trials", type=int, default=200)
    parser.add_argument("--store", choices=["sqlite", "journal"], default="sqlite")
    parser.add_argument("--max-delay", type=float, default=0.5)
    parser.add_argument("--seed", default=None)
    parser.add_argument("--fresh-every", type=int, default=100, help="new file every N trials")
    args = parser.parse_args()
    rng = random.Random(args.seed)
    folder = Path(tempfile.mkdtemp(prefix="turnledger-crash-"))
    suffix = ".db" if args.store == "sqlite" else ".jsonl"
    t0 = time.monotonic()
    reported = recovered = 0
    for i in range(args.trials):
        url = str(folder / f"crash-{i // args.fresh_every}{suffix}")
        result = run_trial(url, rng=rng, max_delay=args.max_delay)
        reported += result.reported
        recovered += result.recovered_in_flight
        if (i + 1) % 25 == 0 or i + 1 == args.trials:
            print(
                f"{i + 1:>6} trials  {reported:>7} reported commits found  "
                f"{recovered:>5} in-flight turns closed as interrupted  "
                f"{time.monotonic() - t0:7.1f}s",
                flush=True,
            )
    print(f"ok: {args.trials} trials, stores in {folder}")


if __name__ == "__main__":
    main()
