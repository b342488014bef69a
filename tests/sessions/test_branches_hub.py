"""Branches through a real hub: a loopback OpenAI-compatible server over
HTTP on 127.0.0.1 and a real SQLite file."""

from __future__ import annotations

from pathlib import Path

import pytest
import trio

from turnledger import SessionBusy, UnknownBranch, UnknownSession, UnknownTurn
from turnledger.adapters.providers import OpenAIChat
from turnledger.adapters.stores import open_store
from turnledger.events import DEFAULT_CODEC, BranchStarted, BranchSwitched
from turnledger.sessions import (
    CommittedResult,
    DiscardedResult,
    RejectedResult,
    branches_of,
    open_hub,
    replay,
)
from turnledger.testing import (
    Reply,
    Stall,
    open_loopback_server,
    openai_sse_chunks,
    openai_stream_reply,
)

pytestmark = pytest.mark.loopback


def _pairs(turns: object) -> list[tuple[str, str]]:
    return [(t.question, t.answer) for t in turns]  # type: ignore[attr-defined]


async def test_edit_regenerate_and_switch_over_http_on_a_sqlite_file(tmp_path: Path) -> None:
    answers = ["a0", "a1", "a2", "a1 edited", "a1 again", "a3 on main"]
    store = await open_store(tmp_path / "branches.db")
    try:
        async with (
            open_loopback_server([openai_stream_reply(a) for a in answers]) as server,
            OpenAIChat(base_url=server.openai_base_url, api_key="k") as provider,
            open_hub(store, provider, model="m", system="sys") as hub,
        ):
            for i in range(3):
                r = await (await hub.submit("s", f"q{i}")).outcome()
                assert isinstance(r, CommittedResult) and r.answer == f"a{i}"
            edit = await hub.edit("s", 1, "q1 edited")
            assert (await edit.outcome()).answer == "a1 edited"  # type: ignore[union-attr]
            # the edit's request carried turn 0 only, then the new question
            sent = [m["content"] for m in server.exchanges[3].json()["messages"]]
            assert sent == ["sys", "q0", "a0", "q1 edited"]
            assert _pairs(await hub.history("s")) == [("q0", "a0"), ("q1 edited", "a1 edited")]

            regen = await hub.regenerate("s")
            assert (await regen.outcome()).answer == "a1 again"  # type: ignore[union-attr]
            sent = [m["content"] for m in server.exchanges[4].json()["messages"]]
            assert sent == ["sys", "q0", "a0", "q1 edited"]
            assert _pairs(await hub.history("s")) == [("q0", "a0"), ("q1 edited", "a1 again")]

            await hub.switch("s", "main")
            assert _pairs(await hub.history("s")) == [("q0", "a0"), ("q1", "a1"), ("q2", "a2")]
            await hub.switch("s", "main")  # already active: nothing recorded
            r = await (await hub.submit("s", "q3")).outcome()
            assert isinstance(r, CommittedResult)
            sent = [m["content"] for m in server.exchanges[5].json()["messages"]]
            assert sent == ["sys", "q0", "a0", "q1", "a1", "q2", "a2", "q3"]

            listing = {b.branch_id: b for b in await hub.branches("s")}
            assert list(listing) == ["main", "b1", "b2"]
            assert (listing["main"].length, listing["main"].head) == (4, r.request_id)
            assert listing["main"].active and not listing["b1"].active
            b1, b2 = listing["b1"], listing["b2"]
            assert (b1.parent, b1.at_turn, b1.kind, b1.length) == ("main", 1, "edit", 2)
            assert (b1.head, b2.head) == (edit.request_id, regen.request_id)
            assert (b2.parent, b2.at_turn, b2.kind, b2.length) == ("b1", 1, "regenerate", 2)
            live = await hub.state("s")
        stored = await store.read("s")
    finally:
        await store.aclose()
    events = [DEFAULT_CODEC.decode(e) for e in stored]
    assert [type(e) for e in events].count(BranchStarted) == 2
    assert [type(e) for e in events].count(BranchSwitched) == 1
    replayed = replay(events)
    assert replayed == live
    assert branches_of(replayed) == branches_of(live)

    # a new hub on the same file finds every branch, and goes on from b1
    store = await open_store(tmp_path / "branches.db")
    try:
        async with (
            open_loopback_server([openai_stream_reply("a2 on b1")]) as server,
            OpenAIChat(base_url=server.openai_base_url, api_key="k") as provider,
            open_hub(store, provider, model="m", system="sys") as hub,
        ):
            assert [b.branch_id for b in await hub.branches("s")] == ["main", "b1", "b2"]
            await hub.switch("s", "b1")
            r = await (await hub.submit("s", "q2 on b1")).outcome()
            assert isinstance(r, CommittedResult)
            sent = [m["content"] for m in server.exchanges[0].json()["messages"]]
            assert sent == ["sys", "q0", "a0", "q1 edited", "a1 edited", "q2 on b1"]
    finally:
        await store.aclose()


