"""Reply builders for the loopback server: what OpenAI-compatible servers and
Ollama send, as :class:`~turnledger.testing.Reply` values and raw chunks.

- :func:`sse_event`, :func:`openai_sse_chunks`, :func:`openai_error_event`:
  SSE bytes, to compose a reply by hand (faults included);
- :func:`openai_stream_reply`, :func:`openai_json_reply`,
  :func:`ollama_stream_reply`, :func:`ollama_json_reply`, :func:`error_reply`:
  whole replies;
- :func:`ollama_ndjson_lines`: NDJSON lines;
- :func:`openai_tool_call_chunks`, :func:`ollama_tool_call_lines`,
  :func:`tool_call_reply`: a round that ends in tool calls;
- :func:`chat_responder`: a responder answering any chat request in the
  protocol it came in.
"""

from __future__ import annotations

import collections
import json
import threading
from collections.abc import Callable, Sequence
from typing import Any

import attrs

from ..events import ToolCall
from ._loopback import Exchange, Part, Reply, Responder, WritePause

__all__ = [
    "chat_responder",
    "error_reply",
    "ollama_json_reply",
    "ollama_ndjson_lines",
    "ollama_stream_reply",
    "ollama_tool_call_lines",
    "openai_error_event",
    "openai_json_reply",
    "openai_sse_chunks",
    "openai_stream_reply",
    "openai_tool_call_chunks",
    "sse_event",
    "tool_call_reply",
]


def _dumps(value: Any) -> str:
    return json.dumps(value, ensure_ascii=False, separators=(",", ":"))


def sse_event(data: str | Any, *, event: str | None = None, id: str | None = None) -> bytes:
    """One SSE event: ``data`` (a string, or a value written as JSON) on
    ``data:`` lines, then a blank line."""
    text = data if isinstance(data, str) else _dumps(data)
    lines = []
    if event is not None:
        lines.append(f"event: {event}")
    if id is not None:
        lines.append(f"id: {id}")
    lines.extend(f"data: {line}" for line in text.split("\n"))
    return ("\n".join(lines) + "\n\n").encode()


def _pieces(text: str, size: int) -> list[str]:
    if size < 1:
        msg = "chunk_size must be positive"
        raise ValueError(msg)
    return [text[i : i + size] for i in range(0, len(text), size)]


