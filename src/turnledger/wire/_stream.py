"""The shared shape of a response decoder: bytes in, preview text out,
a :class:`~turnledger.sessions.Completion` (or a typed error) at the end.

Pure: imports no I/O library.

Layers, each its own object: byte count (``max_input_bytes``) → strict UTF-8
(:mod:`._utf8`) → framing (SSE or NDJSON) → strict JSON (:mod:`._strict_json`) →
turn validation (per protocol). A decoder fails fast: after its first error
every call raises that error.

Stream order. When one read holds good text followed by a fault, the text
before the fault is handed on first and the fault is raised afterwards, so
the preview delivered and the error reported do not depend on how the bytes
were split into reads. :meth:`ResponseDecoder.feed` may therefore return
preview text and leave an error pending in :attr:`ResponseDecoder.error`;
the caller delivers the text and then calls :meth:`ResponseDecoder.check`.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import Any, ClassVar, Final, Protocol

from .._errors import DecodeError, LimitExceeded, ProviderError, StreamProtocolError
from ..events import Usage
from ..sessions._ports import Completion
from ._limits import StreamLimits
from ._sse import ServerSentEvent, SSEDecoder
from ._strict_json import loads_object
from ._utf8 import Utf8Decoder

__all__ = [
    "ERROR_CODES",
    "FINISH_REASONS",
    "MEDIA_TYPES",
    "ROLES",
    "SSE_EVENT_TYPES",
    "BodyDecoder",
    "EventValidator",
    "ResponseDecoder",
    "SSEStreamDecoder",
    "TypedEventValidator",
    "describe",
    "incomplete",
    "int_field",
    "known_finish_reason",
    "malformed",
    "object_field",
    "protocol",
    "provider_error",
    "string_field",
    "typed_event",
    "usage_from",
]

# Closed vocabularies: the only server-sent tokens ever quoted in a detail.
# Anything else the server sends (a proxy may echo the request's own API key
# into any field) is described by its kind and length, never quoted.

#: Finish reasons of OpenAI-compatible servers and Ollama's ``done_reason``.
FINISH_REASONS: Final = frozenset(
    {
        "stop",
        "length",
        "content_filter",
        "tool_calls",
        "function_call",
        "load",
        "unload",
        "eos",
        "end_turn",
        "max_tokens",
        "stop_sequence",
        "abort",
        "error",
        "tool_use",
        "refusal",
        "pause_turn",
        "model_context_window_exceeded",
        "max_output_tokens",
    }
)
#: Chat roles.
ROLES: Final = frozenset({"system", "developer", "user", "assistant", "tool", "function"})
#: SSE event types seen on chat streams.
SSE_EVENT_TYPES: Final = frozenset({"message", "error", "ping", "done", "end"})
#: Error types and codes of OpenAI-compatible servers, Anthropic and the
#: Responses API.
ERROR_CODES: Final = frozenset(
    {
        "api_error",
        "authentication_error",
        "billing_error",
        "context_length_exceeded",
        "insufficient_quota",
        "internal_error",
        "invalid_api_key",
        "invalid_prompt",
        "invalid_request_error",
        "model_not_found",
        "not_found_error",
        "overloaded_error",
        "permission_error",
        "rate_limit_error",
        "rate_limit_exceeded",
        "request_too_large",
        "server_error",
        "service_unavailable",
        "timeout",
    }
)
#: Response media types.
MEDIA_TYPES: Final = frozenset(
    {
        "application/json",
        "application/problem+json",
        "application/x-ndjson",
        "application/octet-stream",
        "text/event-stream",
        "text/html",
        "text/plain",
    }
)


def describe(value: Any, what: str, known: frozenset[str]) -> str:
    """``value`` if it is in the closed vocabulary ``known``; otherwise its
    kind and size (``"unknown role (51 chars)"``), never its content."""
    if type(value) is str:
        if value in known:
            return value
        if not value:
            return f"no {what}"
        return f"unknown {what} ({len(value)} chars)"
    return f"{what} of JSON type {_json_type(value)}"


def known_finish_reason(value: str | None) -> str | None:
    """A finish reason as a :class:`Completion` carries it: a known one as is,
    any other as ``unknown_<n>_chars`` (the session discards it either way)."""
    if value is None or value in FINISH_REASONS:
        return value
    return f"unknown_{len(value)}_chars"


def _json_type(value: Any) -> str:
    if value is None:
        return "null"
    if type(value) is bool:
        return "boolean"
    if type(value) is int or type(value) is float:
        return "number"
    if type(value) is list:
        return "array"
    if type(value) is dict:
        return "object"
    return "string" if type(value) is str else "other"


def _code(value: Any) -> str | None:
    # An error's type or code: a known token, or a small (HTTP-like) number.
    if value is None:
        return None
    if type(value) is int and 0 <= value < 1000:
        return str(value)
    return describe(value, "code", ERROR_CODES)


def provider_error(obj: Any) -> ProviderError:
    """The error for an ``{"error": ...}`` payload, quoting only a known
    type/code (see :func:`describe`)."""
    parts = []
    if isinstance(obj, dict):
        for key in ("type", "code"):
            token = _code(obj.get(key))
            if token is not None:
                parts.append(f"{key}={token}")
    suffix = f" ({', '.join(parts)})" if parts else ""
    return ProviderError(f"the server sent an error{suffix}", reason="provider_error")


def protocol(message: str) -> StreamProtocolError:
    return StreamProtocolError(message)


def incomplete(message: str) -> StreamProtocolError:
    return StreamProtocolError(message, reason="incomplete_stream")


def malformed(message: str) -> DecodeError:
    return DecodeError(message)


def _count(value: Any, what: str) -> int | None:
    if value is None:
        return None
    if type(value) is not int or value < 0:
        raise malformed(f"usage field {what} is not a non-negative integer")
    return value


def typed_event(event: ServerSentEvent, max_depth: int) -> tuple[str, dict[str, Any]]:
    """The ``type`` and the JSON object of a typed SSE event (Anthropic
    Messages, the Responses API): the data's ``type`` must be a string and,
    when the event has a name, the same string."""
    obj = loads_object(event.data, max_depth=max_depth)
    kind = obj.get("type")
    if type(kind) is not str:
        raise malformed("an event's data has no string type")
    if kind != event.event and event.event != "message":
        raise protocol("an SSE event named differently from its data's type")
    return kind, obj


def object_field(obj: dict[str, Any], key: str, what: str) -> dict[str, Any]:
    """``obj[key]``, which must be a JSON object (``what`` names ``obj``)."""
    value = obj.get(key)
    if type(value) is not dict:
        raise malformed(f"{what} has no {key} object")
    return value


def string_field(obj: dict[str, Any], key: str, what: str) -> str:
    """``obj[key]``, which must be a string (``what`` names the field)."""
    value = obj.get(key)
    if type(value) is not str:
        raise malformed(f"{what} is not a string")
    return value


def int_field(obj: dict[str, Any], key: str) -> int:
    """``obj[key]``, which must be an integer."""
    value = obj.get(key)
    if type(value) is not int:
        raise malformed(f"an event has no integer {key}")
    return value


def usage_from(prompt: Any, completion: Any, total: Any = None) -> Usage:
    """Token counts, type-checked; ``total`` defaults to the sum."""
    p = _count(prompt, "prompt")
    c = _count(completion, "completion")
    t = _count(total, "total")
    if t is None and p is not None and c is not None:
        t = p + c
    return Usage(p, c, t)


class ResponseDecoder(ABC):
    """Bytes of one streamed response to preview text and a completion.

    Subclasses supply the framing and validation in :meth:`_feed_text` and
    :meth:`_finish`.
    """

    __slots__ = ("_bytes", "_error", "_max_bytes", "_utf8", "limits")

    def __init__(self, limits: StreamLimits | None = None) -> None:
        self.limits = limits or StreamLimits()
        self._max_bytes = self.limits.max_input_bytes
        self._bytes = 0
        self._utf8 = Utf8Decoder()
        self._error: ProviderError | None = None

    @property
    def error(self) -> ProviderError | None:
        """The error pending or raised, if any."""
        return self._error

    @property
    def bytes_read(self) -> int:
        return self._bytes

    def metadata(self) -> dict[str, int]:
        """Counts about the response that are not the answer (Anthropic's
        thinking characters, say), for a log line; empty by default."""
        return {}

    def check(self) -> None:
        """Raise the pending error, if any."""
        if self._error is not None:
            raise self._error

    def feed(self, chunk: bytes) -> list[str]:
        """Feed one read; returns the preview text it completed (non-empty
        pieces, in order). An error found after some text is left pending."""
        if self._error is not None:
            raise self._error
        n = len(chunk)
        self._bytes += n
        over = self._bytes - self._max_bytes
        if over > 0:
            chunk = chunk[: n - over]
        out: list[str] = []
        try:
            if chunk:
                self._feed_text(self._utf8.decode(chunk), out)
            if over > 0:
                raise LimitExceeded(f"the response is longer than {self._max_bytes} bytes")
        except ProviderError as exc:
            self._error = exc
            if out:
                return out
            raise
        return out

    def finish(self) -> Completion:
        """End of the response body: the completion, or the typed failure."""
        if self._error is not None:
            raise self._error
        try:
            self._utf8.flush()
            return self._finish()
        except ProviderError as exc:
            self._error = exc
            raise

    @abstractmethod
    def _feed_text(self, text: str, out: list[str]) -> None: ...

    @abstractmethod
    def _finish(self) -> Completion: ...


class BodyDecoder(ResponseDecoder):
    """A non-streamed body: collected (within ``max_input_bytes``), then
    parsed whole by :meth:`_parse`."""

    __slots__ = ("_parts",)

    def __init__(self, limits: StreamLimits | None = None) -> None:
        super().__init__(limits)
        self._parts: list[str] = []

    def _feed_text(self, text: str, out: list[str]) -> None:
        self._parts.append(text)

    def _finish(self) -> Completion:
        return self._parse("".join(self._parts))

    @abstractmethod
    def _parse(self, text: str) -> Completion: ...


class TypedEventValidator:
    """What the validators of typed SSE events (Anthropic, Responses) share:
    the answer's pieces and their limit."""

    __slots__ = ("_chars", "_depth", "_max_chars", "_parts")

    def __init__(self, limits: StreamLimits | None = None) -> None:
        lim = limits or StreamLimits()
        self._max_chars = lim.max_output_chars
        self._depth = lim.max_json_depth
        self._parts: list[str] = []
        self._chars = 0

    def _count(self, n: int) -> None:
        self._chars += n
        if self._chars > self._max_chars:
            raise LimitExceeded(f"the answer is longer than {self._max_chars} characters")


