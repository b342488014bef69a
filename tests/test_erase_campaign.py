"""SIGKILL during an erasure, ten trials per store: each ends with the
session fully erased (no byte of it in any file) or fully intact, and the
other sessions as they were. ``scripts/erase_campaign.py`` runs hundreds."""

from __future__ import annotations

import random
import uuid
from collections.abc import Callable
from pathlib import Path
from urllib.parse import quote

import pytest
import trio

from turnledger.testing._erase_campaign import calibrate, prepare, run_erase_trial

pytestmark = pytest.mark.slow

TRIALS = 10


def _campaign(new_url: Callable[[int], str]) -> list[str]:
    url = new_url(-1)
    trio.run(prepare, url)
    one = calibrate(url)  # seconds one erasure takes: kills land before, in and after it
    rng = random.Random(7)
    outcomes = []
    for n in range(TRIALS):
        trial = run_erase_trial(new_url(n), rng, 2 * one)
        assert trial.outcome != "torn" and not trial.problems, trial
        outcomes.append(trial.outcome)
    return outcomes


@pytest.mark.parametrize("name", ["events.db", "events.jsonl"])
def test_sigkill_during_erasure_leaves_it_done_or_not(name: str, tmp_path: Path) -> None:
    def new_url(n: int) -> str:
        folder = tmp_path / f"t{n}"
        folder.mkdir()
        return str(folder / name)

    assert set(_campaign(new_url)) <= {"erased", "intact"}


def test_sigkill_during_erasure_on_postgres(pg_dsn: str) -> None:
    import psycopg

    schemas: list[str] = []

    def new_url(n: int) -> str:
        schema = f"erase_{uuid.uuid4().hex[:12]}"
        with psycopg.connect(pg_dsn, autocommit=True) as admin:
            admin.execute(f'CREATE SCHEMA "{schema}"')
        schemas.append(schema)
        base = pg_dsn.split("?", 1)[0]
        return f"{base}?options={quote(f'-c search_path={schema}')}"

    try:
        assert set(_campaign(new_url)) <= {"erased", "intact"}
    finally:
        with psycopg.connect(pg_dsn, autocommit=True) as admin:
            for schema in schemas:
                admin.execute(f'DROP SCHEMA "{schema}" CASCADE')
