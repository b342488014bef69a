"""Snapshots in a running hub: a long session reopens from its latest
snapshot plus the events after it (after a restart and after passivation),
on SQLite, the journal and PostgreSQL; a damaged, outdated or stale snapshot
is ignored with a warning that says why, and the session replays in full."""

from __future__ import annotations

import sqlite3
from pathlib import Path
from typing import Any

import attrs
import pytest
import trio

from turnledger.adapters.stores import (
    MemorySnapshots,
    open_store,
    snapshots_beside,
    store_kind,
)
from turnledger.events import DEFAULT_CODEC
from turnledger.runtime._snapshots import recover_state
from turnledger.sessions import CommittedResult, open_hub, replay
from turnledger.testing import ScriptedProvider


class Lines:
    """A logger that keeps its lines."""

    def __init__(self) -> None:
        self.lines: list[tuple[str, str, dict[str, Any]]] = []

    def warning(self, event: str, **kw: Any) -> None:
        self.lines.append(("warning", event, kw))

    def debug(self, event: str, **kw: Any) -> None:
        self.lines.append(("debug", event, kw))


@pytest.fixture(params=["sqlite", "journal", pytest.param("postgres", marks=pytest.mark.postgres)])
def target(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    if request.param == "postgres":
        dsn: str = request.getfixturevalue("pg_dsn")
        return dsn
    return str(tmp_path / ("events.db" if request.param == "sqlite" else "events.jsonl"))


async def run_turns(store: Any, snaps: Any, sid: str, questions: list[str], **kw: Any) -> None:
    async with open_hub(store, ScriptedProvider(), model="m", snapshots=snaps, **kw) as hub:
        for q in questions:
            result = await (await hub.submit(sid, q)).outcome()
            assert isinstance(result, CommittedResult)


async def wait_for_snapshot(snaps: Any, sid: str, at_least: int) -> int:
    with trio.fail_after(10):
        while True:
            snap = await snaps.latest(sid)
            if snap is not None and snap.version >= at_least:
                return int(snap.version)
            await trio.sleep(0.01)


async def test_a_session_reopens_from_its_snapshot(target: str) -> None:
    with trio.fail_after(60):
        store = await open_store(target)
        snaps = await snapshots_beside(target)
        try:
            # snapshot every 10 events: 12 turns of 3 events + the start = 37
            await run_turns(store, snaps, "long", [f"q{i}" for i in range(12)], snapshot_every=10)
            version = await wait_for_snapshot(snaps, "long", 10)
            assert 10 <= version <= 37
            full = replay(await store.read_decoded("long", DEFAULT_CODEC))
            log = Lines()
            state, used = await recover_state(store, "long", snaps, log)
            assert used == version and state == full
            assert ("debug", "snapshot_used") in [(a, b) for a, b, _ in log.lines]

            # A restart: a new hub reopens the session from the snapshot and goes on.
            await run_turns(store, snaps, "long", ["after restart"], snapshot_every=10)
            async with open_hub(store, ScriptedProvider(), model="m", snapshots=snaps) as hub:
                history = await hub.history("long")
            assert [t.question for t in history] == [*(f"q{i}" for i in range(12)), "after restart"]

            # Passivation: the actor stops when idle and comes back by its snapshot.
            async with open_hub(
                store, ScriptedProvider(), model="m", snapshots=snaps,
                snapshot_every=5, passivate_after=0.05,
            ) as hub:  # fmt: skip
                await (await hub.submit("long", "one more")).outcome()
                with trio.fail_after(10):
                    while hub.statistics().actors:
                        await trio.sleep(0.02)
                result = await (await hub.submit("long", "and again")).outcome()
                assert isinstance(result, CommittedResult)
                assert len(await hub.history("long")) == 15
            assert (
                replay(await store.read_decoded("long", DEFAULT_CODEC))
                == (await recover_state(store, "long", snaps, Lines()))[0]
            )
        finally:
            await snaps.aclose()
            await store.aclose()


async def test_a_damaged_or_stale_snapshot_falls_back_to_full_replay(tmp_path: Path) -> None:
    db = str(tmp_path / "events.db")
    with trio.fail_after(60):
        store = await open_store(db)
        snaps = await snapshots_beside(db)
        try:
            await run_turns(store, snaps, "s", [f"q{i}" for i in range(6)], snapshot_every=4)
            await wait_for_snapshot(snaps, "s", 4)
            full = replay(await store.read_decoded("s", DEFAULT_CODEC))
        finally:
            await snaps.aclose()

        # One bit flipped in the stored body.
        conn = sqlite3.connect(db + ".snapshots")
        with conn:
            (body,) = conn.execute("SELECT body FROM snapshots").fetchone()
            damaged = bytearray(body)
            damaged[len(damaged) // 2] ^= 0x20
            conn.execute("UPDATE snapshots SET body=?", (bytes(damaged),))
        conn.close()
        snaps = await snapshots_beside(db)
        try:
            log = Lines()
            state, used = await recover_state(store, "s", snaps, log)
            assert used == 0 and state == full
            (warning,) = [kw for lvl, ev, kw in log.lines if ev == "snapshot_ignored"]
            assert "checksum" in warning["reason"]
            # the hub still serves the session, from a full replay
            async with open_hub(store, ScriptedProvider(), model="m", snapshots=snaps) as hub:
                assert len(await hub.history("s")) == 6
        finally:
            await snaps.aclose()
            await store.aclose()

    # Outdated (another schema) and stale (the anchor event is not the one).
    mem = MemorySnapshots()
    store = await open_store(str(tmp_path / "other.db"))
    try:
        await run_turns(store, mem, "s", ["a", "b"], snapshot_every=3)
        await wait_for_snapshot(mem, "s", 3)
        good = mem.kept["s"]
        for bad, why in [
            (attrs.evolve(good, schema=good.schema + 1), "outdated"),
            (attrs.evolve(good, anchor_at=good.anchor_at + 1), "not this session's"),
            (attrs.evolve(good, version=99), "inconsistent"),
        ]:
            mem.kept["s"] = bad
            log = Lines()
            state, used = await recover_state(store, "s", mem, log)
            assert used == 0 and len(state.turns) == 2
            (warning,) = [kw for lvl, ev, kw in log.lines if ev == "snapshot_ignored"]
            assert why in warning["reason"]
    finally:
        await store.aclose()


async def test_snapshots_are_written_off_the_critical_path(tmp_path: Path) -> None:
    """A snapshot store that hangs does not hold up any turn."""

    class Hanging(MemorySnapshots):
        async def save(self, snapshot: Any) -> None:
            await trio.sleep_forever()

    store = await open_store(str(tmp_path / "e.db"))
    try:
        with trio.fail_after(20):
            await run_turns(
                store, Hanging(), "s", [f"q{i}" for i in range(10)],
                snapshot_every=2, shutdown_grace=0.2,
            )  # fmt: skip
    finally:
        await store.aclose()
    assert store_kind(str(tmp_path / "e.db")) == "sqlite"


async def test_a_snapshot_is_due_by_characters_too(tmp_path: Path) -> None:
    mem = MemorySnapshots()
    store = await open_store(str(tmp_path / "e.db"))
    try:
        with trio.fail_after(20):
            # No count trigger. Each turn commits 40 + 46 characters
            # (question, "echo: " + question): the third passes 200.
            async with open_hub(
                store, ScriptedProvider(), model="m", snapshots=mem,
                snapshot_every=None, snapshot_chars=200,
            ) as hub:  # fmt: skip
                for i in range(3):
                    if i == 2:
                        await trio.sleep(0.2)  # time for a snapshot, were one due
                        assert "s" not in mem.kept
                    await (await hub.submit("s", f"{i} " + "x" * 38)).outcome()
                version = await wait_for_snapshot(mem, "s", 1)
        assert version == 1 + 3 * 3  # after the third turn's commit
        state, used = await recover_state(store, "s", mem, Lines())
        assert used == version and len(state.turns) == 3
    finally:
        await store.aclose()


async def test_erasing_a_session_drops_its_snapshot_first(tmp_path: Path) -> None:
    db = str(tmp_path / "e.db")
    canary = "pangolin-canary-93c1"
    store = await open_store(db)
    snaps = await snapshots_beside(db)
    try:
        with trio.fail_after(30):
            async with open_hub(
                store, ScriptedProvider(), model="m", snapshots=snaps, snapshot_every=4
            ) as hub:
                for sid in ("gone", "kept"):
                    for i in range(3):
                        await (await hub.submit(sid, f"{canary} {i}")).outcome()
                await wait_for_snapshot(snaps, "gone", 4)
                await wait_for_snapshot(snaps, "kept", 4)
                await hub.erase("gone")
                assert await snaps.latest("gone") is None
                assert await snaps.latest("kept") is not None
                # trimming (a retention step) drops the snapshot too
                from turnledger.sessions import RetentionPolicy

                steps = await hub.prune(RetentionPolicy(max_turns=1))
                assert [s.session_id for s in steps] == ["kept"]
                assert await snaps.latest("kept") is None
    finally:
        await snaps.aclose()
        await store.aclose()
    raw = (tmp_path / "e.db.snapshots").read_bytes()
    assert canary.encode() not in raw


async def test_a_long_session_reopens_from_the_head_and_reads_its_older_part_once(
    tmp_path: Path,
) -> None:
    """A session longer than a snapshot's head reopens with its older turns
    unread, equals the full replay once they are read, and goes on. An
    older part found damaged when first needed fails that need with a
    typed error, is logged, and the snapshot is dropped: the next open
    replays in full."""
    from turnledger import SessionClosed
    from turnledger.sessions._snapshot import NEWEST, SnapshotInvalid, take_snapshot

    db = str(tmp_path / "events.db")
    turns = NEWEST + 16
    with trio.fail_after(120):
        store = await open_store(db)
        snaps = await snapshots_beside(db)
        try:
            await run_turns(store, snaps, "s", [f"q{i}" for i in range(turns)], snapshot_every=200)
            version = await wait_for_snapshot(snaps, "s", 200)
            snap = await snaps.latest("s")
            assert snap is not None and not snap.older and snap.load_older is not None
            full = replay(await store.read_decoded("s", DEFAULT_CODEC))
            state, used = await recover_state(store, "s", snaps, Lines())
            assert used == version
            assert state.turns._off() > 0  # the older turns are not read yet
            assert state.turns[-1] == full.turns[-1] and len(state.turns) == turns
            assert state == full and state.turns._off() == 0
            eager, _ = await recover_state(store, "s", snaps, Lines(), lazy=False)
            assert eager.turns._off() == 0 and eager == full
            async with open_hub(store, ScriptedProvider(), model="m", snapshots=snaps) as hub:
                result = await (await hub.submit("s", "after reopen")).outcome()
                assert isinstance(result, CommittedResult)
                assert len(await hub.history("s")) == turns + 1
        finally:
            await snaps.aclose()

        def damage() -> None:
            conn = sqlite3.connect(db + ".snapshots")
            with conn:
                (older,) = conn.execute("SELECT older FROM snapshots").fetchone()
                flipped = bytearray(older)
                flipped[len(flipped) // 2] ^= 0x20
                conn.execute("UPDATE snapshots SET older=?", (bytes(flipped),))
            conn.close()

        damage()
        snaps = await snapshots_beside(db)
        try:
            # In a hub: the turn that first needs the older turns is refused
            # (nothing of it written), the next one goes on from a full replay.
            async with open_hub(store, ScriptedProvider(), model="m", snapshots=snaps) as hub:
                with pytest.raises(SessionClosed, match="SnapshotInvalid"):
                    await (await hub.submit("s", "x")).outcome()
                result = await (await hub.submit("s", "y")).outcome()
                assert isinstance(result, CommittedResult)
                history = await hub.history("s")
            assert [t.question for t in history][-2:] == ["after reopen", "y"]
            with trio.fail_after(10):
                while await snaps.latest("s") is not None:  # dropped in the background
                    await trio.sleep(0.01)

            # recover_state itself: the damage is logged when found.
            events = await store.read("s")
            full = replay(DEFAULT_CODEC.decode(e) for e in events)
            last = events[-1]
            await snaps.save(take_snapshot("s", full, last.tag, last.recorded_at, newest=4))
            damage()
            log = Lines()
            state, used = await recover_state(store, "s", snaps, log)
            assert used == len(events) and state.turns[-1] == full.turns[-1]
            with pytest.raises(SnapshotInvalid, match="checksum"):
                list(state.turns)
            (warning,) = [kw for lvl, ev, kw in log.lines if ev == "snapshot_ignored"]
            assert "older part" in warning["reason"]
            with trio.fail_after(10):
                while await snaps.latest("s") is not None:
                    await trio.sleep(0.01)
            state, used = await recover_state(store, "s", snaps, Lines())
            assert used == 0 and state == full
        finally:
            await snaps.aclose()
            await store.aclose()
