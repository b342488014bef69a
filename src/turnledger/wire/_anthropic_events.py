"""Anthropic Messages stream events to a turn.

Pure: imports no I/O library.

The protocol of ``POST /v1/messages`` with ``"stream": true``
(https://docs.anthropic.com/en/api/messages-streaming): SSE events whose
name is the ``type`` of their JSON data, in this order::

    message_start
      (content_block_start, content_block_delta*, content_block_stop)*
    message_delta          stop_reason, usage
    message_stop

with ``ping`` anywhere and ``error`` ending the stream. Blocks are numbered
from 0 and run one after the other. A ``text`` block's ``text_delta`` is the
answer; a ``tool_use`` block (``id``, ``name``, its ``input`` as
``input_json_delta`` pieces of JSON text) is a tool call; ``thinking`` and
``redacted_thinking`` blocks (``thinking_delta``, ``signature_delta``) are
counted (:attr:`AnthropicEventValidator.thinking_chars`), never answer text;
``citations_delta`` is metadata. Anthropic may add event types ("handle
unknown event types gracefully"): an unknown event is skipped, but an
unknown block or delta type is refused, since its text could belong to the
answer.

What the provider reports (the session then judges the finish reason):

===============================================  =====================
stream                                           outcome
===============================================  =====================
``message_stop`` after ``stop_reason``           :class:`Completion`:
                                                 ``end_turn`` and
                                                 ``stop_sequence`` are
                                                 ``stop``, ``tool_use``
                                                 is ``tool_calls``,
                                                 others as sent
                                                 (``max_tokens``,
                                                 ``refusal``...)
an ``error`` event                               ``provider_error``
a second ``message_start``, an event before it,
a delta for a block that is not open, a block
out of order or of an unknown type, content
after ``message_delta``, an event after
``message_stop``, bad tool input                 ``protocol``
``message_stop`` before any ``stop_reason``,
the end of the body before ``message_stop``      ``incomplete_stream``
not JSON, wrong field types                      ``malformed``
over a :class:`StreamLimits` limit               ``limit``
===============================================  =====================
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any, Final

from .._errors import LimitExceeded
from ..events import ToolCall
from ..sessions._ports import Completion
from ._limits import StreamLimits
from ._sse import ServerSentEvent
from ._stream import (
    ROLES,
    SSEStreamDecoder,
    TypedEventValidator,
    describe,
    incomplete,
    int_field,
    known_finish_reason,
    malformed,
    object_field,
    protocol,
    provider_error,
    string_field,
    typed_event,
    usage_from,
)
from ._tool_calls import arguments_text

__all__ = ["AnthropicEventValidator", "AnthropicStreamDecoder"]

#: Content blocks a plain-text or tool turn may hold.
BLOCK_TYPES: Final = frozenset({"text", "tool_use", "thinking", "redacted_thinking"})
#: Each delta type and the block type it belongs to.
_DELTA_BLOCK: Final[Mapping[str, str]] = {
    "text_delta": "text",
    "citations_delta": "text",
    "input_json_delta": "tool_use",
    "thinking_delta": "thinking",
    "signature_delta": "thinking",
}
#: Stop reasons in the session's words (the others are reported as sent).
_FINISH: Final[Mapping[str, str]] = {
    "end_turn": "stop",
    "stop_sequence": "stop",
    "tool_use": "tool_calls",
}


def _int(obj: dict[str, Any], key: str) -> int | None:
    value = obj.get(key)
    if value is not None and (type(value) is not int or value < 0):
        raise malformed(f"usage field {key} is not a non-negative integer")
    return value


class AnthropicEventValidator(TypedEventValidator):
    """Validates the events of one streamed Messages answer.

    :meth:`feed` returns the answer text an event adds (``""`` for none);
    :meth:`finish` returns the completion at the end of the stream.
    """

    __slots__ = (
        "_args",
        "_blocks",
        "_calls",
        "_open",
        "_output",
        "_prompt",
        "_started",
        "_stop",
        "_stopped",
        "_thinking",
        "_wrapping_up",
    )

    def __init__(self, limits: StreamLimits | None = None) -> None:
        super().__init__(limits)
        self._started = False  # message_start seen
        self._wrapping_up = False  # message_delta seen: no more content
        self._stopped = False  # message_stop seen
        self._blocks: list[str] = []  # the type of each block, by index
        self._open = -1  # the index of the open block
        self._thinking = 0
        self._calls: list[tuple[str, str]] = []  # (id, name) of each tool_use block
        self._args: list[list[str]] = []
        self._stop: str | None = None
        self._prompt: int | None = None
        self._output: int | None = None

    @property
    def thinking_chars(self) -> int:
        """Characters of thinking received (never part of the answer)."""
        return self._thinking

    def metadata(self) -> dict[str, int]:
        return {"thinking_chars": self._thinking} if self._thinking else {}

    def feed(self, event: ServerSentEvent) -> str:
        if self._stopped:
            raise protocol("an event after message_stop")
        kind, obj = typed_event(event, self._depth)
        handler = _HANDLERS.get(kind)
        if handler is None:
            return ""  # an event type added after this was written
        if not self._started and kind not in _BEFORE_START:
            raise protocol(f"a {kind} before message_start")
        return handler(self, obj)

    def _message_start(self, obj: dict[str, Any]) -> str:
        if self._started:
            raise protocol("a second message_start")
        self._started = True
        message = object_field(obj, "message", "message_start")
        role = message.get("role")
        if role != "assistant":
            raise protocol(f"a message with role {describe(role, 'role', ROLES)}")
        if message.get("content"):
            raise protocol("message_start with content")
        usage = message.get("usage")
        if usage is not None:
            self._usage(object_field(message, "usage", "message_start"))
        return ""

    def _usage(self, usage: dict[str, Any]) -> None:
        # The prompt is what the model read: new input plus what the cache
        # gave or took; counts are cumulative, the latest wins.
        parts = [
            _int(usage, k)
            for k in ("input_tokens", "cache_creation_input_tokens", "cache_read_input_tokens")
        ]
        if parts[0] is not None:
            self._prompt = sum(p or 0 for p in parts)
        output = _int(usage, "output_tokens")
        if output is not None:
            self._output = output

    def _block_start(self, obj: dict[str, Any]) -> str:
        if self._wrapping_up:
            raise protocol("a content block after message_delta")
        index = int_field(obj, "index")
        if self._open != -1:
            raise protocol("a content block started before the previous one stopped")
        if index != len(self._blocks):
            raise protocol("a content block out of order")
        block = object_field(obj, "content_block", "content_block_start")
        kind = block.get("type")
        if kind not in BLOCK_TYPES:
            raise protocol(f"a content block of type {describe(kind, 'block type', BLOCK_TYPES)}")
        self._blocks.append(kind)
        self._open = index
        if kind == "text":
            text = string_field(block, "text", "a text block's text")
            if text:
                self._count(len(text))
                self._parts.append(text)
            return text
        if kind == "tool_use":
            call_id, name = block.get("id"), block.get("name")
            if type(call_id) is not str or type(name) is not str or not call_id or not name:
                raise protocol("a tool_use block without an id or a name")
            if block.get("input", {}) != {}:
                raise protocol("a tool_use block whose input does not start empty")
            self._calls.append((call_id, name))
            self._args.append([])
        return ""

    def _block_delta(self, obj: dict[str, Any]) -> str:
        if int_field(obj, "index") != self._open or self._open == -1:
            raise protocol("a delta for a content block that is not open")
        delta = object_field(obj, "delta", "content_block_delta")
        kind = delta.get("type")
        block = _DELTA_BLOCK.get(kind) if type(kind) is str else None
        if block is None:
            raise protocol(f"a delta of type {describe(kind, 'delta type', _DELTA_TYPES)}")
        if block != self._blocks[self._open]:
            raise protocol(f"a {kind} in a {self._blocks[self._open]} block")
        if kind == "text_delta":
            text = string_field(delta, "text", "a text_delta's text")
            self._count(len(text))
            self._parts.append(text)
            return text
        if kind == "input_json_delta":
            piece = string_field(delta, "partial_json", "an input_json_delta's partial_json")
            self._count(len(piece))
            self._args[-1].append(piece)
        elif kind == "thinking_delta":
            thought = string_field(delta, "thinking", "a thinking_delta's thinking")
            self._thinking += len(thought)
            if self._thinking > self._max_chars:
                raise LimitExceeded(f"the thinking is longer than {self._max_chars} characters")
        return ""

    def _block_stop(self, obj: dict[str, Any]) -> str:
        if int_field(obj, "index") != self._open or self._open == -1:
            raise protocol("a content_block_stop for a block that is not open")
        self._open = -1
        return ""

    def _message_delta(self, obj: dict[str, Any]) -> str:
        if self._open != -1:
            raise protocol("message_delta inside a content block")
        self._wrapping_up = True
        delta = object_field(obj, "delta", "message_delta")
        stop = delta.get("stop_reason")
        if stop is not None:
            if type(stop) is not str:
                raise malformed("stop_reason is not a string")
            if self._stop is not None and stop != self._stop:
                raise protocol("a second, different stop_reason")
            self._stop = stop
        usage = obj.get("usage")
        if usage is not None:
            self._usage(object_field(obj, "usage", "message_delta"))
        return ""

    def _message_stop(self, obj: dict[str, Any]) -> str:
        if self._open != -1:
            raise protocol("message_stop inside a content block")
        self._stopped = True
        if self._stop is None:
            raise incomplete("message_stop before any stop_reason: the answer was cut short")
        return ""

    def _ping(self, obj: dict[str, Any]) -> str:
        return ""

    def _error(self, obj: dict[str, Any]) -> str:
        raise provider_error(obj.get("error"))

    def finish(self, *, dropped: bool = False) -> Completion:
        if not self._stopped:
            if dropped:
                raise incomplete(
                    "the stream ended inside an unterminated event, before message_stop"
                )
            if not self._started:
                raise incomplete("the stream ended before message_start")
            raise incomplete("the stream ended before message_stop")
        calls = tuple(
            ToolCall(call_id, name, arguments_text("".join(args) or "{}", self._depth))
            for (call_id, name), args in zip(self._calls, self._args, strict=True)
        )
        stop = self._stop
        finish = _FINISH.get(stop, known_finish_reason(stop)) if stop is not None else None
        usage = None
        if self._prompt is not None or self._output is not None:
            usage = usage_from(self._prompt, self._output)
        return Completion("".join(self._parts), finish, usage, calls)


_DELTA_TYPES: Final = frozenset(_DELTA_BLOCK)
_Handler = Callable[[AnthropicEventValidator, dict[str, Any]], str]
_HANDLERS: Final[Mapping[str, _Handler]] = {
    "message_start": AnthropicEventValidator._message_start,
    "content_block_start": AnthropicEventValidator._block_start,
    "content_block_delta": AnthropicEventValidator._block_delta,
    "content_block_stop": AnthropicEventValidator._block_stop,
    "message_delta": AnthropicEventValidator._message_delta,
    "message_stop": AnthropicEventValidator._message_stop,
    "ping": AnthropicEventValidator._ping,
    "error": AnthropicEventValidator._error,
}
#: What may come before message_start.
_BEFORE_START: Final = frozenset({"message_start", "ping", "error"})


class AnthropicStreamDecoder(SSEStreamDecoder):
    """Bytes of a streamed ``/v1/messages`` response to preview and completion."""

    __slots__ = ()
    _validator_class = AnthropicEventValidator
