"""Loopback responders that behave like real model servers with a small
context window: what each one answers a prompt too long for it, and how
each one tells its window.

:func:`model_server` gives a :data:`~._loopback.Responder` for
:class:`~._loopback.LoopbackServer`. The emulated server counts a request's
tokens as its body's bytes divided by ``bytes_per_token`` (3 by default: a
tokenizer that counts fewer bytes a token than the session's estimate of
4 characters), so its window is ``n_ctx * bytes_per_token`` bytes; a request
whose body is larger overflows:

- ``openai``: 400 with ``code: context_length_exceeded``; tells nothing
  (``GET /v1/models`` lists ids only).
- ``vllm``: the same 400; ``GET /v1/models`` gives ``max_model_len``.
- ``llamacpp``: 400 "the request exceeds the available context size";
  ``GET /props`` gives ``n_ctx``.
- ``silent``: a 200 with an empty stream (llama-cpp-python); tells nothing.
- ``ollama``: with ``options.num_ctx``, 400 "the input length exceeds the
  context length"; without it the prompt is silently truncated to 2,048
  tokens and answered. ``POST /api/show`` gives
  ``model_info["llama.context_length"]``.
- ``anthropic``: ``POST /v1/messages``; 400 ``invalid_request_error``
  "prompt is too long"; tells nothing (the API has no such field).
- ``openai-responses``: ``POST /v1/responses``; the 400 of ``openai``;
  tells nothing.

Answers that fit report usage (``prompt_tokens`` by the same count) when
the protocol carries it (OpenAI streams: when ``stream_options.include_usage``
is asked, except ``silent``; Ollama: ``prompt_eval_count``; Anthropic and
Responses: always, as ``input_tokens``).
"""

from __future__ import annotations

import json
import math
from typing import Any, Literal, TypeAlias

from ._loopback import Exchange, Reply, Responder
from ._replies import (
    anthropic_sse_events,
    error_reply,
    ollama_ndjson_lines,
    openai_json_reply,
    openai_sse_chunks,
    protocol_of,
    responses_sse_events,
)

__all__ = ["ServerKind", "model_server"]

ServerKind: TypeAlias = Literal[
    "openai", "vllm", "llamacpp", "silent", "ollama", "anthropic", "openai-responses"
]

#: The window Ollama uses when a request does not set ``num_ctx``.
OLLAMA_DEFAULT_NUM_CTX = 2048


def _json_reply(value: Any, status: int = 200) -> Reply:
    return Reply(
        status=status,
        media_type="application/json",
        body=(json.dumps(value).encode(),),
        framing="length",
    )


def _openai_overflow(n_ctx: int, used: int) -> str:
    error = {
        "message": f"This model's maximum context length is {n_ctx} "
        f"tokens. However, your messages resulted in {used} tokens.",
        "type": "invalid_request_error",
        "param": "messages",
        "code": "context_length_exceeded",
    }
    return json.dumps({"error": error})


def model_server(
    kind: ServerKind,
    *,
    n_ctx: int,
    model: str = "loopback",
    answer: str = "Noted.",
    bytes_per_token: int = 3,
    props: Any = None,
) -> Responder:
    """A responder playing server ``kind`` with a window of ``n_ctx`` tokens.

    Args:
        answer: the text of every answer that fits.
        props: replaces what the discovery endpoint returns (``/props``,
            ``/v1/models`` or ``/api/show``), to play a server that reports
            garbage (a ``bytes`` value is sent as the raw body).
    """

    def tokens(body: bytes) -> int:
        return math.ceil(len(body) / bytes_per_token)

    def discovery(exchange: Exchange) -> Reply | None:
        path, method = exchange.path, exchange.method
        value: Any
        if method == "GET" and path.endswith("/v1/models"):
            entry: dict[str, Any] = {"id": model, "object": "model"}
            if kind == "vllm":
                entry["max_model_len"] = n_ctx
            value, tells = {"object": "list", "data": [entry]}, kind == "vllm"
        elif method == "GET" and path == "/props" and kind == "llamacpp":
            value, tells = {"n_ctx": n_ctx, "default_generation_settings": {"n_ctx": n_ctx}}, True
        elif method == "POST" and path == "/api/show" and kind == "ollama":
            info = {"general.architecture": "llama", "llama.context_length": n_ctx}
            value, tells = {"model_info": info}, True
        else:
            return None
        if props is None or not tells:
            return _json_reply(value)
        if isinstance(props, bytes):
            return Reply(media_type="application/json", body=(props,), framing="length")
        return _json_reply(props)

    def typed(exchange: Exchange, used: int) -> Reply:
        # The two typed-event protocols, each on its own path only.
        if protocol_of(exchange.path) != kind:
            return error_reply(404, '{"error":"not found"}')
        if kind == "anthropic":
            if used > n_ctx:
                error = {
                    "type": "invalid_request_error",
                    "message": f"prompt is too long: {used} tokens > {n_ctx} maximum",
                }
                return error_reply(400, json.dumps({"type": "error", "error": error}))
            return Reply(body=tuple(anthropic_sse_events(answer, usage=(used, 2))))
        if used > n_ctx:
            return error_reply(400, _openai_overflow(n_ctx, used))
        return Reply(body=tuple(responses_sse_events(answer, usage=(used, 2))))

    def respond(exchange: Exchange) -> Reply:
        found = discovery(exchange)
        if found is not None:
            return found
        if exchange.method != "POST":
            return error_reply(404, '{"error":"not found"}')
        try:
            request = exchange.json()
        except ValueError:
            return error_reply(400, '{"error":"the body is not JSON"}')
        stream = request.get("stream", True) is not False
        used = tokens(exchange.body)
        if exchange.path == "/api/chat" and kind == "ollama":
            num_ctx = (request.get("options") or {}).get("num_ctx")
            if num_ctx is not None and used > min(num_ctx, n_ctx):
                return error_reply(400, '{"error":"the input length exceeds the context length"}')
            used = min(used, OLLAMA_DEFAULT_NUM_CTX if num_ctx is None else num_ctx)
            lines = ollama_ndjson_lines(answer)
            last = json.loads(lines[-1])
            last["prompt_eval_count"] = used
            lines[-1] = (json.dumps(last) + "\n").encode()
            return Reply(media_type="application/x-ndjson", body=tuple(lines))
        if kind in ("anthropic", "openai-responses"):
            return typed(exchange, used)
        if not exchange.path.endswith("/chat/completions") or kind == "ollama":
            return error_reply(404, '{"error":"not found"}')
        if used > n_ctx:
            if kind == "silent":
                return Reply(media_type="text/event-stream", body=())
            if kind == "llamacpp":
                return error_reply(
                    400,
                    json.dumps(
                        {
                            "error": {
                                "code": 400,
                                "message": f"the request exceeds the available context size "
                                f"({used} tokens > {n_ctx}), try increasing it",
                                "type": "exceed_context_size_error",
                            }
                        }
                    ),
                )
            return error_reply(400, _openai_overflow(n_ctx, used))
        if not stream:
            return openai_json_reply(answer)
        wants_usage = bool((request.get("stream_options") or {}).get("include_usage"))
        usage = (used, 2) if wants_usage and kind != "silent" else None
        return Reply(body=tuple(openai_sse_chunks(answer, usage=usage)))

    return respond