def openai_sse_chunks(
    text: str,
    *,
    finish_reason: str | None = "stop",
    chunk_size: int = 4,
    model: str = "loopback",
    usage: tuple[int, int] | None = None,
    done: bool = True,
    role_chunk: bool = True,
    id: str = "chatcmpl-loopback",
) -> list[bytes]:
    """An OpenAI chat completion stream for ``text``, one SSE event per item:
    a role delta, content deltas of ``chunk_size`` characters, a finish
    chunk, an optional usage frame (``choices: []``), then ``[DONE]``."""

    def chunk(delta: dict[str, Any], finish: str | None = None) -> bytes:
        return sse_event(
            {
                "id": id,
                "object": "chat.completion.chunk",
                "created": 1700000000,
                "model": model,
                "choices": [
                    {"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish}
                ],
            }
        )

    out = []
    if role_chunk:
        out.append(chunk({"role": "assistant", "content": ""}))
    out.extend(chunk({"content": piece}) for piece in _pieces(text, chunk_size))
    if finish_reason is not None:
        out.append(chunk({}, finish_reason))
    if usage is not None:
        prompt, completion = usage
        out.append(
            sse_event(
                {
                    "id": id,
                    "object": "chat.completion.chunk",
                    "created": 1700000000,
                    "model": model,
                    "choices": [],
                    "usage": {
                        "prompt_tokens": prompt,
                        "completion_tokens": completion,
                        "total_tokens": prompt + completion,
                    },
                }
            )
        )
    if done:
        out.append(b"data: [DONE]\n\n")
    return out


def openai_tool_call_chunks(
    calls: Sequence[ToolCall],
    *,
    text: str = "",
    chunk_size: int = 3,
    finish_reason: str = "tool_calls",
    id: str = "chatcmpl-loopback",
) -> list[bytes]:
    """An OpenAI stream that ends in tool calls: optional text, then each
    call as a first delta (``index``, ``id``, ``function.name``, empty
    arguments) and its arguments in pieces of ``chunk_size`` characters, a
    ``finish_reason`` chunk and ``[DONE]``."""

    def chunk(delta: dict[str, Any], finish: str | None = None) -> bytes:
        choice = {"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish}
        return sse_event({"id": id, "object": "chat.completion.chunk", "choices": [choice]})

    out = [chunk({"role": "assistant", "content": None})]
    out.extend(chunk({"content": piece}) for piece in _pieces(text, 4))
    for i, c in enumerate(calls):
        function = {"name": c.name, "arguments": ""}
        first = {"index": i, "id": c.call_id, "type": "function", "function": function}
        out.append(chunk({"tool_calls": [first]}))
        for piece in _pieces(c.arguments, chunk_size):
            out.append(chunk({"tool_calls": [{"index": i, "function": {"arguments": piece}}]}))
    out.append(chunk({}, finish_reason))
    out.append(b"data: [DONE]\n\n")
    return out


def ollama_tool_call_lines(calls: Sequence[ToolCall], *, model: str = "loopback") -> list[bytes]:
    """An Ollama ``/api/chat`` stream that ends in tool calls: one line with
    ``message.tool_calls`` (arguments as objects, no ids), then the done line."""
    message = {
        "role": "assistant",
        "content": "",
        "tool_calls": [
            {"function": {"name": c.name, "arguments": json.loads(c.arguments)}} for c in calls
        ],
    }
    first = {"model": model, "created_at": "2024-01-01T00:00:00Z", "message": message}
    last = {
        "model": model,
        "created_at": "2024-01-01T00:00:00Z",
        "message": {"role": "assistant", "content": ""},
        "done": True,
        "done_reason": "stop",
    }
    return [(_dumps({**first, "done": False}) + "\n").encode(), (_dumps(last) + "\n").encode()]


def tool_call_reply(
    calls: Sequence[ToolCall], *, protocol: str = "openai", stream: bool = True, **kwargs: Any
) -> Reply:
    """A 200 reply whose round ends in ``calls``, in ``protocol``
    (``openai`` or ``ollama``), streamed or as one JSON body
    (``kwargs``: of :func:`openai_tool_call_chunks`)."""
    if protocol == "ollama":
        lines = ollama_tool_call_lines(calls)
        if stream:
            return Reply(media_type="application/x-ndjson", body=tuple(lines))
        whole = json.loads(lines[0])
        whole.update(done=True, done_reason="stop")
        return Reply(
            media_type="application/json", body=(_dumps(whole).encode(),), framing="length"
        )
    if stream:
        return Reply(body=tuple(openai_tool_call_chunks(calls, **kwargs)))
    message = {
        "role": "assistant",
        "content": None,
        "tool_calls": [
            {
                "id": c.call_id,
                "type": "function",
                "function": {"name": c.name, "arguments": c.arguments},
            }
            for c in calls
        ],
    }
    body = {
        "id": "chatcmpl-loopback",
        "object": "chat.completion",
        "choices": [{"index": 0, "message": message, "finish_reason": "tool_calls"}],
    }
    return Reply(media_type="application/json", body=(_dumps(body).encode(),), framing="length")


def openai_error_event(message: str = "the model failed", *, code: str = "server_error") -> bytes:
    """An ``{"error": ...}`` SSE event, as servers send after a 200."""
    return sse_event({"error": {"message": message, "type": code, "code": code}})


def openai_stream_reply(text: str, **kwargs: Any) -> Reply:
    """A 200 ``text/event-stream`` reply streaming ``text``
    (``kwargs``: of :func:`openai_sse_chunks` and of :class:`Reply`)."""
    reply_kw = {k: kwargs.pop(k) for k in list(kwargs) if k in _REPLY_FIELDS}
    return Reply(body=tuple(openai_sse_chunks(text, **kwargs)), **reply_kw)


def openai_json_reply(
    text: str, *, finish_reason: str | None = "stop", model: str = "loopback"
) -> Reply:
    """A non-streamed 200 ``application/json`` chat completion."""
    body = {
        "id": "chatcmpl-loopback",
        "object": "chat.completion",
        "created": 1700000000,
        "model": model,
        "choices": [
            {
                "index": 0,
                "message": {"role": "assistant", "content": text},
                "finish_reason": finish_reason,
            }
        ],
        "usage": {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2},
    }
    return Reply(media_type="application/json", body=(_dumps(body).encode(),), framing="length")


def ollama_ndjson_lines(
    text: str,
    *,
    done_reason: str | None = "stop",
    chunk_size: int = 4,
    model: str = "loopback",
    done: bool = True,
) -> list[bytes]:
    """An Ollama ``/api/chat`` stream for ``text``: one JSON line per piece,
    then the ``done: true`` line (unless ``done`` is false)."""
    stamp = "2024-01-01T00:00:00.000000Z"
    out = [
        (
            _dumps(
                {
                    "model": model,
                    "created_at": stamp,
                    "message": {"role": "assistant", "content": piece},
                    "done": False,
                }
            )
            + "\n"
        ).encode()
        for piece in _pieces(text, chunk_size)
    ]
    if done:
        last: dict[str, Any] = {
            "model": model,
            "created_at": stamp,
            "message": {"role": "assistant", "content": ""},
            "done": True,
        }
        if done_reason is not None:
            last["done_reason"] = done_reason
        last.update(prompt_eval_count=10, eval_count=len(out), total_duration=1000)
        out.append((_dumps(last) + "\n").encode())
    return out


def ollama_stream_reply(text: str, **kwargs: Any) -> Reply:
    """A 200 ``application/x-ndjson`` reply streaming ``text``."""
    reply_kw = {k: kwargs.pop(k) for k in list(kwargs) if k in _REPLY_FIELDS}
    return Reply(
        media_type="application/x-ndjson",
        body=tuple(ollama_ndjson_lines(text, **kwargs)),
        **reply_kw,
    )


def ollama_json_reply(
    text: str, *, done_reason: str | None = "stop", model: str = "loopback"
) -> Reply:
    """A non-streamed 200 ``/api/chat`` response."""
    body: dict[str, Any] = {
        "model": model,
        "created_at": "2024-01-01T00:00:00Z",
        "message": {"role": "assistant", "content": text},
        "done": True,
        "prompt_eval_count": 10,
        "eval_count": 5,
    }
    if done_reason is not None:
        body["done_reason"] = done_reason
    return Reply(media_type="application/json", body=(_dumps(body).encode(),), framing="length")


def error_reply(
    status: int,
    body: str | bytes = '{"error":{"message":"error","type":"server_error"}}',
    *,
    media_type: str = "application/json",
    headers: Sequence[tuple[str, str]] = (),
) -> Reply:
    """A non-2xx reply with a small body."""
    data = body.encode() if isinstance(body, str) else body
    return Reply(
        status=status, media_type=media_type, body=(data,), headers=list(headers), framing="length"
    )


_REPLY_FIELDS = frozenset(a.name for a in attrs.fields(Reply)) - {"body", "media_type"}


Answer = str | tuple[ToolCall, ...]


def chat_responder(
    answer: str | Sequence[Answer] | Callable[[list[dict[str, Any]]], Answer],
    *,
    chunk_size: int = 8,
    pause: float = 0.0,
) -> Responder:
    """A responder that answers any chat request in the protocol it came in.

    ``POST .../chat/completions`` gets an OpenAI reply, ``POST /api/chat`` an
    Ollama one; streamed or not as the request's ``"stream"`` says.

    Args:
        answer: the answer text; a sequence (one per request, in order; the
            last repeats); or a function of the request's messages. An
            answer may be a tuple of tool calls: that round ends in them.
        chunk_size: characters per streamed delta.
        pause: seconds between two streamed deltas.
    """
    answers: collections.deque[Answer] | None = None
    if not isinstance(answer, str) and not callable(answer):
        answers = collections.deque(answer)
    lock = threading.Lock()

    def text_for(messages: list[dict[str, Any]]) -> Answer:
        if isinstance(answer, str):
            return answer
        if answers is not None:
            with lock:
                return answers.popleft() if len(answers) > 1 else answers[0]
        assert callable(answer)
        return answer(messages)

    def respond(exchange: Exchange) -> Reply:
        try:
            request = exchange.json()
        except ValueError:
            return error_reply(400, '{"error":"the body is not JSON"}')
        stream = request.get("stream", True) is not False
        text = text_for(request.get("messages", []))
        if isinstance(text, tuple):
            kind = "ollama" if exchange.path == "/api/chat" else "openai"
            return tool_call_reply(text, protocol=kind, stream=stream)
        if exchange.path.endswith("/chat/completions"):
            if not stream:
                return openai_json_reply(text)
            parts = openai_sse_chunks(text, chunk_size=chunk_size)
        elif exchange.path == "/api/chat":
            if not stream:
                return ollama_json_reply(text)
            parts = ollama_ndjson_lines(text, chunk_size=chunk_size)
        else:
            return error_reply(404, '{"error":"not found"}')
        body: list[Part] = []
        for part in parts:
            if pause and body:
                body.append(WritePause(pause))
            body.append(part)
        media = "text/event-stream" if exchange.path != "/api/chat" else "application/x-ndjson"
        return Reply(media_type=media, body=tuple(body))

    return respond
