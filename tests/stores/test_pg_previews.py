"""Turn previews through PostgreSQL: published in batches, followed by any
process exactly once and in order, swept after their retention."""

from __future__ import annotations

import random
from collections.abc import AsyncIterator

import psycopg
import pytest
import trio

from turnledger.adapters.stores import PostgresStore, Previews, open_previews
from turnledger.adapters.stores._pg_previews import preview_key

pytestmark = pytest.mark.postgres


@pytest.fixture
async def store(pg_dsn: str) -> AsyncIterator[PostgresStore]:
    s = await PostgresStore.open(pg_dsn)
    async with s:
        yield s


async def _never() -> bool:
    return False


async def _collect(
    previews: Previews, sid: str, rid: str, after: int = 0, **kw: object
) -> list[tuple[int, str]]:
    got: list[tuple[int, str]] = []
    kw.setdefault("ended", _never)
    async for batch in previews.follow(sid, rid, after, **kw):  # type: ignore[arg-type]
        got.extend((d.seq, d.text) for d in batch)
    return got


async def test_a_follower_gets_the_rest_once_in_order_and_ends_at_the_end(
    store: PostgresStore,
) -> None:
    async with open_previews(store) as previews:
        for n in range(1, 6):
            previews.publish("s", "r", n, f"d{n} ")
        await previews.flushed()
        got: list[tuple[int, str]] = []

        async def follow() -> None:
            got.extend(await _collect(previews, "s", "r", after=2))

        with trio.fail_after(20):
            async with trio.open_nursery() as nursery:
                nursery.start_soon(follow)
                for n in range(6, 11):
                    await trio.sleep(0.02)
                    previews.publish("s", "r", n, f"d{n} ")
                previews.end("s", "r", 11)
        assert got == [(n, f"d{n} ") for n in range(3, 11)]
        # another turn's rows are never mixed in
        previews.publish("s", "other", 1, "x")
        previews.end("s", "other", 2)
        with trio.fail_after(10):
            assert await _collect(previews, "s", "other") == [(1, "x")]


async def test_followers_starting_at_any_moment_see_every_delta_exactly_once(
    store: PostgresStore,
) -> None:
    # The switch from reading the table to listening: followers start while
    # the owner writes, at random moments, each from a random delta; each
    # must get exactly the deltas after its start, once, in order.
    total = 150
    rng = random.Random(7)
    async with open_previews(store) as previews:
        results: dict[int, tuple[int, list[int]]] = {}

        async def follower(i: int, after: int) -> None:
            got = await _collect(previews, "s", "busy", after=after)
            results[i] = (after, [seq for seq, _ in got])

        with trio.fail_after(60):
            async with trio.open_nursery() as nursery:
                written = 0
                for n in range(1, total + 1):
                    previews.publish("s", "busy", n, f"{n},")
                    written = n
                    if n % 10 == 0:
                        for _ in range(3):
                            i = len(results) + len(nursery.child_tasks)
                            nursery.start_soon(follower, i, rng.randrange(0, written + 1))
                    await trio.sleep(rng.choice([0, 0, 0.001, 0.005]))
                previews.end("s", "busy", total + 1)
        assert len(results) == 45
        for after, seqs in results.values():
            assert seqs == list(range(after + 1, total + 1))
        # batched: fewer statements than rows
        assert previews.batches < previews.rows_published


async def test_text_reads_back_exactly(store: PostgresStore) -> None:
    texts = ["plain", "nul\x00inside", "lone \ud800 surrogate", "emoji 🦜", "", "a\r\nb"]
    async with open_previews(store) as previews:
        for n, t in enumerate(texts, 1):
            previews.publish("s é/ü", "r\n1", n, t)
        previews.end("s é/ü", "r\n1", len(texts) + 1)
        with trio.fail_after(10):
            got = await _collect(previews, "s é/ü", "r\n1")
    assert got == list(enumerate(texts, 1))


