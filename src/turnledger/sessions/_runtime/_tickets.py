"""What a caller holds for one Submit: the preview chunks and, at the end, the result."""

from __future__ import annotations

import trio

from .._results import TurnResult

__all__ = ["Ticket"]


class Ticket:
    """Preview chunks while the turn runs, then its result (or the error that ended it).

    Written by the session's actor, read by :class:`~turnledger.sessions.TurnHandle`.
    Readers wait with :meth:`wait`: a list of parked tasks made on the first
    wait, rather than a ``ParkingLot`` per ticket (one ticket per turn, and
    most turns have one reader).
    """

    __slots__ = ("_waiters", "chunks", "error", "result")

    def __init__(self) -> None:
        self.chunks: list[str] = []
        self.result: TurnResult | None = None
        self.error: BaseException | None = None
        self._waiters: list[trio.lowlevel.Task] | None = None

    @property
    def done(self) -> bool:
        return self.result is not None or self.error is not None

    async def wait(self) -> None:
        """Wait until the ticket changes (a chunk, the result or an error).

        A cancel point and a schedule point (it always parks), like
        ``ParkingLot.park``.
        """
        task = trio.lowlevel.current_task()
        waiters = self._waiters
        if waiters is None:
            waiters = self._waiters = []
        waiters.append(task)

        def abort(_: object) -> trio.lowlevel.Abort:
            waiters.remove(task)
            return trio.lowlevel.Abort.SUCCEEDED

        await trio.lowlevel.wait_task_rescheduled(abort)

    def _wake(self) -> None:
        waiters = self._waiters
        if waiters:
            self._waiters = None
            for task in waiters:
                trio.lowlevel.reschedule(task)

    def push(self, text: str) -> None:
        if self.result is None and self.error is None:
            self.chunks.append(text)
            self._wake()

    def resolve(self, result: TurnResult) -> None:
        if not self.done:
            self.result = result
            self._wake()

    def fail(self, error: BaseException) -> None:
        if not self.done:
            self.error = error
            self._wake()
