"""``EncryptedStore``: any event store, with every payload sealed by its
session's data key (AES-256-GCM).

What is sealed: the whole payload of every event, so every field that can
hold content (system prompt, questions, answers, tool arguments and results,
detail strings) is covered, whatever later schemas add. What stays clear:
the envelope the store orders by (session id, seq, tag, schema version,
recorded time). The associated data of each ciphertext is the store's id,
the session id, the seq, the tag and the schema version: a row moved to
another place fails to open (:class:`~turnledger.DecryptionFailed`).
"""

from __future__ import annotations

import binascii
import hashlib
import os
import threading
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any, Final, TypeVar

import attrs
import orjson
import trio
from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives.ciphers.aead import AESGCM

from ..._errors import (
    ContentEncrypted,
    DecryptionFailed,
    PlaintextRefused,
    StoreError,
    UnknownSession,
    WrongKey,
)
from ..._logging import library_logger
from ...events import DEFAULT_CODEC, EventDecoder, StoredEvent
from ...events._envelope import envelope
from ...events._exact_json import loads_exact
from ...events.codec import ENCRYPTED_FIELD
from ..stores._common import HeldEvents
from ..stores._payloads import SEALED_BLOB, dumps_payload, sealed_text
from ._keyring import KeyRing
from ._providers import KeyProvider

__all__ = ["EncryptedStore", "SealedSnapshots", "rotate_keys"]

_T = TypeVar("_T")
_R = TypeVar("_R")
_NONCE: Final = 12
_LOCKED: Final = (
    "the content is encrypted: give the key (--key-file, TURNLEDGER_KEY_FILE or "
    "TURNLEDGER_KEYS) to read it"
)


def _event_ad(store_id: str, session_id: str, seq: int, tag: str, version: int) -> bytes:
    return orjson.dumps([store_id, session_id, seq, tag, version])


def _finite(value: object) -> bool:
    # No NaN or infinity anywhere (orjson would write them as null).
    stack = [value]
    pop, extend = stack.pop, stack.extend
    while stack:
        v = pop()
        t = type(v)
        if t is str or t is int or v is None or t is bool:
            continue
        if isinstance(v, float):
            if v - v != 0.0:
                return False
        elif isinstance(v, dict):
            extend(v.values())
        elif isinstance(v, list | tuple):
            extend(v)
    return True


def _flat(payload: dict[str, Any]) -> bool:
    # Only text, integers, booleans and nulls: no float can hide in it (most
    # events' payloads, checked without a walk).
    for v in payload.values():
        t = type(v)
        if t is not str and t is not int and v is not None and t is not bool:
            return False
    return True


def _plaintext(payload: dict[str, Any]) -> bytes:
    """The payload's JSON, as exact as the stores' own :func:`dumps_payload`:
    orjson when it is exact (it refuses integers beyond 64 bits, lone
    surrogates and keys that are not strings; a NaN it would write as null is
    checked for when a null appears), else the stores' writer."""
    try:
        out = orjson.dumps(payload)
    except TypeError:
        return dumps_payload(payload).encode("utf-8")
    if b"null" in out and not _flat(payload) and not _finite(payload):
        return dumps_payload(payload).encode("utf-8")  # raises: NaN is not JSON
    return out


_PREFIX: Final = '{"' + ENCRYPTED_FIELD + '":"'
_PREFIX_B: Final = _PREFIX.encode("ascii")


def _sealed_of_text(session_id: str, seq: int, text: str | bytes) -> str | bytes:
    """The hex inside a row's JSON text: sliced out when the text is
    exactly what :func:`dumps_payload` writes for a sealed payload, else
    parsed (and a plaintext row refused)."""
    text = sealed_text(text)  # sealed bytes: as their hex text
    if isinstance(text, bytes):
        if text.startswith(_PREFIX_B) and text.endswith(b'"}') and text.count(b'"') == 4:
            return text[len(_PREFIX_B) : -2]
    elif text.startswith(_PREFIX) and text.endswith('"}') and text.count('"') == 4:
        return text[len(_PREFIX) : -2]
    try:
        payload = orjson.loads(text)
    except orjson.JSONDecodeError:
        payload = None
    return _sealed_text(session_id, seq, payload)


