"""Summaries and pinned items through a real hub: a loopback
OpenAI-compatible server over HTTP on 127.0.0.1 and a real SQLite file."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import pytest
import trio
from structlog.testing import capture_logs

from turnledger import (
    InvalidCommand,
    SessionBusy,
    SummaryFailed,
    UnknownPin,
    UnknownSession,
    UnknownTurn,
)
from turnledger.adapters.providers import OpenAIChat
from turnledger.adapters.stores import open_store
from turnledger.events import (
    DEFAULT_CODEC,
    BranchId,
    PinAdded,
    RequestId,
    SummaryRecorded,
    SummarySent,
    TurnSubmitted,
)
from turnledger.runtime import PROMPTS
from turnledger.runtime._summaries import policy_range
from turnledger.sessions import (
    Budget,
    CommittedResult,
    Completed,
    ModelSummarizer,
    RecordSummary,
    RejectedResult,
    SessionState,
    Start,
    Submit,
    SummaryPolicy,
    Turn,
    decide,
    evolve,
    initial_state,
    open_hub,
    replay,
)
from turnledger.testing import Reply, Stall, open_loopback_server, openai_stream_reply

pytestmark = pytest.mark.loopback

#: Three of these turns fit with a question (346 bytes), four do not (413).
BUDGET = 390


def _contents(server: object, i: int) -> list[str]:
    return [m["content"] for m in server.exchanges[i].json()["messages"]]  # type: ignore[attr-defined]


async def _events(store: object, sid: str) -> list[object]:
    return [DEFAULT_CODEC.decode(e) for e in await store.read(sid)]  # type: ignore[attr-defined]


async def test_the_model_summarizes_over_http_and_the_next_request_sends_it(
    tmp_path: Path,
) -> None:
    summary = "Summary of the earlier conversation: q0 to q3 asked, a0 to a3 answered."
    replies = [openai_stream_reply(f"a{i}") for i in range(6)]
    replies.append(openai_stream_reply(summary, usage=(120, 20)))
    replies.append(openai_stream_reply("a6"))
    store = await open_store(tmp_path / "s.db")
    try:
        async with (
            open_loopback_server(replies) as server,
            OpenAIChat(base_url=server.openai_base_url, api_key="k") as provider,
            open_hub(store, provider, model="m", system="sys", max_request_bytes=BUDGET) as hub,
        ):
            for i in range(6):
                r = await (await hub.submit("s", f"q{i}")).outcome()
                assert isinstance(r, CommittedResult)
            ev = await hub.summarize("s", end=4)
            # the summarizing request: the named prompt, then the turns as text
            asked = _contents(server, 6)
            assert asked[0] == PROMPTS["concise"]
            assert asked[1].startswith("User: q0\nAssistant: a0\n\nUser: q1")
            assert "q4" not in asked[1]
            assert (ev.summary_id, ev.branch, ev.start, ev.end) == ("s1", "main", 0, 4)
            assert (ev.origin, ev.origin_name, ev.text) == ("model", "concise", summary)
            assert ev.usage is not None and ev.usage.prompt_tokens == 120
            assert ev.size_bytes == len(summary.encode()) and ev.estimated_tokens > 0
            assert (await hub.summaries("s")) == (ev,)

            r = await (await hub.submit("s", "q6")).outcome()
            assert isinstance(r, CommittedResult) and r.answer == "a6"
            # the summary right after the system prompt, then the turns it
            # does not cover, then the question: each turn once
            assert _contents(server, 7) == ["sys", summary, "q4", "a4", "q5", "a5", "q6"]
            history = await hub.history("s")
            assert [t.question for t in history] == [f"q{i}" for i in range(7)]
        events = await _events(store, "s")
        assert sum(isinstance(e, SummaryRecorded) for e in events) == 1
        assert sum(isinstance(e, SummarySent) for e in events) == 1
        # replay that ignores the summary events: exactly the same history
        plain = replay([e for e in events if not isinstance(e, (SummaryRecorded, SummarySent))])
        assert list(plain.turns) == list(history)
        assert list(replay(events).turns) == list(history)  # type: ignore[arg-type]
    finally:
        await store.aclose()


async def test_a_summarizer_that_fails_times_out_or_is_cancelled_writes_nothing(
    tmp_path: Path,
) -> None:
    replies = [openai_stream_reply(f"a{i}") for i in range(3)]
    replies.append(Reply(status=500, media_type="application/json", body=(b'{"error":"SECRET"}',)))
    replies.append(openai_stream_reply("a3"))
    store = await open_store(tmp_path / "s.db")
    started = trio.Event()

    async def broken(turns: Sequence[Turn]) -> str:
        raise RuntimeError("SECRET detail of a failure")

    async def stuck(turns: Sequence[Turn]) -> str:
        started.set()
        await trio.sleep_forever()
        raise AssertionError("unreachable")

    try:
        async with (
            open_loopback_server(replies) as server,
            OpenAIChat(base_url=server.openai_base_url, api_key="k") as provider,
            open_hub(store, provider, model="m", system="sys") as hub,
        ):
            for i in range(3):
                await (await hub.submit("s", f"q{i}")).outcome()
            before = len(await store.read("s"))
            with capture_logs() as logs:
                with pytest.raises(SummaryFailed, match="RuntimeError") as raised:
                    await hub.summarize("s", summarizer=broken)
                assert "SECRET" not in str(raised.value)
                with pytest.raises(SummaryFailed, match=r"more than 0\.2 seconds"):
                    await hub.summarize("s", summarizer=stuck, timeout=0.2)
                # the model's own request fails (HTTP 500): its body is never told
                with pytest.raises(SummaryFailed) as raised:
                    await hub.summarize("s", summarizer=ModelSummarizer())
                assert "SECRET" not in str(raised.value)
            failed = [x for x in logs if x["event"] == "summary_failed"]
            assert len(failed) == 3 and all(x["session_id"] == "s" for x in failed)
            assert not any("SECRET" in str(x) for x in logs)
            # cancelled while it writes: nothing recorded; a turn meanwhile
            # goes on as if no summary were being written
            started = trio.Event()
            async with trio.open_nursery() as nursery:
                scope = trio.CancelScope()

                async def cancelled_summary() -> None:
                    with scope:
                        await hub.summarize("s", summarizer=stuck)

                nursery.start_soon(cancelled_summary)
                with trio.fail_after(10):
                    await started.wait()
                    r = await (await hub.submit("s", "q3")).outcome()
                assert isinstance(r, CommittedResult) and r.answer == "a3"
                scope.cancel()
            assert scope.cancelled_caught
            assert await hub.summaries("s") == ()
            # the turn's events only: no summary of any kind was written
            after = await _events(store, "s")
            assert len(after) == before + 3
            assert not any(isinstance(e, SummaryRecorded) for e in after)
    finally:
        await store.aclose()


async def test_bad_ranges_and_unknown_sessions_are_typed_errors(tmp_path: Path) -> None:
    asked: list[int] = []

    async def count(turns: Sequence[Turn]) -> str:
        asked.append(len(turns))
        return "a summary"

    store = await open_store(tmp_path / "s.db")
    try:
        async with (
            open_loopback_server([openai_stream_reply("a0"), openai_stream_reply("a1")]) as server,
            OpenAIChat(base_url=server.openai_base_url, api_key="k") as provider,
            open_hub(store, provider, model="m") as hub,
        ):
            with pytest.raises(UnknownSession):
                await hub.summarize("nobody", summarizer=count)
            with pytest.raises(UnknownSession):
                await hub.pin("nobody", "text", origin="memory")
            await (await hub.submit("s", "q0")).outcome()
            before = len(await store.read("s"))
            for start, end in ((0, 2), (1, 1), (-1, 1), (3, 5)):
                with pytest.raises(UnknownTurn):
                    await hub.summarize("s", start=start, end=end, summarizer=count)
            with pytest.raises(InvalidCommand):
                await hub.summarize("s", branch="b7", summarizer=count)
            with pytest.raises(SummaryFailed, match="no summary prompt"):
                await hub.summarize("s", summarizer=ModelSummarizer("nonesuch"))
            assert asked == [] and len(await store.read("s")) == before
            ev = await hub.summarize("s", summarizer=count, request_id="sum-1")
            assert (ev.origin, ev.request_id, ev.start, ev.end) == ("function", "sum-1", 0, 1)
            assert ev.origin_name.endswith("count")
            # the same summarizing request again: recorded once
            again = await hub.summarize("s", summarizer=count, request_id="sum-1")
            assert again == ev and len(await hub.summaries("s")) == 1
    finally:
        await store.aclose()


async def test_pins_are_sent_after_the_system_prompt_and_change_only_at_rest(
    tmp_path: Path,
) -> None:
    replies = [openai_stream_reply("a0"), Reply(body=(Stall(),), media_type="text/event-stream")]
    replies += [openai_stream_reply("a2")]
    store = await open_store(tmp_path / "s.db")
    try:
        async with (
            open_loopback_server(replies) as server,
            OpenAIChat(base_url=server.openai_base_url, api_key="k") as provider,
            open_hub(store, provider, model="m", system="sys", max_pinned_tokens=40) as hub,
        ):
            await (await hub.submit("s", "q0")).outcome()
            assert await hub.pin("s", "The user is Ada.", origin="memory") == "p1"
            assert await hub.pin("s", "Cite sources.", origin="policy", pin_id="rule") == "rule"
            assert [p.pin_id for p in await hub.pins("s")] == ["p1", "rule"]
            stalled = await hub.submit("s", "q1")
            with trio.fail_after(10):
                while len(server.exchanges) < 2:
                    await trio.sleep(0.01)
            assert _contents(server, 1) == [
                "sys",
                "The user is Ada.",
                "Cite sources.",
                "q0",
                "a0",
                "q1",
            ]
            with pytest.raises(SessionBusy):
                await hub.pin("s", "more", origin="memory")
            with pytest.raises(SessionBusy):
                await hub.unpin("s", "p1")
            await stalled.cancel()
            with pytest.raises(UnknownPin):
                await hub.unpin("s", "p9")
            with pytest.raises(InvalidCommand):
                await hub.pin("s", "again", origin="memory", pin_id="rule")
            await hub.unpin("s", "rule")
            # over the pinned items' own budget: the question is rejected, nothing sent
            await hub.pin("s", "x" * 400, origin="retrieval:doc-7")
            r = await (await hub.submit("s", "q2")).outcome()
            assert isinstance(r, RejectedResult) and r.reason == "over_budget"
            assert "pinned items" in r.detail
            assert len(server.exchanges) == 2
            await hub.unpin("s", "p2")
            r = await (await hub.submit("s", "q2")).outcome()
            assert isinstance(r, CommittedResult)
            assert _contents(server, 2) == ["sys", "The user is Ada.", "q0", "a0", "q2"]
            live = await hub.state("s")
        events = await _events(store, "s")
        assert [e.pin_id for e in events if isinstance(e, PinAdded)] == ["p1", "rule", "p2"]
        assert replay(events) == live  # type: ignore[arg-type]
    finally:
        await store.aclose()


async def test_the_policy_summarizes_in_the_background_and_retries_a_failure(
    tmp_path: Path,
) -> None:
    calls: list[int] = []
    gate = trio.Event()

    async def flaky(turns: Sequence[Turn]) -> str:
        calls.append(len(turns))
        if len(calls) == 1:
            raise OSError("the summarizer's server is down")
        await gate.wait()  # held: the turns go on without it
        return f"summary of {len(turns)} turns"

    policy = SummaryPolicy(after_dropped=0, summarizer=flaky, retry_after=0)
    replies = [openai_stream_reply(f"a{i}") for i in range(8)]  # four turns fit in 440 bytes
    store = await open_store(tmp_path / "s.db")
    try:
        async with (
            open_loopback_server(replies) as server,
            OpenAIChat(base_url=server.openai_base_url, api_key="k") as provider,
            open_hub(
                store,
                provider,
                model="m",
                system="sys",
                max_request_bytes=440,
                summary_policy=policy,
            ) as hub,
        ):
            with capture_logs() as logs:
                for i in range(7):
                    r = await (await hub.submit("s", f"q{i}")).outcome()
                    assert isinstance(r, CommittedResult), r
                    await trio.sleep(0.05)  # the policy's task runs beside the turns
            # the first try failed and was logged; a later question tried again,
            # and that one is still held while every turn committed
            assert len(calls) >= 2
            assert any(x["event"] == "summary_failed" for x in logs)
            assert await hub.summaries("s") == ()
            gate.set()
            with trio.fail_after(10):
                while not await hub.summaries("s"):
                    await trio.sleep(0.02)
            (s,) = await hub.summaries("s")
            assert s.origin == "function" and s.start == 0
            # q5 dropped a turn (the first try, failed), q6 two (the second:
            # turns 0-3, the dropped ones and half of those sent)
            assert calls == [3, 4] and (s.start, s.end) == (0, 4)
            r = await (await hub.submit("s", "q7")).outcome()
            assert isinstance(r, CommittedResult)
            sent = _contents(server, 7)
            assert sent == ["sys", s.text, "q4", "a4", "q5", "a5", "q6", "a6", "q7"]
            assert len(await hub.history("s")) == 8
    finally:
        await store.aclose()


def test_the_policy_asks_by_dropped_turns_or_by_share_of_the_window() -> None:
    state: SessionState = initial_state()
    budget = Budget(max_request_bytes=420)

    def send(msg: object) -> tuple[object, ...]:
        nonlocal state
        events = decide(state, msg, budget=budget)  # type: ignore[arg-type]
        for ev in events:
            state = evolve(state, ev)
        return events

    send(Start("be brief", "m", context_window=1000, output_reserve=100, window_source="user"))
    for i in range(6):
        send(Submit(RequestId(f"r{i}"), f"question {i}"))
        send(Completed(RequestId(f"r{i}"), f"answer {i}", "stop"))
    (sub,) = send(Submit(RequestId("q"), "go on"))
    assert isinstance(sub, TurnSubmitted) and sub.turns_dropped == 3 and sub.turns_sent == 3
    assert sub.estimated_prompt_tokens is not None
    # dropped turns: over N asks, N or more does not
    # (turns 0 to 3: the three dropped, and half of the three sent)
    assert policy_range(SummaryPolicy(after_dropped=2), state, sub) == (0, 4)
    assert policy_range(SummaryPolicy(after_dropped=3), state, sub) is None
    # the estimated prompt over a share of the window asks; under it does not
    share = sub.estimated_prompt_tokens / 1000
    assert policy_range(SummaryPolicy(window_fraction=share * 0.9), state, sub) == (0, 4)
    assert policy_range(SummaryPolicy(window_fraction=share * 1.1), state, sub) is None
    # a summary that already covers the dropped turns with room to spare
    # (recorded while the turn is in flight): none again
    send(RecordSummary(RequestId("sum"), BranchId("main"), 0, 4, "s", "function", "f"))
    assert policy_range(SummaryPolicy(after_dropped=0), state, sub) is None
