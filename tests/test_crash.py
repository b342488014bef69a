"""Crash safety with real processes: SIGKILL a child mid-run, reopen, check.

``scripts/crash_campaign.py`` runs the same trials by the thousand.
"""

from __future__ import annotations

import os
import random
from pathlib import Path

import pytest
import trio

from turnledger.adapters.stores import open_store
from turnledger.testing._crash import run_trial

TRIALS = int(os.environ.get("TURNLEDGER_CRASH_TRIALS", "20"))
pytestmark = pytest.mark.slow


@pytest.mark.timeout(600)  # TRIALS child processes, each started, killed and checked
@pytest.mark.parametrize("kind", ["sqlite", "journal"])
def test_sigkill_loses_no_reported_commit(kind: str, tmp_path: Path) -> None:
    rng = random.Random(f"{kind}-{os.getpid()}")
    suffix = ".db" if kind == "sqlite" else ".jsonl"
    url = str(tmp_path / f"crash{suffix}")
    totals = {"reported": 0, "recovered": 0}
    reported: set[tuple[str, str]] = set()
    for _ in range(TRIALS):
        # The same file across trials: each run recovers what the last left.
        result = run_trial(url, rng=rng)
        assert result.reported == len(result.reported_ids) >= 1
        totals["reported"] += result.reported
        totals["recovered"] += result.recovered_in_flight
        reported |= set(result.reported_ids)
    # Kills must have landed mid-turn at least sometimes, or the test proves little.
    assert totals["recovered"] >= 1, totals
    # Checked here again, without the trial's own checker: every commit any
    # trial reported is in the file, once, and the trial's count is the file's.
    committed, events = trio.run(_committed_in, url)
    assert reported <= set(committed), reported - set(committed)
    assert len(committed) == len(set(committed))
    # (the last trial's count was taken before it closed what was in flight)
    assert result.committed == len(committed)
    assert result.events + result.recovered_in_flight == events


async def _committed_in(url: str) -> tuple[list[tuple[str, str]], int]:
    """``(session, request)`` of every TurnCommitted in the store, read raw,
    and the number of events."""
    store = await open_store(url)
    try:
        found: list[tuple[str, str]] = []
        events = 0
        for sid in await store.session_ids():
            stored = await store.read(sid)
            assert [e.seq for e in stored] == list(range(1, len(stored) + 1)), sid
            events += len(stored)
            found += [(sid, e.payload["request_id"]) for e in stored if e.tag == "turn_committed"]
        return found, events
    finally:
        await store.aclose()