def _key_ad(store_id: str, session_id: str) -> bytes:
    return orjson.dumps(["data-key", store_id, session_id])


def _sealed_text(session_id: str, seq: int, payload: object) -> str:
    # The one shape an encrypted row may have: {"$enc": "<hex>"} (hex, not
    # base64: twice as fast both ways in CPython, for a third more bytes).
    if type(payload) is dict and len(payload) == 1:
        value = payload.get(ENCRYPTED_FIELD)
        if type(value) is str:
            return value
    raise PlaintextRefused(
        f"session {session_id!r} seq {seq}: a plaintext row in an encrypted store is refused"
    )


def _open(
    aead: AESGCM | None,
    store_id: str,
    session_id: str,
    seq: int,
    tag: str,
    version: int,
    sealed: str | bytes,
) -> bytes:
    if aead is None:
        raise WrongKey(
            f"session {session_id!r} has no data key (erased, or the key ring is missing): "
            "its content cannot be read"
        )
    try:
        raw = bytes.fromhex(sealed if isinstance(sealed, str) else sealed.decode("ascii"))
        return aead.decrypt(
            raw[:_NONCE], raw[_NONCE:], _event_ad(store_id, session_id, seq, tag, version)
        )
    except (InvalidTag, ValueError):
        raise DecryptionFailed(
            f"session {session_id!r} seq {seq} ({tag}): the ciphertext does not open here: "
            "wrong key, or the row was moved from another session, position or store"
        ) from None


