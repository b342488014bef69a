"""Reply builders for the loopback server: what OpenAI-compatible servers,
Ollama, Anthropic's Messages API and OpenAI's Responses API send, as
:class:`~turnledger.testing.Reply` values and raw chunks.

- :func:`sse_event`, :func:`openai_sse_chunks`, :func:`openai_error_event`:
  SSE bytes, to compose a reply by hand (faults included);
- :func:`openai_stream_reply`, :func:`openai_json_reply`,
  :func:`ollama_stream_reply`, :func:`ollama_json_reply`, :func:`error_reply`:
  whole replies;
- :func:`ollama_ndjson_lines`: NDJSON lines;
- :func:`anthropic_sse_events`, :func:`anthropic_stream_reply`,
  :func:`anthropic_error_event`; :func:`responses_sse_events`,
  :func:`responses_stream_reply`, :func:`responses_error_event`: the two
  typed-event protocols (tool calls with ``calls=``);
- :func:`openai_tool_call_chunks`, :func:`ollama_tool_call_lines`,
  :func:`tool_call_reply`: a round that ends in tool calls;
- :func:`answer_parts`, :func:`media_type_of`: a whole answer in any of the
  four protocols;
- :func:`chat_responder`: a responder answering any chat request in the
  protocol it came in (:func:`protocol_of` its path, :func:`chat_messages`
  its messages).
"""

from __future__ import annotations

import collections
import json
import threading
from collections.abc import Callable, Sequence
from typing import Any, Literal, TypeAlias

import attrs

from ..events import ToolCall
from ._loopback import Exchange, Part, Reply, Responder, WritePause

