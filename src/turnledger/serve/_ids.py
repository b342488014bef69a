"""Session and request ids in the HTTP API's paths: one rule, both ways.

The library takes any non-empty text as an id, so the API addresses every
such id. In a path an id is one segment: its UTF-8 bytes percent-encoded
(as JavaScript's ``encodeURIComponent`` does). Two ids cannot travel that
way: ``.`` and ``..``, which URL parsers remove as dot segments, even
written ``%2e``. Those, and every id that starts with ``~``, travel with a
``~`` in front (``~.``, ``~..``, ``~~home``), so a segment starting with
``~`` always means "drop the ``~``". Ids of ``A-Z a-z 0-9 - _ .`` (other than
those two) travel as they are. The page's script mirrors :func:`quote_id`.
Pure: no I/O.
"""

from __future__ import annotations

from urllib.parse import quote, unquote_to_bytes

__all__ = ["quote_id", "unquote_id"]

_ESCAPE = "~"
#: What ``encodeURIComponent`` leaves as it is, beyond ``quote``'s own set.
_SAFE = "!'()*"


def quote_id(value: str) -> str:
    """The path segment that addresses the id ``value`` in the HTTP API.

    Raises:
        ValueError: ``value`` is empty or not valid Unicode text (a lone
            surrogate), so no session can have it.
    """
    if not value:
        raise ValueError("an id is a non-empty string")
    escape = value in (".", "..") or value.startswith(_ESCAPE)
    try:
        return (_ESCAPE if escape else "") + quote(value, safe=_SAFE, errors="strict")
    except UnicodeEncodeError:
        raise ValueError("an id must be valid Unicode text") from None


def unquote_id(segment: str) -> str:
    """The id a path segment addresses (the inverse of :func:`quote_id`).

    Percent-escapes are decoded first, so ``%7Ex`` is ``~x`` (the id ``x``):
    an escaped character is the same character in a URL.

    Raises:
        ValueError: the segment is not one :func:`quote_id` can give: its
            bytes are not UTF-8, it is empty once decoded, or it is a bare
            ``.`` or ``..``.
    """
    try:
        text = unquote_to_bytes(segment).decode("utf-8")
    except UnicodeDecodeError:
        raise ValueError("the percent-encoded bytes of an id must be UTF-8") from None
    if text in (".", ".."):
        raise ValueError(f"the id {text!r} is written ~{text} in a path")
    if text.startswith(_ESCAPE):
        text = text[1:]
    if not text:
        raise ValueError("an id is a non-empty string")
    return text
