"""Exact JSON parsing for stored payloads (pure: no I/O library).

:func:`loads_exact` has the exact semantics of :func:`json.loads` and is
faster, through orjson. orjson differs from the standard library in
two ways: it turns an integer beyond 64 bits into a float, and it refuses the
escape of a lone surrogate. So a result that holds any float, or that orjson
refuses, is parsed again by the standard library. Event payloads never hold
floats, so the second parse is rare.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import orjson

fast_loads: Callable[[str | bytes], Any] = orjson.loads

__all__ = ["fast_loads", "has_float", "loads_exact"]


def has_float(value: Any) -> bool:
    """Whether a parsed JSON value holds a float anywhere."""
    # Plain loops: this runs once per event read, on small dicts.
    t = type(value)
    if t is float:
        return True
    if t is dict:
        value = value.values()
    elif t is not list:
        return False
    for v in value:
        t = type(v)
        if t is float:
            return True
        if (t is dict or t is list) and has_float(v):
            return True
    return False


def loads_exact(text: str | bytes) -> Any:
    """Parse JSON text exactly as :func:`json.loads` would.

    Raises:
        ValueError: the text is not JSON (``json.JSONDecodeError``), is nested
            too deeply to parse, or is bytes that are not UTF-8, UTF-16 or
            UTF-32 (``UnicodeDecodeError``).
    """
    try:
        try:
            value = fast_loads(text)
        except ValueError:
            pass
        else:
            if not has_float(value):
                return value
        return json.loads(text)
    except RecursionError:  # nested deeper than the interpreter's stack
        raise ValueError("JSON nested too deeply") from None
