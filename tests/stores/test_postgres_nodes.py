"""PostgresStore opened as a node (``node_id``): the nodes table and its
heartbeats, leases that name their node and die with it, and the inbox of
calls between nodes."""

from __future__ import annotations

import threading
import time
from collections.abc import AsyncIterator

import pytest
import trio

from turnledger import LeaseLost, SessionOwnedElsewhere, StoreError
from turnledger.adapters.stores import PostgresStore
from turnledger.events import StoredEvent

pytestmark = pytest.mark.postgres


def _events(session_id: str, after: int, n: int = 1) -> list[StoredEvent]:
    return [StoredEvent(session_id, after + i + 1, "x", 1, {"i": after + i}, 0.0) for i in range(n)]


def _sql(dsn: str, query: str, *args: object) -> list[tuple[object, ...]]:
    import psycopg

    with psycopg.connect(dsn, autocommit=True) as conn:
        cur = conn.execute(query, args)  # type: ignore[arg-type]
        return cur.fetchall() if cur.description else []


@pytest.fixture
async def two_nodes(pg_dsn: str) -> AsyncIterator[tuple[PostgresStore, PostgresStore]]:
    a = await PostgresStore.open(pg_dsn, node_id="a", lease=30.0, renew_every=0.2)
    b = await PostgresStore.open(pg_dsn, node_id="b", lease=30.0, renew_every=0.2)
    try:
        yield a, b
    finally:
        await a.aclose()
        await b.aclose()


async def test_a_lease_names_its_node_and_refuses_other_nodes_while_it_lives(
    two_nodes: tuple[PostgresStore, PostgresStore],
) -> None:
    a, b = two_nodes
    await a.acquire("s")
    lease = await b.owner("s")
    assert lease is not None and (lease.node, lease.live) == ("a", True)
    with pytest.raises(SessionOwnedElsewhere, match="node=a"):
        await b.acquire("s")
    assert await b.owner("nobody") is None
    assert [(x.session_id, x.node) for x in await b.owners()] == [("s", "a")]


async def test_a_lease_naming_an_unknown_node_is_a_dead_owners(
    pg_dsn: str, two_nodes: tuple[PostgresStore, PostgresStore]
) -> None:
    a, b = two_nodes
    await a.acquire("s")
    await a.append("s", _events("s", 0), 0)
    _sql(pg_dsn, "UPDATE turnledger_events_leases SET node = 'ghost' WHERE session_id = 's'")
    lease = await b.owner("s")
    assert lease is not None and (lease.node, lease.live) == ("ghost", False)
    await b.acquire("s")  # taken over: the lease's node is no live node
    assert await b.append("s", _events("s", 1), 1) == 2
    # The store that held it before is fenced off.
    with pytest.raises(LeaseLost):
        await a.append("s", _events("s", 1), 1)
    assert [e.seq for e in await a.read("s")] == [1, 2]


async def test_a_node_whose_heartbeat_ran_out_loses_its_sessions_before_their_lease(
    pg_dsn: str, two_nodes: tuple[PostgresStore, PostgresStore]
) -> None:
    a, b = two_nodes
    await a.acquire("s")
    await trio.to_thread.run_sync(a._leases.stop_renewing)  # a paused node: no more beats
    # Its heartbeat is judged by the expiry the server wrote, by the server's
    # clock: here it ran out (the lease itself has 30 s to go).
    _sql(pg_dsn, "UPDATE turnledger_events_nodes SET expires_at = now() WHERE node_id = 'a'")
    lease = await b.owner("s")
    assert lease is not None and not lease.live
    assert lease.expires_at.timestamp() > time.time() + 20
    await b.acquire("s")
    assert (await b.owner("s")).node == "b"  # type: ignore[union-attr]
    assert await a.renew() == ["s"]  # the paused node, back, finds it gone
    assert a.lost_sessions() == ["s"]
    with pytest.raises(LeaseLost):
        await a.append("s", _events("s", 0), 0)
    nodes = {n.node_id: n for n in await b.nodes(dead=True)}
    assert not nodes["a"].live and nodes["b"].live
    assert [n.node_id for n in await b.nodes()] == ["b"]


async def test_expiry_is_the_servers_clock_not_the_clients(
    pg_dsn: str, two_nodes: tuple[PostgresStore, PostgresStore], monkeypatch: pytest.MonkeyPatch
) -> None:
    a, b = two_nodes
    await a.acquire("s")
    # A node whose clock runs an hour ahead still sees the lease live, and
    # cannot take it: nothing about expiry is read from a client's clock.
    ahead = time.time() + 3600
    monkeypatch.setattr(time, "time", lambda: ahead)
    with pytest.raises(SessionOwnedElsewhere):
        await b.acquire("s")
    monkeypatch.undo()
    rows = _sql(
        pg_dsn,
        "SELECT expires_at - heartbeat_at = make_interval(secs => 30) FROM"
        " turnledger_events_nodes ORDER BY node_id",
    )
    assert rows == [(True,), (True,)]


