"""Pick and open a store from one string, as the command line takes it."""

from __future__ import annotations

import os
from typing import Any

from ...events import EventStore

__all__ = ["open_store", "store_kind"]


def store_kind(url_or_path: str | os.PathLike[str]) -> str:
    """``"postgres"`` for a ``postgresql://`` (or ``postgres://``) URL,
    ``"journal"`` for a path ending in ``.jsonl``, else ``"sqlite"``."""
    text = os.fspath(url_or_path)
    if text.startswith(("postgresql://", "postgres://")):
        return "postgres"
    if text.lower().endswith(".jsonl"):
        return "journal"
    return "sqlite"


async def open_store(url_or_path: str | os.PathLike[str], **options: Any) -> EventStore:
    """Open the store ``url_or_path`` names (see :func:`store_kind`).

    ``options`` go to the store's ``open``: for example ``read_only=True`` or
    ``max_bytes=`` for a journal, ``synchronous=`` for SQLite, ``schema=`` for
    PostgreSQL.

    Raises:
        StoreError: the store cannot be opened (see each store's ``open``).
    """
    kind = store_kind(url_or_path)
    if kind == "postgres":
        from .postgres import PostgresStore

        return await PostgresStore.open(os.fspath(url_or_path), **options)
    if kind == "journal":
        from .journal import JournalStore

        return await JournalStore.open(url_or_path, **options)
    from .sqlite import SQLiteStore

    return await SQLiteStore.open(url_or_path, **options)
