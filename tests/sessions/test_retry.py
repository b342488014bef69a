"""A context overflow before anything was shown: the hub sends the same turn
again, once, under the same request id, with the smaller projection."""

from __future__ import annotations

from trio.testing import wait_all_tasks_blocked

from turnledger.events import DEFAULT_CODEC, TurnRetried, TurnSubmitted
from turnledger.sessions import ChatRequest, CommittedResult, DiscardedResult, open_hub
from turnledger.testing import Fail, Finish, Hang, MemoryStore, ScriptedProvider, Step


def _provider(second: list[Step]) -> ScriptedProvider:
    calls: list[ChatRequest] = []

    def script(request: ChatRequest) -> list[Step]:
        calls.append(request)
        if request.messages[-1].content.startswith("old"):
            return [Finish("fine")]
        if sum(r.request_id == request.request_id for r in calls) == 1:
            return [Fail("context_overflow", "HTTP 400")]
        return second

    return ScriptedProvider(script)


async def test_the_retry_commits_with_fewer_turns() -> None:
    store = MemoryStore()
    provider = _provider([Finish("after the retry")])
    async with open_hub(store, provider, model="m", context_window=100_000) as hub:
        for i in range(3):
            await (await hub.submit("s", f"old {i} " + "x" * 200)).outcome()
        result = await (await hub.submit("s", "new?", request_id="r")).outcome()
    assert isinstance(result, CommittedResult) and result.answer == "after the retry"
    first, again = [req for req in provider.requests if req.request_id == "r"]
    assert len(again.messages) < len(first.messages)  # whole turns dropped
    events = await store.read_decoded("s", DEFAULT_CODEC)
    (retried,) = [e for e in events if isinstance(e, TurnRetried)]
    (submitted,) = [e for e in events if isinstance(e, TurnSubmitted) and e.request_id == "r"]
    assert retried.turns_sent < submitted.turns_sent
    assert [t.answer for t in await hub.history("s")] == ["fine"] * 3 + ["after the retry"]


async def test_cancelling_the_retried_turn_stops_its_request() -> None:
    provider = _provider([Hang()])
    async with open_hub(MemoryStore(), provider, model="m", context_window=100_000) as hub:
        await (await hub.submit("s", "old " + "x" * 300)).outcome()
        turn = await hub.submit("s", "new?", request_id="r")
        await wait_all_tasks_blocked()
        assert [req.request_id for req in provider.requests].count("r") == 2
        assert provider.open == 1
        result = await turn.cancel()
        await wait_all_tasks_blocked()
        assert provider.open == 0 and provider.cancelled == ["r"]
    assert isinstance(result, DiscardedResult) and result.reason == "cancelled"
