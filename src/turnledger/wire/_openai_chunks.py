"""OpenAI-compatible chat chunks to a plain-text turn.

Pure: imports no I/O library.

The protocol of ``POST /v1/chat/completions`` with ``"stream": true`` as
OpenAI documents it and OpenAI-compatible servers (llama.cpp, vLLM, LM Studio,
Ollama's ``/v1``, LiteLLM) send it. SSE defines only the framing; what follows
is this application protocol, narrowed to plain-text answers:

- every event is a ``message`` event whose data is a JSON object, or the
  literal ``[DONE]``;
- ``choices`` holds at most one choice, at index 0; a chunk with no choices,
  or none at all, is allowed (usage frames, Azure's filter results);
- ``delta.role`` is ``"assistant"`` or null; ``delta.content`` is a string or
  null; other delta fields (``refusal``, ``reasoning_content``, ...) are
  ignored; ``tool_calls`` pieces are assembled into whole calls
  (``_tool_calls``), the legacy ``function_call`` is refused;
- ``finish_reason`` is null until the answer ends, then a string; it may
  repeat but not change, and no text may follow it;
- ``usage`` may come in any chunk, with or without choices, or never
  (``stream_options.include_usage`` is ignored by many servers);
- the stream ends with ``data: [DONE]`` dispatched as a complete event,
  after a finish_reason; nothing but comments may follow it.

What the provider reports (the session then judges ``finish_reason``):

=============================================  ===================
stream                                         outcome
=============================================  ===================
``[DONE]`` after a finish_reason               :class:`Completion`
``{"error": ...}`` or an ``error`` event       ``provider_error``
function_call, bad tool-call pieces or
arguments, second choice, index != 0,
text after the finish, an event after DONE,
role other than assistant, changed finish      ``protocol``
``[DONE]`` before any finish_reason, end of
body before ``[DONE]`` (incl. empty body)      ``incomplete_stream``
not JSON, wrong field types                    ``malformed``
over a :class:`StreamLimits` limit             ``limit``
=============================================  ===================

A ``[DONE]`` with no finish_reason is what servers send when they cut a
generation short (llama.cpp when another request preempts it), so it is
reported as ``incomplete_stream``. (Seed 002 files this case under
``PROTOCOL``; the issue asks for "incomplete", which is also the more useful
answer to "why is this turn missing".)
"""

from __future__ import annotations

from typing import Any

from .._errors import LimitExceeded
from ..events import Usage
from ..sessions._ports import Completion
from ._limits import StreamLimits
from ._sse import ServerSentEvent
from ._stream import (
    ROLES,
    SSE_EVENT_TYPES,
    BodyDecoder,
    SSEStreamDecoder,
    describe,
    incomplete,
    known_finish_reason,
    malformed,
    protocol,
    provider_error,
    usage_from,
)
from ._strict_json import loads_object
from ._tool_calls import OpenAIToolCallAssembler, openai_tool_calls

__all__ = [
    "OpenAIChunkValidator",
    "OpenAIResponseDecoder",
    "OpenAIStreamDecoder",
    "parse_openai_completion",
]


def _usage(value: Any) -> Usage | None:
    if value is None:
        return None
    if type(value) is not dict:
        raise malformed("usage is not an object")
    return usage_from(
        value.get("prompt_tokens"), value.get("completion_tokens"), value.get("total_tokens")
    )


def _check_tools(obj: dict[str, Any]) -> None:
    if obj.get("function_call") is not None:
        raise protocol("a legacy function_call (tools use tool_calls)")


def _check_role(role: Any) -> None:
    if role is not None and role != "assistant":
        raise protocol(f"a message with role {describe(role, 'role', ROLES)}")