__all__ = [
    "WireProtocol",
    "answer_parts",
    "anthropic_error_event",
    "anthropic_sse_events",
    "anthropic_stream_reply",
    "chat_messages",
    "chat_responder",
    "error_reply",
    "media_type_of",
    "ollama_json_reply",
    "ollama_ndjson_lines",
    "ollama_stream_reply",
    "ollama_tool_call_lines",
    "openai_error_event",
    "openai_json_reply",
    "openai_sse_chunks",
    "openai_stream_reply",
    "openai_tool_call_chunks",
    "protocol_of",
    "responses_error_event",
    "responses_sse_events",
    "responses_stream_reply",
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
    (``openai``, ``ollama``, ``anthropic`` or ``openai-responses``; the last
    two always stream), streamed or as one JSON body (``kwargs``: of
    :func:`openai_tool_call_chunks`; ``text`` and ``chunk_size`` for the
    last two)."""
    if protocol == "anthropic":
        text, size = kwargs.get("text", ""), kwargs.get("chunk_size", 3)
        events = anthropic_sse_events(text, stop_reason="tool_use", calls=calls, chunk_size=size)
        return Reply(body=tuple(events))
    if protocol == "openai-responses":
        text, size = kwargs.get("text", ""), kwargs.get("chunk_size", 3)
        return Reply(body=tuple(responses_sse_events(text, calls=calls, chunk_size=size)))
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


def _typed(kind: str, data: dict[str, Any]) -> bytes:
    # A typed event as Anthropic and OpenAI write it: the name is the type.
    return sse_event({"type": kind, **data}, event=kind)


def anthropic_sse_events(
    text: str,
    *,
    stop_reason: str | None = "end_turn",
    chunk_size: int = 4,
    model: str = "loopback",
    usage: tuple[int, int] = (10, 2),
    calls: Sequence[ToolCall] = (),
    thinking: str = "",
    stop: bool = True,
    ping: bool = True,
) -> list[bytes]:
    """An Anthropic Messages stream, one SSE event per item: ``message_start``,
    a ``ping``, an optional thinking block, a text block (``text_delta`` of
    ``chunk_size`` characters; none for empty text), a ``tool_use`` block per
    call (its input in pieces of ``chunk_size``), ``message_delta`` with
    ``stop_reason`` and usage, then ``message_stop`` (unless ``stop`` is false)."""
    prompt, output = usage
    message: dict[str, Any] = {
        "id": "msg_loopback",
        "type": "message",
        "role": "assistant",
        "model": model,
        "content": [],
        "stop_reason": None,
        "stop_sequence": None,
        "usage": {"input_tokens": prompt, "output_tokens": 1},
    }
    out = [_typed("message_start", {"message": message})]
    if ping:
        out.append(_typed("ping", {}))
    blocks: list[tuple[dict[str, Any], list[dict[str, Any]]]] = []
    if thinking:
        deltas = [{"type": "thinking_delta", "thinking": p} for p in _pieces(thinking, chunk_size)]
        deltas.append({"type": "signature_delta", "signature": "c2lnbmF0dXJl"})
        blocks.append(({"type": "thinking", "thinking": "", "signature": ""}, deltas))
    if text:
        deltas = [{"type": "text_delta", "text": p} for p in _pieces(text, chunk_size)]
        blocks.append(({"type": "text", "text": ""}, deltas))
    for c in calls:
        start = {"type": "tool_use", "id": c.call_id, "name": c.name, "input": {}}
        pieces = _pieces(c.arguments, chunk_size) if c.arguments != "{}" else []
        blocks.append((start, [{"type": "input_json_delta", "partial_json": p} for p in pieces]))
    for i, (start, deltas) in enumerate(blocks):
        out.append(_typed("content_block_start", {"index": i, "content_block": start}))
        out.extend(_typed("content_block_delta", {"index": i, "delta": d}) for d in deltas)
        out.append(_typed("content_block_stop", {"index": i}))
    if stop_reason is not None:
        delta = {"stop_reason": stop_reason, "stop_sequence": None}
        out.append(_typed("message_delta", {"delta": delta, "usage": {"output_tokens": output}}))
    if stop:
        out.append(_typed("message_stop", {}))
    return out


def anthropic_error_event(kind: str = "overloaded_error", message: str = "Overloaded") -> bytes:
    """An Anthropic ``error`` event, as sent after the 200 (``overloaded_error``...)."""
    return _typed("error", {"error": {"type": kind, "message": message}})


def anthropic_stream_reply(text: str, **kwargs: Any) -> Reply:
    """A 200 ``text/event-stream`` Anthropic reply streaming ``text``
    (``kwargs``: of :func:`anthropic_sse_events` and of :class:`Reply`)."""
    reply_kw = {k: kwargs.pop(k) for k in list(kwargs) if k in _REPLY_FIELDS}
    return Reply(body=tuple(anthropic_sse_events(text, **kwargs)), **reply_kw)


def responses_sse_events(
    text: str,
    *,
    chunk_size: int = 4,
    model: str = "loopback",
    usage: tuple[int, int] = (10, 2),
    calls: Sequence[ToolCall] = (),
    incomplete: str | None = None,
    end: bool = True,
    named: bool = True,
) -> list[bytes]:
    """An OpenAI Responses stream: ``response.created``, a message item
    (its ``output_text`` deltas of ``chunk_size`` characters and ``.done``;
    none for empty text), a ``function_call`` item per call (arguments in
    pieces), then ``response.completed`` holding the whole output, or
    ``response.incomplete`` with reason ``incomplete``; nothing at the end if
    ``end`` is false. ``named``: each event has an ``event:`` line, as OpenAI
    writes (vLLM and others send the data alone)."""
    seq = iter(range(1_000_000))

    def ev(kind: str, **data: Any) -> bytes:
        obj = {"type": kind, **data, "sequence_number": next(seq)}
        return sse_event(obj, event=kind if named else None)

    base = {"id": "resp_loopback", "object": "response", "created_at": 1700000000, "model": model}
    out = [ev("response.created", response={**base, "status": "in_progress", "output": []})]
    output: list[dict[str, Any]] = []
    if text:
        item_id, i = "msg_loopback", len(output)
        item = {"type": "message", "id": item_id, "status": "in_progress", "role": "assistant"}
        out.append(ev("response.output_item.added", output_index=i, item={**item, "content": []}))
        where = {"item_id": item_id, "output_index": i, "content_index": 0}
        part = {"type": "output_text", "text": "", "annotations": []}
        out.append(ev("response.content_part.added", **where, part=part))
        out.extend(
            ev("response.output_text.delta", **where, delta=p) for p in _pieces(text, chunk_size)
        )
        out.append(ev("response.output_text.done", **where, text=text))
        whole = {**part, "text": text}
        out.append(ev("response.content_part.done", **where, part=whole))
        done = {**item, "status": "completed", "content": [whole]}
        out.append(ev("response.output_item.done", output_index=i, item=done))
        output.append(done)
    for c in calls:
        i = len(output)
        item = {
            "type": "function_call",
            "id": f"fc_{c.call_id}",
            "call_id": c.call_id,
            "name": c.name,
        }
        added = {**item, "status": "in_progress", "arguments": ""}
        out.append(ev("response.output_item.added", output_index=i, item=added))
        where = {"item_id": item["id"], "output_index": i}
        out.extend(
            ev("response.function_call_arguments.delta", **where, delta=p)
            for p in _pieces(c.arguments, chunk_size)
        )
        out.append(ev("response.function_call_arguments.done", **where, arguments=c.arguments))
        done = {**item, "status": "completed", "arguments": c.arguments}
        out.append(ev("response.output_item.done", output_index=i, item=done))
        output.append(done)
    prompt, completion = usage
    tokens = {
        "input_tokens": prompt,
        "output_tokens": completion,
        "total_tokens": prompt + completion,
    }
    if not end:
        return out
    if incomplete is not None:
        response = {
            **base,
            "status": "incomplete",
            "incomplete_details": {"reason": incomplete},
            "output": output,
            "usage": tokens,
        }
        out.append(ev("response.incomplete", response=response))
    else:
        response = {**base, "status": "completed", "output": output, "usage": tokens}
        out.append(ev("response.completed", response=response))
    return out


def responses_error_event(code: str = "server_error", message: str = "the model failed") -> bytes:
    """A Responses ``error`` event, as sent after the 200."""
    return _typed("error", {"code": code, "message": message, "param": None})


def responses_stream_reply(text: str, **kwargs: Any) -> Reply:
    """A 200 ``text/event-stream`` Responses reply streaming ``text``
    (``kwargs``: of :func:`responses_sse_events` and of :class:`Reply`)."""
    reply_kw = {k: kwargs.pop(k) for k in list(kwargs) if k in _REPLY_FIELDS}
    return Reply(body=tuple(responses_sse_events(text, **kwargs)), **reply_kw)


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


#: The wire protocols the builders speak (the ``--provider`` names).
WireProtocol: TypeAlias = Literal["openai", "ollama", "anthropic", "openai-responses"]


def media_type_of(protocol: WireProtocol) -> str:
    """The media type of a streamed answer in ``protocol``."""
    return "application/x-ndjson" if protocol == "ollama" else "text/event-stream"


def answer_parts(
    protocol: WireProtocol, text: str, *, chunk_size: int = 8, truncated: bool = False
) -> list[bytes]:
    """A whole streamed answer in ``protocol``, one frame per item;
    ``truncated``: it ends at the token cap instead (``length``,
    ``max_tokens``, ``response.incomplete``), which no session commits."""
    if protocol == "ollama":
        return ollama_ndjson_lines(
            text, chunk_size=chunk_size, done_reason="length" if truncated else "stop"
        )
    if protocol == "anthropic":
        stop = "max_tokens" if truncated else "end_turn"
        return anthropic_sse_events(text, chunk_size=chunk_size, stop_reason=stop)
    if protocol == "openai-responses":
        reason = "max_output_tokens" if truncated else None
        return responses_sse_events(text, chunk_size=chunk_size, incomplete=reason)
    finish = "length" if truncated else "stop"
    return openai_sse_chunks(text, chunk_size=chunk_size, finish_reason=finish)


def protocol_of(path: str) -> WireProtocol | None:
    """The protocol a request path speaks, or ``None``."""
    if path.endswith("/chat/completions"):
        return "openai"
    if path == "/api/chat":
        return "ollama"
    if path.endswith("/v1/messages"):
        return "anthropic"
    if path.endswith("/responses"):
        return "openai-responses"
    return None


def _text_of(content: Any) -> str:
    # A message's text: a string, or the text of its blocks.
    if isinstance(content, str):
        return content
    if not isinstance(content, list):
        return ""
    out = []
    for block in content:
        if isinstance(block, dict):
            inner = block.get("text", block.get("content", ""))
            out.append(inner if isinstance(inner, str) else _text_of(inner))
    return "".join(out)


def chat_messages(protocol: WireProtocol, request: dict[str, Any]) -> list[dict[str, Any]]:
    """A request's messages as ``{"role", "content"}`` text, whatever the
    protocol (Anthropic's ``system`` and blocks, Responses' input items)."""
    if protocol == "anthropic":
        system = _text_of(request.get("system", ""))
        out = [{"role": "system", "content": system}] if system else []
        for m in request.get("messages", []):
            content = m.get("content")
            tool = isinstance(content, list) and any(
                isinstance(b, dict) and b.get("type") == "tool_result" for b in content
            )
            out.append({"role": "tool" if tool else m.get("role"), "content": _text_of(content)})
        return out
    if protocol == "openai-responses":
        out = []
        for item in request.get("input", []):
            if item.get("type") == "function_call_output":
                out.append({"role": "tool", "content": item.get("output", "")})
            elif item.get("type") != "function_call":
                out.append({"role": item.get("role"), "content": _text_of(item.get("content"))})
            elif not out or out[-1]["role"] != "assistant":  # the calls' own message
                out.append({"role": "assistant", "content": ""})
        return out
    return list(request.get("messages", []))


Answer = str | tuple[ToolCall, ...]


def chat_responder(
    answer: str | Sequence[Answer] | Callable[[list[dict[str, Any]]], Answer],
    *,
    chunk_size: int = 8,
    pause: float = 0.0,
) -> Responder:
    """A responder that answers any chat request in the protocol it came in.

    ``POST .../chat/completions`` gets an OpenAI reply, ``POST /api/chat`` an
    Ollama one, ``POST .../v1/messages`` an Anthropic one and
    ``POST .../responses`` an OpenAI Responses one; OpenAI and Ollama
    streamed or not as the request's ``"stream"`` says.

    Args:
        answer: the answer text; a sequence (one per request, in order; the
            last repeats); or a function of the request's messages (as
            :func:`chat_messages` gives them). An answer may be a tuple of
            tool calls: that round ends in them.
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
        protocol = protocol_of(exchange.path)
        if protocol is None:
            return error_reply(404, '{"error":"not found"}')
        try:
            request = exchange.json()
        except ValueError:
            return error_reply(400, '{"error":"the body is not JSON"}')
        stream = request.get("stream", True) is not False
        text = text_for(chat_messages(protocol, request))
        if isinstance(text, tuple):
            return tool_call_reply(text, protocol=protocol, stream=stream)
        if not stream and protocol == "openai":
            return openai_json_reply(text)
        if not stream and protocol == "ollama":
            return ollama_json_reply(text)
        body: list[Part] = []
        for part in answer_parts(protocol, text, chunk_size=chunk_size):
            if pause and body:
                body.append(WritePause(pause))
            body.append(part)
        return Reply(media_type=media_type_of(protocol), body=tuple(body))

    return respond
