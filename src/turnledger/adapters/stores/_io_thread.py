"""One thread per database connection, fed by a queue, waking its trio
callers in groups: the machinery under the SQLite store's two threads and the
PostgreSQL store's writer.

A caller puts a :class:`Request` on the queue and parks its task; the thread
answers with :func:`deliver`, one ``run_sync_soon`` per trio run for a whole
group of answers. A parked caller cannot be cancelled (the abort always fails),
so a write is never abandoned halfway.
"""

from __future__ import annotations

import contextlib
import queue
import threading
from abc import ABC, abstractmethod
from collections.abc import Callable, Sequence
from typing import Any, Generic, TypeVar

import outcome
import trio

__all__ = ["Append", "Call", "Request", "Thread", "deliver", "each_alone"]

_C = TypeVar("_C")
_R = TypeVar("_R", bound="Request")


# --- requests handed to the threads ------------------------------------------


class Request:
    __slots__ = ("task", "token")

    task: trio.lowlevel.Task
    token: trio.lowlevel.TrioToken


class Append(Request):
    __slots__ = ("expected", "rows", "session_id")

    def __init__(self, session_id: str, expected: int, rows: list[tuple[Any, ...]]) -> None:
        self.session_id = session_id
        self.expected = expected
        self.rows = rows


class Call(Request):
    __slots__ = ("fn", "last")

    def __init__(self, fn: Callable[[Any], Any], last: bool = False) -> None:
        self.fn = fn
        self.last = last


def _wake(items: list[tuple[trio.lowlevel.Task, outcome.Outcome[Any]]]) -> None:
    for task, result in items:
        trio.lowlevel.reschedule(task, result)


def deliver(done: Sequence[tuple[Request, outcome.Outcome[Any]]]) -> None:
    # One wake-up per trio run for the whole group, not one per caller.
    by_token: dict[trio.lowlevel.TrioToken, list[tuple[trio.lowlevel.Task, Any]]] = {}
    for req, result in done:
        by_token.setdefault(req.token, []).append((req.task, result))
    for token, items in by_token.items():
        # Callers wait until woken, so their runs are alive.
        with contextlib.suppress(trio.RunFinishedError):
            token.run_sync_soon(_wake, items)


def each_alone(
    group: Sequence[_R],
    handle: Callable[[list[_R]], list[tuple[Request, outcome.Outcome[Any]]]],
) -> list[tuple[Request, outcome.Outcome[Any]]]:
    """After a group failed as a whole: each request handled in a group of
    its own, so each caller learns its own fate."""
    out: list[tuple[Request, outcome.Outcome[Any]]] = []
    for req in group:
        out.extend(handle([req]))
    return out


def _abort_never(_: Any) -> trio.lowlevel.Abort:
    return trio.lowlevel.Abort.FAILED


class Thread(ABC, Generic[_C]):
    """A thread owning one connection, fed by a queue of requests."""

    def __init__(self, name: str) -> None:
        self.queue: queue.SimpleQueue[Request] = queue.SimpleQueue()
        self.conn: _C | None = None
        self.thread = threading.Thread(target=self._main, name=name, daemon=True)
        self.thread.start()

    async def call(self, request: Request) -> Any:
        request.task = trio.lowlevel.current_task()
        request.token = trio.lowlevel.current_trio_token()
        self.queue.put(request)
        return await trio.lowlevel.wait_task_rescheduled(_abort_never)

    def gather(
        self, first: _R, fits: Callable[[Request], bool], limit: int
    ) -> tuple[list[_R], Request | None]:
        """``first`` and the requests queued behind it while ``fits`` takes
        them, ``limit`` in all at most; and the first one not taken, to be
        handled next (so FIFO order holds, with calls such as close too)."""
        group = [first]
        while len(group) < limit:
            try:
                nxt = self.queue.get_nowait()
            except queue.Empty:
                break
            if not fits(nxt):
                return group, nxt
            group.append(nxt)  # type: ignore[arg-type]  # fits took it
        return group, None

    def _main(self) -> None:
        carry: Request | None = None
        while True:
            req = carry if carry is not None else self.queue.get()
            carry = None
            if isinstance(req, Call):
                deliver([(req, outcome.capture(req.fn, self.conn))])
                if req.last:
                    return
            else:
                carry = self.handle(req)

    @abstractmethod
    def handle(self, req: Request) -> Request | None: ...
