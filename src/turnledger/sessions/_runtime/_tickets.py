"""What a caller holds for one Submit: the preview chunks and, at the end, the result."""

from __future__ import annotations

import trio

from .._results import TurnResult

__all__ = ["Ticket"]


class Ticket:
    """Preview chunks while the turn runs, then its result (or the error that ended it).

    Written by the session's actor, read by :class:`~turnledger.sessions.TurnHandle`.
    """

    __slots__ = ("chunks", "error", "lot", "result")

    def __init__(self) -> None:
        self.chunks: list[str] = []
        self.result: TurnResult | None = None
        self.error: BaseException | None = None
        self.lot = trio.lowlevel.ParkingLot()

    @property
    def done(self) -> bool:
        return self.result is not None or self.error is not None

    def push(self, text: str) -> None:
        if self.result is None and self.error is None:
            self.chunks.append(text)
            if self.lot:
                self.lot.unpark_all()

    def resolve(self, result: TurnResult) -> None:
        if not self.done:
            self.result = result
            self.lot.unpark_all()

    def fail(self, error: BaseException) -> None:
        if not self.done:
            self.error = error
            self.lot.unpark_all()
