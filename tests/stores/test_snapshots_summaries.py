"""Snapshots, retention and summaries or pins: a session with either is not
snapshotted after them (it reopens from the snapshot taken before, plus its
events, with every pin and summary), and retention never trims it."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import trio

from turnledger.adapters.stores import open_store, snapshots_beside
from turnledger.events import DEFAULT_CODEC
from turnledger.runtime._snapshots import recover_state
from turnledger.sessions import RetentionPolicy, Turn, open_hub, plan_retention, replay
from turnledger.testing import ScriptedProvider

from .test_snapshots_store import Lines, wait_for_snapshot


async def _first(turns: Sequence[Turn]) -> str:
    return "first: " + turns[0].question


async def test_a_session_with_pins_and_summaries_reopens_with_them(tmp_path: Path) -> None:
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
                await hub.pin("s", "kept", origin="memory")
                await hub.summarize("s", end=2, summarizer=_first)
                for i in range(4, 9):
                    await (await hub.submit("s", f"q{i}")).outcome()
                live = await hub.state("s")
            snap = await snaps.latest("s")
            # 13 events before the pin (the start, 4 turns of 3): none after it
            assert snap is not None and 4 <= snap.version <= 13
            state, used = await recover_state(store, "s", snaps, Lines())
            assert used == snap.version
            stored = await store.read("s")
            assert state == live == replay([DEFAULT_CODEC.decode(e) for e in stored])
            assert [p.pin_id for p in state.pins] == ["p1"]
            assert [x.text for x in state.summaries] == ["first: q0"]
            # retention keeps it whole: a trim would move the summary's turns
            # and drop the pin made before the cut
            assert plan_retention("s", stored, RetentionPolicy(max_turns=3), now=0.0) is None
            # (the same log without them would be trimmed)
            carried = {"pin_added", "summary_recorded", "summary_sent"}
            plain = [e for e in stored if e.tag not in carried]
            step = plan_retention("s", plain, RetentionPolicy(max_turns=3), now=0.0)
            assert step is not None and step.action == "trim"
        finally:
            await snaps.aclose()
            await store.aclose()
