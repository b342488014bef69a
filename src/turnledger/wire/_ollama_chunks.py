"""Ollama ``/api/chat`` lines to a plain-text turn.

Pure: imports no I/O library.

Ollama streams ``application/x-ndjson``: one JSON object per line, each with
``message: {role, content}`` and ``done: false``, then a last object with
``done: true``, ``done_reason`` and the token counts
(``prompt_eval_count``, ``eval_count``). A non-streamed response is that last
object alone, carrying the whole message.

- every line is a JSON object with a boolean ``done``;
- ``message.role`` is ``"assistant"`` or absent; ``message.content`` a
  string; ``thinking`` and other fields are ignored; ``tool_calls`` are
  whole calls, arguments as an object (``_tool_calls``);
- ``{"error": "..."}`` is a provider error (Ollama sends it mid-stream when
  generation fails after the 200);
- nothing may follow the ``done: true`` line; the end of the body before it
  is ``incomplete_stream``.

The provider returns ``done_reason`` as the finish reason; the session
commits only ``"stop"`` (``length``, ``load``, a missing reason: discarded).
"""

from __future__ import annotations

from .._errors import LimitExceeded
from ..events import ToolCall, Usage
from ..sessions._ports import Completion
from ._limits import StreamLimits
from ._ndjson import NDJSONDecoder
from ._stream import (
    ROLES,
    BodyDecoder,
    ResponseDecoder,
    describe,
    incomplete,
    known_finish_reason,
    malformed,
    protocol,
    provider_error,
    usage_from,
)
from ._strict_json import loads_object
from ._tool_calls import ollama_tool_calls

__all__ = ["OllamaLineValidator", "OllamaResponseDecoder", "OllamaStreamDecoder"]


class OllamaLineValidator:
    """Validates the JSON lines of one ``/api/chat`` answer."""

    __slots__ = (
        "_calls",
        "_chars",
        "_depth",
        "_done",
        "_finish",
        "_max_chars",
        "_parts",
        "_usage",
    )

    def __init__(self, limits: StreamLimits | None = None) -> None:
        lim = limits or StreamLimits()
        self._max_chars = lim.max_output_chars
        self._depth = lim.max_json_depth
        self._calls: tuple[ToolCall, ...] = ()
        self._parts: list[str] = []
        self._chars = 0
        self._done = False
        self._finish: str | None = None
        self._usage: Usage | None = None

    @property
    def done(self) -> bool:
        return self._done

    def feed(self, line: str) -> str:
        if self._done:
            raise protocol("data after the done line")
        obj = loads_object(line, max_depth=self._depth)
        if "error" in obj:
            raise provider_error(obj["error"])
        text = ""
        message = obj.get("message")
        if message is not None:
            if type(message) is not dict:
                raise malformed("message is not an object")
            calls = message.get("tool_calls")
            if calls:
                more = ollama_tool_calls(calls, self._depth, len(self._calls))
                self._calls += more
            role = message.get("role")
            if role is not None and role != "assistant":
                raise protocol(f"a message with role {describe(role, 'role', ROLES)}")
            content = message.get("content")
            if content is not None:
                if type(content) is not str:
                    raise malformed("message content is not a string")
                if content:
                    self._chars += len(content)
                    if self._chars > self._max_chars:
                        raise LimitExceeded(
                            f"the answer is longer than {self._max_chars} characters"
                        )
                    self._parts.append(content)
                    text = content
        done = obj.get("done")
        if type(done) is not bool:
            raise malformed("a line has no boolean done")
        if done:
            self._done = True
            reason = obj.get("done_reason")
            if reason is not None and type(reason) is not str:
                raise malformed("done_reason is not a string")
            self._finish = reason
            self._usage = usage_from(obj.get("prompt_eval_count"), obj.get("eval_count"))
        return text

    def finish(self, *, dropped: bool = False) -> Completion:
        if not self._done:
            if dropped:
                raise incomplete("the stream ended inside an unterminated line, before done")
            raise incomplete("the stream ended before the done line")
        usage = self._usage
        if usage == Usage():
            usage = None
        finish = known_finish_reason(self._finish)
        return Completion("".join(self._parts), finish, usage, self._calls)


class OllamaStreamDecoder(ResponseDecoder):
    """Bytes of an ``application/x-ndjson`` chat response to preview and completion."""

    __slots__ = ("_lines", "_validator")

    def __init__(self, limits: StreamLimits | None = None) -> None:
        super().__init__(limits)
        self._lines = NDJSONDecoder(self.limits)
        self._validator = OllamaLineValidator(self.limits)

    def _feed_text(self, text: str, out: list[str]) -> None:
        if not text:
            return
        feed = self._validator.feed
        for line in self._lines.decode_text(text):
            piece = feed(line)
            if piece:
                out.append(piece)
        self._lines.check()  # an error the NDJSON layer left pending after these lines

    def _finish(self) -> Completion:
        self._lines.flush()
        return self._validator.finish(dropped=self._lines.dropped)


class OllamaResponseDecoder(BodyDecoder):
    """Bytes of a non-streamed ``/api/chat`` response (one JSON object)."""

    __slots__ = ()

    def _parse(self, text: str) -> Completion:
        validator = OllamaLineValidator(self.limits)
        validator.feed(text)
        return validator.finish()
