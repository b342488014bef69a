"""Event stores: memory, SQLite, a JSON-lines journal and PostgreSQL.

:func:`open_store` picks one from a string: a ``postgresql://`` URL or a
libpq keyword string (``host=... dbname=...``), a ``.jsonl`` journal, or
else an SQLite file.
"""

from ._open import open_store, store_kind
from ._pg_previews import PreviewDelta, Previews, open_previews
from .journal import JournalStore
from .memory import MemoryStore
from .postgres import NodeInfo, PostgresStore, SessionLease
from .snapshots import MemorySnapshots, PostgresSnapshots, SQLiteSnapshots, snapshots_beside
from .sqlite import SQLiteStats, SQLiteStore

__all__ = [
    "JournalStore",
    "MemorySnapshots",
    "MemoryStore",
    "NodeInfo",
    "PostgresSnapshots",
    "PostgresStore",
    "PreviewDelta",
    "Previews",
    "SQLiteSnapshots",
    "SQLiteStats",
    "SQLiteStore",
    "SessionLease",
    "open_previews",
    "open_store",
    "snapshots_beside",
    "store_kind",
]
