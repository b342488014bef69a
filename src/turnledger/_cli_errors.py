"""How command-line code ends with an exit code and a message."""

from __future__ import annotations


class Exit(Exception):
    """End the command with ``code``, printing ``message`` on stderr."""

    def __init__(self, code: int, message: str = "") -> None:
        super().__init__(message)
        self.code = code
        self.message = message
