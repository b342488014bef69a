"""The hub's window cache: one question to the provider per model, and every
session waiting for that answer woken at once.

A burst of new sessions (a thousand clients arriving at ``turnledger serve``)
all ask for the same model's window. When the answer was guarded by a lock,
the waiters got it one scheduler pass each, a thousand passes in a row under
load; these tests would fail if the waiting went back to one at a time.
"""

from __future__ import annotations

from typing import Any

import trio
import trio.testing

from turnledger.runtime._window import WindowCache
from turnledger.sessions._ports import ModelInfo


class _Describer:
    """A provider that describes models, answering when ``gate`` is set."""

    def __init__(self) -> None:
        self.gate = trio.Event()
        self.asked = 0

    async def complete(self, *args: Any, **kwargs: Any) -> Any:  # the port's other half
        raise AssertionError("not used")

    async def describe(self, model: str, *, context_window: int | None = None) -> ModelInfo:
        self.asked += 1
        await self.gate.wait()
        return ModelInfo(context_window=32_768, source="discovered")


class _Log:
    def info(self, event: str, **fields: object) -> None:
        pass

    def warning(self, event: str, **fields: object) -> None:
        pass


async def test_many_waiters_one_question_all_woken_together() -> None:
    cache = WindowCache()
    provider = _Describer()
    got: list[ModelInfo] = []

    async def ask() -> None:
        got.append(await cache.info(provider, "m", None, _Log()))  # type: ignore[arg-type]

    async with trio.open_nursery() as nursery:
        for _ in range(200):
            nursery.start_soon(ask)
        await trio.testing.wait_all_tasks_blocked()
        assert provider.asked == 1 and got == []
        provider.gate.set()
        # A handful of scheduler passes, not one per waiter.
        for _ in range(8):
            await trio.lowlevel.checkpoint()
        assert len(got) == 200
    assert provider.asked == 1
    assert all(info == ModelInfo(context_window=32_768, source="discovered") for info in got)
    # Known now: answered from the cache, the provider not asked again.
    assert await cache.info(provider, "m", None, _Log()) is got[0]  # type: ignore[arg-type]
    assert provider.asked == 1


async def test_an_asker_cancelled_leaves_the_question_to_a_waiter() -> None:
    cache = WindowCache()
    provider = _Describer()
    got: list[ModelInfo] = []

    async def ask() -> None:
        got.append(await cache.info(provider, "m", None, _Log()))  # type: ignore[arg-type]

    async with trio.open_nursery() as nursery:
        first = trio.CancelScope()
        nursery.start_soon(_in_scope, first, ask)
        await trio.testing.wait_all_tasks_blocked()
        for _ in range(5):
            nursery.start_soon(ask)
        await trio.testing.wait_all_tasks_blocked()
        assert provider.asked == 1
        first.cancel()
        await trio.testing.wait_all_tasks_blocked()
        # One of the waiters asked again; the others wait for it.
        assert provider.asked == 2 and got == []
        provider.gate.set()
    assert len(got) == 5 and provider.asked == 2


async def _in_scope(scope: trio.CancelScope, fn: Any) -> None:
    with scope:
        await fn()
