#!/usr/bin/env python3
"""Crash campaign: thousands of SIGKILL trials against SQLite, the journal
and PostgreSQL, counting commits, lost and torn.

    python scripts/crash_campaign.py --trials 2000 --store sqlite
    python scripts/crash_campaign.py --trials 500 --store journal --max-delay 1.0
    python scripts/crash_campaign.py --trials 10000 --store postgres \\
        --pg-dsn postgresql://postgres@127.0.0.1:5432/test

Each trial runs sessions in a child process, kills it with SIGKILL at a random
moment after its first commit, reopens the store and surveys it (see
turnledger.testing._campaign): commits the child reported that are missing
(lost), logs that do not read back whole (torn), and turns left in flight
that the next start did not close (unrecovered). Every N trials start on a
new file (or a new PostgreSQL schema). The campaign goes on past a failed
trial, printing what it found, and exits 1 if any trial failed; the stores
of a failed campaign (or with --keep) are left in place for inspection.
"""

from __future__ import annotations

import argparse
import logging
import os
import random
import shutil
import signal
import sys
import tempfile
import time
import uuid
from pathlib import Path
from urllib.parse import quote

import structlog

from turnledger.testing._campaign import run_campaign_trial


def _pg_url(base: str, schema: str) -> str:
    import psycopg

    with psycopg.connect(base, autocommit=True, connect_timeout=10) as admin:
        admin.execute(f'CREATE SCHEMA "{schema}"')
    sep = "&" if "?" in base else "?"
    return f"{base}{sep}options={quote(f'-c search_path={schema}')}"


def main() -> int:
    # The checks start hubs; their log lines would drown the progress lines.
    structlog.configure(wrapper_class=structlog.make_filtering_bound_logger(logging.WARNING))
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--trials", type=int, default=200, help="how many (default 200)")
    parser.add_argument("--store", choices=["sqlite", "journal", "postgres"], default="sqlite")
    parser.add_argument("--max-delay", type=float, default=0.5, help="seconds after 1st commit")
    parser.add_argument("--seed", default=None, help="seed of the kill delays")
    parser.add_argument("--fresh-every", type=int, default=100, help="new store every N trials")
    parser.add_argument(
        "--pg-dsn",
        default=os.environ.get("TURNLEDGER_TEST_PG_DSN"),
        help="postgresql:// URL of a database to make schemas in "
        "(default: $TURNLEDGER_TEST_PG_DSN)",
    )
    parser.add_argument("--every", type=int, default=25, help="print a line every N trials")
    parser.add_argument("--keep", action="store_true", help="keep the stores of a passed campaign")
    args = parser.parse_args()
    if args.store == "postgres" and not args.pg_dsn:
        parser.error("--store postgres needs --pg-dsn or TURNLEDGER_TEST_PG_DSN")
    rng = random.Random(args.seed)
    folder = Path(tempfile.mkdtemp(prefix="turnledger-crash-"))
    run_id = uuid.uuid4().hex[:8]
    t0 = time.monotonic()
    reported = lost = torn = unrecovered = in_flight = failed = done = 0
    url = ""
    # SIGTERM ends the campaign after the trial under way, with the totals so
    # far (an interrupt raised inside that trial's event loop could land in
    # the middle of trio's own bookkeeping); Ctrl-C ends it at once.
    stop: list[int] = []
    signal.signal(signal.SIGTERM, lambda signum, frame: stop.append(signum))
    for i in range(args.trials):
        if stop:
            print(f"stopped after {done} trials (SIGTERM)", flush=True)
            break
        try:
            if i % args.fresh_every == 0:
                n = i // args.fresh_every
                if args.store == "postgres":
                    url = _pg_url(args.pg_dsn, f"crash_{run_id}_{n}")
                else:
                    suffix = ".db" if args.store == "sqlite" else ".jsonl"
                    url = str(folder / f"crash-{n}{suffix}")
            trial = run_campaign_trial(url, rng=rng, max_delay=args.max_delay)
        except KeyboardInterrupt:
            signal.signal(signal.SIGTERM, signal.SIG_IGN)  # let it sum up
            print(f"stopped after {done} trials", flush=True)
            break
        done += 1
        s = trial.survey
        reported += trial.reported
        lost, torn, unrecovered = lost + s.lost, torn + s.torn, unrecovered + s.unrecovered
        in_flight += s.in_flight
        if s.problems:
            failed += 1
            print(f"trial {i + 1} on {url} (killed after {trial.killed_after:.3f}s):", flush=True)
            for problem in s.problems:
                print(f"  {problem}", flush=True)
        if (i + 1) % args.every == 0 or i + 1 == args.trials:
            print(
                f"{args.store} {i + 1:>6} trials  {reported:>8} commits reported  "
                f"{lost} lost  {torn} torn  {in_flight:>6} in flight at the kill, "
                f"{unrecovered} not recovered  {time.monotonic() - t0:8.1f}s",
                flush=True,
            )
    where = f"schemas crash_{run_id}_*" if args.store == "postgres" else str(folder)
    if failed or args.keep:
        where = f"; stores in {where}"
    else:  # nothing to inspect
        _drop(args, run_id, folder, (max(done, 1) - 1) // args.fresh_every + 1)
        where = ""
    verdict = "ok" if not failed else f"FAILED in {failed} trials"
    print(
        f"{verdict}: {args.store}, {done} trials, {reported} commits reported, "
        f"{lost} lost, {torn} torn, {in_flight} in flight at the kill, "
        f"{unrecovered} not recovered{where}"
    )
    return 1 if failed else 0


def _drop(args: argparse.Namespace, run_id: str, folder: Path, stores: int) -> None:
    shutil.rmtree(folder, ignore_errors=True)
    if args.store == "postgres":
        import psycopg

        with psycopg.connect(args.pg_dsn, autocommit=True, connect_timeout=10) as admin:
            for n in range(stores):
                admin.execute(f'DROP SCHEMA IF EXISTS "crash_{run_id}_{n}" CASCADE')


if __name__ == "__main__":
    sys.exit(main())
