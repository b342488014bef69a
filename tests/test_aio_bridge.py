"""turnledger.aio's bridge between an asyncio caller and the trio task that
does the call: a caller that stops waiting ends its trio task, and a trio
run that ends fails every call still waiting instead of leaving it hung.

A store whose reads of session ``stuck`` never return stands for any trio
call that blocks: ``Hub.state`` of a session with no actor reads the store.
"""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
import trio

from turnledger import SessionClosed, aio
from turnledger.testing import MemoryStore, ScriptedProvider


class StuckReads(MemoryStore):
    """Reads of session ``stuck`` wait forever; the test sees them start and end."""

    def __init__(self) -> None:
        super().__init__()
        self.reading = 0
        self.cancelled = 0

    async def read_decoded(self, session_id: str, decoder: Any, after: int = 0) -> Any:
        if session_id != "stuck":
            return await super().read_decoded(session_id, decoder, after)
        self.reading += 1
        try:
            await trio.sleep_forever()
        except trio.Cancelled:
            self.cancelled += 1
            raise
        finally:
            self.reading -= 1
        raise AssertionError("unreachable")  # pragma: no cover


async def _until(condition: Any, timeout: float = 10.0) -> None:
    """Let both loops run until ``condition()`` holds (at most ``timeout`` s)."""
    async with asyncio.timeout(timeout):
        while not condition():
            await asyncio.sleep(0.01)


def test_a_cancelled_asyncio_waiter_ends_its_trio_task() -> None:
    store = StuckReads()

    async def main() -> None:
        async with aio.open_hub(store, ScriptedProvider(), model="m") as hub:
            waiter = asyncio.create_task(hub.state("stuck"))
            await _until(lambda: store.reading == 1)
            waiter.cancel()
            with pytest.raises(asyncio.CancelledError):
                await waiter
            # the trio task that read for it is cancelled, not left running
            await _until(lambda: store.reading == 0)
            assert store.cancelled == 1
            # and the hub goes on serving
            assert (await hub.state("other")).version == 0

    asyncio.run(main())


def test_a_trio_run_that_ends_fails_the_calls_still_waiting() -> None:
    store = StuckReads()
    outcome: list[BaseException] = []

    async def main() -> None:
        async with aio.open_hub(store, ScriptedProvider(), model="m", shutdown_grace=0.2) as hub:
            waiter = asyncio.create_task(hub.state("stuck"))
            await _until(lambda: store.reading == 1)
        # The hub closed; its grace cut the stuck call off, and the trio run
        # ended: the asyncio caller hears of it instead of waiting forever.
        try:
            async with asyncio.timeout(10):
                await waiter
        except SessionClosed as exc:
            outcome.append(exc)

    asyncio.run(main())
    assert len(outcome) == 1 and "trio run ended" in str(outcome[0])
    assert store.reading == 0
