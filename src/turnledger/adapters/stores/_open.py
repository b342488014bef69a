"""Pick and open a store from one string, as the command line takes it."""

from __future__ import annotations

import os
import re
from typing import Any

from ...events import EventStore

__all__ = ["default_keyring", "open_store", "store_kind"]

#: One ``keyword = value`` pair of a libpq connection string: the value is
#: single-quoted (with backslash escapes) or a run of non-blank characters.
_PAIR = re.compile(r"\s*([A-Za-z_][A-Za-z0-9_]*)\s*=\s*('(?:[^'\\]|\\.)*'|(?:[^\s'\\]|\\.)+)\s*")


def is_libpq_keywords(text: str) -> bool:
    """Whether ``text`` reads as a libpq keyword/value connection string
    (``host=127.0.0.1 dbname=app``): one or more ``keyword=value`` pairs and
    nothing else. Which keywords are valid is libpq's business: a string of
    pairs goes to PostgreSQL, which names an unknown one, rather than
    becoming a file name (a file whose name looks like this is written
    ``./name=value``)."""
    pos, pairs = 0, 0
    while pos < len(text):
        match = _PAIR.match(text, pos)
        if match is None:
            return False
        pos, pairs = match.end(), pairs + 1
    return pairs > 0


def store_kind(url_or_path: str | os.PathLike[str]) -> str:
    """``"postgres"`` for a ``postgresql://`` (or ``postgres://``) URL or a
    libpq keyword string (see :func:`is_libpq_keywords`), ``"journal"`` for a
    path ending in ``.jsonl``, else ``"sqlite"``."""
    text = os.fspath(url_or_path)
    if text.startswith(("postgresql://", "postgres://")):
        return "postgres"
    if isinstance(url_or_path, str) and is_libpq_keywords(text):
        return "postgres"
    if text.lower().endswith(".jsonl"):
        return "journal"
    return "sqlite"


def default_keyring(url_or_path: str | os.PathLike[str]) -> str:
    """Where an encrypted store keeps its data keys unless told otherwise:
    ``<file>.keys`` beside a SQLite database or a journal; the same
    PostgreSQL database (table ``turnledger_data_keys``) for PostgreSQL."""
    text = os.fspath(url_or_path)
    return text if store_kind(url_or_path) == "postgres" else text + ".keys"


async def open_store(
    url_or_path: str | os.PathLike[str],
    *,
    keys: Any = None,
    keyring: str | os.PathLike[str] | None = None,
    **options: Any,
) -> EventStore:
    """Open the store ``url_or_path`` names (see :func:`store_kind`).

    ``options`` go to the store's ``open``: for example ``read_only=True`` or
    ``max_bytes=`` for a journal, ``synchronous=`` for SQLite, ``schema=`` for
    PostgreSQL.

    Encryption at rest (docs/encryption.md): with ``keys`` (a
    :class:`~turnledger.adapters.encryption.KeyProvider`) every payload is
    sealed; the data keys live in ``keyring`` (a SQLite file path or a
    PostgreSQL DSN; default :func:`default_keyring`). Without ``keys``, a
    store whose key ring file exists opens *locked*: sessions are listed,
    content is refused as encrypted. Opened with ``keys`` for writing, it
    first finishes any erasure a killed process began (the session's key was
    destroyed, its rows not yet removed).

    Raises:
        WrongKey: the provider's current key does not open the data keys
            wrapped under its id (nothing was written).
        StoreError: the store cannot be opened (see each store's ``open``).
    """
    ring_at = os.fspath(keyring) if keyring is not None else default_keyring(url_or_path)
    locked = keys is None and store_kind(ring_at) != "postgres" and os.path.exists(ring_at)
    store = await _open_plain(url_or_path, **options)
    if keys is None and not locked:
        return store
    from ..encryption import EncryptedStore, PostgresKeyRing, SQLiteKeyRing

    if keys is None:
        return EncryptedStore(store, None, None)
    try:
        if store_kind(ring_at) == "postgres":
            ring: Any = await PostgresKeyRing.open(ring_at, schema=options.get("schema"))
        else:
            ring = await SQLiteKeyRing.open(ring_at, create=not options.get("read_only", False))
    except BaseException:
        await store.aclose()
        raise
    encrypted = EncryptedStore(store, ring, keys)
    try:
        await encrypted.check_keys()
        if not options.get("read_only", False):
            await encrypted.finish_erasures()
    except BaseException:
        await encrypted.aclose()
        raise
    return encrypted


async def _open_plain(url_or_path: str | os.PathLike[str], **options: Any) -> EventStore:
    kind = store_kind(url_or_path)
    if kind == "postgres":
        from .postgres import PostgresStore

        return await PostgresStore.open(os.fspath(url_or_path), **options)
    if kind == "journal":
        from .journal import JournalStore

        return await JournalStore.open(url_or_path, **options)
    from .sqlite import SQLiteStore

    return await SQLiteStore.open(url_or_path, **options)
