"""Text to NDJSON lines (Ollama's framing).

Pure: imports no I/O library.

Newline-delimited JSON (https://github.com/ndjson/ndjson-spec): each JSON
text is followed by ``"\\n"``. A ``"\\r"`` before it is left on the line,
where the JSON parser reads it as whitespace; a bare CR is not a line end.
Blank lines are skipped. A last line without its ``"\\n"`` is dropped at the
end of the stream, like an unterminated SSE event: it may have been cut off.

Limits: characters per line and number of lines. Errors are reported in
stream order, as in the SSE decoder.
"""

from __future__ import annotations

from .._errors import LimitExceeded, ProviderError
from ._limits import StreamLimits
from ._lines import LineSplitter
from ._utf8 import Utf8Decoder

__all__ = ["NDJSONDecoder"]

_DEFAULT_LIMITS = StreamLimits()


class NDJSONDecoder:
    """Incremental NDJSON line splitter with ``decode`` / ``flush``.

    Feed it bytes (strict UTF-8) or text, consistently. Returns the complete,
    non-blank lines, without their line end.

    Args:
        limits: uses ``max_line_chars`` and ``max_events`` (lines).
    """

    __slots__ = ("_error", "_lines", "_max_lines", "_splitter", "_utf8")

    def __init__(self, limits: StreamLimits | None = None) -> None:
        lim = limits or _DEFAULT_LIMITS
        self._splitter = LineSplitter(lim.max_line_chars, "an NDJSON line", cr=False)
        self._max_lines = lim.max_events
        self._utf8 = Utf8Decoder()
        self._lines = 0
        self._error: ProviderError | None = None

    def decode(self, chunk: bytes) -> list[str]:
        """Feed one read of bytes; returns the lines it completed."""
        return self.decode_text(self._utf8.decode(chunk))

    def flush(self) -> list[str]:
        """End of stream. An unterminated last line is dropped (see :attr:`dropped`)."""
        self.check()
        self._utf8.flush()
        return []

    def check(self) -> None:
        """Raise the error left pending after the lines last returned, if any."""
        if self._error is not None:
            raise self._error

    @property
    def dropped(self) -> bool:
        """True if an unterminated, non-blank line is buffered."""
        return bool(self._splitter.tail.strip())

    def decode_text(self, text: str) -> list[str]:
        """Feed decoded text."""
        if self._error is not None:
            raise self._error
        if not text:
            return []
        splitter = self._splitter
        out: list[str] = []
        for line in splitter.split(text):
            if line and not line.isspace():  # blank lines are skipped
                out.append(line)
        self._lines += len(out)
        error = splitter.error
        if self._lines > self._max_lines:
            del out[len(out) - (self._lines - self._max_lines) :]
            error = LimitExceeded(f"more than {self._max_lines} NDJSON lines")
        if error is not None:
            self._error = error
            if not out:
                raise error
        return out
