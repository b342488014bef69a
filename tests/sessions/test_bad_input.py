"""Bad input from callers gets a typed answer and leaves every session working."""

from __future__ import annotations

import json

import pytest

from turnledger import InvalidCommand
from turnledger.sessions import CommittedResult, RejectedResult, open_hub
from turnledger.testing import MemoryStore, ScriptedProvider

LONE = json.loads('"caf\\ud800e"')  # a lone surrogate: no UTF-8 form


async def test_a_question_that_is_not_text_is_rejected_and_the_session_goes_on() -> None:
    store = MemoryStore()
    async with open_hub(store, ScriptedProvider(), model="m", on_busy="supersede") as hub:
        before = await (await hub.submit("s", "fine?")).outcome()
        assert isinstance(before, CommittedResult)
        bad = await (await hub.submit("s", LONE)).outcome()
        assert isinstance(bad, RejectedResult) and bad.reason == "invalid_question"
        after = await (await hub.submit("s", "still fine?")).outcome()
        assert isinstance(after, CommittedResult)
        assert hub.statistics().actors_failed == 0
        assert [t.question for t in await hub.history("s")] == ["fine?", "still fine?"]


@pytest.mark.parametrize("session_id", ["", LONE])
async def test_ids_that_are_not_text_are_refused_before_anything_runs(session_id: str) -> None:
    store = MemoryStore()
    async with open_hub(store, ScriptedProvider(), model="m") as hub:
        with pytest.raises(InvalidCommand):
            await hub.submit(session_id, "q")
        with pytest.raises(InvalidCommand):
            await hub.submit("s", "q", request_id=session_id)
        assert hub.statistics().actors_started == 0
    assert await store.read_all() == []


async def test_the_hub_applies_the_token_budget() -> None:
    from turnledger.sessions import CharTokenEstimator

    store = MemoryStore()
    estimator = CharTokenEstimator(chars_per_token=1.0, per_message=0, per_request=0)
    async with open_hub(
        store, ScriptedProvider(), model="m", max_prompt_tokens=40, token_estimator=estimator
    ) as hub:
        ok = await (await hub.submit("s", "q" * 10)).outcome()
        assert isinstance(ok, CommittedResult)  # the echo answer is 16 characters
        too_big = await (await hub.submit("s", "q" * 41)).outcome()
        assert isinstance(too_big, RejectedResult) and too_big.reason == "over_budget"
        await (await hub.submit("s", "r" * 20)).outcome()
    submitted = [e.payload for e in await store.read("s") if e.tag == "turn_submitted"]
    # the third question (20) plus the first turn (10 + 16) is over 40: trimmed
    assert [(p["turns_sent"], p["turns_dropped"]) for p in submitted] == [(0, 0), (0, 1)]
