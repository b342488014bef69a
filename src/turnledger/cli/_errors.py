"""How a command ends: the exit codes, :class:`Exit`, and messages that
never show a password."""

from __future__ import annotations

import os
import re
import urllib.parse
from collections.abc import Iterable

__all__ = [
    "EXIT_FAILED",
    "EXIT_INTERRUPTED",
    "EXIT_NOT_FOUND",
    "EXIT_OK",
    "EXIT_STORE",
    "EXIT_USAGE",
    "Exit",
    "display_db",
    "scrub",
    "secrets_of",
]

EXIT_OK = 0
EXIT_FAILED = 1
EXIT_USAGE = 2
EXIT_STORE = 3
EXIT_NOT_FOUND = 4
EXIT_INTERRUPTED = 130


class Exit(Exception):
    """End the command with ``code``, printing ``message`` on stderr."""

    def __init__(self, code: int, message: str = "") -> None:
        super().__init__(message)
        self.code = code
        self.message = message


#: A ``password=`` (or ``sslpassword=``) value in a libpq keyword string or a
#: URL query: single-quoted with backslash escapes, or up to the next blank.
_KEYWORD_PASSWORD = re.compile(
    r"(?P<key>\b(?:ssl)?password\s*=\s*)(?P<value>'(?:[^'\\]|\\.)*'?|(?:[^\s'\\]|\\.)+)",
    re.IGNORECASE,
)
_MASK = "***"


def _unquote_keyword(value: str) -> str:
    if value.startswith("'"):
        value = value[1:-1] if len(value) > 1 and value.endswith("'") else value[1:]
    return re.sub(r"\\(.)", r"\1", value)


def display_db(db: str) -> str:
    """``db`` as it may be printed: every password in it is replaced by
    ``***``, whatever the form (a URL's ``user:password@``, a ``password=``
    keyword or URL query field, quoted or not)."""
    shown = _KEYWORD_PASSWORD.sub(lambda m: m["key"] + _MASK, db)
    scheme, sep, rest = shown.partition("://")
    if not sep or "@" not in rest:
        return shown
    try:
        parts = urllib.parse.urlsplit(shown)
        password = parts.password
    except ValueError:
        # Not a URL Python can split: hide everything before the last "@".
        return f"{scheme}://{_MASK}@{rest.rpartition('@')[2]}"
    if password is None:
        return shown
    host = parts.netloc.rpartition("@")[2]
    user = parts.username or ""
    return urllib.parse.urlunsplit(parts._replace(netloc=f"{user}:{_MASK}@{host}"))


def secrets_of(db: str | None) -> set[str]:
    """The passwords ``db`` holds, and ``PGPASSWORD``: text that must not
    appear in any message, even when an error quotes the connection."""
    found = {os.environ.get("PGPASSWORD", "")}
    if db:
        for match in _KEYWORD_PASSWORD.finditer(db):
            raw = match["value"]
            found |= {raw, _unquote_keyword(raw), urllib.parse.unquote(raw)}
        _, sep, rest = db.partition("://")
        if sep and "@" in rest:
            userinfo = rest.rpartition("@")[0]
            if ":" in userinfo:
                raw = userinfo.partition(":")[2]
                found |= {raw, urllib.parse.unquote(raw)}
    return {s for s in found if s}


def scrub(text: str, secrets: Iterable[str]) -> str:
    """``text`` with every one of ``secrets`` replaced by ``***``."""
    for secret in sorted(secrets, key=len, reverse=True):
        text = text.replace(secret, _MASK)
    return text
