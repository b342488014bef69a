"""SIGKILL during an erasure, ten trials per store, plaintext and encrypted:
each ends with the session fully erased (no byte of it in any file; with
encryption, no key and no unfinished erasure left in the key ring) or fully
intact, and the other sessions as they were. ``scripts/erase_campaign.py``
runs hundreds."""

from __future__ import annotations

import functools
import random
import uuid
from collections.abc import Callable
from pathlib import Path
from urllib.parse import quote

import pytest
import trio

from turnledger.testing._erase_campaign import (
    calibrate,
    key_file_for,
    prepare,
    run_erase_trial,
)

pytestmark = pytest.mark.slow

TRIALS = 10


def _campaign(new_url: Callable[[int], str], keys: Path | None = None) -> list[str]:
    url = new_url(-1)
    trio.run(functools.partial(prepare, url, key_file=keys))
    # seconds one erasure takes: kills land before, in and after it
    one = calibrate(url, key_file=keys)
    rng = random.Random(7)
    outcomes = []
    for n in range(TRIALS):
        trial = run_erase_trial(new_url(n), rng, 2 * one, key_file=keys)
        assert trial.outcome != "torn" and not trial.problems, trial
        outcomes.append(trial.outcome)
    return outcomes


@pytest.mark.parametrize("encrypted", [False, True], ids=["plaintext", "encrypted"])
@pytest.mark.parametrize("name", ["events.db", "events.jsonl"])
def test_sigkill_during_erasure_leaves_it_done_or_not(
    name: str, encrypted: bool, tmp_path: Path
) -> None:
    def new_url(n: int) -> str:
        folder = tmp_path / f"t{n}"
        folder.mkdir()
        return str(folder / name)

    keys = key_file_for(tmp_path) if encrypted else None
    assert set(_campaign(new_url, keys)) <= {"erased", "intact"}


@pytest.mark.parametrize("encrypted", [False, True], ids=["plaintext", "encrypted"])
def test_sigkill_during_erasure_on_postgres(pg_dsn: str, encrypted: bool, tmp_path: Path) -> None:
    import psycopg

    schemas: list[str] = []

    def new_url(n: int) -> str:
        schema = f"erase_{uuid.uuid4().hex[:12]}"
        with psycopg.connect(pg_dsn, autocommit=True) as admin:
            admin.execute(f'CREATE SCHEMA "{schema}"')
        schemas.append(schema)
        base = pg_dsn.split("?", 1)[0]
        return f"{base}?options={quote(f'-c search_path={schema}')}"

    keys = key_file_for(tmp_path) if encrypted else None
    try:
        assert set(_campaign(new_url, keys)) <= {"erased", "intact"}
    finally:
        with psycopg.connect(pg_dsn, autocommit=True) as admin:
            for schema in schemas:
                admin.execute(f'DROP SCHEMA "{schema}" CASCADE')
