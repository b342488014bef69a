"""The ticket a caller waits on: its first reader parks in a slot with the
ticket as abort function, further readers in a list; cancelling any of them
leaves the others parked, and a change wakes every one still parked."""

from __future__ import annotations

import pytest
import trio
import trio.testing

from turnledger.runtime._tickets import Ticket


def _nobody_parked(ticket: Ticket) -> bool:
    return ticket._first is None and not ticket._more


async def _readers(ticket: Ticket, n: int, woken: list[int], nursery: trio.Nursery) -> None:
    for i in range(n):

        async def read(i: int = i) -> None:
            await ticket.wait()
            woken.append(i)

        nursery.start_soon(read)
    await trio.testing.wait_all_tasks_blocked()


@pytest.mark.parametrize("readers", [1, 2, 4])
async def test_a_change_wakes_every_reader_once(readers: int) -> None:
    ticket = Ticket()
    woken: list[int] = []
    async with trio.open_nursery() as nursery:
        await _readers(ticket, readers, woken, nursery)
        ticket.push("a")
        await trio.testing.wait_all_tasks_blocked()
        assert sorted(woken) == list(range(readers))
        ticket.push("b")  # nobody parked: nothing to wake
    assert ticket.chunks == ["a", "b"]
    assert _nobody_parked(ticket)


@pytest.mark.parametrize("cancelled", [0, 1, 2])
async def test_a_cancelled_reader_leaves_the_others_parked(cancelled: int) -> None:
    # Reader 0 has the first slot, 1 and 2 the list. After one is cancelled,
    # reader 3 parks (in the first slot if it was free); then the ticket
    # fails and wakes exactly the three still parked.
    ticket = Ticket()
    woken: list[int] = []
    scopes = [trio.CancelScope() for _ in range(4)]

    async def read(i: int) -> None:
        with scopes[i]:
            await ticket.wait()
            woken.append(i)

    async with trio.open_nursery() as nursery:
        for i in range(3):
            nursery.start_soon(read, i)
            await trio.testing.wait_all_tasks_blocked()  # parked in this order
        scopes[cancelled].cancel()
        await trio.testing.wait_all_tasks_blocked()
        assert woken == []
        assert (ticket._first is None) == (cancelled == 0)
        nursery.start_soon(read, 3)
        await trio.testing.wait_all_tasks_blocked()
        assert ticket._first is not None
        ticket.fail(RuntimeError("gone"))
        await trio.testing.wait_all_tasks_blocked()
    assert sorted(woken) == sorted({0, 1, 2, 3} - {cancelled})
    assert _nobody_parked(ticket)


async def test_a_reader_woken_then_parked_again_is_aborted_alone() -> None:
    # The first slot is given up on every wake: a task that parks again
    # after a chunk takes it again, and its cancellation touches only it.
    ticket = Ticket()
    log: list[str] = []

    async def preview() -> None:
        while not ticket.done:
            await ticket.wait()
            log.append(f"chunks {len(ticket.chunks)}")

    async with trio.open_nursery() as nursery:
        nursery.start_soon(preview)
        await trio.testing.wait_all_tasks_blocked()
        ticket.push("a")
        await trio.testing.wait_all_tasks_blocked()
        ticket.push("b")
        await trio.testing.wait_all_tasks_blocked()
        nursery.cancel_scope.cancel()
    assert log == ["chunks 1", "chunks 2"]
    assert _nobody_parked(ticket)
    with trio.testing.assert_checkpoints():
        with trio.move_on_after(0):
            await ticket.wait()  # always parks, even when cancelled at once
    assert _nobody_parked(ticket)
