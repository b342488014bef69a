"""A SQLite file that shows fewer events than its writer acknowledged is
refused, down to a single lost event.

The lock file keeps the highest feed position ever acknowledged; a file put
back from an older copy (or a write-ahead log cut short) shows fewer. One
event lost is as much a loss as many: the check must not be off by one.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import trio

from turnledger import StoreCorrupted
from turnledger.adapters.stores import SQLiteStore

from ._store_scenarios import stream_events


@pytest.mark.parametrize("lost", [1, 2])
async def test_a_file_missing_even_one_acknowledged_event_is_refused(
    tmp_path: Path, lost: int
) -> None:
    path = tmp_path / "events.db"
    with trio.fail_after(30):
        async with await SQLiteStore.open(path) as store:
            await store.append("a", stream_events("a", 0, 3), 0)
        older = path.read_bytes()  # positions 1-3
        async with await SQLiteStore.open(path) as store:
            await store.append("a", stream_events("a", 3, lost), 3)
        path.write_bytes(older)
        acknowledged = 3 + lost
        with pytest.raises(
            StoreCorrupted, match=f"position 3, but position {acknowledged} was acknowledged"
        ):
            await SQLiteStore.open(path)
        with pytest.raises(StoreCorrupted, match=f"position {acknowledged} was acknowledged"):
            await SQLiteStore.open(path, read_only=True)
        assert path.read_bytes() == older  # nothing was changed


async def test_a_file_with_every_acknowledged_event_opens(tmp_path: Path) -> None:
    path = tmp_path / "events.db"
    with trio.fail_after(30):
        async with await SQLiteStore.open(path) as store:
            await store.append("a", stream_events("a", 0, 4), 0)
        async with await SQLiteStore.open(path) as store:
            assert [e.seq for e in await store.read("a")] == [1, 2, 3, 4]