class _Decrypting:
    """An :class:`EventDecoder` that opens each row, then hands the plaintext
    to the caller's decoder. Runs on the store's I/O thread: the keys it
    needs are loaded beforehand."""

    def __init__(
        self,
        decoder: EventDecoder[_T],
        store_id: str,
        aeads: Mapping[str, AESGCM],
        held: dict[str, dict[int, tuple[StoredEvent, object, Any]]] | None = None,
        fetch: Callable[[str], AESGCM | None] | None = None,
    ) -> None:
        self._decoder = decoder
        self._store_id = store_id
        self._aeads = aeads
        self._held = held
        self._fetch = fetch

    def _aead(self, session_id: str) -> AESGCM | None:
        # The session's data key: cached, or (with ``fetch``) read from the
        # key ring and unwrapped here, on the store's I/O thread, with the
        # session's first read.
        aead = self._aeads.get(session_id)
        if aead is None and self._fetch is not None:
            aead = self._fetch(session_id)
        return aead

    def open_envelope(self, stored: StoredEvent) -> StoredEvent:
        """``stored`` with its payload opened and parsed exactly (as a
        store's ``read`` parses JSON text); kept, for a store that holds its
        events in memory (see :class:`EncryptedStore`)."""
        held = self._held
        if held is None:
            return self._open_envelope(stored)
        sid = stored.session_id
        mine = held.get(sid)
        if mine is None:
            mine = held[sid] = {}
        hit = mine.get(stored.seq)
        if hit is not None and hit[0] is stored and hit[1] is None:
            opened: StoredEvent = hit[2]
            return opened
        opened = self._open_envelope(stored)
        mine[stored.seq] = (stored, None, opened)
        return opened

    def decode_held(self, session_id: str, events: Sequence[StoredEvent]) -> list[Any]:
        """The events of a store that holds them in memory, decoded: each
        one this decoder decoded before (the very same event) is taken as it
        was; the others are opened in one batch (:meth:`decode_rows`) and
        kept."""
        held = self._held
        assert held is not None
        mine = held.get(session_id)
        if mine is None:
            mine = held[session_id] = {}
        decoder = self._decoder
        aead = self._aeads.get(session_id)
        store_id = self._store_id
        ad_head = _event_ad(store_id, session_id, 0, "", 0)[:-7]  # as in decode_rows
        ad_tails: dict[tuple[str, int], bytes] = {}
        unhex = binascii.a2b_hex
        out: list[Any] = []
        todo: list[int] = []
        rows: list[tuple[int, str, int, str | bytes]] = []
        for ev in events:
            seq, tag, version, payload = ev.seq, ev.tag, ev.schema_version, ev.payload
            hit = mine.get(seq)
            if hit is not None and hit[0] is ev and hit[1] is decoder:
                out.append(hit[2])
                continue
            todo.append(len(out))
            out.append(None)
            value = payload.get(ENCRYPTED_FIELD) if len(payload) == 1 else None
            if type(value) is not str or aead is None or type(seq) is not int:
                # plaintext, damage or no key: judged (and refused) as a row
                text = _PREFIX + value + '"}' if type(value) is str else dumps_payload(payload)
                rows.append((seq, tag, version, text))
                continue
            tail = ad_tails.get((tag, version))
            if tail is None:
                tail = ad_tails[(tag, version)] = _event_ad("", "", 0, tag, version)[8:]
            try:
                raw = unhex(value)
                plain = aead.decrypt(raw[:_NONCE], raw[_NONCE:], b"%b%d%b" % (ad_head, seq, tail))
            except (InvalidTag, ValueError):
                plain = _open(aead, store_id, session_id, seq, tag, version, value)
            rows.append((seq, tag, version, plain))
        if rows:
            decoded = decoder.decode_rows(session_id, [self._judged(session_id, r) for r in rows])
            for i, value in zip(todo, decoded, strict=True):
                out[i] = value
                ev = events[i]
                mine[ev.seq] = (ev, decoder, value)
        return out

    def _judged(
        self, session_id: str, row: tuple[int, str, int, str | bytes]
    ) -> tuple[int, str, int, str | bytes]:
        # A row decode_held could not open itself (its text is str) goes
        # through decode_rows' checks; an opened one (bytes) is as it is.
        if isinstance(row[3], bytes):
            return row
        seq, tag, version, text = row
        sealed = _sealed_of_text(session_id, seq, text)
        aead = self._aead(session_id)
        return (
            seq,
            tag,
            version,
            _open(aead, self._store_id, session_id, seq, tag, version, sealed),
        )

    def _open_envelope(self, stored: StoredEvent) -> StoredEvent:
        sid, seq = stored.session_id, stored.seq
        text = self._open_one(stored)
        return envelope(
            sid,
            seq,
            stored.tag,
            stored.schema_version,
            loads_exact(text.decode("utf-8")),
            stored.recorded_at,
            stored.position,
        )

    def _open_one(self, stored: StoredEvent) -> bytes:
        sid, seq = stored.session_id, stored.seq
        sealed = _sealed_text(sid, seq, stored.payload)
        aead = self._aead(sid)
        return _open(aead, self._store_id, sid, seq, stored.tag, stored.schema_version, sealed)

    def decode(self, stored: StoredEvent) -> Any:
        # The plaintext is JSON text: decoded as the rows of a store that
        # keeps text are (the caller's fast path), which is what decoding
        # its parsed envelope gives.
        row = (stored.seq, stored.tag, stored.schema_version, self._open_one(stored))
        return self._decoder.decode_rows(stored.session_id, [row])[0]

    def decode_rows(
        self, session_id: str, rows: Iterable[tuple[int, str, int, str | bytes]]
    ) -> list[Any]:
        aead = self._aead(session_id)
        store_id = self._store_id
        opened: list[tuple[int, str, int, str | bytes]] = []
        append = opened.append
        if aead is None:  # every row fails alike: say so for the first
            for seq, tag, version, text in rows:
                sealed = _sealed_of_text(session_id, seq, text)
                _open(None, store_id, session_id, seq, tag, version, sealed)
            return self._decoder.decode_rows(session_id, opened)
        # The replay loop: _sealed_of_text and _open inlined for the common
        # row (text as written by dumps_payload; bytes from a store that
        # reads its UTF-8, str from one that reads text), since it runs per
        # event. The hex is unhexed in place (a memoryview, no copy, no
        # decode to str), and the associated data is built from a prefix
        # made once per session: byte for byte what _event_ad writes.
        decrypt = aead.decrypt
        unhex = binascii.a2b_hex
        ad_head = _event_ad(store_id, session_id, 0, "", 0)[:-7]  # '["store","session",'
        ad_tails: dict[tuple[str, int], bytes] = {}
        start = len(_PREFIX)
        for seq, tag, version, text in rows:
            tail = ad_tails.get((tag, version))
            if tail is None:
                tail = ad_tails[(tag, version)] = _event_ad("", "", 0, tag, version)[8:]
            ad = b"%b%d%b" % (ad_head, seq, tail) if type(seq) is int else b""
            hexed: str | memoryview | None = None
            if isinstance(text, bytes):
                if text.startswith(SEALED_BLOB):  # format 2: no hex to undo
                    try:
                        plain = decrypt(text[1 : 1 + _NONCE], text[1 + _NONCE :], ad)
                    except InvalidTag:
                        hexed_text = sealed_text(text)[start:-2]
                        plain = _open(aead, store_id, session_id, seq, tag, version, hexed_text)
                    append((seq, tag, version, plain))
                    continue
                if text.startswith(_PREFIX_B) and text.endswith(b'"}'):
                    hexed = memoryview(text)[start:-2]
            elif text.startswith(_PREFIX) and text.endswith('"}'):
                hexed = text[start:-2]
            if hexed is not None:
                # Format 1. (A quote inside is not hex: a2b_hex refuses it,
                # and the row is judged below, plaintext or damaged.)
                try:
                    raw = unhex(hexed)
                    append((seq, tag, version, decrypt(raw[:_NONCE], raw[_NONCE:], ad)))
                    continue
                except (InvalidTag, ValueError, TypeError):
                    pass
            sealed = _sealed_of_text(session_id, seq, text)
            append(
                (seq, tag, version, _open(aead, store_id, session_id, seq, tag, version, sealed))
            )
        return self._decoder.decode_rows(session_id, opened)


