"""The store port from the outside: a store of one's own, written as the
README shows it (``append``, ``read`` and ``session_ids`` over
``BaseEventStore``), passes the whole contract and runs sessions; the
defaults it leans on say what is missing instead of guessing."""

from __future__ import annotations

import re
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest

from turnledger import StoreError
from turnledger.events import DEFAULT_CODEC, BaseEventStore, StoredEvent
from turnledger.sessions import CommittedResult, open_hub, replay_sessions
from turnledger.testing import EventStoreContract, MemoryStore, ScriptedProvider, sample_events

ROOT = Path(__file__).parents[2]


def _blocks_after(marker: str) -> list[str]:
    """The Python blocks of the README (or of docs/, once the section lives
    there) from the one holding ``marker`` on: the store and its contract."""
    for page in [ROOT / "README.md", *sorted((ROOT / "docs").glob("**/*.md"))]:
        blocks = re.findall(r"```python\n(.*?)```", page.read_text(encoding="utf-8"), re.S)
        for i, block in enumerate(blocks):
            if marker in block:
                return blocks[i : i + 2]
    raise AssertionError(f"no Python block holds {marker!r}")


# The two blocks run here as written: the first defines DictStore, the
# second TestDictStore, which pytest collects from this module.
for _block in _blocks_after("class DictStore(BaseEventStore)"):
    exec(compile(_block, "README.md", "exec"), globals())
DictStore: Any = globals()["DictStore"]
assert "TestDictStore" in globals()


def test_the_readme_store_writes_only_what_the_port_asks() -> None:
    own = {n for n, v in vars(DictStore).items() if callable(v) and not n.startswith("__")}
    assert own == {"append", "read", "session_ids"}


async def test_the_readme_store_runs_sessions() -> None:
    store = DictStore()
    async with open_hub(store, ScriptedProvider.instant("a turn"), model="m") as hub:
        results = [await (await hub.submit(f"s{i}", "What is a turn?")).outcome() for i in (1, 2)]
        history = await hub.history("s1")
    assert all(isinstance(r, CommittedResult) for r in results)
    assert [(t.question, t.answer) for t in history] == [("What is a turn?", "a turn")]
    states = await replay_sessions(store, ["s1", "s2"])
    assert [len(s.turns) for s in states.values()] == [1, 1]
    feed = await store.read_all()
    assert [e.position for e in feed] == list(range(1, len(feed) + 1))
    assert await store.session_ids() == ["s1", "s2"]


class _Lines(BaseEventStore):
    """append and read only, over a MemoryStore: lists nothing of its own."""

    def __init__(self) -> None:
        self.inner = MemoryStore()

    async def append(
        self, session_id: str, events: Sequence[StoredEvent], expected_version: int
    ) -> int:
        return await self.inner.append(session_id, events, expected_version)

    async def read(self, session_id: str, after: int = 0) -> list[StoredEvent]:
        return await self.inner.read(session_id, after)


def _one(session_id: str) -> list[StoredEvent]:
    return [
        DEFAULT_CODEC.encode(sample_events()[0], session_id=session_id, seq=1, recorded_at=1.7e9)
    ]


async def test_a_store_that_lists_nothing_is_told_what_to_write() -> None:
    store = _Lines()
    await store.append("s", _one("s"), 0)
    assert await store.read_decoded("s", DEFAULT_CODEC) == sample_events()[:1]
    for call in (store.session_ids, store.read_all):
        with pytest.raises(TypeError, match=r"_Lines must define session_ids\(\) or read_all\(\)"):
            await call()


async def test_the_feed_and_the_list_each_default_over_the_other() -> None:
    class FeedOnly(_Lines):
        async def read_all(self, after: int = 0, limit: int | None = None) -> list[StoredEvent]:
            return await self.inner.read_all(after, limit)

    class ListOnly(_Lines):
        async def session_ids(self) -> list[str]:
            return await self.inner.session_ids()

    for store in (FeedOnly(), ListOnly()):
        for sid in ("b", "a", "c"):
            await store.append(sid, _one(sid), 0)
        assert await store.session_ids() == ["b", "a", "c"]
        feed = await store.read_all(after=1, limit=1)
        assert [(e.session_id, e.position) for e in feed] == [("a", 2)]


_FIELDS = ("session_id", "seq", "tag", "schema_version", "payload", "recorded_at")


async def test_the_default_feed_needs_positions() -> None:
    class NoPositions(_Lines):
        async def read(self, session_id: str, after: int = 0) -> list[StoredEvent]:
            events = await self.inner.read(session_id, after)
            return [StoredEvent(*(getattr(e, f) for f in _FIELDS)) for e in events]

        async def session_ids(self) -> list[str]:
            return await self.inner.session_ids()

    store = NoPositions()
    await store.append("s", _one("s"), 0)
    with pytest.raises(StoreError, match="gave an event without a position"):
        await store.read_all()


async def test_a_store_without_erase_refuses_it_and_keeps_everything() -> None:
    store = DictStore()
    await store.append("s", _one("s"), 0)
    with pytest.raises(StoreError, match="DictStore does not support erasure"):
        await store.erase("s")
    assert len(await store.read("s")) == 1
    assert await store.erasures() == []


def test_a_contract_must_say_whether_its_store_survives_reopening() -> None:
    with pytest.raises(TypeError, match="Forgetful must say whether its store survives reopening"):

        class Forgetful(EventStoreContract):
            async def open_store(self, path: Path) -> MemoryStore:
                return MemoryStore()

    # A base of contracts that opens nothing need not say.
    class Base(EventStoreContract):
        timeout = 5.0

    assert not hasattr(Base, "supports_reopen")
