"""An actor recovers its session with the fast fold (StateDecoder +
fold_items), from the whole log or from a snapshot and the events after it:
the state must be the one ``replay`` gives, and a log ``replay`` refuses must
be refused with the same error."""

from __future__ import annotations

import json
import random
from typing import Any

import structlog
import trio
from hypothesis import given as hgiven
from hypothesis import settings
from hypothesis import strategies as st

from turnledger import ReplayError
from turnledger.adapters.stores import MemorySnapshots
from turnledger.events import DEFAULT_CODEC, StoredEvent
from turnledger.runtime._snapshots import recover_state
from turnledger.sessions import Message, Start, replay
from turnledger.sessions._snapshot import take_snapshot
from turnledger.testing import MemoryStore

from .test_properties import budgets, scripts, starts
from .test_replay_fold import _play


def _stored(rows: list[tuple[str, int, dict[str, Any]]]) -> list[StoredEvent]:
    return [
        StoredEvent("s", seq, tag, version, payload, float(seq))
        for seq, (tag, version, payload) in enumerate(rows, 1)
    ]


async def _recover(events: list[StoredEvent], snapshots: MemorySnapshots | None) -> Any:
    store = MemoryStore()
    if events:
        await store.append("s", events, 0)
    try:
        state, _ = await recover_state(store, "s", snapshots, structlog.get_logger())
    except ReplayError as exc:
        return (ReplayError, str(exc))
    return state


def _reference(rows: list[tuple[str, int, dict[str, Any]]]) -> Any:
    try:
        return replay([DEFAULT_CODEC.from_payload(*row) for row in rows])
    except ReplayError as exc:
        return (ReplayError, str(exc))


@settings(max_examples=150, deadline=None)
@hgiven(start=starts, budget=budgets, script=scripts, seed=st.integers(0, 2**32 - 1))
def test_recovery_is_replay_from_the_log_and_from_a_snapshot(
    start: Start, budget: int | None, script: list[Message], seed: int
) -> None:
    log = _play(start, budget, script)
    rows = [DEFAULT_CODEC.to_payload(ev) for ev in log]
    # Through JSON, as a store gives payloads back.
    rows = [(tag, version, json.loads(json.dumps(p))) for tag, version, p in rows]
    rng = random.Random(seed)

    async def main() -> None:
        for n in range(len(rows) + 1):  # every prefix: states in flight too
            want = _reference(rows[:n])
            assert await _recover(_stored(rows[:n]), None) == want
            if n >= 2:
                # A snapshot after a random earlier event, the rest folded.
                k = rng.randrange(1, n)
                before = replay(log[:k])
                if before.branches:
                    continue  # (branched sessions are never snapshotted)
                snapshots = MemorySnapshots()
                await snapshots.save(take_snapshot("s", before, rows[k - 1][0], float(k)))
                assert await _recover(_stored(rows[:n]), snapshots) == want

    trio.run(main)


def test_a_damaged_log_is_refused_as_replay_refuses_it() -> None:
    log = _play(Start("", "m"), None, [])
    rows = [DEFAULT_CODEC.to_payload(ev) for ev in log]
    submitted = (
        "turn_submitted",
        2,
        {
            "request_id": "r1",
            "question": "q",
            "turns_sent": 0,
            "turns_dropped": 0,
            "request_bytes": 10,
            "estimated_prompt_tokens": None,
        },
    )
    committed = (
        "turn_committed",
        1,
        {"request_id": "r2", "answer": "a", "finish_reason": "stop", "usage": None},
    )
    bad = [*rows, submitted, ("stream_started", 1, {"request_id": "r1"}), committed]
    want = _reference(bad)
    assert type(want) is tuple and want[0] is ReplayError
    assert trio.run(_recover, _stored(bad), None) == want