class EventValidator(Protocol):
    """A protocol's turn validator over SSE events."""

    def __init__(self, limits: StreamLimits | None = None) -> None: ...

    def feed(self, event: ServerSentEvent) -> str:
        """One event; returns the answer text it adds (``""`` for none)."""
        ...

    def finish(self, *, dropped: bool = False) -> Completion:
        """The end of the stream (``dropped``: inside an unterminated event)."""
        ...


class SSEStreamDecoder(ResponseDecoder):
    """Bytes of a ``text/event-stream`` response to preview and completion,
    through the protocol's :class:`EventValidator` (``_validator_class``)."""

    __slots__ = ("_sse", "_validator")
    _validator_class: ClassVar[type[EventValidator]]

    def __init__(self, limits: StreamLimits | None = None) -> None:
        super().__init__(limits)
        self._sse = SSEDecoder(self.limits)
        self._validator = self._validator_class(self.limits)

    def feed(self, chunk: bytes) -> list[str]:
        # ResponseDecoder.feed with the layers called inline: this runs once
        # per read of a live stream.
        if self._error is not None or self._bytes + len(chunk) > self._max_bytes:
            return super().feed(chunk)
        self._bytes += len(chunk)
        out: list[str] = []
        try:
            self._feed_text(self._utf8.decode(chunk), out)
        except ProviderError as exc:
            self._error = exc
            if out:
                return out
            raise
        return out

    def _feed_text(self, text: str, out: list[str]) -> None:
        if not text:
            return
        sse = self._sse
        feed = self._validator.feed
        for event in sse.decode_text(text):
            piece = feed(event)
            if piece:
                out.append(piece)
        sse.check()  # an error the SSE layer left pending after these events

    def _finish(self) -> Completion:
        self._sse.flush()
        return self._validator.finish(dropped=self._sse.dropped)

    def metadata(self) -> dict[str, int]:
        counts = getattr(self._validator, "metadata", None)
        return counts() if counts is not None else {}
