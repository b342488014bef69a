"""Where a command's log lines go, and when.

Three audiences, three ways:

- **A program** (stderr is not a terminal, or ``--log-json``): JSON lines as
  they happen, for ``jq`` and log collectors. Nothing is held or left out.
- **A person watching the log** (a terminal with ``-v``, or a command whose
  log is what one watches, such as ``serve``): console lines as they happen,
  each on a line of its own (:class:`~._display.LogStream`).
- **A person reading a story** (``demo`` and ``chat`` on a terminal): the
  warnings and errors are held while the story is told and shown after it,
  under a line that counts them. A log line that cuts an answer in two helps
  nobody read either.

On a console, a fact the command tells in its own words (``chat``'s window
line says which context window applies, and why) is not printed a second
time as a log line: the command lists those events, and they are noted for it
(:meth:`CommandLog.noted`) instead. JSON lines keep them.
"""

from __future__ import annotations

import sys
from collections.abc import Iterable, Mapping, MutableMapping
from typing import Any, Final, TextIO

import structlog

from ._display import LogStream

__all__ = ["MAX_HELD_LINES", "CommandLog"]

#: Log lines kept for after the story; more are counted, not kept (a long
#: chat must not grow without bound for the sake of its warnings).
MAX_HELD_LINES: Final = 500


class _Held:
    """A stream that keeps what is written, for :meth:`CommandLog.release`;
    a terminal if stderr is one, so the lines get the colours they will be
    shown with."""

    def __init__(self, stderr: TextIO) -> None:
        self._stderr = stderr
        self.parts: list[str] = []
        self.lines = 0
        self.left_out = 0

    def isatty(self) -> bool:
        return self._stderr.isatty()

    def write(self, text: str) -> int:
        if self.lines >= MAX_HELD_LINES:
            self.left_out += text.count("\n")
        else:
            self.parts.append(text)
            self.lines += text.count("\n")
        return len(text)

    def flush(self) -> None:
        pass


def _rank(level: str) -> int:
    """The most severe level first in the heading of the held lines."""
    order = ("critical", "error", "exception", "warning")
    return order.index(level) if level in order else len(order)


class CommandLog:
    """The log of one run of the command line (see the module docstring).

    Args:
        stderr: where log lines are shown.
        json: ``--log-json`` (``True``), or ``None`` to choose: JSON unless
            ``stderr`` is a terminal.
        verbosity: ``-v`` given how many times.
        hold: the command tells a story on the terminal: hold the log lines
            until it is told (unless ``-v`` asks for them as they happen).
        told: events the command tells in its own words.
    """

    def __init__(
        self,
        stderr: TextIO,
        *,
        json: bool | None,
        verbosity: int,
        hold: bool = False,
        told: Iterable[str] = (),
    ) -> None:
        self._stderr = stderr
        self.json = not stderr.isatty() if json is None else json
        self.verbosity = verbosity
        self._told = frozenset(told)
        self._notes: dict[str, dict[str, Any]] = {}
        self._held = _Held(stderr) if hold and not self.json and verbosity <= 0 else None
        #: Held lines by level (``warning``, ``error``...), for the heading.
        self._levels: dict[str, int] = {}

    @property
    def holding(self) -> bool:
        """Whether log lines are held until :meth:`release`."""
        return self._held is not None

    def configure(self) -> None:
        """Configure structlog for the process, as this log says."""
        from ..adapters.logging import configure_logging

        stream: Any = self._held if self._held is not None else LogStream(self._stderr)
        configure_logging(
            json=self.json, verbosity=self.verbosity, stream=stream, processors=[self._note]
        )

    def _note(self, _: Any, method: str, event_dict: MutableMapping[str, Any]) -> Any:
        event = event_dict.get("event")
        if event in self._told:
            self._notes[str(event)] = dict(event_dict)
            if not self.json:
                raise structlog.DropEvent
        if self._held is not None:
            level = str(event_dict.get("level", method))
            self._levels[level] = self._levels.get(level, 0) + 1
        return event_dict

    def noted(self, event: str) -> Mapping[str, Any] | None:
        """The last line of ``event`` (one the command tells), if one was logged."""
        return self._notes.get(event)

    def release(self, command: str) -> None:
        """Show the held lines, if any, after what the command printed
        (idempotent: they are shown once)."""
        held = self._held
        if held is None or not (held.parts or held.left_out):
            return
        sys.stdout.flush()
        counts = ", ".join(
            f"{n} {level}{'s' if n > 1 else ''}"
            for level, n in sorted(self._levels.items(), key=lambda item: _rank(item[0]))
        )
        out = LogStream(self._stderr)
        out.write(
            f"\n── turnledger {command} logged {counts or 'these lines'} "
            "(held until the end; -v shows the log as it happens)\n"
        )
        out.write("".join(held.parts))
        if held.left_out:
            out.write(f"… and {held.left_out} more log lines, not kept\n")
        out.flush()
        held.parts.clear()
        held.left_out = 0
