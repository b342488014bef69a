"""Snapshots and branches: a session that has branched is not snapshotted
(a snapshot holds one path of turns); it reopens from the snapshot taken
before it branched plus its events, with every branch."""

from __future__ import annotations

from pathlib import Path

import trio

from turnledger.adapters.stores import open_store, snapshots_beside
from turnledger.events import DEFAULT_CODEC
from turnledger.runtime._snapshots import recover_state
from turnledger.sessions import branches_of, open_hub, replay
from turnledger.testing import ScriptedProvider

from .test_snapshots_store import Lines, wait_for_snapshot


async def test_a_branched_session_reopens_with_every_branch(tmp_path: Path) -> None:
    target = str(tmp_path / "events.db")
    with trio.fail_after(60):
        store = await open_store(target)
        snaps = await snapshots_beside(target)
        try:
            kw = {"model": "m", "snapshots": snaps, "snapshot_every": 4}
            async with open_hub(store, ScriptedProvider(), **kw) as hub:  # type: ignore[arg-type]
                for i in range(4):
                    await (await hub.submit("s", f"q{i}")).outcome()
                await wait_for_snapshot(snaps, "s", 4)
                await (await hub.edit("s", 2, "q2 again")).outcome()
                for i in range(4):
                    await (await hub.submit("s", f"b1 q{i}")).outcome()
                await hub.switch("s", "main")
                await (await hub.submit("s", "q4")).outcome()
                live = await hub.state("s")
            snap = await snaps.latest("s")
            # 13 events before the branch (the start, 4 turns of 3): none after it
            assert snap is not None and 4 <= snap.version <= 13
            state, used = await recover_state(store, "s", snaps, Lines())
            assert used == snap.version
            assert state == live == replay(await store.read_decoded("s", DEFAULT_CODEC))
            listed = [(b.branch_id, b.length, b.active) for b in branches_of(state)]
            assert listed == [("main", 5, True), ("b1", 7, False)]
            async with open_hub(store, ScriptedProvider(), **kw) as hub:  # type: ignore[arg-type]
                await hub.switch("s", "b1")
                assert len(await hub.history("s")) == 7
        finally:
            await snaps.aclose()
            await store.aclose()
