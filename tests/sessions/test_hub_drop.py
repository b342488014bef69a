"""Hub.drop and Hub.idle_sessions (what a serve node uses to let sessions
go: on SIGTERM, and when another node took one over), and the node id an
actor keeps in its log context."""

from __future__ import annotations

import structlog
import trio
from structlog.testing import capture_logs

from turnledger.events import RequestId
from turnledger.sessions import CommittedResult, DiscardedResult, open_hub
from turnledger.testing import Begin, Chunk, Finish, Hang, ScriptedProvider, Step

from ._helpers import HookedStore, events_of

R1, R2 = RequestId("r1"), RequestId("r2")


def by_request(scripts: dict[str, list[Step]]) -> ScriptedProvider:
    return ScriptedProvider(lambda req: scripts.get(req.request_id, [Finish("ok")]))


async def test_drop_stops_an_idle_actor_and_the_next_message_replays(store: HookedStore) -> None:
    async with open_hub(store, by_request({}), model="m") as hub:
        assert isinstance(await (await hub.submit("s", "one", request_id=R1)).outcome(),
                          CommittedResult)  # fmt: skip
        assert hub.idle_sessions() == ["s"]
        await hub.drop("s")
        assert hub.idle_sessions() == [] and hub.statistics().actors == 0
        await hub.drop("nobody")  # no actor: nothing to do
        again = await (await hub.submit("s", "two", request_id=R2)).outcome()
        assert isinstance(again, CommittedResult)
        assert hub.statistics().actors_started == 2
        assert [t.question for t in await hub.history("s")] == ["one", "two"]


async def test_drop_ends_a_turn_in_flight_as_interrupted(store: HookedStore) -> None:
    provider = by_request({"r1": [Begin(), Chunk("so far"), Hang()]})
    async with open_hub(store, provider, model="m") as hub:
        handle = await hub.submit("s", "one", request_id=R1)
        with trio.fail_after(10):
            async for _ in handle.preview():
                break
        assert hub.idle_sessions() == []  # busy: not idle
        await hub.drop("s")
        result = await handle.outcome()
        assert isinstance(result, DiscardedResult) and result.reason == "interrupted"
    tags = [type(e).__name__ for e in await events_of(store, "s")]
    assert tags[-1] == "TurnDiscarded"


async def test_an_actor_keeps_the_node_id_of_its_process_in_its_log_lines(
    store: HookedStore,
) -> None:
    structlog.contextvars.bind_contextvars(node_id="n7", other="dropped")
    try:
        with capture_logs(processors=[structlog.contextvars.merge_contextvars]) as logs:
            async with open_hub(store, by_request({}), model="m") as hub:
                await (await hub.submit("s", "one", request_id=R1)).outcome()
    finally:
        structlog.contextvars.unbind_contextvars("node_id", "other")
    moves = [x for x in logs if x["event"] == "transition"]
    assert moves and all(x["node_id"] == "n7" and x["session_id"] == "s" for x in moves)
    assert not any("other" in x for x in moves)
