"""Payload JSON shared by the durable stores.

Writing uses the standard library (``allow_nan=False``: NaN and infinities are
not JSON, so a batch holding one is refused whole). Reading uses
:func:`turnledger.events._exact_json.loads_exact`: the exact semantics of
:func:`json.loads`, faster with orjson.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from typing import Any, Final, TypeVar

from ..._errors import StoreError
from ...events import EventDecoder, PayloadNotJSON, StoredEvent
from ...events._exact_json import loads_exact
from ...events._store import damage
from ...events.codec import ENCRYPTED_FIELD

__all__ = [
    "SEALED_BLOB",
    "check_envelope",
    "damage",
    "decode_rows",
    "dumps_payload",
    "loads_payload",
    "payload_value",
    "sealed_text",
]

_T = TypeVar("_T")
_I = TypeVar("_I")

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
    if len(payload) == 1:
        # An encrypted payload (turnledger.adapters.encryption): its one
        # value is hex, which JSON writes as is (ASCII letters and digits
        # need no escape; the bytes test is the fast one).
        sealed = payload.get(ENCRYPTED_FIELD)
        if type(sealed) is str and sealed.isascii() and sealed.encode("ascii").isalnum():
            return '{"' + ENCRYPTED_FIELD + '":"' + sealed + '"}'
    try:
        text = _dumps_utf8(payload)
    except (TypeError, ValueError) as exc:
        raise StoreError(f"payload is not JSON-able: {exc}") from exc
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        text = _dumps_ascii(payload)
    return text


#: The first byte of a sealed payload kept as bytes (format 2 of encrypted
#: rows, in stores that keep bytes: SQLite). Then come the nonce and the
#: ciphertext. No JSON text starts with it, so a row says by its first byte
#: whether it is JSON text (plaintext, or format 1: ``{"$enc": "<hex>"}``)
#: or sealed bytes.
SEALED_BLOB: Final = b"\x01"


def payload_value(payload: Mapping[str, Any]) -> str | bytes:
    """What a store that keeps bytes writes for ``payload``: a sealed
    payload given as bytes (``{"$enc": b"<nonce + ciphertext>"}``) as
    :data:`SEALED_BLOB` and those bytes, anything else as
    :func:`dumps_payload` text."""
    if len(payload) == 1 and type(payload) is dict:
        sealed = payload.get(ENCRYPTED_FIELD)
        if type(sealed) is bytes:
            return SEALED_BLOB + sealed
    return dumps_payload(payload)


def sealed_text(value: str | bytes) -> str | bytes:
    """``value`` as JSON text: a :data:`SEALED_BLOB` row as the format 1
    text of the same ciphertext (``{"$enc": "<hex>"}``), what every reader
    of envelopes, and a decoder without the key, understands; anything
    else as it is."""
    if type(value) is bytes and value.startswith(SEALED_BLOB):
        return '{"' + ENCRYPTED_FIELD + '":"' + value[1:].hex() + '"}'
    return value


#: Parse stored payload text exactly as :func:`json.loads` would.
loads_payload = loads_exact


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


def decode_rows(
    where: str, session_id: str, rows: list[tuple[Any, ...]], decoder: EventDecoder[_T]
) -> list[_T]:
    """``decoder.decode_rows`` of ``(seq, tag, schema_version, text)`` rows,
    with :class:`PayloadNotJSON` reported as ``StoreCorrupted`` naming the
    event (``where`` prefixes the message); anything else propagates."""
    try:
        return decoder.decode_rows(session_id, rows)
    except PayloadNotJSON:
        # Sealed bytes given to a decoder that does not open them (no key):
        # read as their format 1 text, which it refuses as encrypted.
        if any(type(row[3]) is bytes and row[3].startswith(SEALED_BLOB) for row in rows):
            text = [(*row[:3], sealed_text(row[3]), *row[4:]) for row in rows]
            return decode_rows(where, session_id, text, decoder)
        error = damage(
            where,
            session_id,
            [(row[0], row) for row in rows],
            lambda row: decoder.decode_rows(session_id, [row]),
        )
        raise error from error.__cause__
