"""A provider that answers at once (``AnswersAtOnce``): the actor records its
answer without a request task, and the log is the one the request task
would have written, message for message."""

from __future__ import annotations

from typing import Any

import trio
from trio.testing import wait_all_tasks_blocked

from turnledger.events import Event, RequestId
from turnledger.sessions import (
    AnswersAtOnce,
    ChatRequest,
    Completion,
    StreamSink,
    TurnResult,
    open_hub,
)
from turnledger.testing import Begin, Chunk, Fail, Finish, ScriptedProvider, Step

from ._helpers import HookedStore, events_of


class Counted(ScriptedProvider):
    """Counts the requests that went through ``complete()``."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.completes = 0

    async def complete(self, request: ChatRequest, sink: StreamSink) -> Completion:
        self.completes += 1
        return await super().complete(request, sink)


def script(request: ChatRequest) -> list[Step]:
    """Answers, a failure, a retried context overflow: what an instant
    provider can say, decided by the request alone."""
    question = request.messages[-1].content
    if question.startswith("fail"):
        return [Fail("rate_limited", "HTTP 429")]
    if question.startswith("long") and request.round == 0 and len(request.messages) > 2:
        # Overflows until whole turns are dropped: the hub retries once.
        return [Fail("context_overflow", "HTTP 400")]
    return [Begin(), Finish(f"answer to {question}")]


QUESTIONS = ["one", "fail two", "three", "long four", "five", "fail six", "seven"]


async def run_turns(provider: ScriptedProvider) -> tuple[dict[str, list[Event]], list[TurnResult]]:
    store = HookedStore()
    results = []
    async with open_hub(store, provider, model="m", context_window=100_000) as hub:
        for sid in ("a", "b"):
            for i, question in enumerate(QUESTIONS):
                turn = await hub.submit(sid, question, request_id=f"{sid}{i}")
                results.append(await turn.outcome())

        async def caller(sid: str) -> None:
            for i in range(3):
                turn = await hub.submit(sid, f"more {i}", request_id=f"{sid}x{i}")
                results.append(await turn.outcome())

        # Then both sessions at once, their turns interleaved.
        async with trio.open_nursery() as nursery:
            for sid in ("a", "b"):
                nursery.start_soon(caller, sid)
        await wait_all_tasks_blocked()
        stats = hub.statistics()
    assert stats.requests == 0
    return {sid: await events_of(store, sid) for sid in ("a", "b")}, results


async def test_the_log_is_the_same_with_and_without_the_answer_at_once() -> None:
    at_once = Counted(script, at_once=True)
    through_task = Counted(script)
    assert isinstance(at_once, AnswersAtOnce)
    events, results = await run_turns(at_once)
    expected_events, expected_results = await run_turns(through_task)
    assert at_once.completes == 0  # every answer came at once
    assert through_task.completes == len(through_task.requests) > len(QUESTIONS) * 2
    assert sorted(results, key=repr) == sorted(expected_results, key=repr)
    assert events == expected_events
    # Every kind of ending is there: committed, discarded, retried.
    tags = {type(e).__name__ for e in events["a"]}
    assert {"TurnCommitted", "TurnDiscarded", "TurnRetried", "StreamStarted"} <= tags
    assert sorted(r.request_id for r in at_once.requests) == sorted(
        r.request_id for r in through_task.requests
    )


async def test_a_question_answered_at_once_is_one_append() -> None:
    # The answer is asked for before the question is written, and both are
    # appended together: one append and one batch per turn, not two.
    counts = []
    for provider in (Counted(script, at_once=True), Counted(script)):
        store = HookedStore()
        async with open_hub(store, provider, model="m") as hub:
            for i in range(5):
                result = await (await hub.submit("s", f"q{i}")).outcome()
                assert result.kind == "committed"
            stats = hub.statistics()
        counts.append((stats.appends, stats.events))
    assert counts == [(1 + 5, 1 + 5 * 3), (1 + 5 * 2, 1 + 5 * 3)]


async def test_a_cancel_during_the_append_of_an_answer_at_once_comes_too_late() -> None:
    store = HookedStore()
    provider = Counted(script, at_once=True)
    async with open_hub(store, provider, model="m") as hub:
        store.before("turn_submitted", lambda: hub.cancel("s"))
        turn = await hub.submit("s", "q", request_id=RequestId("r"))
        result = await turn.outcome()
        await wait_all_tasks_blocked()
    assert result.kind == "committed"
    tags = [type(e).__name__ for e in await events_of(store, "s")]
    assert tags == ["SessionStarted", "TurnSubmitted", "StreamStarted", "TurnCommitted"]


async def test_an_answer_whose_question_the_store_refuses_is_not_recorded() -> None:
    store = HookedStore()
    provider = Counted(script, at_once=True)
    async with open_hub(store, provider, model="m") as hub:
        await hub.open_session("s")
        store.fail_appends = 1
        result = await (await hub.submit("s", "q", request_id=RequestId("r"))).outcome()
        assert result.kind == "rejected" and result.reason == "store_error"
        again = await (await hub.submit("s", "q", request_id=RequestId("r2"))).outcome()
        assert again.kind == "committed"
    tags = [type(e).__name__ for e in await events_of(store, "s")]
    assert tags == ["SessionStarted", "TurnSubmitted", "StreamStarted", "TurnCommitted"]


async def test_a_provider_bug_in_answer_now_ends_the_turn_not_the_hub() -> None:
    class Broken(ScriptedProvider):
        def answer_now(self, request: ChatRequest) -> Completion | None:
            raise RuntimeError("secret detail")

    store = HookedStore()
    async with open_hub(store, Broken(), model="m") as hub:
        result = await (await hub.submit("s", "q")).outcome()
        assert result.kind == "discarded"
        assert (result.reason, result.detail) == ("provider_error", "RuntimeError")
        # The session goes on.
        assert (await (await hub.submit("s", "again")).outcome()).kind == "discarded"


async def test_a_script_that_streams_goes_through_complete() -> None:
    provider = Counted(lambda _request: [Begin(), Finish("ok")], at_once=True)
    streaming = Counted(lambda _request: [Begin(), Chunk("streamed"), Finish()], at_once=True)
    async with open_hub(HookedStore(), provider, model="m") as hub:
        assert (await (await hub.submit("s", "q")).outcome()).kind == "committed"
    async with open_hub(HookedStore(), streaming, model="m") as hub:
        result = await (await hub.submit("s", "q")).outcome()
    assert provider.completes == 0
    assert streaming.completes == 1 and len(streaming.requests) == 1  # the script ran once
    assert result.kind == "committed" and result.answer == "streamed"


async def test_a_cancel_queued_before_a_retry_answered_at_once_comes_first() -> None:
    # A retry goes out after its TurnRetried is written; answered at once,
    # its messages come after whatever was queued meanwhile, as a request
    # task's would: the cancel wins and the answer is a late completion.
    store = HookedStore()
    provider = Counted(script, at_once=True)
    async with open_hub(store, provider, model="m", context_window=100_000) as hub:
        for question in ("one", "two", "three"):  # turns a retry can drop
            assert (await (await hub.submit("s", question)).outcome()).kind == "committed"
        store.before("turn_retried", lambda: hub.cancel("s"))
        turn = await hub.submit("s", "long question", request_id=RequestId("r"))
        result = await turn.outcome()
    assert result.kind == "discarded" and result.reason == "cancelled"
    tags = [type(e).__name__ for e in await events_of(store, "s")]
    assert tags[-4:] == ["TurnSubmitted", "TurnRetried", "TurnDiscarded", "CompletionIgnored"]
    assert provider.completes == 0
