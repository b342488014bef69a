"""Bytes to text: incremental, strict UTF-8.

Pure: imports no I/O library.

A multibyte character can straddle two reads, so the decoder keeps the
undecoded tail of one read for the next. Invalid input (overlong forms, lone
continuation bytes, encoded surrogates, code points above U+10FFFF, a
sequence cut off at the end of the stream) is a :class:`~turnledger.DecodeError`,
never U+FFFD. Python's own incremental UTF-8 decoder with ``errors="strict"``
already implements exactly these rules (RFC 3629, Unicode table 3-7); this
module adds the error mapping and stream-order error reporting.

Errors are reported in stream order: when a read contains valid text followed
by invalid bytes, :meth:`Utf8Decoder.decode` returns the valid text first and
raises on the next call (or on :meth:`~Utf8Decoder.flush`). Whatever the read
sizes, the layers above therefore see the same text before the same error.
"""

from __future__ import annotations

import codecs

from .._errors import DecodeError

__all__ = ["Utf8Decoder"]

_utf8_decode = codecs.utf_8_decode


class Utf8Decoder:
    """Incremental strict UTF-8 decoder with ``decode`` / ``flush``.

    Once it has raised, every later call raises the same error.
    """

    __slots__ = ("_error", "_offset", "_pending")

    def __init__(self) -> None:
        self._pending = b""  # an incomplete sequence kept from the last read
        self._offset = 0  # stream offset of the first byte of _pending
        self._error: DecodeError | None = None

    def decode(self, data: bytes) -> str:
        """Decode one read; returns the text of every complete character.

        Raises:
            DecodeError: the stream is not valid UTF-8.
        """
        if self._pending or self._error is not None:
            if self._error is not None:
                raise self._error
            data = self._pending + data
        try:
            text, consumed = _utf8_decode(data, "strict", False)
        except UnicodeDecodeError as exc:
            return self._fail(data, exc)
        self._offset += consumed
        self._pending = data[consumed:] if consumed != len(data) else b""
        return text

    def flush(self) -> str:
        """End of stream: an incomplete trailing sequence is an error.

        Returns:
            Always ``""`` (kept for the ``decode``/``flush`` shape).
        """
        if self._error is not None:
            raise self._error
        if self._pending:
            self._error = DecodeError(
                f"invalid UTF-8: the stream ends inside a character at byte {self._offset}"
            )
            raise self._error
        return ""

    def _fail(self, data: bytes, exc: UnicodeDecodeError) -> str:
        where = self._offset + exc.start
        self._error = DecodeError(f"invalid UTF-8 at byte {where} ({exc.reason})")
        self._pending = b""
        # The bytes before the error are valid; hand them on first.
        prefix = data[: exc.start]
        if not prefix:
            raise self._error from exc
        self._offset = where
        return prefix.decode("utf-8")

    @property
    def bytes_pending(self) -> int:
        """Bytes of an incomplete character held for the next read."""
        return len(self._pending)
