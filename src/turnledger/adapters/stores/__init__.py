"""Event stores: memory, SQLite, a JSON-lines journal and PostgreSQL."""

from .memory import MemoryStore

__all__ = ["MemoryStore"]
