"""The actor's mailbox: bounded, ordered, one receiver, with the cancellation
and close semantics of a trio memory channel where the hub relies on them."""

from __future__ import annotations

from collections.abc import Callable

import pytest
import trio
import trio.testing

from turnledger.runtime._mailbox import Mailbox


async def woken_by(box: Mailbox[int], wake: Callable[[], None]) -> list[int]:
    """What a receiver waiting on ``box`` gets once ``wake()`` ran."""
    got: list[list[int]] = []

    async def receiver() -> None:
        got.append(await box.receive(10))

    async with trio.open_nursery() as nursery:
        nursery.start_soon(receiver)
        await trio.testing.wait_all_tasks_blocked()
        wake()
    return got[0]


async def test_messages_come_out_in_order_and_in_batches_of_at_most_the_limit() -> None:
    box: Mailbox[int] = Mailbox(8)
    for i in range(5):
        box.send_nowait(i)
    assert len(box) == 5
    assert await box.receive(3) == [0, 1, 2]
    assert await box.receive(3) == [3, 4]
    assert len(box) == 0
    assert box.receive_nowait(3) == []


async def test_a_full_mailbox_refuses_send_nowait_and_makes_send_wait() -> None:
    box: Mailbox[str] = Mailbox(2)
    box.send_nowait("a")
    box.send_nowait("b")
    with pytest.raises(trio.WouldBlock):
        box.send_nowait("c")
    done: list[str] = []

    async def sender(item: str) -> None:
        await box.send(item)
        done.append(item)

    async with trio.open_nursery() as nursery:
        nursery.start_soon(sender, "c")
        await trio.testing.wait_all_tasks_blocked()
        nursery.start_soon(sender, "d")
        await trio.testing.wait_all_tasks_blocked()
        assert done == []
        # Taking one makes room for one blocked sender, the first that came.
        assert box.receive_nowait(1) == ["a"]
        await trio.testing.wait_all_tasks_blocked()
        assert done == ["c"]
        assert len(box) == 2
        # A batch with room takes what was queued, then the blocked senders' messages.
        assert await box.receive(10) == ["b", "c", "d"]
    assert done == ["c", "d"]


async def test_a_message_handed_to_the_waiting_receiver_takes_no_place() -> None:
    # As with a memory channel: the receiver was waiting, so the first
    # message is handed over and `size` more fit behind it.
    box: Mailbox[int] = Mailbox(1)

    def send() -> None:
        box.send_nowait(1)
        box.send_nowait(2)
        with pytest.raises(trio.WouldBlock):
            box.send_nowait(3)

    assert await woken_by(box, send) == [1, 2]
    # Once the receiver took them, the mailbox holds `size` again.
    box.send_nowait(4)
    with pytest.raises(trio.WouldBlock):
        box.send_nowait(5)


async def test_a_poke_wakes_the_receiver_with_nothing() -> None:
    box: Mailbox[int] = Mailbox(4)
    assert await woken_by(box, box.poke) == []
    # A poke while nobody waits makes the next receive return at once.
    box.poke()
    with trio.fail_after(1):
        assert await box.receive(10) == []
    # And only that one.
    with trio.move_on_after(0.01) as scope:
        await box.receive(10)
    assert scope.cancelled_caught


async def test_a_cancelled_receiver_took_nothing_and_may_receive_again() -> None:
    box: Mailbox[int] = Mailbox(4)
    with trio.move_on_after(0.01) as scope:
        await box.receive(10)
    assert scope.cancelled_caught
    box.send_nowait(1)
    assert await box.receive(10) == [1]
    # Cancelled while messages wait: the receive is a cancel point, and the
    # messages stay for the next one.
    box.send_nowait(2)
    with trio.CancelScope() as cancelled:
        cancelled.cancel()
        await box.receive(10)
    assert len(box) == 1
    assert await box.receive(10) == [2]


async def test_a_cancelled_sender_sent_nothing() -> None:
    box: Mailbox[str] = Mailbox(1)
    box.send_nowait("a")
    async with trio.open_nursery() as nursery:
        scope = trio.CancelScope()

        async def sender() -> None:
            with scope:
                await box.send("never")

        nursery.start_soon(sender)
        await trio.testing.wait_all_tasks_blocked()
        scope.cancel()
    assert scope.cancelled_caught
    assert await box.receive(10) == ["a"]
    assert box.receive_nowait(10) == []
    # Cancelled before it could even look: nothing sent, though there is room.
    with trio.CancelScope() as cancelled:
        cancelled.cancel()
        await box.send("never either")
    assert len(box) == 0


async def test_closing_breaks_blocked_and_later_senders_and_drops_the_queue() -> None:
    box: Mailbox[str] = Mailbox(1)
    box.send_nowait("a")
    errors: list[BaseException] = []

    async def sender() -> None:
        try:
            await box.send("b")
        except trio.BrokenResourceError as exc:
            errors.append(exc)

    async with trio.open_nursery() as nursery:
        nursery.start_soon(sender)
        await trio.testing.wait_all_tasks_blocked()
        box.close()
    assert len(errors) == 1
    assert box.closed and len(box) == 0
    with pytest.raises(trio.BrokenResourceError):
        box.send_nowait("c")
    with pytest.raises(trio.BrokenResourceError):
        await box.send("c")
    box.poke()  # never fails
    box.close()  # idempotent


async def test_close_under_a_waiting_receiver_wakes_it_with_nothing() -> None:
    box: Mailbox[int] = Mailbox(1)
    assert await woken_by(box, box.close) == []


def test_a_mailbox_holds_at_least_one_message() -> None:
    with pytest.raises(ValueError, match="at least one"):
        Mailbox[int](0)
