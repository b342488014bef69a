"""Text to JSON, strictly (RFC 8259 plus the rules a ledger needs).

Pure: imports no I/O library.

Each of these is a :class:`~turnledger.DecodeError`:

- a duplicate key in any object (RFC 8259 leaves the meaning open; two
  parsers may pick different values, so a ledger must refuse it);
- trailing data after the value (``{"a":1}{"b":2}``, ``{"a":1} x``);
- ``NaN``, ``Infinity``, ``-Infinity`` and numbers that overflow a double
  (``1e999``);
- nesting deeper than ``max_depth`` (the outermost value is depth 1);
- an escaped lone surrogate (``"\\ud800"``): it has no UTF-8 form and would
  break every store downstream;
- everything else outside RFC 8259 (single quotes, comments, trailing
  commas, control characters in strings, leading zeros, a BOM, ...).

How. orjson parses: it is strict about all of the above except duplicate
keys, and 2-2.5x faster than ``json.loads`` on chat chunks, which is what
lets the strict SSE+JSON path beat httpx-sse with ``json.loads`` (see
``benchmarks/streaming.py``); the standard library with an
``object_pairs_hook`` was no faster than the baseline. Duplicate keys are
found without a second parse: in a JSON text every ``:`` outside strings
separates one key from its value, so::

    text.count(":") == pairs + colons inside strings
    orjson.dumps(value).count(b":") == distinct keys kept + colons inside strings

and the two are equal exactly when no object lost a key, provided no colon
inside a string was written as the escape ``\\u003a`` (orjson writes colons
raw). When the text contains ``\\u003`` the standard library parses it again
with an ``object_pairs_hook`` that refuses duplicates. Before counting, the
common case is settled by one comparison: compact servers that write raw
UTF-8 send exactly ``orjson.dumps(value)``, which has no duplicates.
Integers stay exact. orjson returns an integer beyond 64 bits as a float;
such a value never dumps back to the text it came from, so only when the
canonical comparison fails and the text holds a run of 19 or more digits is
the text parsed again by the standard library (exact integers, duplicates
refused). orjson has accepted it by then, so every rule above still holds.
An integer too long for a double (over 308 digits) is refused, as ``1e999``.

:func:`loads_object` is the parser for provider chunks: the same rules, and a
top-level value that is not an object is an error too.
"""

from __future__ import annotations

import json
import re
from typing import Any

import orjson

from .._errors import DecodeError

__all__ = ["loads_object", "loads_strict"]

_loads = orjson.loads
_dumps = orjson.dumps
_JSONDecodeError = orjson.JSONDecodeError
_JSONEncodeError = orjson.JSONEncodeError

# A JSON string token (quotes included), unrolled for speed.
_STRING = re.compile(r'"[^"\\]*(?:\\.[^"\\]*)*"', re.DOTALL)
_BRACKETS = re.compile(r"[\[\]{}]")
# 19 digits may already be past a 64-bit integer (below -2**63).
_LONG_DIGITS = re.compile(r"[0-9]{19}")
_DUPLICATE = "a JSON object has a duplicate key"


class _Duplicate(ValueError):
    pass


def _pairs(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    obj = dict(pairs)
    if len(obj) != len(pairs):
        raise _Duplicate
    return obj


_STDLIB = json.JSONDecoder(object_pairs_hook=_pairs)


def _too_deep(text: str, max_depth: int) -> bool:
    # Brackets inside strings only make a count larger, so bound first.
    outside = _STRING.sub("", text)
    if outside.count("{") + outside.count("[") <= max_depth:
        return False
    depth = 0
    for bracket in _BRACKETS.findall(outside):
        if bracket in "[{":
            depth += 1
            if depth > max_depth:
                return True
        else:
            depth -= 1
    return False


def _parse(text: str) -> Any:
    try:
        return _loads(text)  # orjson stops at depth 1024: no stack overflow
    except _JSONDecodeError as exc:
        raise DecodeError(f"invalid JSON: {exc.msg} at character {exc.pos}") from None


def loads_strict(text: str, *, max_depth: int = 16) -> Any:
    """Parse one JSON text strictly.

    Args:
        text: the JSON text.
        max_depth: the deepest nesting allowed.

    Raises:
        DecodeError: the text is not one strict JSON value. The message never
            quotes the input.
    """
    value = _parse(text)
    kind = type(value)
    if kind is not dict and kind is not list:
        if kind is float and _LONG_DIGITS.search(text):
            return _exact(text)
        return value
    return _checked(text, value, max_depth)


def loads_object(text: str, *, max_depth: int = 16) -> dict[str, Any]:
    """Parse one JSON text strictly (as :func:`loads_strict`) that must be an object.

    Raises:
        DecodeError: the text is not one strict JSON value, or the value is
            not an object.
    """
    value = _parse(text)
    if type(value) is not dict:
        raise DecodeError(f"a JSON {_KINDS.get(type(value), 'value')} where an object belongs")
    result: dict[str, Any] = _checked(text, value, max_depth)
    return result


_KINDS: dict[type, str] = {
    list: "array",
    str: "string",
    int: "number",
    float: "number",
    bool: "boolean",
    type(None): "null",
}


def _checked(text: str, value: Any, max_depth: int) -> Any:
    # The rules orjson does not apply, for an object or array it parsed.
    try:
        dumped = _dumps(value)
    except _JSONEncodeError:  # nested deeper than orjson writes (255)
        raise DecodeError(f"JSON nested deeper than {max_depth} levels") from None
    # Depth: a bound on the text first (brackets in strings only add to it).
    if text.count("{") + text.count("[") > max_depth and _too_deep(text, max_depth):
        raise DecodeError(f"JSON nested deeper than {max_depth} levels")
    if dumped == text.encode():
        # The text is exactly the canonical form of what was parsed (compact
        # servers with raw UTF-8 send that): nothing was lost, no duplicates.
        return value
    if "\\u003" in text or _LONG_DIGITS.search(text):
        return _exact(text)
    if dumped.count(b":") != text.count(":"):
        raise DecodeError(_DUPLICATE)
    return value


def _exact(text: str) -> Any:
    # The standard library's parse of a text orjson accepted: integers exact,
    # duplicate keys refused (the depth is already checked, so no recursion
    # limit is near).
    try:
        return _STDLIB.decode(text)
    except _Duplicate:
        raise DecodeError(_DUPLICATE) from None
    except ValueError:
        raise DecodeError("invalid JSON") from None
