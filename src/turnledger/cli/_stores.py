"""Opening the store a command names: to read it (it must exist, nothing in
it changes) or to write it."""

from __future__ import annotations

import os
import stat
from typing import Any

from .. import StoreError
from ..adapters.stores import open_store, store_kind
from ..events import EventStore
from ._display import visible
from ._errors import EXIT_NOT_FOUND, EXIT_STORE, EXIT_USAGE, Exit, display_db

__all__ = ["check_db_path", "command_keys", "open_to_read", "open_to_write", "use_key_file"]


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
    raise Exit(EXIT_USAGE, f"{visible(display_db(db))} is {what}, not a store file")


async def open_to_read(db: str) -> EventStore:
    """Open ``db`` only to read it: it must exist, and nothing in it changes
    (a journal is read without taking its writer's lock, since a chat may be
    writing to it)."""
    kind = store_kind(db)
    check_db_path(db, kind)
    if kind != "postgres" and not os.path.exists(db):
        raise Exit(EXIT_NOT_FOUND, f"no such file: {visible(display_db(db))}")
    return await _open(db, read_only=True)


async def open_to_write(db: str) -> EventStore:
    """Open (or create) ``db`` for a command that runs sessions."""
    check_db_path(db, store_kind(db))
    return await _open(db)


#: The key file the command line named (``--key-file``), if any.
_key_file: str | None = None


def use_key_file(path: str | None) -> None:
    """Remember ``--key-file`` for every store the command opens."""
    global _key_file
    _key_file = path


def command_keys() -> Any:
    """The key provider of the command (``--key-file``, ``TURNLEDGER_KEY_FILE``
    or ``TURNLEDGER_KEYS``), or ``None``: a usage error if it cannot be read."""
    if _key_file is None and not (
        os.environ.get("TURNLEDGER_KEY_FILE") or os.environ.get("TURNLEDGER_KEYS")
    ):
        return None
    try:
        from ..adapters.encryption import keys_from_environment
    except ImportError as exc:
        raise Exit(EXIT_USAGE, f"encryption needs the cryptography package: {exc}") from exc
    try:
        return keys_from_environment(_key_file)
    except ValueError as exc:
        raise Exit(EXIT_USAGE, str(exc)) from exc


async def _open(db: str, *, read_only: bool = False) -> EventStore:
    try:
        return await open_store(db, keys=command_keys(), read_only=read_only)
    except StoreError as exc:
        raise Exit(EXIT_STORE, f"cannot open {visible(display_db(db))}: {exc}") from exc
