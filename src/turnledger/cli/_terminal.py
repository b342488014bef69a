"""``chat`` on a terminal: the prompt, the spinner, colour, marks.

The prompt is prompt_toolkit's: it runs in a worker thread (trio owns the
main one) and gives line editing, a persistent input history, bracketed
paste (a pasted block of lines is one question) and Esc-Enter (or
Alt-Enter) for an explicit new line. The standard ``readline`` offers no
bracketed paste from Python's ``input()`` and no safe way to read a line
off the main thread, which is why it was not chosen.

Colour only when the output is a terminal, ``TERM`` is not ``dumb`` and
``NO_COLOR`` is unset or empty (https://no-color.org).
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path
from typing import Any, TextIO

import trio

from ._display import LINE, visible

__all__ = ["Look", "PromptReader", "Spinner", "data_dir"]


def data_dir() -> Path:
    """Where ``chat`` keeps its default store and input history:
    ``$XDG_DATA_HOME/turnledger`` (``~/.local/share/turnledger``)."""
    base = os.environ.get("XDG_DATA_HOME") or os.path.join(
        os.path.expanduser("~"), ".local", "share"
    )
    return Path(base) / "turnledger"


class Look:
    """How text is shown on ``stream``: escapes for colour, or none."""

    DIM = "\x1b[2m"
    BOLD = "\x1b[1m"
    RED = "\x1b[31m"
    CYAN = "\x1b[36m"
    RESET = "\x1b[0m"

    def __init__(self, stream: TextIO) -> None:
        self.stream = stream
        self.terminal = stream.isatty()
        self.colour = (
            self.terminal
            and not os.environ.get("NO_COLOR")
            and os.environ.get("TERM", "") != "dumb"
        )

    def paint(self, text: str, *codes: str) -> str:
        if not self.colour or not codes:
            return text
        return "".join(codes) + text + self.RESET

    def rows(self, text: str) -> int:
        """Terminal rows ``text`` (as shown, from the start of a line) covers."""
        from prompt_toolkit.utils import get_cwidth

        cols = max(1, shutil.get_terminal_size().columns)
        return sum(max(1, -(-get_cwidth(line) // cols)) for line in text.split("\n"))

    def redraw_dim(self, shown: str) -> bool:
        """Show the ``shown`` text again, dimmed, over itself; False when it
        no longer fits on the screen (then it stays as it is)."""
        if not self.colour or not shown:
            return False
        rows = self.rows(shown)
        if rows >= shutil.get_terminal_size().lines:
            return False
        up = f"\x1b[{rows - 1}A" if rows > 1 else ""
        self.stream.write(f"\r{up}\x1b[J{self.DIM}{shown}{self.RESET}")
        self.stream.flush()
        return True


class Spinner:
    """``waiting…`` with a turning mark until stopped: shown only on a
    terminal, and wiped from the line when it stops."""

    FRAMES = "|/-\\"

    def __init__(self, look: Look, interval: float = 0.12) -> None:
        self.look = look
        self.interval = interval
        self.scope = trio.CancelScope()
        self.shown = False

    async def run(self) -> None:
        if not self.look.terminal:
            return
        with self.scope:
            i = 0
            while True:
                frame = self.FRAMES[i % len(self.FRAMES)]
                self.look.stream.write("\r" + self.look.paint(f"{frame} waiting…", Look.DIM))
                self.look.stream.flush()
                self.shown = LINE.spinner = True
                i += 1
                await trio.sleep(self.interval)

    def stop(self) -> None:
        """Stop and wipe it (idempotent)."""
        self.scope.cancel()
        if self.shown:
            self.look.stream.write("\r\x1b[K")
            self.look.stream.flush()
            self.shown = LINE.spinner = False


class PromptReader:
    """Questions from a person at a terminal, with prompt_toolkit."""

    def __init__(self, history_file: Path | None, look: Look) -> None:
        from prompt_toolkit import PromptSession
        from prompt_toolkit.history import FileHistory, History, InMemoryHistory
        from prompt_toolkit.key_binding import KeyBindings

        bindings = KeyBindings()

        @bindings.add("escape", "enter")
        def _newline(event: Any) -> None:
            event.current_buffer.insert_text("\n")

        history: History = InMemoryHistory()
        if history_file is not None:
            try:
                history_file.parent.mkdir(parents=True, exist_ok=True)
                history = FileHistory(str(history_file))
            except OSError:
                pass  # no history across runs, but the chat works
        self.look = look
        self.session: Any = PromptSession(
            history=history,
            key_bindings=bindings,
            prompt_continuation=lambda width, line, wrap: "." * (width - 1) + " ",
            enable_history_search=False,
        )

    def _read(self) -> str | None:
        try:
            text: str = self.session.prompt(
                [("bold", "you> ")] if self.look.colour else "you> ",
            )
        except (EOFError, KeyboardInterrupt):
            # ^D or ^C at the prompt: the end of the chat. The shell's
            # prompt must start on a line of its own.
            self.look.stream.write("\n")
            self.look.stream.flush()
            return None
        return text

    async def read(self) -> str | None:
        """The next question (lines of a paste kept together), or None at the
        end (^D, ^C)."""
        return await trio.to_thread.run_sync(self._read, abandon_on_cancel=True)


def shown_text(text: str) -> str:
    """Answer text as the terminal shows it."""
    return visible(text, lines=True)
