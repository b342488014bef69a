"""What the command-line modules share: ending with an exit code, and
showing a store's name without its password."""

from __future__ import annotations

import argparse
import os
import re
import stat
import urllib.parse
from collections.abc import Callable, Iterable


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


#: What a terminal would act on instead of showing: C0 controls, DEL, C1
#: controls (``\x9b`` starts an escape sequence on some terminals), the
#: line and paragraph separators, and the bidirectional overrides that
#: reorder what is shown.
_OTHER_INVISIBLE = "\x7f-\x9f\u200e\u200f\u2028\u2029\u202a-\u202e\u2066-\u2069"
_ONE_LINE = re.compile(f"[\x00-\x1f{_OTHER_INVISIBLE}]")
#: The same, but tab (``\x09``) and newline (``\x0a``) stay.
_MULTI_LINE = re.compile(f"[\x00-\x08\x0b-\x1f{_OTHER_INVISIBLE}]")
#: What JSON leaves raw but a terminal acts on (``json.dumps`` escapes C0).
_JSON_INVISIBLE = re.compile(f"[{_OTHER_INVISIBLE}]")


def _escape(match: re.Match[str]) -> str:
    code = ord(match[0])
    return f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}"


def visible(text: str, *, lines: bool = False) -> str:
    """``text`` as it may be printed to a terminal: every control character
    shown as an escape (``\\x1b``, ``\\r``, ``\\x07``...). With ``lines``,
    newlines and tabs stay (an answer printed as it was written)."""
    return (_MULTI_LINE if lines else _ONE_LINE).sub(_escape, text)


def visible_json(text: str) -> str:
    """A JSON document with the characters ``json.dumps`` leaves raw but a
    terminal acts on (DEL, C1 controls, bidirectional overrides) written as
    ``\\uXXXX`` escapes: they only occur inside strings, so the document
    still parses to the same value."""
    return _JSON_INVISIBLE.sub(lambda m: f"\\u{ord(m[0]):04x}", text)


def text_arg(text: str) -> str:
    """An argument that names something (a session id, a system prompt):
    not empty, and Unicode that can be stored (no lone surrogate, which is
    what a non-UTF-8 byte in the command line becomes)."""
    if not text:
        raise argparse.ArgumentTypeError("must not be empty")
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        raise argparse.ArgumentTypeError(
            f"not valid Unicode: {text.encode('utf-8', 'backslashreplace').decode()!r}"
        ) from None
    return text


def at_least(low: int) -> Callable[[str], int]:
    """An integer argument of at least ``low``."""

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"not an integer: {text!r}") from None
        if value < low:
            raise argparse.ArgumentTypeError(f"must be at least {low}, not {value}")
        return value

    return parse


def http_url(text: str) -> str:
    """An ``http://`` or ``https://`` URL with a host."""
    try:
        parts = urllib.parse.urlsplit(text)
        parts.port  # noqa: B018 - raises for a port that is not a number
    except ValueError as exc:
        raise argparse.ArgumentTypeError(f"not a URL: {exc}") from None
    if parts.scheme.lower() not in ("http", "https") or not parts.hostname:
        raise argparse.ArgumentTypeError(f"not an http:// or https:// URL: {visible(text)!r}")
    return text


def check_db_path(db: str, kind: str) -> None:
    """Refuse, as a usage error, a ``db`` path that names a directory or a
    device rather than a store file (SQLite would say "disk I/O error")."""
    if kind == "postgres":
        return
    try:
        mode = os.stat(db).st_mode
    except OSError:
        return  # missing (created, or "no such file") or unreadable: the store says
    if stat.S_ISREG(mode):
        return
    what = "a directory" if stat.S_ISDIR(mode) else "a device or other special file"
    raise Exit(2, f"{visible(display_db(db))} is {what}, not a store file")
