"""The shared shape of a response decoder: bytes in, preview text out,
a :class:`~turnledger.sessions.Completion` (or a typed error) at the end.

Pure: imports no I/O library.

Layers, each its own object: byte count (``max_input_bytes``) → strict UTF-8
(:mod:`._utf8`) → framing (SSE or NDJSON) → strict JSON (:mod:`._json`) →
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

import re
from abc import ABC, abstractmethod
from typing import Any

from ..._errors import DecodeError, LimitExceeded, ProviderError, StreamProtocolError
from ...events import Usage
from ...sessions._ports import Completion
from ._limits import StreamLimits
from ._utf8 import Utf8Decoder

__all__ = [
    "BodyDecoder",
    "ResponseDecoder",
    "incomplete",
    "malformed",
    "protocol",
    "provider_error",
    "usage_from",
]

_TOKEN = re.compile(r"[A-Za-z0-9_.:/+\-]{1,64}")


def _safe(value: Any) -> str | None:
    # Only short identifier-like values of a provider's error (its type or
    # code) may be quoted; messages and bodies never are.
    if type(value) is int:
        return str(value)
    if type(value) is str and _TOKEN.fullmatch(value):
        return value
    return None


def provider_error(obj: Any) -> ProviderError:
    """The error for an ``{"error": ...}`` payload, quoting only its type/code."""
    parts = []
    if isinstance(obj, dict):
        for key in ("type", "code"):
            token = _safe(obj.get(key))
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
