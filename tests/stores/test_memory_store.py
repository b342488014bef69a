from pathlib import Path

from turnledger.events import EventStore
from turnledger.testing import EventStoreContract, MemoryStore


class TestMemoryStore(EventStoreContract):
    async def open_store(self, path: Path) -> EventStore:
        return MemoryStore()
