"""The fault-injecting store and provider the simulation is built on."""

from __future__ import annotations

import errno
import random

import pytest
import trio

from turnledger import LeaseLost, StoreError, StoreFull, StoreUnavailable
from turnledger.events import DEFAULT_CODEC, StoredEvent, ToolCall, TurnSubmitted
from turnledger.sessions import ChatMessage, ChatRequest
from turnledger.testing import FaultyStore, MemoryStore
from turnledger.testing._faults import Leases, dangling_calls


def _batch(n: int, after: int = 0) -> list[StoredEvent]:
    return [
        DEFAULT_CODEC.encode(
            TurnSubmitted(f"r{i}", "q", 0, 0, 1), session_id="s", seq=i, recorded_at=0
        )
        for i in range(after + 1, after + n + 1)
    ]


def _store(fault: str, rate: float = 1.0, **kw: object) -> FaultyStore:
    return FaultyStore(MemoryStore(), random.Random(0), rate=rate, faults=[fault], **kw)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("fault", "error", "code"),
    [
        ("enospc_append", StoreFull, errno.ENOSPC),
        ("eio_append", StoreError, errno.EIO),
        ("enospc_commit", StoreFull, errno.ENOSPC),
        ("eio_commit", StoreError, errno.EIO),
    ],
)
async def test_failed_writes_write_nothing(
    fault: str, error: type[Exception], code: int, autojump_clock: trio.testing.MockClock
) -> None:
    store = _store(fault)
    await store.acquire("s")
    with pytest.raises(error) as info:
        await store.append("s", _batch(2), 0)
    assert isinstance(info.value.__cause__, OSError) and info.value.__cause__.errno == code
    assert await store.read("s") == [] and store.injected == {"s": [fault]}


async def test_fsync_failure_refuses_everything_after(autojump_clock: object) -> None:
    store = _store("fsync")
    await store.acquire("s")
    with pytest.raises(StoreError, match="fsync"):
        await store.append("s", _batch(1), 0)
    with pytest.raises(StoreError, match="reopen"):
        await store.read("s")
    # Durable or not, as the seed said; a new process sees which.
    after = FaultyStore(store.inner, random.Random(0), rate=0.0)
    assert len(await after.read("s")) in (0, 1)


async def test_a_dead_process_reaches_nothing() -> None:
    store = _store("latency", rate=0.0)
    await store.acquire("s")
    store.kill()
    with pytest.raises(StoreUnavailable):
        await store.append("s", _batch(1), 0)
    assert await store.inner.read("s") == []


async def test_a_stale_epoch_is_fenced(autojump_clock: object) -> None:
    leases = Leases()
    old = _store("latency", rate=0.0, leases=leases)
    await old.acquire("s")
    old.freeze()
    new = FaultyStore(old.inner, random.Random(0), rate=0.0, leases=leases, writes=old.writes)
    await new.acquire("s")  # the stalled owner's lease is taken over
    async with trio.open_nursery() as nursery:
        late = trio.Event()

        async def stalled_append() -> None:
            with pytest.raises(LeaseLost):
                await old.append("s", _batch(1), 0)
            late.set()

        nursery.start_soon(stalled_append)
        await trio.sleep(5)
        assert not late.is_set()  # it waits while stalled
        await new.append("s", _batch(1), 0)
        old.thaw()
    assert [w[0] for w in old.writes] == [2]


def test_dangling_calls_are_named() -> None:
    call = ToolCall("c1", "t", "{}")
    asked = ChatMessage("assistant", "", (call,))
    answered = ChatMessage("tool", "r", tool_call_id="c1", name="t")
    user = ChatMessage("user", "q")
    assert dangling_calls(ChatRequest("r", "m", (user, asked, answered))) == []
    assert dangling_calls(ChatRequest("r", "m", (user, asked))) == ["c1"]


def test_an_unknown_fault_is_refused() -> None:
    with pytest.raises(ValueError, match="disk_on_fire"):
        _store("disk_on_fire")
