"""1,000 sessions at once through one hub: nothing lost, nothing doubled, nothing left."""

from __future__ import annotations

import random
from collections import Counter
from typing import Any

import trio

from turnledger.events import TurnCommitted, TurnRejected, TurnSubmitted
from turnledger.sessions import ChatRequest, CommittedResult, RejectedResult, open_hub
from turnledger.testing import Begin, Chunk, Finish, ScriptedProvider, Step

from ._helpers import HookedStore, events_of

SESSIONS = 1000
TURNS = 3  # per caller; two callers per session


def jittery(request: ChatRequest) -> list[Step]:
    rng = random.Random(request.request_id)
    return [
        Begin(),
        Chunk("a", delay=rng.random() / 10),
        Chunk("b", delay=rng.random() / 10),
        Finish(f"answer to {request.messages[-1].content}"),
    ]


async def test_a_thousand_sessions_at_once(store: HookedStore, autojump_clock: Any) -> None:
    provider = ScriptedProvider(jittery)
    committed: dict[str, list[str]] = {f"s{i}": [] for i in range(SESSIONS)}
    rejected: Counter[str] = Counter()

    async def caller(sid: str, who: str) -> None:
        # Two callers share each session; the session refuses a question
        # while another is in flight, so each caller retries with a new id.
        n = 0
        for turn in range(TURNS):
            while True:
                n += 1
                rid = f"{sid}-{who}-{n}"
                result = await (await hub.submit(sid, f"{who}{turn}", request_id=rid)).outcome()
                if isinstance(result, CommittedResult):
                    assert result.answer == f"answer to {who}{turn}"
                    committed[sid].append(rid)
                    break
                assert isinstance(result, RejectedResult) and result.reason == "busy"
                rejected[sid] += 1
                await trio.sleep(random.random() / 20)

    async with open_hub(store, provider, model="m") as hub:
        async with trio.open_nursery() as nursery:
            for i in range(SESSIONS):
                nursery.start_soon(caller, f"s{i}", "a")
                nursery.start_soon(caller, f"s{i}", "b")
        stats = hub.statistics()
        assert stats.actors == SESSIONS and stats.in_flight == 0
    stats = hub.statistics()
    assert (stats.actors, stats.requests, stats.in_flight) == (0, 0, 0)
    assert hub._nursery.child_tasks == frozenset()
    assert sorted(store.acquired) == sorted(store.released) == sorted(committed)
    assert provider.open == 0 and len(provider.closed) == len(provider.requests)

    total = 0
    for sid, rids in committed.items():
        events = await events_of(store, sid)
        submitted = [e.request_id for e in events if isinstance(e, TurnSubmitted)]
        commits = [e.request_id for e in events if isinstance(e, TurnCommitted)]
        refused = [e.request_id for e in events if isinstance(e, TurnRejected)]
        history = [t.request_id for t in (await hub.state(sid)).turns]
        # no lost turn, no duplicate: the log, the history and the callers agree
        assert submitted == commits == history
        assert sorted(history) == sorted(rids) and len(rids) == 2 * TURNS
        assert len(refused) == rejected[sid] and not set(refused) & set(submitted)
        total += len(history)
    assert total == SESSIONS * 2 * TURNS
