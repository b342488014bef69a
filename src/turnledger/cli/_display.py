"""Text as it may reach a terminal, and the output helpers of the commands."""

from __future__ import annotations

import datetime as dt
import json
import os
import re
import shlex
import shutil
import sys
from typing import Any, TextIO

from ..sessions import CommittedResult, DiscardedResult, TurnResult
from ..text import INVISIBLE_RANGES, visible

__all__ = [
    "ID_WIDTH",
    "LINE",
    "LogStream",
    "Out",
    "command_name",
    "describe",
    "fmt_time",
    "print_json",
    "visible",
    "visible_json",
]


#: Characters of a request id a line of the command line shows (``log``'s
#: lines and tree, ``chat``'s ``/branches``); a longer one is cut with "…".
ID_WIDTH = 12

#: What JSON leaves raw (``json.dumps`` escapes C0) but a terminal acts on.
_JSON_INVISIBLE = re.compile(
    "[" + "".join(f"\\u{lo:04x}-\\u{hi:04x}" for lo, hi in INVISIBLE_RANGES if lo > 0x1F) + "]"
)


def visible_json(text: str) -> str:
    """A JSON document with the characters ``json.dumps`` leaves raw but a
    terminal acts on (DEL, C1 controls, bidirectional overrides) written as
    ``\\u`` escapes of four hex digits: they only occur inside strings, so the document
    still parses to the same value."""
    return _JSON_INVISIBLE.sub(lambda m: f"\\u{ord(m[0]):04x}", text)


def print_json(obj: Any) -> None:
    """One JSON document on a line of stdout, safe for a terminal."""
    print(visible_json(json.dumps(obj, ensure_ascii=False)))


def fmt_time(ts: float) -> str:
    """A store timestamp as UTC ISO 8601 with milliseconds."""
    return dt.datetime.fromtimestamp(ts, dt.UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")[:-4] + "Z"


class _Line:
    """Whether the terminal's current line holds text not yet ended (an
    answer streaming, the spinner): a log line must start on a new one."""

    open = False
    #: The spinner is on the line: wipe it (it comes back on its next turn).
    spinner = False


LINE = _Line()


class LogStream:
    """stderr for the log lines: on a terminal, a log line that would land
    after an unfinished line of the transcript starts on a line of its own."""

    def __init__(self, stream: TextIO) -> None:
        self.stream = stream

    def isatty(self) -> bool:
        return self.stream.isatty()

    def write(self, text: str) -> int:
        if text and self.stream.isatty():
            if LINE.spinner:  # once: it is drawn again on its next turn
                self.stream.write("\r\x1b[K")
                LINE.spinner = False
            elif LINE.open:
                self.stream.write("\n")
                LINE.open = False
        return self.stream.write(text)

    def flush(self) -> None:
        self.stream.flush()


class Out:
    """Transcript printing: flushed at once, so a pipe shows it as it happens."""

    def __init__(self, stream: TextIO) -> None:
        self.stream = stream
        # A terminal acts on control characters: show them as escapes
        # there; a pipe or a file gets the text exactly as it was written.
        self.terminal = stream.isatty()

    def __call__(self, text: str = "", end: str = "\n") -> None:
        if self.terminal:
            text = visible(text, lines=True)
            if text or end:
                LINE.open = not (text + end).endswith("\n")
        self.stream.write(text + end)
        self.stream.flush()


def describe(result: TurnResult) -> str:
    """A turn's outcome in one line."""
    if isinstance(result, CommittedResult):
        return f"committed (finish_reason={result.finish_reason})"
    if isinstance(result, DiscardedResult):
        detail = f": {result.detail}" if result.detail else ""
        return f"discarded, reason={result.reason}{detail}"
    return f"rejected, reason={result.reason}: {result.detail}"


def command_name() -> str:
    """How to run this turnledger again from the current shell, as it is:
    ``turnledger`` when that name on PATH is this installation's script;
    else that script's path (``.venv/bin/turnledger`` in an un-activated
    virtual environment); else ``python -m turnledger`` with this Python."""
    bin_dir = os.path.dirname(sys.executable)
    script = os.path.join(bin_dir, "turnledger")
    if not os.path.isfile(script):
        return f"{shlex.quote(sys.executable)} -m turnledger"
    found = shutil.which("turnledger")
    if found and os.path.realpath(found) == os.path.realpath(script):
        return "turnledger"
    relative = os.path.relpath(script)
    return shlex.quote(script if relative.startswith("..") else relative)
