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
Integers beyond 64 bits come back as floats (orjson's rule); token counts
never get there.
"""

from __future__ import annotations

import json
import re
from typing import Any

import orjson

from ..._errors import DecodeError

__all__ = ["loads_strict"]

_loads = orjson.loads
_dumps = orjson.dumps
_JSONDecodeError = orjson.JSONDecodeError
_JSONEncodeError = orjson.JSONEncodeError

# A JSON string token (quotes included), unrolled for speed.
_STRING = re.compile(r'"[^"\\]*(?:\\.[^"\\]*)*"', re.DOTALL)
_BRACKETS = re.compile(r"[\[\]{}]")
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


def loads_strict(text: str, *, max_depth: int = 16) -> Any:
    """Parse one JSON text strictly.

    Args:
        text: the JSON text.
        max_depth: the deepest nesting allowed.

    Raises:
        DecodeError: the text is not one strict JSON value. The message never
            quotes the input.
    """
    try:
        value = _loads(text)  # orjson stops at depth 1024: no stack overflow
    except _JSONDecodeError as exc:
        raise DecodeError(f"invalid JSON: {exc.msg} at character {exc.pos}") from None
    kind = type(value)
    if kind is not dict and kind is not list:
        return value
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
    if "\\u003" in text:
        try:
            _STDLIB.decode(text)
        except _Duplicate:
            raise DecodeError(_DUPLICATE) from None
        except ValueError:
            raise DecodeError("invalid JSON") from None
    elif dumped.count(b":") != text.count(":"):
        raise DecodeError(_DUPLICATE)
    return value
