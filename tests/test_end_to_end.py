"""The whole stack over real HTTP: hub + actor + provider + loopback server + store."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import structlog

from turnledger.adapters.providers import OllamaChat, OpenAIChat
from turnledger.adapters.stores import open_store
from turnledger.events import DEFAULT_CODEC, TurnSubmitted
from turnledger.sessions import CommittedResult, DiscardedResult, open_hub, replay
from turnledger.testing import (
    MemoryStore,
    Reply,
    Stall,
    WritePause,
    error_reply,
    ollama_stream_reply,
    open_loopback_server,
    openai_error_event,
    openai_sse_chunks,
    openai_stream_reply,
)

pytestmark = pytest.mark.loopback

QUESTIONS = ["第一个问题：what is a turn?", 'Second: "quotes" and\nnewlines 🌱', "third"]
ANSWERS = ["一个回合 is a question and its answer.", "Both survive: “quotes”\n🌱", "ok"]


@pytest.mark.parametrize("protocol", ["openai", "ollama"])
async def test_three_turns_commit_the_same_way_over_both_protocols(
    protocol: str, tmp_path: Path
) -> None:
    if protocol == "openai":
        replies = [openai_stream_reply(a, chunk_size=3) for a in ANSWERS]
    else:
        replies = [ollama_stream_reply(a, chunk_size=3) for a in ANSWERS]
    store = await open_store(tmp_path / "e2e.db")
    try:
        async with open_loopback_server(replies) as server:
            provider: Any = (
                OpenAIChat(base_url=server.openai_base_url, api_key="k")
                if protocol == "openai"
                else OllamaChat(base_url=server.base_url)
            )
            async with provider, open_hub(store, provider, model="m", system="be brief") as hub:
                for q, a in zip(QUESTIONS, ANSWERS, strict=True):
                    turn = await hub.submit("s", q)
                    result = await turn.outcome()
                    assert result == CommittedResult(turn.request_id, a, "stop", result.usage)
                history = await hub.history("s")
        stored = await store.read("s")
    finally:
        await store.aclose()
    assert [(t.question, t.answer) for t in history] == list(zip(QUESTIONS, ANSWERS, strict=True))
    events = [DEFAULT_CODEC.decode(e) for e in stored]
    assert [e.tag for e in stored] == ["session_started"] + [
        "turn_submitted", "stream_started", "turn_committed"
    ] * 3  # fmt: skip
    assert tuple(replay(events).turns) == history
    # the body each server received is exactly the size the projection measured,
    # and carries the earlier turns whole
    submitted = [e for e in events if isinstance(e, TurnSubmitted)]
    for ev, exchange in zip(submitted, server.exchanges, strict=True):
        assert len(exchange.body) == ev.request_bytes
    last = server.exchanges[-1].json()["messages"]
    assert [m["content"] for m in last] == [
        "be brief",
        QUESTIONS[0],
        ANSWERS[0],
        QUESTIONS[1],
        ANSWERS[1],
        QUESTIONS[2],
    ]


async def test_cancel_through_the_hub_closes_the_connection() -> None:
    body = (*openai_sse_chunks("streaming", finish_reason=None, done=False), Stall())
    store = MemoryStore()
    async with (
        open_loopback_server(Reply(body=body)) as server,
        OpenAIChat(base_url=server.openai_base_url) as provider,
        open_hub(store, provider, model="m") as hub,
    ):
        turn = await hub.submit("s", "q")
        async for delta in turn.preview():
            if delta:
                break
        result = await turn.cancel()
        assert isinstance(result, DiscardedResult) and result.reason == "cancelled"
        assert result.preview_chars > 0
        exchange = server.exchanges[0]
        await exchange.wait_ended()
        assert exchange.client_disconnected and not exchange.completed
        assert hub.statistics().requests == 0
        assert await hub.history("s") == ()


SECRET_KEY = "sk-SENTINEL-KEY-0123456789"
SECRET_BODY = "SENTINEL-BODY /home/deploy/app/server.py line 42"


async def test_secrets_and_error_bodies_reach_no_log_event_or_result() -> None:
    replies = [
        openai_stream_reply("fine"),
        error_reply(500, json.dumps({"error": {"message": SECRET_BODY}})),
        error_reply(401, SECRET_BODY, media_type="text/plain"),
        Reply(body=(*openai_sse_chunks("part", finish_reason=None, done=False),
                    openai_error_event(SECRET_BODY))),
        Reply(status=200, media_type="text/html", body=(SECRET_BODY,)),
        Reply(body=(openai_sse_chunks("x", done=False)[1], WritePause(0.05),
                    f"data: {{{SECRET_BODY}\n\n".encode())),
    ]  # fmt: skip
    store = MemoryStore()
    results = []
    with structlog.testing.capture_logs() as logs:
        async with open_loopback_server(replies) as server, OpenAIChat(
            base_url=server.openai_base_url, api_key=SECRET_KEY, include_usage=True
        ) as provider, open_hub(store, provider, model="m") as hub:  # fmt: skip
            for i in range(len(replies)):
                turn = await hub.submit("s", f"question {i}")
                results.append(await turn.outcome())
                results.append(repr(turn))
            results.append(repr(provider))
            results.append(repr(hub))
    # the key was really used, so its absence below means something
    assert server.exchanges[0].header("authorization") == f"Bearer {SECRET_KEY}"
    reasons = [r.reason for r in results if isinstance(r, DiscardedResult)]
    assert reasons == ["http_status", "http_status", "provider_error", "protocol", "malformed"]
    stored = json.dumps([[e.tag, e.payload] for e in await store.read_all()], ensure_ascii=False)
    everything = "\n".join([repr(logs), stored, repr(results)])
    for secret in (SECRET_KEY, "SENTINEL-BODY", "/home/deploy"):
        assert secret not in everything
    assert len(logs) > 20  # the check above looked at real log lines


def test_a_provider_repr_hides_credentials_in_its_url() -> None:
    url = "https://user:pw-SENTINEL@host.test/v1?key=SENTINEL"
    provider = OpenAIChat(base_url=url, api_key="k")
    assert "SENTINEL" not in repr(provider) and "host.test/v1" in repr(provider)
