"""A server that echoes the request's API key into the fields it controls.

Error codes and types, SSE event names, finish reasons, roles, Ollama's
``done_reason`` and ``error``, Anthropic's stop reasons and block and delta
types, the Responses API's error codes and incomplete reasons, the media
type and other response headers: the key goes out in ``Authorization`` (or
Anthropic's ``x-api-key``) and comes back in each of them, over
real loopback HTTP, through a real hub, into a real SQLite file and a real
journal, with JSON log lines at debug level. No byte of any store file, log
line, preview, result, state or repr may hold it.
"""

from __future__ import annotations

import io
import json
from pathlib import Path
from typing import Any

import pytest
import structlog

from turnledger import ProviderError
from turnledger.adapters.logging import configure_logging
from turnledger.adapters.providers import AnthropicChat, OllamaChat, OpenAIChat, OpenAIResponses
from turnledger.adapters.stores import open_store
from turnledger.events import RequestId
from turnledger.sessions import ChatMessage, ChatRequest, DiscardedResult, open_hub
from turnledger.testing import (
    Reply,
    anthropic_error_event,
    anthropic_stream_reply,
    ollama_ndjson_lines,
    open_loopback_server,
    openai_sse_chunks,
    openai_stream_reply,
    responses_error_event,
    responses_sse_events,
    responses_stream_reply,
    sse_event,
)

from ._helpers import Sink

pytestmark = pytest.mark.loopback

# A classic key: "sk-" and 48 letters and digits (51 characters).
KEY = "sk-" + "SENTINELkey0123456789abcdefghijklmnopqrstuvwxyzAB"[:48]


def _chunk(delta: dict[str, Any], finish: str | None = None) -> bytes:
    choice = {"index": 0, "delta": delta, "finish_reason": finish}
    return sse_event({"id": "c", "object": "chat.completion.chunk", "choices": [choice]})


def _line(**fields: Any) -> bytes:
    return (json.dumps(fields) + "\n").encode()


ECHO_HEADERS = [("X-Echo", KEY), ("WWW-Authenticate", f"Bearer {KEY}"), ("X-Request-Key", KEY)]

OPENAI_REPLIES = {
    "error code and type": Reply(
        body=(sse_event({"error": {"message": "no", "type": KEY, "code": KEY}}),)
    ),
    "error code in a JSON body": Reply(
        media_type="application/json",
        body=(json.dumps({"error": {"type": KEY, "code": KEY}}),),
        framing="length",
    ),
    "SSE event name": Reply(body=(sse_event({"choices": []}, event=KEY),)),
    "finish_reason": Reply(body=tuple(openai_sse_chunks("answer", finish_reason=KEY))),
    "delta.role": Reply(body=(_chunk({"role": KEY, "content": "x"}),)),
    "media type": Reply(media_type=KEY, body=tuple(openai_sse_chunks("answer"))),
    "headers of a good answer": openai_stream_reply("fine", headers=ECHO_HEADERS),
    "headers of a 401": Reply(status=401, media_type=None, headers=ECHO_HEADERS, framing="length"),
    "a header h11 refuses": Reply(headers=[(f"{KEY} echo", "x")], body=(b"x",)),
}
OLLAMA_REPLIES = {
    "role": Reply(
        media_type="application/x-ndjson",
        body=(_line(message={"role": KEY, "content": "x"}, done=False),),
    ),
    "done_reason": Reply(
        media_type="application/x-ndjson", body=tuple(ollama_ndjson_lines("x", done_reason=KEY))
    ),
    "error": Reply(media_type="application/x-ndjson", body=(_line(error=KEY),)),
    "error object": Reply(
        media_type="application/x-ndjson", body=(_line(error={"type": KEY, "code": KEY}),)
    ),
}


def _typed(kind: str, **data: Any) -> bytes:
    return sse_event({"type": kind, **data}, event=kind)


_START = _typed("message_start", message={"role": "assistant", "content": []})
ANTHROPIC_REPLIES = {
    "error type and message": Reply(body=(anthropic_error_event(KEY, KEY),)),
    "a 529's body and headers": Reply(
        status=529,
        media_type="application/json",
        headers=ECHO_HEADERS,
        body=(json.dumps({"type": "error", "error": {"type": KEY, "message": KEY}}),),
        framing="length",
    ),
    "SSE event name": Reply(body=(sse_event({"type": "ping"}, event=KEY),)),
    "stop_reason": anthropic_stream_reply("answer", stop_reason=KEY),
    "role": Reply(body=(_typed("message_start", message={"role": KEY, "content": []}),)),
    "block type": Reply(
        body=(_START, _typed("content_block_start", index=0, content_block={"type": KEY}))
    ),
    "delta type": Reply(
        body=(
            _START,
            _typed("content_block_start", index=0, content_block={"type": "text", "text": ""}),
            _typed("content_block_delta", index=0, delta={"type": KEY, "text": KEY}),
        )
    ),
    "headers of a good answer": anthropic_stream_reply("fine", headers=ECHO_HEADERS),
}
_CREATED = responses_sse_events("x")[0]
RESPONSES_REPLIES = {
    "error code and message": Reply(body=(_CREATED, responses_error_event(KEY, KEY))),
    "failed response's error": Reply(
        body=(_CREATED, _typed("response.failed", response={"error": {"code": KEY}}))
    ),
    "incomplete reason": responses_stream_reply("answer", incomplete=KEY),
    "item role": Reply(
        body=(
            _CREATED,
            _typed(
                "response.output_item.added",
                output_index=0,
                item={"type": "message", "role": KEY, "content": []},
            ),
        )
    ),
    "headers of a 401": Reply(status=401, media_type=None, headers=ECHO_HEADERS, framing="length"),
}


