"""What the command-line modules share: ending with an exit code, and
showing a store's name without its password."""

from __future__ import annotations

import urllib.parse


class Exit(Exception):
    """End the command with ``code``, printing ``message`` on stderr."""

    def __init__(self, code: int, message: str = "") -> None:
        super().__init__(message)
        self.code = code
        self.message = message


def display_db(db: str) -> str:
    """``db`` as it may be printed: a URL's password is replaced by ``***``."""
    try:
        parts = urllib.parse.urlsplit(db)
    except ValueError:
        return db
    if not parts.scheme or parts.password is None:
        return db
    host = parts.netloc.rpartition("@")[2]
    user = parts.username or ""
    return urllib.parse.urlunsplit(parts._replace(netloc=f"{user}:***@{host}"))
