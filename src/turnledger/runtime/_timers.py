"""The timers of every turn in flight in one hub: one task and one heap.

A turn's timer costs a heap push, not a cancel scope: the actors wait for
their mailbox without a deadline, and this task sends a turn its
``Timeout`` when the turn's deadline or idle timeout passes, exactly as a
timer task of the turn's own would. Entries are never removed when a turn
ends; they are skipped when they reach the top, and the heap is compacted
whenever it holds more than twice the turns still waiting (plus a little),
so its size stays proportional to the turns in flight.

Why the head is enough. A turn's wake-up time is ``min(deadline, last
activity + idle)``; activity only moves it later, and a turn that starts now
wakes no earlier than any turn already in flight (every setting is the hub's).
So the task sleeps until the top entry and only needs waking when the heap
was empty, or for an entry earlier than the one it sleeps for (which the
settings rule out, but it is checked rather than assumed).
"""

from __future__ import annotations

import heapq
import itertools
import math
from typing import Final, Protocol

import trio

__all__ = ["Timed", "Timers"]

#: Dead entries tolerated before the first compaction.
_SLACK: Final = 64


class Timed(Protocol):
    """A turn in flight, as its timer sees it."""

    @property
    def ended(self) -> bool:
        """The turn ended (or already had its Timeout): forget it."""
        ...

    def wake_at(self, idle: float | None) -> float:
        """When the turn times out if nothing happens before (trio clock)."""
        ...

    def expired(self, now: float, idle: float | None) -> str | None:
        """``"deadline"`` or ``"idle"`` if the turn timed out at ``now``, else None."""
        ...

    def fire(self, detail: str) -> None:
        """Send the turn its ``Timeout(request_id, detail)`` (never blocks)."""
        ...


class Timers:
    """Runs the turn timers of one hub (start :meth:`run` in its nursery)."""

    __slots__ = ("_heap", "_idle", "_limit", "_lot", "_order", "_until")

    def __init__(self, idle: float | None) -> None:
        self._idle = idle
        self._heap: list[tuple[float, int, Timed]] = []
        # Ties broken by arrival, never by comparing turns.
        self._order = itertools.count()
        self._limit = _SLACK
        self._lot = trio.lowlevel.ParkingLot()
        #: When the task wakes up next (inf while the heap is empty).
        self._until = math.inf

    def __len__(self) -> int:
        return len(self._heap)

    def add(self, turn: Timed) -> None:
        """Time ``turn`` from now on. Never blocks and is not a checkpoint."""
        wake = turn.wake_at(self._idle)
        if wake == math.inf:
            return
        heap = self._heap
        if len(heap) >= self._limit:
            heap[:] = [entry for entry in heap if not entry[2].ended]
            heapq.heapify(heap)
            self._limit = 2 * len(heap) + _SLACK
        heapq.heappush(heap, (wake, next(self._order), turn))
        if wake < self._until:
            self._lot.unpark_all()

    async def run(self) -> None:
        """Fire timers until cancelled."""
        heap = self._heap
        idle = self._idle
        while True:
            if not heap:
                self._until = math.inf
                await self._lot.park()
                continue
            wake, _, turn = heap[0]
            if turn.ended:
                heapq.heappop(heap)
                continue
            now = trio.current_time()
            if now < wake:
                self._until = wake
                with trio.move_on_at(wake):
                    await self._lot.park()
                continue
            detail = turn.expired(now, idle)
            if detail is None:
                # Activity moved its idle clock: look again later.
                heapq.heapreplace(heap, (turn.wake_at(idle), next(self._order), turn))
                continue
            heapq.heappop(heap)
            turn.fire(detail)