async def test_a_turn_without_an_end_row_ends_once_its_outcome_is_logged(
    store: PostgresStore,
) -> None:
    # The owner died: no end row ever comes. The follower asks `ended` at
    # the poll interval; once it says yes it waits the grace and ends.
    asked = 0
    logged = trio.Event()

    async def ended() -> bool:
        nonlocal asked
        asked += 1
        return logged.is_set()

    async with open_previews(store) as previews:
        previews.publish("s", "dead", 1, "a")
        previews.publish("s", "dead", 2, "b")
        got: list[tuple[int, str]] = []

        async def follow() -> None:
            got.extend(
                await _collect(previews, "s", "dead", ended=ended, poll_interval=0.1, end_grace=0.3)
            )

        with trio.fail_after(20):
            async with trio.open_nursery() as nursery:
                nursery.start_soon(follow)
                await trio.sleep(0.5)
                assert got == []  # still following (batches are yielded, not kept)
                started = trio.current_time()
                logged.set()
            took = trio.current_time() - started
    assert got == [(1, "a"), (2, "b")]
    assert asked >= 3  # polled while nothing came
    assert took < 2.0  # poll interval + grace, with room for a loaded machine


async def test_rows_are_swept_after_the_window_and_orphans_after_their_age(
    store: PostgresStore, pg_dsn: str
) -> None:
    async with open_previews(store, retain_after_end=0.5, orphan_after=2.0) as previews:
        previews.publish("s", "ended", 1, "x")
        previews.end("s", "ended", 2)
        previews.publish("s", "running", 1, "y")
        await previews.flushed()
        await previews.sweep()
        assert await previews.read("s", "ended", 0) == [(1, "delta", "x"), (2, "end", "")]
        await trio.sleep(0.8)
        # The ended turn's window passed; the running one stays.
        assert await previews.sweep() == 2
        assert await previews.read("s", "ended", 0) == []
        assert await previews.read("s", "running", 0) == [(1, "delta", "y")]
        await trio.sleep(1.5)
        # No end after the orphan age: its owner died; it goes too.
        assert await previews.sweep() == 1
        assert await previews.read("s", "running", 0) == []


async def test_a_lost_listening_connection_loses_no_delta(
    store: PostgresStore, pg_dsn: str
) -> None:
    async with open_previews(store) as previews:
        got: list[int] = []

        async def follow() -> None:
            async for batch in previews.follow("s", "cut", 0, ended=_never, poll_interval=30):
                got.extend(d.seq for d in batch)

        with trio.fail_after(30):
            async with trio.open_nursery() as nursery:
                nursery.start_soon(follow)
                previews.publish("s", "cut", 1, "a")
                await previews.flushed()
                while not got:
                    await trio.sleep(0.01)
                # The listening connection is cut (a proxy, a restart):
                # notifications sent meanwhile reach nobody.
                with psycopg.connect(pg_dsn, autocommit=True) as admin:
                    admin.execute(
                        "SELECT pg_terminate_backend(pid) FROM pg_stat_activity"
                        " WHERE query = %s AND pid <> pg_backend_pid()",
                        (f'LISTEN "{store.table}_previews"',),
                    )
                previews.publish("s", "cut", 2, "b")
                previews.end("s", "cut", 3)
        # Without the poll (30 s) only the re-listen's read-again got them.
        assert got == [1, 2]


async def test_bad_durations_are_refused_and_create_nothing(
    store: PostgresStore, pg_dsn: str
) -> None:
    for bad in ({"retain_after_end": 0}, {"orphan_after": -1}, {"sweep_every": 0}):
        with pytest.raises(ValueError, match="positive"):
            async with open_previews(store, **bad):  # type: ignore[arg-type]
                pass
    with psycopg.connect(pg_dsn) as conn:
        row = conn.execute("SELECT to_regclass(%s)", (f"{store.table}_previews",)).fetchone()
    assert row == (None,)


def test_the_key_is_short_and_tells_turns_apart() -> None:
    a, b = preview_key("s", "r1"), preview_key("s", "r2")
    assert len(a) == 16 and a != b
    assert preview_key("s\x00", "r") != preview_key("s", "\x00r")
