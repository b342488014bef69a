"""What users need to test code built on turnledger.

- :class:`EventStoreContract`: the contract suite every event store passes.
- :class:`~turnledger.adapters.stores.MemoryStore`: the in-memory store.
"""

from ..adapters.stores.memory import MemoryStore
from ._contract import EventStoreContract, sample_events

__all__ = ["EventStoreContract", "MemoryStore", "sample_events"]