@pytest.mark.parametrize("store_name", ["ledger.db", "ledger.jsonl"])
async def test_an_echoed_key_reaches_no_store_log_preview_or_repr(
    store_name: str, tmp_path: Path
) -> None:
    log = io.StringIO()
    seen: list[str] = []
    discarded = 0
    configure_logging(json=True, verbosity=2, stream=log)
    store = await open_store(tmp_path / store_name)
    try:
        for name, replies, make in [
            ("openai", OPENAI_REPLIES, lambda url: OpenAIChat(base_url=url + "/v1", api_key=KEY)),
            ("ollama", OLLAMA_REPLIES, lambda url: OllamaChat(base_url=url, api_key=KEY)),
            ("anthropic", ANTHROPIC_REPLIES, lambda url: AnthropicChat(base_url=url, api_key=KEY)),
            (
                "openai-responses",
                RESPONSES_REPLIES,
                lambda url: OpenAIResponses(base_url=url + "/v1", api_key=KEY),
            ),
        ]:
            async with (
                open_loopback_server(list(replies.values())) as server,
                make(server.base_url) as provider,
                open_hub(store, provider, model="m", system="s") as hub,
            ):
                for case in replies:
                    # A session per case: in one conversation a failure without
                    # an answer to a growing request would count as a context
                    # overflow and be retried, shifting the replies.
                    turn = await hub.submit(f"{name}: {case}", f"question about the {case}")
                    seen.extend([d async for d in turn.preview()])
                    result = await turn.outcome()
                    discarded += isinstance(result, DiscardedResult)
                    seen += [repr(result), str(result), repr(turn)]
                for case in replies:
                    seen.append(repr(await hub.state(f"{name}: {case}")))
                seen += [repr(hub), repr(provider)]
            # the key really went out with every request, and came back
            assert len(server.exchanges) == len(replies)
            for exchange in server.exchanges:
                if name == "anthropic":
                    assert exchange.header("x-api-key") == KEY
                    assert exchange.header("authorization") is None
                else:
                    assert exchange.header("authorization") == f"Bearer {KEY}"
    finally:
        await store.aclose()
        structlog.reset_defaults()
    # every case but the good answer was discarded
    every = [OPENAI_REPLIES, OLLAMA_REPLIES, ANTHROPIC_REPLIES, RESPONSES_REPLIES]
    assert discarded == sum(map(len, every)) - 2
    lines = log.getvalue().splitlines()
    assert len(lines) > 50  # the JSON lines looked at below are real
    files = sorted(tmp_path.iterdir())
    assert files
    for path in files:
        assert KEY.encode() not in path.read_bytes(), path.name
    for text in [*lines, *seen]:
        assert KEY not in text
    # the key in shorter pieces: no quoting of a prefix either
    assert KEY[:20] not in log.getvalue() + "".join(seen)
    # what the details say instead
    details = [json.loads(line).get("detail", "") for line in lines]
    assert any("unknown role (51 chars)" in d for d in details)
    assert any("finish_reason=unknown_51_chars" in d for d in details)


async def test_a_header_h11_refuses_leaves_the_key_out_of_the_exception_chain() -> None:
    reply = Reply(headers=[(f"{KEY} echo", "x")], body=(b"x",))
    async with open_loopback_server(reply) as server:
        provider = OpenAIChat(base_url=server.openai_base_url, api_key=KEY)
        async with provider:
            request = ChatRequest(RequestId("r1"), "m", (ChatMessage("user", "q"),))
            with pytest.raises(ProviderError) as info:
                await provider.complete(request, Sink())
    exc: BaseException | None = info.value
    assert info.value.reason == "transport"
    while exc is not None:
        assert KEY not in str(exc) and KEY not in repr(exc)
        exc = exc.__cause__ or exc.__context__


def test_unknown_tokens_are_described_never_quoted() -> None:
    from turnledger.adapters.providers import OllamaLineValidator, OpenAIChunkValidator
    from turnledger.adapters.providers import ServerSentEvent as Event

    def message(validator: Any, item: Any) -> str:
        with pytest.raises(ProviderError) as info:
            validator.feed(item)
        return str(info.value)

    chunk = json.dumps({"choices": [{"delta": {"role": KEY}}]})
    assert message(OpenAIChunkValidator(), Event(chunk)) == (
        "a message with role unknown role (51 chars)"
    )
    assert message(OpenAIChunkValidator(), Event("{}", KEY)) == (
        "an SSE event of type unknown event type (51 chars)"
    )
    error = json.dumps({"error": {"type": "server_error", "code": KEY}})
    assert message(OpenAIChunkValidator(), Event(error)) == (
        "the server sent an error (type=server_error, code=unknown code (51 chars))"
    )
    assert message(OllamaLineValidator(), json.dumps({"message": {"role": 7}})) == (
        "a message with role role of JSON type number"
    )
    validator = OpenAIChunkValidator()
    validator.feed(Event(json.dumps({"choices": [{"delta": {}, "finish_reason": KEY}]})))
    validator.feed(Event("[DONE]"))
    assert validator.finish().finish_reason == "unknown_51_chars"
    known = OpenAIChunkValidator()
    known.feed(Event(json.dumps({"choices": [{"delta": {}, "finish_reason": "length"}]})))
    known.feed(Event("[DONE]"))
    assert known.finish().finish_reason == "length"
