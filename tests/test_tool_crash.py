"""SIGKILL while a tool runs, in every wire protocol: the log recovers the
turn as ``interrupted``, and no later request carries the call without its
result."""

from __future__ import annotations

import signal
from pathlib import Path

import pytest

from _procs import readline_within, spawn
from turnledger.adapters.providers import PROVIDER_KINDS
from turnledger.adapters.stores import open_store
from turnledger.events import DEFAULT_CODEC, ToolCallsRequested, TurnDiscarded
from turnledger.sessions import CommittedResult, Tool, ToolInvocation, open_hub, replay
from turnledger.testing import (
    Reply,
    WireProtocol,
    answer_parts,
    chat_messages,
    media_type_of,
    open_loopback_server,
)

pytestmark = pytest.mark.loopback

CHILD = r"""
import sys, trio
from turnledger.adapters.providers import PROVIDER_KINDS
from turnledger.adapters.stores import open_store
from turnledger.events import ToolCall
from turnledger.sessions import Tool, open_hub
from turnledger.testing import (
    Reply, answer_parts, media_type_of, open_loopback_server, tool_call_reply,
)

async def hang(inv):
    print("tool running", inv.call_id, flush=True)
    await trio.sleep_forever()

async def main(path, protocol):
    kind = PROVIDER_KINDS[protocol]
    first = Reply(media_type=media_type_of(protocol), body=answer_parts(protocol, "first"))
    replies = [first, tool_call_reply((ToolCall("k1", "hang", "{}"),), protocol=protocol)]
    store = await open_store(path)
    async with open_loopback_server(replies) as server:
        provider = kind.provider_class()(base_url=server.base_url + kind.loopback_path)
        tools = [Tool("hang", hang)]
        async with provider, open_hub(store, provider, model="m", tools=tools) as hub:
            await (await hub.submit("s", "first question")).outcome()
            await hub.submit("s", "use the tool")
            await trio.sleep_forever()

trio.run(main, sys.argv[1], sys.argv[2])
"""


async def _never(inv: ToolInvocation) -> str:
    raise AssertionError("not called")


@pytest.mark.parametrize(
    ("protocol", "suffix"),
    [("openai", ".db"), ("openai", ".jsonl"), ("anthropic", ".db"),
     ("openai-responses", ".jsonl")],
)  # fmt: skip
async def test_sigkill_mid_tool_recovers_as_interrupted(
    protocol: WireProtocol, suffix: str, tmp_path: Path
) -> None:
    path = str(tmp_path / f"tools{suffix}")
    child = spawn(CHILD, path, protocol)
    try:
        assert readline_within(child) == "tool running k1"
        child.send_signal(signal.SIGKILL)
        child.wait(10)
    finally:
        if child.poll() is None:
            child.kill()
            child.wait(30)
    store = await open_store(path)
    try:
        before = [DEFAULT_CODEC.decode(e) for e in await store.read("s")]
        assert isinstance(before[-1], ToolCallsRequested)  # the crash left the call open
        again = Reply(media_type=media_type_of(protocol), body=answer_parts(protocol, "again"))
        async with open_loopback_server([again]) as server:
            kind = PROVIDER_KINDS[protocol]
            provider = kind.provider_class()(base_url=server.base_url + kind.loopback_path)
            async with (
                provider,
                open_hub(store, provider, model="m", tools=[Tool("hang", _never)]) as hub,
            ):
                result = await (await hub.submit("s", "next")).outcome()
        events = [DEFAULT_CODEC.decode(e) for e in await store.read("s")]
    finally:
        await store.aclose()
    assert isinstance(result, CommittedResult) and result.answer == "again"
    discarded = events[len(before)]
    assert isinstance(discarded, TurnDiscarded) and discarded.reason == "interrupted"
    (exchange,) = server.exchanges
    messages = chat_messages(protocol, exchange.json())
    assert [m["role"] for m in messages] == ["user", "assistant", "user"]
    assert [m["content"] for m in messages] == ["first question", "first", "next"]
    assert [t.question for t in replay(events).turns] == ["first question", "next"]
