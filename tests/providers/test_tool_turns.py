"""Tool turns in every protocol, through a real hub and loopback HTTP: one
round, three rounds, a cancel while a tool runs. The calls go out in the
protocol's words and their results come back in it; a call never reaches a
request (or history) without its result. (SIGKILL while a tool runs:
``tests/test_tool_crash.py``.)"""

from __future__ import annotations

from typing import Any

import pytest
import trio

from turnledger.adapters.stores import MemoryStore
from turnledger.events import ToolCall
from turnledger.sessions import (
    CommittedResult,
    DiscardedResult,
    Tool,
    ToolInvocation,
    open_hub,
)
from turnledger.testing import (
    LoopbackServer,
    Reply,
    answer_parts,
    chat_messages,
    media_type_of,
    open_loopback_server,
    tool_call_reply,
)

from ._wires import WIRES, Wire

pytestmark = pytest.mark.loopback


async def calc(inv: ToolInvocation) -> str:
    return str(sum(int(v) for v in inv.arguments.values()))


TOOLS = [Tool("calc", calc, "adds numbers", '{"type":"object"}')]


def answer(w: Wire, text: str) -> Reply:
    return Reply(media_type=media_type_of(w.name), body=tuple(answer_parts(w.name, text)))


def sent(server: LoopbackServer, w: Wire) -> list[list[dict[str, Any]]]:
    """Each request's messages, in the protocol-neutral form."""
    return [chat_messages(w.name, e.json()) for e in server.exchanges]


def _round(i: int) -> tuple[ToolCall, ...]:
    return (ToolCall(f"c{i}a", "calc", f'{{"a":{i},"b":1}}'), ToolCall(f"c{i}b", "calc", "{}"))


@pytest.mark.parametrize("rounds", [1, 3])
@pytest.mark.parametrize("wire", WIRES, ids=[w.name for w in WIRES])
async def test_tool_rounds_commit_whole(wire: Wire, rounds: int) -> None:
    replies = [tool_call_reply(_round(i), protocol=wire.name) for i in range(rounds)]
    replies.append(answer(wire, "Done."))
    store = MemoryStore()
    async with (
        open_loopback_server(replies) as server,
        wire.provider(wire.url(server, "")) as provider,
        open_hub(store, provider, model="m", system="sys", tools=TOOLS) as hub,
    ):
        result = await (await hub.submit("s", "add things")).outcome()
        (turn,) = await hub.history("s")
    assert isinstance(result, CommittedResult) and result.answer == "Done."
    assert len(turn.rounds) == rounds
    for i, rnd in enumerate(turn.rounds):
        by_id = {r.call_id: r.content for r in rnd.results}
        assert [by_id[c.call_id] for c in rnd.calls] == [str(i + 1), "0"]
    requests = sent(server, wire)
    assert len(requests) == rounds + 1
    # each request carries every complete round so far: calls, then results
    for n, messages in enumerate(requests):
        roles = [m["role"] for m in messages]
        assert roles == ["system", "user", *(["assistant", "tool", "tool"] * n)], wire.name
        assert [m["content"] for m in messages if m["role"] == "tool"] == [
            c for i in range(n) for c in (str(i + 1), "0")
        ]
    # and the ids of the calls, in the protocol's own fields
    last = server.exchanges[-1].json()
    if wire.name == "anthropic":
        ids = [b["tool_use_id"] for m in last["messages"] for b in m["content"]
               if isinstance(m["content"], list) and b["type"] == "tool_result"]  # fmt: skip
    elif wire.name == "openai-responses":
        ids = [i["call_id"] for i in last["input"] if i.get("type") == "function_call_output"]
    elif wire.name == "openai":
        ids = [m["tool_call_id"] for m in last["messages"] if m["role"] == "tool"]
    else:  # Ollama has no call ids: results name their tool
        ids = [m["tool_name"] for m in last["messages"] if m["role"] == "tool"]
    expected = [c.call_id for i in range(rounds) for c in _round(i)]
    assert ids == (["calc"] * len(expected) if wire.name == "ollama" else expected)


@pytest.mark.parametrize("wire", WIRES, ids=[w.name for w in WIRES])
async def test_a_cancel_mid_tool_drops_the_turn_whole(wire: Wire) -> None:
    running = trio.Event()

    async def hang(inv: ToolInvocation) -> str:
        running.set()
        await trio.sleep_forever()
        raise AssertionError("unreachable")

    replies = [
        answer(wire, "First."),
        tool_call_reply((ToolCall("k1", "hang", "{}"),), protocol=wire.name),
        answer(wire, "Next."),
    ]
    async with (
        open_loopback_server(replies) as server,
        wire.provider(wire.url(server, "")) as provider,
        open_hub(MemoryStore(), provider, model="m", tools=[Tool("hang", hang)]) as hub,
    ):
        await (await hub.submit("s", "first")).outcome()
        handle = await hub.submit("s", "use the tool")
        with trio.fail_after(5):
            await running.wait()
        await handle.cancel()
        result = await handle.outcome()
        assert isinstance(result, DiscardedResult) and result.reason == "cancelled"
        assert [t.answer for t in await hub.history("s")] == ["First."]
        after = await (await hub.submit("s", "next")).outcome()
        assert isinstance(after, CommittedResult)
    # the next request holds whole turns only: no call without its result
    assert [m["role"] for m in sent(server, wire)[-1]] == ["user", "assistant", "user"]
