"""The deterministic simulation: a slice of seeds in CI, and its checks.

``scripts/simulate.py --seeds 100000`` runs the rest; a failing seed prints
the command that replays it.
"""

from __future__ import annotations

import os

import pytest

from turnledger.events import (
    CompletionIgnored,
    SessionStarted,
    StreamStarted,
    ToolCall,
    ToolCallsRequested,
    ToolResultRecorded,
    ToolRoundSubmitted,
    TurnCommitted,
    TurnDiscarded,
    TurnSubmitted,
)
from turnledger.testing import SimulationFailure, simulate
from turnledger.testing._simulation import check_log

#: Seeds CI runs: about 40 ms of CPU each, so 20 s for the slice.
SEEDS = int(os.environ.get("TURNLEDGER_SIM_SEEDS", "500"))
START = int(os.environ.get("TURNLEDGER_SIM_START", "0"))


@pytest.mark.timeout(600)  # SEEDS simulations, about 40 ms of CPU each
def test_a_slice_of_seeds_breaks_no_invariant() -> None:
    failures = []
    totals = {"crashes": 0, "stalls": 0, "store_faults": 0, "committed": 0}
    for seed in range(START, START + SEEDS):
        try:
            report = simulate(seed)
        except SimulationFailure as exc:
            failures.append(str(exc))
            continue
        for key in totals:
            totals[key] += getattr(report, key)
    assert not failures, "\n".join(failures[:5])
    # The slice exercised what it is for.
    assert all(v > SEEDS // 10 for v in totals.values()), totals


def test_a_seed_replays_exactly() -> None:
    for seed in (3, 17, 101):
        first, again = simulate(seed), simulate(seed)
        assert first == again
    assert simulate(3).digest != simulate(4).digest


S0 = SessionStarted("", "m")


def _turn(rid: str, answer: str) -> list[object]:
    return [
        TurnSubmitted(rid, "q", 0, 0, 10),
        StreamStarted(rid),
        TurnCommitted(rid, answer, "stop"),
    ]


def test_check_log_passes_a_sound_log() -> None:
    events = [S0, *_turn("a", "a/0/1"), CompletionIgnored("a", "completed")]
    assert check_log("s", events, {("a", 0): ["a/0/1"]}) == []  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("events", "answers", "found"),
    [
        # an event of a request after its end
        ([S0, *_turn("a", "x"), StreamStarted("a")], None, "follows the request's end"),
        # a request that ends twice
        ([S0, *_turn("a", "x"), TurnDiscarded("a", "cancelled")], None, "follows"),
        # an answer the provider never gave to that request (a preview, a stale one)
        ([S0, *_turn("a", "b/0/2")], {("a", 0): ["a/0/1"], ("b", 0): ["b/0/2"]}, "not what"),
        # an end without a question
        ([S0, TurnCommitted("a", "x", "stop")], None, "never submitted"),
        # rounds that go back
        (
            [
                S0,
                TurnSubmitted("a", "q", 0, 0, 10),
                ToolCallsRequested("a", 0, (ToolCall("c", "t", "{}"),)),
                ToolResultRecorded("a", "c", "r"),
                ToolRoundSubmitted("a", 1, 10),
                ToolCallsRequested("a", 0, (ToolCall("d", "t", "{}"),)),
            ],
            None,
            "round 0 while round 1 is out",
        ),
    ],
)
def test_check_log_finds(events: list[object], answers: object, found: str) -> None:
    problems = check_log("s", events, answers)  # type: ignore[arg-type]
    assert any(found in p for p in problems), problems


def test_a_failure_names_the_replay_command() -> None:
    exc = SimulationFailure(1234, ["s0/r was acknowledged as committed and is not in the store"])
    assert str(exc).splitlines()[-1] == "replay: python scripts/simulate.py --seed 1234"
