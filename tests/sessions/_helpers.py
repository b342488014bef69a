"""Helpers shared by the session runtime tests."""

from __future__ import annotations

import errno
import os
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

import trio
import trio.testing

from turnledger import SessionOwnedElsewhere, StoreError, StoreFull
from turnledger.events import DEFAULT_CODEC, Event, StoredEvent
from turnledger.sessions import replay
from turnledger.testing import MemoryStore


class HookedStore(MemoryStore):
    """A MemoryStore whose appends can be held, failed or interleaved by a test."""

    def __init__(self) -> None:
        super().__init__()
        self._hooks: list[tuple[str, Callable[[], Awaitable[None]]]] = []
        self.fail_appends = 0
        self.owned_elsewhere: set[str] = set()
        self.acquired: list[str] = []
        self.released: list[str] = []

    def before(self, tag: str, fn: Callable[[], Awaitable[None]]) -> None:
        """Await ``fn()`` before the next append whose batch holds an event tagged ``tag``."""
        self._hooks.append((tag, fn))

    async def append(
        self, session_id: str, events: Sequence[StoredEvent], expected_version: int
    ) -> int:
        tags = {e.tag for e in events}
        for i, (tag, fn) in enumerate(self._hooks):
            if tag in tags:
                del self._hooks[i]
                await fn()
                break
        if self.fail_appends:
            self.fail_appends -= 1
            await trio.lowlevel.checkpoint()
            raise self.failure()
        return await super().append(session_id, events, expected_version)

    @staticmethod
    def failure() -> StoreError:
        """What a failing append raises (a test may replace it): a full
        disk, as a store maps it, with the OS error as its cause."""
        error = StoreFull("/data/chats.db: the append was not written")
        error.__cause__ = OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        return error

    async def acquire(self, session_id: str) -> None:
        await trio.lowlevel.checkpoint()
        if session_id in self.owned_elsewhere:
            raise SessionOwnedElsewhere(session_id, "held by pid 4242")
        self.acquired.append(session_id)

    async def release(self, session_id: str) -> None:
        await trio.lowlevel.checkpoint()
        self.released.append(session_id)


async def at(seq: trio.testing.Sequencer, position: int) -> None:
    async with seq(position):
        pass


async def events_of(store: MemoryStore, session_id: str) -> list[Event]:
    return [DEFAULT_CODEC.decode(s) for s in await store.read(session_id)]


async def tags_of(store: MemoryStore, session_id: str) -> list[str]:
    return [s.tag for s in await store.read(session_id)]


async def replayed(store: MemoryStore, session_id: str) -> Any:
    return replay(await events_of(store, session_id))


def lines(logs: list[dict[str, Any]], event: str, **match: Any) -> list[dict[str, Any]]:
    return [
        line
        for line in logs
        if line["event"] == event and all(line.get(k) == v for k, v in match.items())
    ]
