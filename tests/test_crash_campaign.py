"""The crash campaign's parts: one SIGKILL trial per store, and a survey
that counts what a crash lost or tore rather than stopping at the first.

``scripts/crash_campaign.py`` runs the trials by the thousand.
"""

from __future__ import annotations

import random
import sqlite3
from pathlib import Path

import pytest
import trio

from turnledger.adapters.stores import open_store
from turnledger.sessions import open_hub
from turnledger.testing import ScriptedProvider
from turnledger.testing._campaign import run_campaign_trial, survey

pytestmark = pytest.mark.slow


async def _one_turn(url: str) -> str:
    store = await open_store(url)
    try:
        async with open_hub(store, ScriptedProvider.instant("yes"), model="m") as hub:
            turn = await hub.submit("s", "question")
            assert (await turn.outcome()).kind == "committed"
            return turn.request_id
    finally:
        await store.aclose()


async def test_the_survey_counts_a_lost_commit(tmp_path: Path) -> None:
    url = str(tmp_path / "s.db")
    with trio.fail_after(30):
        rid = await _one_turn(url)
        found = await survey(url, [("s", rid), ("s", "never-written")])
    assert (found.committed, found.lost, found.torn) == (1, 1, 0)
    assert found.problems == ("s/never-written reported committed, not in the log",)


async def test_the_survey_counts_a_torn_log(tmp_path: Path) -> None:
    url = str(tmp_path / "s.db")
    with trio.fail_after(30):
        rid = await _one_turn(url)
        with sqlite3.connect(url) as db:  # a row past a gap, as a torn write would leave
            db.execute(
                "INSERT INTO events (session_id, seq, tag, schema_version, payload, recorded_at)"
                " VALUES ('s', 9, 'stream_started', 1, '{\"request_id\": \"x\"}', 0)"
            )
        found = await survey(url, [("s", rid)])
    assert (found.lost, found.torn) == (1, 1)  # the torn session's commits count as lost
    assert "seq runs" in found.problems[0]


@pytest.mark.parametrize("kind", ["sqlite", "journal", "postgres"])
def test_a_sigkill_trial_per_store(
    kind: str, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    if kind == "postgres":
        url = request.getfixturevalue("pg_dsn")
    else:
        url = str(tmp_path / ("crash.db" if kind == "sqlite" else "crash.jsonl"))
    rng = random.Random(kind)
    for _ in range(2):  # the same store: each trial recovers what the last left
        trial = run_campaign_trial(url, rng=rng, max_delay=0.3)
        assert trial.reported >= 1
        assert (trial.survey.lost, trial.survey.torn, trial.survey.unrecovered) == (0, 0, 0)
        assert trial.survey.committed >= trial.reported