async def test_a_node_id_is_one_live_process(pg_dsn: str) -> None:
    a = await PostgresStore.open(pg_dsn, node_id="n", lease=30.0)
    try:
        with pytest.raises(StoreError, match="node id 'n' is in use by another live process"):
            await PostgresStore.open(pg_dsn, node_id="n")
    finally:
        await a.aclose()
    # Leaving deletes the node's row: the id is free again.
    assert _sql(pg_dsn, "SELECT count(*) FROM turnledger_events_nodes") == [(0,)]
    again = await PostgresStore.open(pg_dsn, node_id="n")
    await again.aclose()
    for bad in ("", " n", "n\n", "x" * 201):
        with pytest.raises(ValueError, match="node id"):
            await PostgresStore.open(pg_dsn, node_id=bad)
    with pytest.raises(ValueError, match="read-only"):
        await PostgresStore.open(pg_dsn, node_id="r", read_only=True)


async def test_nodes_show_their_sessions_heartbeats_and_lag(
    two_nodes: tuple[PostgresStore, PostgresStore],
) -> None:
    a, b = two_nodes
    await a.acquire("s1")
    await a.acquire("s2")
    await b.acquire("t1")
    first = {n.node_id: n for n in await a.nodes()}
    await trio.sleep(0.7)
    listed = {n.node_id: n for n in await a.nodes()}
    assert listed["a"].sessions == ("s1", "s2") and listed["a"].session_count == 2
    assert listed["b"].sessions == ("t1",)
    for name in "ab":
        assert listed[name].renewals >= first[name].renewals + 2
        assert listed[name].lag_ms >= 0
        assert listed[name].live and not listed[name].stopping
    assert (await a.nodes(sessions=1))[0].sessions == ("s1",)
    await a.mark_stopping()
    assert {n.node_id: n.stopping for n in await b.nodes()} == {"a": True, "b": False}


async def test_the_inbox_carries_a_call_and_its_reply_once(
    two_nodes: tuple[PostgresStore, PostgresStore],
) -> None:
    a, b = two_nodes
    assert a.inbox is not None and b.inbox is not None
    heard: list[str] = []
    woken = threading.Event()

    def listen(payload: str) -> None:
        heard.append(payload)
        woken.set()

    b.inbox.listen(listen)
    with trio.fail_after(10):
        while "call" not in heard:  # (the first is said when it starts listening)
            await trio.sleep(0.01)
    heard.clear()
    call_id = await trio.to_thread.run_sync(a.inbox.post, "b", "s", "turns", {"q": "ü"})
    with trio.fail_after(10):
        while "call" not in heard:
            await trio.sleep(0.01)
    calls = await trio.to_thread.run_sync(b.inbox.claim)
    assert [(c.id, c.sender, c.session_id, c.kind, c.body) for c in calls] == [
        (call_id, "a", "s", "turns", {"q": "ü"})
    ]
    assert await trio.to_thread.run_sync(b.inbox.claim) == []  # taken once
    assert not await trio.to_thread.run_sync(a.inbox.withdraw, call_id)  # claimed already
    assert await trio.to_thread.run_sync(a.inbox.take_reply, call_id) is None
    await trio.to_thread.run_sync(b.inbox.reply, calls[0], {"status": 200})
    assert await trio.to_thread.run_sync(a.inbox.take_reply, call_id) == {"status": 200}
    assert await trio.to_thread.run_sync(a.inbox.take_reply, call_id) is None  # gone
    # A call nobody claimed is taken back.
    lone = await trio.to_thread.run_sync(a.inbox.post, "nobody", "s", "cancel", {})
    assert await trio.to_thread.run_sync(a.inbox.withdraw, lone)


async def test_a_prune_leaves_a_session_another_process_owns(pg_dsn: str) -> None:
    from turnledger.sessions import RetentionPolicy, open_hub
    from turnledger.testing import ScriptedProvider

    now = [1_800_000_000.0]
    a = await PostgresStore.open(pg_dsn, node_id="a")
    b = await PostgresStore.open(pg_dsn, node_id="b")
    try:
        with trio.fail_after(60):
            async with open_hub(b, ScriptedProvider.instant(), model="m") as other:
                await (await other.submit("theirs", "q")).outcome()  # b holds it
                async with open_hub(
                    a, ScriptedProvider.instant(), model="m", clock=lambda: now[0]
                ) as hub:
                    await (await hub.submit("mine", "q")).outcome()
                    await hub.drop("mine")  # idle, and its lease let go
                    now[0] += 10**9  # both are long idle by this hub's clock
                    done = await hub.prune(RetentionPolicy(max_idle=60))
                    assert [(s.session_id, s.action) for s in done] == [("mine", "erase")]
                assert await a.session_ids() == ["theirs"]
    finally:
        await a.aclose()
        await b.aclose()
