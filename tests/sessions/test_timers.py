"""The hub's turn timers: one heap, bounded by the turns in flight, firing in order."""

from __future__ import annotations

import math

import trio
import trio.testing

from turnledger.runtime._timers import Timers


class FakeTurn:
    """A turn in flight as the timers see it: it times out at ``wake`` (which
    a test moves to stand for activity) with ``detail``."""

    def __init__(
        self, name: str, wake: float, fired: list[tuple[str, str]], detail: str = "deadline"
    ) -> None:
        self.name = name
        self.wake = wake
        self.detail = detail
        self.ended = False
        self.fired = fired

    def wake_at(self, idle: float | None) -> float:
        return self.wake

    def expired(self, now: float, idle: float | None) -> str | None:
        return self.detail if now >= self.wake else None

    def fire(self, detail: str) -> None:
        self.fired.append((self.name, detail))
        self.ended = True


async def test_the_heap_stays_proportional_to_the_turns_in_flight() -> None:
    timers = Timers(idle=None)
    fired: list[tuple[str, str]] = []
    live: list[FakeTurn] = []
    for i in range(10_000):
        turn = FakeTurn(f"t{i}", trio.current_time() + 60.0, fired)
        timers.add(turn)
        live.append(turn)
        if len(live) > 10:
            live.pop(0).ended = True  # ended turns are never removed one by one
        assert len(timers) <= 2 * 11 + 64 + 1
    # a turn without any timeout is not timed at all
    timers.add(FakeTurn("never", math.inf, fired))
    assert len(timers) <= 2 * 11 + 64 + 1
    assert fired == []


async def test_turns_fire_in_order_and_activity_postpones_the_idle_timeout(
    autojump_clock: trio.testing.MockClock,
) -> None:
    fired: list[tuple[str, str]] = []

    timers = Timers(idle=None)
    async with trio.open_nursery() as nursery:
        nursery.start_soon(timers.run)
        await trio.testing.wait_all_tasks_blocked()
        start = trio.current_time()
        a = FakeTurn("a", start + 1.0, fired, "idle")
        b = FakeTurn("b", start + 0.5, fired)
        timers.add(a)
        timers.add(b)
        ended = FakeTurn("ended", start + 0.5, fired)
        timers.add(ended)
        ended.ended = True  # ended before its time: never fires
        await trio.sleep(0.9)
        assert fired == [("b", "deadline")]
        a.wake = trio.current_time() + 1.0  # a delta: idle moves to 1.9
        await trio.sleep(0.8)  # 1.7: the old idle time (1.0) is past
        assert fired == [("b", "deadline")]
        await trio.sleep(0.3)  # 2.0
        assert fired == [("b", "deadline"), ("a", "idle")]
        nursery.cancel_scope.cancel()


async def test_an_earlier_turn_added_while_sleeping_wakes_the_timers(
    autojump_clock: trio.testing.MockClock,
) -> None:
    # The hub's settings rule it out, but the heap does not rely on it.
    fired: list[tuple[str, str]] = []

    timers = Timers(idle=None)
    async with trio.open_nursery() as nursery:
        nursery.start_soon(timers.run)
        start = trio.current_time()
        timers.add(FakeTurn("late", start + 100.0, fired))
        await trio.testing.wait_all_tasks_blocked()
        timers.add(FakeTurn("early", start + 1.0, fired))
        await trio.sleep(2.0)
        assert fired == [("early", "deadline")]
        nursery.cancel_scope.cancel()
