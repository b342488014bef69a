"""A store that refuses a branch's write: the caller is told, the active
branch is unchanged, and the session goes on."""

from __future__ import annotations

import pytest

from turnledger import StoreFull
from turnledger.events import RequestId
from turnledger.sessions import CommittedResult, RejectedResult, open_hub
from turnledger.testing import ScriptedProvider

from ._helpers import HookedStore, replayed


async def test_a_switch_or_an_edit_the_store_refuses_changes_nothing(store: HookedStore) -> None:
    async with open_hub(store, ScriptedProvider.instant("ok"), model="m") as hub:
        for i in range(2):
            await (await hub.submit("s", f"q{i}")).outcome()
        await (await hub.edit("s", 1, "q1 again")).outcome()  # on b1 now
        store.fail_appends = 1
        with pytest.raises(StoreFull):
            await hub.switch("s", "main")
        assert [b.branch_id for b in await hub.branches("s") if b.active] == ["b1"]
        store.fail_appends = 1
        refused = await (await hub.edit("s", 0, "q0 again", request_id="e2")).outcome()
        assert isinstance(refused, RejectedResult) and refused.reason == "store_error"
        assert [b.branch_id for b in await hub.branches("s")] == ["main", "b1"]
        # the store takes writes again: the session goes on
        await hub.switch("s", "main")
        assert [t.question for t in await hub.history("s")] == ["q0", "q1"]
        again = await (await hub.edit("s", 0, "q0 again", request_id=RequestId("e3"))).outcome()
        assert isinstance(again, CommittedResult)
        assert await hub.state("s") == await replayed(store, "s")
