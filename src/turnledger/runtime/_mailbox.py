"""A session actor's mailbox: a bounded queue with many senders and one receiver.

Why not a trio memory channel. The actor takes every message already queued
in one go (one batch, one store append), wakes up for pokes that carry
nothing, and is the only receiver. Through a channel each message cost a
``receive_nowait`` (one ``WouldBlock`` raised per wake-up to end the batch),
each wake-up a fresh abort closure, and each poke a queued item to filter
out again; all of it garbage for the cyclic GC, per message. Here a wake-up
costs one ``reschedule``, a batch one list.

The semantics the hub relies on are the channel's:

- :meth:`send_nowait` queues the message, raises ``trio.WouldBlock`` if the
  mailbox already holds ``size`` messages, ``trio.BrokenResourceError`` once
  it is closed. A message that wakes the waiting receiver is handed over, as
  a channel does: it does not take one of the ``size`` places.
- :meth:`send` waits while the mailbox is full; blocked senders get in, in
  the order they came, as the receiver takes messages. Cancellation: if
  cancelled, the message was not sent (nor is it later).
- :meth:`close` (by the receiver) drops what is queued and makes every
  blocked and later sender fail with ``trio.BrokenResourceError``.
- :meth:`poke` wakes the receiver without queuing anything; it never fails.
"""

from __future__ import annotations

from typing import Generic, TypeVar

import outcome
import trio

__all__ = ["Mailbox"]

T = TypeVar("T")

_reschedule = trio.lowlevel.reschedule


class Mailbox(Generic[T]):
    """Messages for one receiving task; see the module docstring."""

    __slots__ = ("_abort", "_closed", "_extra", "_poked", "_queue", "_receiver", "_senders", "size")

    def __init__(self, size: int) -> None:
        if size < 1:
            raise ValueError(f"a mailbox holds at least one message, not {size}")
        #: Messages queued before senders wait.
        self.size = size
        # A list, not a deque: an empty deque takes about 760 bytes (its
        # first block of 64 slots), an empty list 56, and every idle session
        # has a mailbox. The queue never holds more than ``size`` messages
        # plus those of a batch, so taking from its front stays cheap.
        self._queue: list[T] = []
        #: The receiver while it waits for a message or a poke.
        self._receiver: trio.lowlevel.Task | None = None
        #: 1 while a message handed to the waiting receiver is still queued
        #: (it ran not yet): that message takes none of the ``size`` places.
        self._extra = 0
        self._poked = False
        self._closed = False
        #: Blocked senders and their messages, in the order they came (made
        #: on the first one: most mailboxes never fill up).
        self._senders: dict[trio.lowlevel.Task, T] | None = None
        # Bound once: the receiver parks for every batch.
        self._abort = self._abort_receive

    def __len__(self) -> int:
        """Messages queued (not counting those of blocked senders)."""
        return len(self._queue)

    @property
    def closed(self) -> bool:
        return self._closed

    # -- senders -------------------------------------------------------------

    def send_nowait(self, item: T) -> None:
        """Queue ``item`` without blocking; not a checkpoint.

        Raises:
            trio.WouldBlock: the mailbox is full.
            trio.BrokenResourceError: the mailbox is closed.
        """
        if self._closed:
            raise trio.BrokenResourceError("the mailbox is closed")
        queue = self._queue
        if len(queue) >= self.size + self._extra:
            raise trio.WouldBlock
        queue.append(item)
        task = self._receiver
        if task is not None:
            self._receiver = None
            self._extra = 1
            _reschedule(task)

    async def send(self, item: T) -> None:
        """Queue ``item``, waiting while the mailbox is full.

        A cancel point and a schedule point.

        Raises:
            trio.BrokenResourceError: the mailbox is (or got) closed; the
                message was not delivered.

        Cancellation: if cancelled, the message was not sent.
        """
        await trio.lowlevel.checkpoint_if_cancelled()
        try:
            self.send_nowait(item)
        except trio.WouldBlock:
            pass
        else:
            await trio.lowlevel.cancel_shielded_checkpoint()
            return
        task = trio.lowlevel.current_task()
        senders = self._senders
        if senders is None:
            senders = self._senders = {}
        senders[task] = item

        def abort(_: object) -> trio.lowlevel.Abort:
            del senders[task]
            return trio.lowlevel.Abort.SUCCEEDED

        await trio.lowlevel.wait_task_rescheduled(abort)

    def poke(self) -> None:
        """Make the receiver's current or next :meth:`receive` return, even
        with nothing queued. Never blocks, never fails, not a checkpoint."""
        if self._closed:
            return
        task = self._receiver
        if task is None:
            self._poked = True
        else:
            self._receiver = None
            _reschedule(task)

    # -- the receiver --------------------------------------------------------

    async def receive(self, limit: int) -> list[T]:
        """Wait for messages (or a poke), then take at most ``limit`` of them,
        oldest first: possibly none, after a poke.

        A cancel point and a schedule point. Only one task may receive.

        Cancellation: if cancelled, nothing was taken.
        """
        if self._queue or self._poked or self._senders:
            await trio.lowlevel.checkpoint()
        else:
            assert self._receiver is None, "a mailbox has one receiver"
            self._receiver = trio.lowlevel.current_task()
            await trio.lowlevel.wait_task_rescheduled(self._abort)
        self._poked = False
        return self.receive_nowait(limit)

    def _abort_receive(self, _: object) -> trio.lowlevel.Abort:
        self._receiver = None
        return trio.lowlevel.Abort.SUCCEEDED

    def receive_nowait(self, limit: int) -> list[T]:
        """Take at most ``limit`` messages without waiting (possibly none);
        not a checkpoint. Blocked senders then get in, as far as there is room."""
        self._extra = 0
        queue = self._queue
        if len(queue) <= limit:
            batch = queue  # the whole queue, without a copy
            queue = self._queue = []
        else:
            batch = queue[:limit]
            del queue[:limit]
        senders = self._senders
        while senders and len(queue) < self.size:
            # Their messages come after those queued before, in their order;
            # those that fit in the batch go straight into it.
            task = next(iter(senders))
            item = senders.pop(task)
            if len(batch) < limit:
                batch.append(item)
            else:
                queue.append(item)
            _reschedule(task)
        return batch

    def close(self) -> None:
        """Drop what is queued; blocked and later senders get
        ``trio.BrokenResourceError``. Not a checkpoint; idempotent."""
        self._closed = True
        self._queue.clear()
        self._poked = False
        senders = self._senders
        if senders:
            for task in senders:
                _reschedule(task, outcome.Error(trio.BrokenResourceError("the mailbox is closed")))
            senders.clear()
        receiver = self._receiver
        if receiver is not None:
            # Closed under a waiting receiver (not how the actor uses it):
            # it returns with nothing rather than waiting forever.
            self._receiver = None
            _reschedule(receiver)
