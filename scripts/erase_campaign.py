#!/usr/bin/env python3
"""Erasure under SIGKILL: hundreds of trials against SQLite, the journal and
PostgreSQL, each ending with the erased session fully erased or fully intact.

    python scripts/erase_campaign.py --trials 200 --store sqlite
    python scripts/erase_campaign.py --trials 200 --store journal
    python scripts/erase_campaign.py --trials 200 --store postgres \\
        --pg-dsn postgresql://postgres@127.0.0.1:5432/test
    python scripts/erase_campaign.py --trials 200 --store sqlite --encrypted

Each trial writes 20 sessions into a new store (one holding a canary in its
system prompt, questions, answers and a tool result), erases that one in a
child process, kills the child with SIGKILL at a random moment from its start
of the erasure to twice the time one erasure takes (measured first), reopens
the store and judges it (see turnledger.testing._erase_campaign): ``erased``
(unknown, and no byte of the canary in any file of the store's folder),
``intact`` (read back as written) or ``torn`` (a failure); every other session
must read back as written. Prints the counts and exits 1 if any trial failed.

With ``--encrypted`` every store is sealed under a key of its own (a key
file beside it): the erasure destroys the session's data key first, then
its rows, and ``erased`` also requires that the key ring keeps neither the
key nor a record of an unfinished erasure after the store was reopened.
"""

from __future__ import annotations

import argparse
import functools
import random
import shutil
import sys
import tempfile
import time
import uuid
from collections import Counter
from pathlib import Path
from urllib.parse import quote

import trio

from turnledger.testing._erase_campaign import (
    calibrate,
    key_file_for,
    prepare,
    run_erase_trial,
)


def _pg_url(base: str, schema: str) -> str:
    import psycopg

    with psycopg.connect(base, autocommit=True, connect_timeout=10) as admin:
        admin.execute(f'CREATE SCHEMA "{schema}"')
    sep = "&" if "?" in base else "?"
    return f"{base}{sep}options={quote(f'-c search_path={schema}')}"


def _drop_schema(base: str, schema: str) -> None:
    import psycopg

    with psycopg.connect(base, autocommit=True, connect_timeout=10) as admin:
        admin.execute(f'DROP SCHEMA "{schema}" CASCADE')


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--trials", type=int, default=200)
    p.add_argument("--store", choices=["sqlite", "journal", "postgres"], default="sqlite")
    p.add_argument("--pg-dsn", default=None, help="PostgreSQL server (for --store postgres)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--encrypted", action="store_true",
                   help="seal the store under a key: crypto-shredding, then the rows")  # fmt: skip
    p.add_argument("--max-delay", type=float, default=None,
                   help="latest kill, in seconds after the erasure starts "
                   "(default: twice one erasure, measured)")  # fmt: skip
    args = p.parse_args()
    if args.store == "postgres" and not args.pg_dsn:
        p.error("--pg-dsn is required for --store postgres")
    rng = random.Random(args.seed)
    root = Path(tempfile.mkdtemp(prefix="erase-campaign-"))

    def new_url(n: int) -> tuple[str, str | None]:
        if args.store == "postgres":
            schema = f"erase_{uuid.uuid4().hex[:12]}"
            return _pg_url(args.pg_dsn, schema), schema
        folder = root / f"t{n}"
        folder.mkdir()
        return str(folder / ("events.jsonl" if args.store == "journal" else "events.db")), None

    def key_file(url: str, n: int) -> Path | None:
        if not args.encrypted:
            return None
        folder = root / f"k{n}" if args.store == "postgres" else Path(url).parent
        folder.mkdir(exist_ok=True)
        return key_file_for(folder)

    url, schema = new_url(-1)
    keys = key_file(url, -1)
    trio.run(functools.partial(prepare, url, key_file=keys))
    one = calibrate(url, key_file=keys)
    if schema is not None:
        _drop_schema(args.pg_dsn, schema)
    max_delay = args.max_delay if args.max_delay is not None else 2 * one
    label = f"{args.store}{', encrypted' if args.encrypted else ''}"
    print(f"{label}: one erasure takes {one * 1000:.2f} ms in a child; "
          f"kills at U(0, {max_delay * 1000:.2f} ms) after it starts", flush=True)  # fmt: skip
    counts: Counter[str] = Counter()
    failed = 0
    started = time.monotonic()
    for n in range(args.trials):
        url, schema = new_url(n)
        try:
            trial = run_erase_trial(url, rng, max_delay, key_file=key_file(url, n))
        finally:
            if schema is not None:
                _drop_schema(args.pg_dsn, schema)
        counts[trial.outcome] += 1
        if args.encrypted:
            counts["finished on reopen"] += trial.finished_on_reopen
        if trial.outcome == "torn" or trial.problems:
            failed += 1
            print(f"trial {n}: {trial.outcome} after {trial.delay}: {trial.problems}", flush=True)
        elif args.store != "postgres":
            shutil.rmtree(Path(url).parent)
        elif args.encrypted:
            shutil.rmtree(root / f"k{n}")
        if (n + 1) % 50 == 0:
            print(f"  {n + 1} trials: {dict(counts)}", flush=True)
    elapsed = time.monotonic() - started
    print(f"{label}: {args.trials} trials in {elapsed:.1f} s: "
          f"{counts['erased']} erased, {counts['intact']} intact, {counts['torn']} torn, "
          f"{failed} failed", flush=True)  # fmt: skip
    if args.encrypted:
        print(f"  of the erased, {counts['finished on reopen']} were finished on reopen "
              "(killed after the key's destruction, before the rows went)", flush=True)  # fmt: skip
    if not failed:
        shutil.rmtree(root, ignore_errors=True)
    else:
        print(f"stores kept in {root}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
