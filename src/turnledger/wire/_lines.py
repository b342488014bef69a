"""Text to lines, across reads: the framing both SSE and NDJSON stand on.

Pure: imports no I/O library.

A read may end anywhere: inside a line (the rest comes with the next read)
or, for SSE, between the CR and the LF of one CRLF. :class:`LineSplitter`
keeps what is not yet a whole line and hands on only complete lines, without
their line ends (the shape of httpx-sse's ``SSELineDecoder``, with the line
ends each format allows rather than ``str.splitlines``):

- ``cr=True`` (SSE): a line ends at LF, CRLF or a bare CR; a CR at the end of
  one read and an LF at the start of the next are one line end;
- ``cr=False`` (NDJSON): only LF ends a line; a CR stays on the line.

Every line, complete or still buffered, is bounded by ``max_line`` characters.
A line over it ends the list :meth:`LineSplitter.split` returns: the lines
before it are handed on, and the :class:`~turnledger.LimitExceeded` waits in
:attr:`LineSplitter.error` for the caller to raise after handling them, so
errors come in stream order whatever the read sizes.
"""

from __future__ import annotations

from .._errors import LimitExceeded

__all__ = ["LineSplitter"]


class LineSplitter:
    """Incremental line splitter with a bound on the line length.

    Args:
        max_line: the longest line allowed, in characters.
        what: names the lines in the limit's message (``"an SSE line"``).
        cr: whether CR ends a line (SSE) or is part of it (NDJSON).
    """

    __slots__ = ("_after_cr", "_cr", "_max_line", "_partial", "_partial_len", "_what", "error")

    def __init__(self, max_line: int, what: str, *, cr: bool) -> None:
        self._max_line = max_line
        self._what = what
        self._cr = cr
        self._after_cr = False  # the last read ended with CR: skip a leading LF
        self._partial: list[str] = []  # an unterminated line, in pieces
        self._partial_len = 0
        #: A line over the limit, found after the lines last returned.
        self.error: LimitExceeded | None = None

    def busy(self) -> bool:
        """Whether a partial line (or a CR whose LF may follow) is buffered."""
        return self._after_cr or bool(self._partial)

    @property
    def tail(self) -> str:
        """The unterminated line buffered so far."""
        return "".join(self._partial)

    def split(self, text: str) -> list[str]:
        """The lines ``text`` completes, in order, without their line ends.

        What follows the last line end is kept for the next call. If a line
        is too long, the list stops before it and :attr:`error` is set.
        """
        if self._after_cr:
            self._after_cr = False
            if text[:1] == "\n":
                text = text[1:]
        if self._cr and "\r" in text:
            self._after_cr = text[-1] == "\r"
            text = text.replace("\r\n", "\n").replace("\r", "\n")
        lines = text.split("\n")
        tail = lines.pop()
        max_line = self._max_line
        if self._partial:
            if not lines:
                self._partial.append(tail)
                self._partial_len += len(tail)
                if self._partial_len > max_line:
                    self.error = self._too_long()
                return []
            self._partial.append(lines[0])
            lines[0] = "".join(self._partial)
            self._partial = []
            self._partial_len = 0
            if len(lines[0]) > max_line:
                self.error = self._too_long()
                return []
        # No line of this text is too long if the text is not.
        if len(text) > max_line:
            for i, line in enumerate(lines):
                if len(line) > max_line:
                    self.error = self._too_long()
                    return lines[:i]
            if len(tail) > max_line:
                self.error = self._too_long()
                return lines
        if tail:
            self._partial.append(tail)
            self._partial_len = len(tail)
        return lines

    def _too_long(self) -> LimitExceeded:
        return LimitExceeded(f"{self._what} is longer than {self._max_line} characters")
