"""Payload JSON shared by the durable stores.

Writing uses the standard library (``allow_nan=False``: NaN and infinities are
not JSON, so a batch holding one is refused whole). Reading uses orjson when it
is installed, with the exact semantics of :func:`json.loads`: orjson turns an
integer beyond 64 bits into a float and refuses lone surrogates, so a result
that holds any float, or that orjson refuses, is parsed again by the standard
library. Event payloads never hold floats, so the second parse is rare.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Mapping
from typing import Any

from ..._errors import StoreError
from ...events import StoredEvent

try:
    import orjson
except ImportError:  # pragma: no cover - orjson is a dependency; stay usable without it
    fast_loads: Callable[[str | bytes], Any] | None = None
else:
    fast_loads = orjson.loads

__all__ = ["check_envelope", "dumps_payload", "fast_loads", "has_float", "loads_payload"]

_dumps_utf8 = json.JSONEncoder(ensure_ascii=False, allow_nan=False, separators=(",", ":")).encode
_dumps_ascii = json.JSONEncoder(ensure_ascii=True, allow_nan=False, separators=(",", ":")).encode


def dumps_payload(payload: Mapping[str, Any]) -> str:
    """Compact JSON text of ``payload``, encodable as UTF-8.

    Text is kept readable (``ensure_ascii=False``); a string holding a lone
    surrogate cannot be UTF-8, so such a payload is written with ``\\u``
    escapes instead, which read back exactly.

    Raises:
        StoreError: the payload is not a JSON object of JSON values.
    """
    if not isinstance(payload, dict):
        raise StoreError(f"payload must be a dict, not {type(payload).__name__}")
    try:
        text = _dumps_utf8(payload)
    except (TypeError, ValueError) as exc:
        raise StoreError(f"payload is not JSON-able: {exc}") from exc
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        text = _dumps_ascii(payload)
    return text


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


def loads_payload(text: str | bytes) -> Any:
    """Parse JSON text exactly as :func:`json.loads` would (faster when orjson
    is installed). Raises ``ValueError`` on bad JSON."""
    if fast_loads is not None:
        try:
            value = fast_loads(text)
        except ValueError:
            pass
        else:
            if not has_float(value):
                return value
    return json.loads(text)


def check_envelope(ev: StoredEvent) -> float:
    """Refuse envelope fields a durable store cannot keep exactly; return
    ``recorded_at`` as a float."""
    if type(ev.tag) is not str or type(ev.schema_version) is not int:
        raise StoreError(f"event seq {ev.seq}: tag must be a str and schema_version an int")
    try:
        recorded_at = float(ev.recorded_at)
    except (TypeError, ValueError) as exc:
        raise StoreError(f"event seq {ev.seq}: recorded_at is not a number") from exc
    if not math.isfinite(recorded_at):
        raise StoreError(f"event seq {ev.seq}: recorded_at is not finite")
    return recorded_at