class OpenAIChunkValidator:
    """Validates parsed SSE events of one streamed answer.

    :meth:`feed` returns the text an event adds (``""`` for none);
    :meth:`finish` returns the completion at the end of the stream.
    """

    __slots__ = (
        "_chars",
        "_depth",
        "_done",
        "_finish",
        "_max_chars",
        "_parts",
        "_tools",
        "_usage",
    )

    def __init__(self, limits: StreamLimits | None = None) -> None:
        lim = limits or StreamLimits()
        self._max_chars = lim.max_output_chars
        self._depth = lim.max_json_depth
        self._tools = OpenAIToolCallAssembler(lim.max_output_chars, lim.max_json_depth)
        self._parts: list[str] = []
        self._chars = 0
        self._finish: str | None = None
        self._usage: Usage | None = None
        self._done = False

    @property
    def answer_chars(self) -> int:
        return self._chars

    @property
    def done(self) -> bool:
        """``[DONE]`` was dispatched."""
        return self._done

    def feed(self, event: ServerSentEvent) -> str:
        if self._done:
            raise protocol("an event after [DONE]")
        if event.event != "message":
            if event.event == "error":
                raise provider_error(None)
            kind = describe(event.event, "event type", SSE_EVENT_TYPES)
            raise protocol(f"an SSE event of type {kind}")
        data = event.data
        if data == "[DONE]":
            self._done = True
            if self._finish is None:
                raise incomplete("[DONE] before any finish_reason: the answer was cut short")
            return ""
        obj = loads_object(data, max_depth=self._depth)
        if "error" in obj:
            raise provider_error(obj["error"])
        usage = obj.get("usage")
        if usage is not None:
            self._usage = _usage(usage)
        choices = obj.get("choices")
        if choices is None:
            if usage is None:
                raise malformed("a chunk has neither choices nor usage")
            return ""
        if type(choices) is not list:
            raise malformed("choices is not a list")
        if not choices:
            return ""
        if len(choices) > 1:
            raise protocol("more than one choice in a chunk")
        choice = _the_choice(choices[0])
        text = ""
        delta = choice.get("delta")
        if delta is not None:
            if type(delta) is not dict:
                raise malformed("a delta is not an object")
            if delta.get("function_call") is not None:
                _check_tools(delta)
            calls = delta.get("tool_calls")
            if calls:
                if self._finish is not None:
                    raise protocol("a tool call after the finish_reason")
                self._tools.feed(calls)
            role = delta.get("role")
            if role is not None and role != "assistant":
                _check_role(role)
            content = delta.get("content")
            if content is not None:
                if type(content) is not str:
                    raise malformed("delta content is not a string")
                if content:
                    if self._finish is not None:
                        raise protocol("text after the finish_reason")
                    self._chars += len(content)
                    if self._chars > self._max_chars:
                        raise _too_long(self._max_chars)
                    self._parts.append(content)
                    text = content
        finish = choice.get("finish_reason")
        if finish is not None:
            if type(finish) is not str:
                raise malformed("finish_reason is not a string")
            if self._finish is not None and finish != self._finish:
                raise protocol("a second, different finish_reason")
            self._finish = finish
        return text

    def finish(self, *, dropped: bool = False) -> Completion:
        if not self._done:
            if dropped:
                raise incomplete("the stream ended inside an unterminated event, before [DONE]")
            if self._finish is not None:
                raise incomplete("the stream ended after the finish_reason but before [DONE]")
            raise incomplete("the stream ended before a finish_reason and [DONE]")
        calls = self._tools.calls() if self._tools else ()
        finish = known_finish_reason(self._finish)
        return Completion("".join(self._parts), finish, self._usage, calls)


def _the_choice(choice: Any) -> dict[str, Any]:
    # The one choice a plain-text chat answer has, at index 0.
    if type(choice) is not dict:
        raise malformed("a choice is not an object")
    index = choice.get("index", 0)
    if type(index) is not int:
        raise malformed("a choice index is not an integer")
    if index:
        raise protocol(f"a choice at index {index}")
    return choice


def _too_long(limit: int) -> LimitExceeded:
    return LimitExceeded(f"the answer is longer than {limit} characters")


class OpenAIStreamDecoder(SSEStreamDecoder):
    """Bytes of a ``text/event-stream`` chat response to preview and completion."""

    __slots__ = ()
    _validator_class = OpenAIChunkValidator


def parse_openai_completion(text: str, limits: StreamLimits | None = None) -> Completion:
    """A non-streamed ``chat.completion`` body (one JSON object)."""
    lim = limits or StreamLimits()
    obj = loads_object(text, max_depth=lim.max_json_depth)
    if "error" in obj:
        raise provider_error(obj["error"])
    choices = obj.get("choices")
    if type(choices) is not list:
        raise malformed("choices is not a list")
    if len(choices) != 1:
        raise protocol(f"{len(choices)} choices instead of one")
    choice = _the_choice(choices[0])
    message = choice.get("message")
    if type(message) is not dict:
        raise malformed("the choice has no message object")
    _check_tools(message)
    calls = message.get("tool_calls")
    tool_calls = openai_tool_calls(calls, lim.max_json_depth) if calls else ()
    _check_role(message.get("role"))
    content = message.get("content")
    if content is None:
        content = ""
    elif type(content) is not str:
        raise malformed("message content is not a string")
    if len(content) > lim.max_output_chars:
        raise _too_long(lim.max_output_chars)
    finish = choice.get("finish_reason")
    if finish is not None and type(finish) is not str:
        raise malformed("finish_reason is not a string")
    usage = _usage(obj.get("usage"))
    return Completion(content, known_finish_reason(finish), usage, tool_calls)


class OpenAIResponseDecoder(BodyDecoder):
    """Bytes of a non-streamed ``application/json`` chat response."""

    __slots__ = ()

    def _parse(self, text: str) -> Completion:
        return parse_openai_completion(text, self.limits)