class EncryptedStore:
    """An event store whose payloads are sealed per session (see the module).

    Built by :func:`~turnledger.adapters.stores.open_store` with ``keys=``
    (or directly over any store and :class:`KeyRing`). Without a provider
    (``keys=None``) it is *locked*: it lists sessions, but reading content
    raises :class:`~turnledger.ContentEncrypted` and appending raises
    :class:`~turnledger.PlaintextRefused`. Any other attribute (``path``,
    ``stats``, ...) is the inner store's.
    """

    def __init__(self, inner: Any, ring: KeyRing | None, keys: KeyProvider | None) -> None:
        self.inner = inner
        self.ring = ring
        self.keys = keys
        self._aeads: dict[str, AESGCM] = {}
        self._nonces: dict[str, list[Any]] = {}
        # Data keys are unwrapped on worker threads, and a key destroyed
        # meanwhile must not be cached: every drop from the cache bumps
        # the epoch (under the lock), and a key fetched before a bump is
        # used for its own read only, never cached.
        self._cache_lock = threading.Lock()
        self._epoch = 0
        # With a ring that reads on the calling thread and a provider that
        # unwraps in memory, a session's data key is fetched and unwrapped
        # on the store's I/O thread within the session's first read: no
        # thread hop of its own (see docs/encryption.md, What it costs).
        self._fetch_with_rows = (
            keys is not None
            and bool(getattr(keys, "unwraps_in_memory", False))
            and hasattr(ring, "get_many_blocking")
        )
        # Sealed payloads as bytes where the inner store keeps bytes
        # (format 2), else as hex in JSON text (format 1).
        self._blobs = bool(getattr(inner, "sealed_blobs", False))
        # A store that holds its events parsed in memory (the journal, the
        # memory store) has each sealed event opened once, as its plaintext
        # twin holds them parsed: session id -> seq -> (the sealed event,
        # the decoder or None, its decoded event or opened envelope), valid
        # while the store still holds that very event. Dropped with the
        # session's key.
        self._held: dict[str, dict[int, tuple[StoredEvent, object, Any]]] | None = (
            {} if isinstance(inner, HeldEvents) else None
        )

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)

    @property
    def locked(self) -> bool:
        """True without a key: content cannot be read or written."""
        return self.keys is None or self.ring is None

    def _ring(self) -> tuple[KeyRing, KeyProvider]:
        if self.keys is None or self.ring is None:
            raise ContentEncrypted(_LOCKED)
        return self.ring, self.keys

    # --- keys ---------------------------------------------------------------

    def _cache(self, epoch: int, aeads: Mapping[str, AESGCM]) -> None:
        # Keep keys fetched since ``epoch`` unless one was dropped meanwhile.
        with self._cache_lock:
            if self._epoch == epoch:
                for sid, aead in aeads.items():
                    self._aeads.setdefault(sid, aead)

    def _unwrap_blocking(self, session_ids: Sequence[str]) -> dict[str, AESGCM]:
        """Read and unwrap those sessions' data keys on this (worker)
        thread, in one call, and cache them (see ``_epoch``)."""
        ring, keys = self._ring()
        with self._cache_lock:
            epoch = self._epoch
        wrapped = ring.get_many_blocking(session_ids)  # type: ignore[attr-defined]
        store_id = ring.store_id
        out = {sid: AESGCM(keys.unwrap(w, _key_ad(store_id, sid))) for sid, w in wrapped.items()}
        self._cache(epoch, out)
        return out

    def _fetch_one(self, session_id: str) -> AESGCM | None:
        return self._unwrap_blocking([session_id]).get(session_id)

    async def _load(self, session_ids: Iterable[str]) -> None:
        """Unwrap into the cache the data keys of those sessions that have one."""
        missing = [sid for sid in dict.fromkeys(session_ids) if sid not in self._aeads]
        if not missing:
            return
        ring, keys = self._ring()
        if hasattr(ring, "get_many_blocking"):  # read and unwrap in one thread hop
            await trio.to_thread.run_sync(self._unwrap_blocking, missing)
            return
        with self._cache_lock:
            epoch = self._epoch
        wrapped = await ring.get_many(missing)
        if not wrapped:
            return
        store_id = ring.store_id

        def unwrap() -> dict[str, AESGCM]:
            return {
                sid: AESGCM(keys.unwrap(w, _key_ad(store_id, sid))) for sid, w in wrapped.items()
            }

        self._cache(epoch, await trio.to_thread.run_sync(unwrap))

    async def _key_for_writing(self, session_id: str) -> AESGCM:
        await self._load([session_id])
        aead = self._aeads.get(session_id)
        if aead is not None:
            return aead
        ring, keys = self._ring()
        context = _key_ad(ring.store_id, session_id)
        data_key = AESGCM.generate_key(bit_length=256)
        wrapped = await trio.to_thread.run_sync(keys.wrap, data_key, context)
        kept = await ring.add(session_id, wrapped)
        if kept != wrapped:  # another writer made the session's key first
            data_key = await trio.to_thread.run_sync(keys.unwrap, kept, context)
        aead = self._aeads[session_id] = AESGCM(data_key)
        return aead

    async def check_keys(self) -> None:
        """Fail fast on a wrong current key: unwrap one data key wrapped
        with the provider's current key id, if the ring holds one. (Without
        this, a key with the right id and the wrong bytes would wrap new
        sessions' keys that the right key can never open.)

        Raises:
            WrongKey: the current key does not open a key it should.

        Cancellation: one read of the ring and one unwrap on worker threads;
        nothing is written.
        """
        ring, keys = self._ring()
        found = await ring.one_of(keys.current_kek_id())
        if found is not None:
            sid, wrapped = found
            aead = AESGCM(
                await trio.to_thread.run_sync(keys.unwrap, wrapped, _key_ad(ring.store_id, sid))
            )
            self._aeads.setdefault(sid, aead)

    def seal_snapshots(self, snapshots: Any) -> SealedSnapshots:
        """``snapshots`` with every body sealed under its session's data key."""
        return SealedSnapshots(snapshots, self)

    async def forget(self, session_id: str) -> bool:
        """Destroy the session's data key (crypto-shredding): its ciphertext,
        wherever a copy survives (PostgreSQL's dead tuples, a backup), can no
        longer be read. An erasure calls this before removing the rows.

        Cancellation: the key is deleted in one statement on a worker
        thread; a cancelled call may still have deleted it.
        """
        ring, _ = self._ring()
        self._drop(session_id)
        try:
            return await ring.forget(session_id)
        finally:
            self._drop(session_id)  # a key fetched while it was being destroyed

    def _drop(self, session_id: str) -> None:
        with self._cache_lock:
            self._epoch += 1
            self._aeads.pop(session_id, None)
        self._nonces.pop(session_id, None)
        if self._held is not None:
            self._held.pop(session_id, None)

    # --- the EventStore port ------------------------------------------------

    def _nonce(self, session_id: str) -> bytes:
        """A nonce never used before with this session's data key: 8 random
        bytes drawn once per key and process, then a 4-byte counter. (A
        random 12-byte nonce per event costs a system call that lets the
        store's threads take the interpreter away; two processes draw the
        same 8 bytes for one key with odds of 2^-64 per pair.)"""
        state = self._nonces.get(session_id)
        if state is None or state[1] >= 0xFFFFFFFF:
            state = self._nonces[session_id] = [os.urandom(8), 0]
        count: int = state[1] + 1
        state[1] = count
        prefix: bytes = state[0]
        return prefix + count.to_bytes(4, "big")

    def _seal(self, aead: AESGCM, store_id: str, ev: StoredEvent) -> StoredEvent:
        if not isinstance(ev.payload, dict) or ENCRYPTED_FIELD in ev.payload:
            raise StoreError(f"event seq {ev.seq}: payload must be a plaintext dict")
        plain = _plaintext(ev.payload)
        nonce = self._nonce(ev.session_id)
        sealed = aead.encrypt(
            nonce, plain, _event_ad(store_id, ev.session_id, ev.seq, ev.tag, ev.schema_version)
        )
        return envelope(
            ev.session_id,
            ev.seq,
            ev.tag,
            ev.schema_version,
            {ENCRYPTED_FIELD: nonce + sealed if self._blobs else (nonce + sealed).hex()},
            ev.recorded_at,
            ev.position,
        )

    async def append(
        self, session_id: str, events: Sequence[StoredEvent], expected_version: int
    ) -> int:
        """Seal each payload, then the inner store's append.

        Cancellation: as the inner store's append; a data key made for a
        session whose first append was cancelled stays, unused, in the ring.
        """
        if not events:
            result: int = await self.inner.append(session_id, events, expected_version)
            return result
        if self.locked:
            raise PlaintextRefused(
                "the store is encrypted and no key was given: nothing can be written"
            )
        aead = await self._key_for_writing(session_id)
        store_id = self._ring()[0].store_id
        sealed = [self._seal(aead, store_id, ev) for ev in events]
        result = await self.inner.append(session_id, sealed, expected_version)
        return result

    def _decrypting(self, decoder: EventDecoder[_T]) -> _Decrypting:
        ring, _ = self._ring()
        fetch = self._fetch_one if self._fetch_with_rows else None
        return _Decrypting(decoder, ring.store_id, self._aeads, self._held, fetch)

    async def _opened(self, events: list[StoredEvent]) -> list[StoredEvent]:
        if not events:
            return events
        if self.locked:
            raise ContentEncrypted(_LOCKED)
        await self._load(ev.session_id for ev in events)
        # Only open_envelope is used: the codec behind it decodes nothing.
        opener = self._decrypting(DEFAULT_CODEC)
        return [opener.open_envelope(ev) for ev in events]

    async def read(self, session_id: str, after: int = 0) -> list[StoredEvent]:
        """The inner store's events, opened.

        Raises:
            ContentEncrypted: no key was given (and the session has events).
            PlaintextRefused, DecryptionFailed, WrongKey: see each.

        Cancellation: as the inner store's.
        """
        return await self._opened(await self.inner.read(session_id, after))

    async def read_decoded(
        self, session_id: str, decoder: EventDecoder[_T], after: int = 0
    ) -> list[_T]:
        """The inner store's ``read_decoded``, each row opened on its I/O thread.

        Cancellation: as the inner store's.
        """
        if self.locked:
            return [_locked(ev) for ev in await self.inner.read(session_id, after)]
        if self._held is not None:
            await self._load([session_id])
            events = await self.inner.read(session_id, after)
            return self._decrypting(decoder).decode_held(session_id, events)
        if not self._fetch_with_rows:
            await self._load([session_id])
        out: list[_T] = await self.inner.read_decoded(session_id, self._decrypting(decoder), after)
        return out

    async def read_decoded_many(
        self,
        session_ids: Sequence[str],
        decoder: EventDecoder[_T],
        fold: Callable[[str, list[_T]], _R],
    ) -> dict[str, _R]:
        """The inner store's ``read_decoded_many``, each row opened.

        Cancellation: as the inner store's.
        """
        if self.locked:
            for sid in session_ids:
                for ev in await self.inner.read(sid):
                    _locked(ev)
            return {sid: fold(sid, []) for sid in session_ids}
        if self._held is not None or not self._fetch_with_rows:
            await self._load(session_ids)
        if self._held is not None:
            opener = self._decrypting(decoder)
            folded: dict[str, _R] = {}
            for sid in session_ids:
                if sid not in folded:
                    folded[sid] = fold(sid, opener.decode_held(sid, await self.inner.read(sid)))
            return folded
        out: dict[str, _R] = await self.inner.read_decoded_many(
            session_ids, self._decrypting(decoder), fold
        )
        return out

    async def read_all(self, after: int = 0, limit: int | None = None) -> list[StoredEvent]:
        """The inner store's feed, opened.

        Cancellation: as the inner store's.
        """
        return await self._opened(await self.inner.read_all(after, limit))

    async def session_ids(self) -> list[str]:
        """The inner store's sessions (ids are not content: they stay clear).

        Cancellation: as the inner store's.
        """
        out: list[str] = await self.inner.session_ids()
        return out

    async def erase(self, session_id: str, keep: Sequence[StoredEvent] = ()) -> Any:
        """Crypto-shred, then erase: the session's data key is destroyed
        first, then the inner store's ``erase`` removes the rows. ``keep``
        (a trim to the newest turns) is sealed under a fresh data key.

        A whole erasure is recorded in the key ring in the same transaction
        that destroys the key (:meth:`KeyRing.begin_erasure`), and the record
        is dropped once the rows are gone. A process killed in between
        leaves the record; the next writer that opens the store finishes the
        erasure (:meth:`finish_erasures`), so the session ends erased, never
        listed with rows that no key opens.

        Cancellation: a cancelled call may have destroyed the key and not
        the rows: the session then reads as having no key (``WrongKey``),
        never as plaintext; the next open of the store, or erasing it again,
        removes the rows.
        """
        eraser = getattr(self.inner, "erase", None)
        if eraser is None:
            raise StoreError(f"{type(self.inner).__name__} does not support erasure")
        if keep:
            await self.forget(session_id)
            aead = await self._key_for_writing(session_id)
            store_id = self._ring()[0].store_id
            sealed = [self._seal(aead, store_id, ev) for ev in keep]
            return await eraser(session_id, sealed)
        ring, _ = self._ring()
        self._drop(session_id)
        await ring.begin_erasure(session_id)
        self._drop(session_id)  # a key fetched while it was being destroyed
        try:
            done = await eraser(session_id, [])
        except UnknownSession:
            await ring.end_erasure(session_id)  # there were no rows: nothing changed
            raise
        await ring.end_erasure(session_id)
        return done

    async def finish_erasures(self) -> list[str]:
        """Finish the erasures a killed process began: each session the key
        ring records as being erased (its key already destroyed) has its rows
        removed by the inner store's ``erase``, then its record dropped. An
        erasure that fails again is logged (``erasure_unfinished``) and left
        for the next open. :func:`~turnledger.adapters.stores.open_store`
        calls this on every store it opens with keys for writing.

        Returns the sessions whose erasure was finished.

        Cancellation: each erasure is the inner store's (never interrupted);
        a cancelled call leaves the remaining records for the next open.
        """
        ring, _ = self._ring()
        eraser = getattr(self.inner, "erase", None)
        finished: list[str] = []
        for sid in await ring.pending_erasures():
            if eraser is None:
                break
            try:
                await eraser(sid, [])
            except UnknownSession:
                pass  # its rows went before the process was killed
            except StoreError as exc:
                library_logger(__name__).warning(
                    "erasure_unfinished", session_id=sid, reason=type(exc).__name__
                )
                continue
            await ring.end_erasure(sid)
            library_logger(__name__).info("erasure_finished", session_id=sid)
            finished.append(sid)
        return finished

    async def acquire(self, session_id: str) -> None:
        """The inner store's ``acquire``.

        Cancellation: as the inner store's.
        """
        await self.inner.acquire(session_id)

    async def release(self, session_id: str) -> None:
        """The inner store's ``release``.

        Cancellation: as the inner store's.
        """
        await self.inner.release(session_id)

    async def aclose(self) -> None:
        """Close the inner store and the key ring.

        Cancellation: as the inner store's ``aclose``.
        """
        try:
            await self.inner.aclose()
        finally:
            if self.ring is not None:
                await self.ring.aclose()

    async def __aenter__(self) -> EncryptedStore:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.aclose()


