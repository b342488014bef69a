"""Tool turns through the whole stack: hub + actor + tools + provider over
real HTTP (the loopback server) + a store."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import trio

from turnledger.adapters.providers import OllamaChat, OpenAIChat
from turnledger.adapters.stores import open_store
from turnledger.events import (
    DEFAULT_CODEC,
    CompletionIgnored,
    Event,
    ToolCall,
    ToolResultRecorded,
    ToolRoundSubmitted,
    TurnSubmitted,
)
from turnledger.sessions import (
    CommittedResult,
    DiscardedResult,
    Tool,
    ToolError,
    ToolInvocation,
    open_hub,
    replay,
)
from turnledger.testing import (
    MemoryStore,
    Reply,
    Stall,
    open_loopback_server,
    openai_sse_chunks,
    openai_stream_reply,
    tool_call_reply,
)

pytestmark = pytest.mark.loopback


class Recorder:
    """Tools that record their invocations."""

    def __init__(self) -> None:
        self.calls: list[ToolInvocation] = []
        self.started = trio.Event()
        self.cancelled = 0

    async def clock(self, inv: ToolInvocation) -> str:
        self.calls.append(inv)
        return "12:00"

    async def calc(self, inv: ToolInvocation) -> object:
        self.calls.append(inv)
        expr = str(inv.arguments["expr"])
        if expr == "boom":
            raise ValueError("secret internals")
        if expr == "nope":
            raise ToolError("cannot compute that")
        if expr == "exit":
            raise SystemExit(3)
        if expr == "interrupt":
            raise KeyboardInterrupt
        a, b = expr.split("*")
        return {"value": int(a) * int(b)}

    async def slow(self, inv: ToolInvocation) -> str:
        self.calls.append(inv)
        self.started.set()
        try:
            await trio.sleep_forever()
        except trio.Cancelled:
            self.cancelled += 1
            raise
        return "never"  # pragma: no cover

    def tools(self) -> list[Tool]:
        schema = {"type": "object", "properties": {"expr": {"type": "string"}}}
        return [
            Tool("clock", self.clock, "the time"),
            Tool("calc", self.calc, "multiply a*b", schema),
            Tool("slow", self.slow, "never ends"),
        ]


def calc(call_id: str, expr: str) -> ToolCall:
    return ToolCall(call_id, "calc", json.dumps({"expr": expr}))


def provider_for(protocol: str, server: Any) -> Any:
    if protocol == "openai":
        return OpenAIChat(base_url=server.openai_base_url, api_key="k", read_size=1)
    return OllamaChat(base_url=server.base_url, read_size=1)


async def run_turns(
    replies: list[Reply],
    questions: list[str],
    *,
    protocol: str = "openai",
    store: Any = None,
    recorder: Recorder | None = None,
    **hub_kw: Any,
) -> tuple[list[Any], list[Event], Any, Recorder]:
    rec = recorder or Recorder()
    store = store or MemoryStore()
    results = []
    async with open_loopback_server(replies) as server:
        provider = provider_for(protocol, server)
        async with (
            provider,
            open_hub(
                store, provider, model="m", system="be brief", tools=rec.tools(), **hub_kw
            ) as hub,
        ):
            for q in questions:
                turn = await hub.submit("s", q)
                results.append(await turn.outcome())
    events = [DEFAULT_CODEC.decode(e) for e in await store.read("s")]
    return results, events, server, rec


def assert_requests_paired(server: Any) -> None:
    """Every request the server got answers each tool call right after it."""
    for exchange in server.exchanges:
        messages = exchange.json()["messages"]
        for i, m in enumerate(messages):
            calls = m.get("tool_calls") or []
            results = messages[i + 1 : i + 1 + len(calls)]
            assert [r["role"] for r in results] == ["tool"] * len(calls)
            if m["role"] == "tool":
                assert any(p.get("tool_calls") for p in messages[:i])


@pytest.mark.parametrize("protocol", ["openai", "ollama"])
async def test_a_one_round_turn_commits_and_sends_the_result_back(protocol: str) -> None:
    calls = (ToolCall("call_0", "clock", "{}"),)
    replies = [
        tool_call_reply(calls, protocol=protocol, chunk_size=1),
        openai_stream_reply("It is noon.")
        if protocol == "openai"
        else Reply(
            media_type="application/x-ndjson",
            body=(
                b'{"message":{"role":"assistant","content":"It is noon."},"done":false}\n',
                b'{"message":{"role":"assistant","content":""},"done":true,"done_reason":"stop"}\n',
            ),
        ),
        openai_stream_reply("ok")
        if protocol == "openai"
        else Reply(
            media_type="application/x-ndjson",
            body=(
                b'{"message":{"role":"assistant","content":"ok"},"done":true,"done_reason":"stop"}\n',
            ),
        ),
    ]
    results, events, server, rec = await run_turns(
        replies, ["what time is it?", "thanks"], protocol=protocol
    )
    assert isinstance(results[0], CommittedResult) and results[0].answer == "It is noon."
    assert isinstance(results[1], CommittedResult)
    (inv,) = rec.calls
    assert (inv.request_id, inv.call_id, inv.arguments) == (results[0].request_id, "call_0", {})
    state = replay(events)
    (turn, _) = state.turns
    assert [r.calls for r in turn.rounds] == [calls]
    assert turn.rounds[0].results[0].content == "12:00"
    # each request body is exactly the size recorded for it
    sizes = [e.request_bytes for e in events if isinstance(e, (TurnSubmitted, ToolRoundSubmitted))]
    assert sizes == [len(x.body) for x in server.exchanges]
    assert_requests_paired(server)
    # the third request carries the whole tool turn
    roles = [m["role"] for m in server.exchanges[2].json()["messages"]]
    assert roles == ["system", "user", "assistant", "tool", "assistant", "user"]


async def test_three_rounds_and_parallel_calls_commit_as_one_turn(tmp_path: Path) -> None:
    replies = [
        tool_call_reply((calc("a", "6*7"), ToolCall("b", "clock", "{}")), chunk_size=2),
        tool_call_reply((calc("c", "2*3"),)),
        tool_call_reply((calc("d", "1*1"), calc("e", "5*5"), ToolCall("f", "clock", "{}"))),
        openai_stream_reply("42, 6, 1, 25 at noon"),
    ]
    store = await open_store(tmp_path / "tools.db")
    try:
        results, events, server, rec = await run_turns(replies, ["compute"], store=store)
    finally:
        await store.aclose()
    assert isinstance(results[0], CommittedResult)
    assert {c.call_id for c in rec.calls} == set("abcdef")
    (turn,) = replay(events).turns
    assert [len(r.calls) for r in turn.rounds] == [2, 1, 3]
    # results in the order of the calls, whatever order the tools finished in
    last = server.exchanges[3].json()["messages"]
    assert [m.get("tool_call_id") for m in last if m["role"] == "tool"] == list("abcdef")
    assert [m["content"] for m in last if m["role"] == "tool"][:2] == ['{"value":42}', "12:00"]
    assert_requests_paired(server)
    # nothing of the turn is history before its TurnCommitted, the last event
    assert type(events[-1]).__name__ == "TurnCommitted"


async def test_calls_of_a_round_run_concurrently() -> None:
    both = trio.Event()
    arrived = 0

    async def meet(inv: ToolInvocation) -> str:
        nonlocal arrived
        arrived += 1
        if arrived == 2:
            both.set()
        with trio.fail_after(5):
            await both.wait()  # sequential calls would never get here
        return inv.call_id

    replies = [
        tool_call_reply((ToolCall("x", "meet", "{}"), ToolCall("y", "meet", "{}"))),
        openai_stream_reply("met"),
    ]
    async with open_loopback_server(replies) as server:
        provider = OpenAIChat(base_url=server.openai_base_url)
        async with (
            provider,
            open_hub(MemoryStore(), provider, model="m", tools=[Tool("meet", meet)]) as hub,
        ):
            result = await (await hub.submit("s", "meet")).outcome()
    assert isinstance(result, CommittedResult) and result.answer == "met"


async def test_a_tool_that_raises_is_reported_to_the_model_or_stops_the_turn() -> None:
    replies = [
        tool_call_reply((calc("a", "boom"), calc("b", "nope"))),
        openai_stream_reply("sorry"),
    ]
    results, _events, server, _ = await run_turns(replies, ["q"])
    assert isinstance(results[0], CommittedResult)
    tool_messages = [m for m in server.exchanges[1].json()["messages"] if m["role"] == "tool"]
    assert [m["content"] for m in tool_messages] == [
        "the tool failed (ValueError)",
        "cannot compute that",
    ]
    assert "secret" not in server.exchanges[1].body.decode()
    results, events, server, _ = await run_turns(
        [tool_call_reply((calc("a", "boom"),))], ["q"], on_tool_error="stop"
    )
    assert isinstance(results[0], DiscardedResult) and results[0].reason == "tool_error"
    assert len(replay(events).turns) == 0
    assert len(server.exchanges) == 1


@pytest.mark.parametrize(
    ("expr", "raised"), [("exit", "SystemExit"), ("interrupt", "KeyboardInterrupt")]
)
async def test_a_tool_raising_systemexit_or_keyboardinterrupt_ends_only_its_call(
    expr: str, raised: str
) -> None:
    # Neither the hub nor the program stops: the call's result says what the
    # tool raised, and the next turn of the same hub commits.
    replies = [
        tool_call_reply((calc("a", expr),)),
        openai_stream_reply("sorry"),
        openai_stream_reply("still here"),
    ]
    results, events, server, _ = await run_turns(replies, ["q", "next"])
    assert [type(r) for r in results] == [CommittedResult, CommittedResult]
    tool_messages = [m for m in server.exchanges[1].json()["messages"] if m["role"] == "tool"]
    assert [m["content"] for m in tool_messages] == [f"the tool failed ({raised})"]
    assert [t.answer for t in replay(events).turns] == ["sorry", "still here"]
    # With on_tool_error="stop", it ends its turn as tool_error, and only that.
    replies = [tool_call_reply((calc("a", expr),)), openai_stream_reply("still here")]
    results, events, _, _ = await run_turns(replies, ["q", "next"], on_tool_error="stop")
    assert isinstance(results[0], DiscardedResult) and results[0].reason == "tool_error"
    assert isinstance(results[1], CommittedResult)


def _stalled_stream() -> Reply:
    return Reply(body=(*openai_sse_chunks("partial answer")[:2], Stall()))


@pytest.mark.parametrize("where", ["tool_running", "second_stream", "between_rounds"])
async def test_a_cancel_anywhere_in_a_tool_turn_leaves_history_as_before(where: str) -> None:
    rec = Recorder()
    first = openai_stream_reply("first answer")
    if where == "tool_running":
        replies = [first, tool_call_reply((ToolCall("s1", "slow", "{}"),))]
    elif where == "second_stream":
        replies = [first, tool_call_reply((ToolCall("c1", "clock", "{}"),)), _stalled_stream()]
    else:
        replies = [
            first,
            tool_call_reply((ToolCall("c1", "clock", "{}"),)),
            Reply(hang_before_headers=True),
        ]
    replies.append(openai_stream_reply("after"))
    store = MemoryStore()
    async with open_loopback_server(replies) as server:
        provider = OpenAIChat(base_url=server.openai_base_url)
        async with (
            provider,
            open_hub(store, provider, model="m", tools=rec.tools(), idle_timeout=None) as hub,
        ):
            assert isinstance(await (await hub.submit("s", "first")).outcome(), CommittedResult)
            before = await hub.history("s")
            turn = await hub.submit("s", "use a tool")
            with trio.fail_after(5):
                if where == "tool_running":
                    await rec.started.wait()
                else:
                    # the second round's request is out (and streaming, or not)
                    tail = "stream_started" if where == "second_stream" else "tool_round_submitted"
                    while (await store.read("s"))[-1].tag != tail or len(server.exchanges) < 3:
                        await trio.sleep(0.01)
            await hub.cancel("s")
            result = await turn.outcome()
            assert isinstance(result, DiscardedResult) and result.reason == "cancelled"
            assert await hub.history("s") == before
            after = await (await hub.submit("s", "again")).outcome()
            assert isinstance(after, CommittedResult) and after.answer == "after"
    if where == "tool_running":
        assert rec.cancelled == 1
    last = server.exchanges[-1].json()["messages"]
    assert [m["role"] for m in last] == ["user", "assistant", "user"]
    assert_requests_paired(server)
    events = [DEFAULT_CODEC.decode(e) for e in await store.read("s")]
    assert tuple(replay(events).turns)[:-1] == tuple(before)


async def test_a_result_after_the_turn_ended_is_recorded_as_ignored() -> None:
    release = trio.Event()

    async def stubborn(inv: ToolInvocation) -> str:
        with trio.CancelScope(shield=True):
            await release.wait()
        return "too late"

    replies = [tool_call_reply((ToolCall("z", "stubborn", "{}"),))]
    store = MemoryStore()
    async with open_loopback_server(replies) as server:
        provider = OpenAIChat(base_url=server.openai_base_url)
        async with (
            provider,
            open_hub(store, provider, model="m", tools=[Tool("stubborn", stubborn)]) as hub,
        ):
            turn = await hub.submit("s", "q")
            with trio.fail_after(5):
                while len(await store.read("s")) < 4:  # started, submitted, stream, calls
                    await trio.sleep(0.01)
            await hub.cancel("s")
            assert isinstance(await turn.outcome(), DiscardedResult)
            release.set()
            with trio.fail_after(5):
                while len(await store.read("s")) < 6:
                    await trio.sleep(0.01)
    events = [DEFAULT_CODEC.decode(e) for e in await store.read("s")]
    assert events[-1] == CompletionIgnored(turn.request_id, "tool_result")
    assert not any(isinstance(e, ToolResultRecorded) for e in events)