async def test_bad_branch_input_is_a_typed_error_and_writes_nothing(tmp_path: Path) -> None:
    store = await open_store(tmp_path / "bad.db")
    try:
        async with (
            open_loopback_server([openai_stream_reply("a0")]) as server,
            OpenAIChat(base_url=server.openai_base_url, api_key="k") as provider,
            open_hub(store, provider, model="m") as hub,
        ):
            with pytest.raises(UnknownSession):
                await hub.edit("nobody", 0, "q")
            with pytest.raises(UnknownSession):
                await hub.switch("nobody", "main")
            with pytest.raises(UnknownSession):
                await hub.branches("nobody")
            assert await store.read("nobody") == []
            await hub.open_session("s")
            with pytest.raises(UnknownTurn):
                await hub.regenerate("s")  # no turn yet
            await (await hub.submit("s", "q0")).outcome()
            before = await store.read("s")
            with pytest.raises(UnknownTurn, match="no turn 1 to edit"):
                await hub.edit("s", 1, "q")
            with pytest.raises(UnknownTurn):
                await hub.edit("s", -1, "q")
            with pytest.raises(UnknownBranch, match="'b9'"):
                await hub.switch("s", "b9")
            assert await store.read("s") == before
            # an empty edited question is rejected like a Submit, and starts no branch
            r = await (await hub.edit("s", 0, "   ")).outcome()
            assert isinstance(r, RejectedResult) and r.reason == "empty_question"
            assert [b.branch_id for b in await hub.branches("s")] == ["main"]
            assert len(server.exchanges) == 1
    finally:
        await store.aclose()


async def test_a_switch_while_busy_is_refused_or_supersedes(tmp_path: Path) -> None:
    stalled = Reply(body=(*openai_sse_chunks("slow", finish_reason=None, done=False), Stall()))
    for on_busy in ("reject", "supersede"):
        store = await open_store(tmp_path / f"{on_busy}.db")
        try:
            replies = [openai_stream_reply("a0"), openai_stream_reply("b"), stalled]
            async with (
                open_loopback_server(replies) as server,
                OpenAIChat(base_url=server.openai_base_url, api_key="k") as provider,
                open_hub(store, provider, model="m", on_busy=on_busy) as hub,
            ):
                await (await hub.submit("s", "q0")).outcome()
                await (await hub.edit("s", 0, "q0 edited")).outcome()  # b1
                await hub.switch("s", "main")
                busy = await hub.submit("s", "q1 on main")
                with trio.fail_after(10):
                    async for delta in busy.preview():
                        if delta:
                            break
                # The stream's start is written beside the relayed delta:
                # wait for it, so the log is still while the switch is refused.
                with trio.fail_after(10):
                    while (await store.read("s"))[-1].tag != "stream_started":
                        await trio.sleep(0.01)
                if on_busy == "reject":
                    before = await store.read("s")
                    with pytest.raises(SessionBusy):
                        await hub.switch("s", "b1")
                    assert await store.read("s") == before
                    result = await busy.cancel()
                    assert isinstance(result, DiscardedResult) and result.reason == "cancelled"
                else:
                    await hub.switch("s", "b1")
                    with trio.fail_after(10):
                        result = await busy.outcome()
                    assert isinstance(result, DiscardedResult) and result.reason == "superseded"
                    assert _pairs(await hub.history("s")) == [("q0 edited", "b")]
                main = next(b for b in await hub.branches("s") if b.branch_id == "main")
                assert main.length == 1  # the discarded turn never entered main
        finally:
            await store.aclose()