class SealedSnapshots:
    """A snapshot store whose bodies are sealed with their session's data
    key (associated data: store, session, version, schema), so a snapshot
    holds no readable content either, and crypto-shredding covers it.
    :func:`~turnledger.sessions.open_hub` wraps a snapshot store in this by
    itself when its event store is an :class:`EncryptedStore`."""

    sealed = True

    def __init__(self, inner: Any, store: EncryptedStore) -> None:
        self.inner = inner
        self.store = store

    def _ad(self, snap: Any) -> bytes:
        ring, _ = self.store._ring()
        return orjson.dumps(["snapshot", ring.store_id, snap.session_id, snap.version, snap.schema])

    async def save(self, snapshot: Any) -> None:
        """Seal the body (and the older part, apart), then the inner store's ``save``.

        Cancellation: as the inner store's ``save``.
        """
        aead = await self.store._key_for_writing(snapshot.session_id)
        ad = self._ad(snapshot)
        nonce = os.urandom(_NONCE)
        body = nonce + aead.encrypt(nonce, snapshot.body, ad)
        older = b""
        if snapshot.older:
            nonce = os.urandom(_NONCE)
            older = nonce + aead.encrypt(nonce, snapshot.older, ad + b"older")
        await self.inner.save(
            attrs.evolve(
                snapshot, body=body, checksum=hashlib.sha256(body).hexdigest(), older=older
            )
        )

    async def latest(self, session_id: str) -> Any:
        """The inner store's latest, opened; one that does not open comes
        back with an empty body, so loading it reports it damaged. Its
        older part is opened when it is read; one that does not open reads
        as gone.

        Cancellation: as the inner store's.
        """
        snap = await self.inner.latest(session_id)
        if snap is None:
            return None
        await self.store._load([session_id])
        aead = self.store._aeads.get(session_id)
        ad = self._ad(snap)
        try:
            if aead is None or hashlib.sha256(snap.body).hexdigest() != snap.checksum:
                raise ValueError("no key, or damaged")
            body = aead.decrypt(snap.body[:_NONCE], snap.body[_NONCE:], ad)
        except (InvalidTag, ValueError):
            return attrs.evolve(snap, body=b"", checksum="does not open")
        sealed_older, load = snap.older, snap.load_older

        def older() -> bytes | None:
            raw = sealed_older or (load() if load is not None else None)
            if not raw:
                return None
            try:
                opened: bytes = aead.decrypt(raw[:_NONCE], raw[_NONCE:], ad + b"older")
            except (InvalidTag, ValueError):
                return None
            return opened

        return attrs.evolve(
            snap,
            body=body,
            checksum=hashlib.sha256(body).hexdigest(),
            older=b"",
            load_older=older,
        )

    async def drop(self, session_id: str) -> None:
        """The inner store's ``drop``. Cancellation: as the inner store's."""
        await self.inner.drop(session_id)

    async def aclose(self) -> None:
        """The inner store's ``aclose``.

        Cancellation: as the inner store's.
        """
        await self.inner.aclose()


def _locked(ev: StoredEvent) -> Any:
    raise ContentEncrypted(f"session {ev.session_id!r}: {_LOCKED}")


async def rotate_keys(store: EncryptedStore) -> int:
    """Rewrap every data key under the provider's current key-encryption key.

    No event is rewritten: only the small wrapped keys change. Keep the old
    key in the provider until this returns; then it can be dropped.

    Returns:
        How many data keys were rewrapped.

    Raises:
        ContentEncrypted: the store was opened without keys.
        WrongKey: a data key is wrapped with a key the provider lacks.

    Cancellation: each key is swapped in its own statement; a cancelled
    rotation leaves some keys under the old key, all readable, and running it
    again finishes the rest.
    """
    ring, keys = store._ring()
    current = keys.current_kek_id()
    count = 0
    for sid, wrapped in await ring.all():
        if wrapped.kek_id == current:
            continue
        context = _key_ad(ring.store_id, sid)
        data_key = await trio.to_thread.run_sync(keys.unwrap, wrapped, context)
        new = await trio.to_thread.run_sync(keys.wrap, data_key, context)
        if await ring.replace(sid, wrapped, new):
            count += 1
    return count
