"""What a caller holds for one Submit: the preview chunks and, at the end, the result."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import trio

from ..sessions._results import TurnResult

__all__ = ["Ticket"]


class Ticket:
    """Preview chunks while the turn runs, then its result (or the error that ended it).

    Written by the session's actor, read by :class:`~turnledger.sessions.TurnHandle`.
    Readers wait with :meth:`wait`, or park through :meth:`park` themselves.
    Rather than a ``ParkingLot`` per ticket (one ticket per turn, and most
    turns have one reader), the first parked task has a slot of its own and
    the ticket itself as its abort function (:meth:`__call__`); only further
    readers get a list, and an abort function each that knows them. Nor is
    there a list of chunks until a chunk or a reader of them comes (an
    instant answer has none). Every turn makes a ticket and waits on it
    once, and each object not made is one the cyclic collector does not
    count.
    """

    __slots__ = ("_chunks", "_first", "_more", "error", "result", "settled")

    def __init__(self) -> None:
        self._chunks: list[str] | None = None
        self.result: TurnResult | None = None
        self.error: BaseException | None = None
        #: Done with neither result nor error: a command with no turn (a switch).
        self.settled = False
        self._first: trio.lowlevel.Task | None = None
        self._more: list[trio.lowlevel.Task] | None = None

    @property
    def chunks(self) -> list[str]:
        """The preview chunks so far (the list itself: the actor extends it)."""
        chunks = self._chunks
        if chunks is None:
            chunks = self._chunks = []
        return chunks

    @property
    def done(self) -> bool:
        return self.result is not None or self.error is not None or self.settled

    async def wait(self) -> None:
        """Wait until the ticket changes (a chunk, the result or an error).

        A cancel point and a schedule point (it always parks), like
        ``ParkingLot.park``.
        """
        await trio.lowlevel.wait_task_rescheduled(self.park())

    def park(self) -> Callable[[Any], trio.lowlevel.Abort]:
        """Register the current task to be rescheduled when the ticket
        changes; return the abort function for
        :func:`trio.lowlevel.wait_task_rescheduled`, which the caller must
        await next (:meth:`wait` does both; a reader that calls ``park``
        saves a coroutine per wait)."""
        task = trio.lowlevel.current_task()
        if self._first is None:
            self._first = task
            return self
        more = self._more
        if more is None:
            more = self._more = []
        more.append(task)

        def abort(_: object) -> trio.lowlevel.Abort:
            more.remove(task)
            return trio.lowlevel.Abort.SUCCEEDED

        return abort

    def __call__(self, _: object) -> trio.lowlevel.Abort:
        """Abort the wait of the task in the first slot.

        Only that task was given the ticket as its abort function, and trio
        calls it only while that task is still parked here (a woken task has
        left the slot and is never aborted).
        """
        self._first = None
        return trio.lowlevel.Abort.SUCCEEDED

    def _wake(self) -> None:
        first = self._first
        if first is not None:
            self._first = None
            trio.lowlevel.reschedule(first)
        more = self._more
        if more:
            self._more = None
            for task in more:
                trio.lowlevel.reschedule(task)

    def push(self, text: str) -> None:
        if self.result is None and self.error is None:
            chunks = self._chunks
            if chunks is None:
                self._chunks = [text]
            else:
                chunks.append(text)
            self._wake()

    def resolve(self, result: TurnResult) -> None:
        if not self.done:
            self.result = result
            self._wake()

    def settle(self) -> None:
        """End a ticket that has no turn to report (a switch that happened)."""
        if not self.done:
            self.settled = True
            self._wake()

    def fail(self, error: BaseException) -> None:
        if not self.done:
            self.error = error
            self._wake()
