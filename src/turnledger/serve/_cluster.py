"""A ``serve`` process as a node of a cluster (``--node-id``, PostgreSQL).

The node's part, beside the routes (``_app``): it answers the calls other
nodes put in its inbox (questions, cancels, edits, regenerations and branch
switches for sessions it owns), sends its own calls and waits for their
replies, and drops the actors of sessions whose lease another node took
over (it was paused, say: the epoch fences its writes; its actors must not
go on with a stale state). The SQL is the store's (``_pg_cluster``); why it
is shaped so is in docs/cluster.md.
"""

from __future__ import annotations

import contextlib
from collections.abc import Awaitable, Callable
from typing import Any

import structlog
import trio

from ..adapters.stores._pg_cluster import Call, Inbox
from ..adapters.stores.postgres import PostgresStore
from ..sessions import Hub

__all__ = ["Node", "NotTaken"]

log = structlog.get_logger("turnledger.serve")

#: How often the inbox is looked at without a wake-up (a NOTIFY missed while
#: the listening connection was being replaced), and lost leases looked for.
_POLL = 1.0
#: How long a call may wait to be claimed before it is taken back.
_CLAIM_WITHIN = 3.0
#: Calls older than this are swept from the inbox (their senders gave up).
_SWEEP_AFTER = 600.0

Answer = Callable[[Call], Awaitable[dict[str, Any]]]


class NotTaken(Exception):
    """The target node did not claim the call in time (it was taken back), or
    claimed it and then lost the session (it died, or was paused past its
    lease): the caller looks at the session's owner again. (Running the call
    again is safe: it carries its request id.)"""


class Node:
    """This process as a node: its inbox, both ways."""

    def __init__(self, store: PostgresStore, hub: Hub) -> None:
        inbox = store.inbox
        assert inbox is not None and store.node_id is not None
        self.store = store
        self.hub = hub
        self.inbox: Inbox = inbox
        self.node_id: str = store.node_id
        #: Set on SIGTERM: no new local work; calls for questions are
        #: answered "look again" so that their senders take the sessions.
        self.stopping = False
        self._replies: dict[int, trio.Event] = {}
        #: Replies that woke this node before their caller waited for them
        #: (an owner quicker than the thread hop back from the post).
        self._early: set[int] = set()
        self._calls = trio.Event()
        self._token = trio.lowlevel.current_trio_token()

    # -- wake-ups from the listening thread ------------------------------------

    def _woken(self, payload: str) -> None:
        with contextlib.suppress(trio.RunFinishedError):
            self._token.run_sync_soon(self._wake, payload)

    def _wake(self, payload: str) -> None:
        if payload == "call":
            self._calls.set()
        elif payload.startswith("reply:"):
            call_id = int(payload[6:])
            waiting = self._replies.get(call_id)
            if waiting is not None:
                waiting.set()
            elif len(self._early) < 10_000:  # (the sweep drops the rest)
                self._early.add(call_id)

    # -- the node's life -----------------------------------------------------------

    async def run(self, answer: Answer) -> None:
        """Answer the calls put in this node's inbox (each with ``answer``,
        concurrently) and drop the actors of sessions found taken over,
        until cancelled.

        Cancellation: stops at once; calls being answered are abandoned
        (their senders time out and look at the session's owner again).
        """
        self.inbox.listen(self._woken)
        swept = trio.current_time()
        async with trio.open_nursery() as nursery:
            while True:
                with trio.move_on_after(_POLL):
                    await self._calls.wait()
                self._calls = trio.Event()
                try:
                    calls = await trio.to_thread.run_sync(self.inbox.claim)
                    if trio.current_time() - swept > _SWEEP_AFTER / 10:
                        swept = trio.current_time()
                        await trio.to_thread.run_sync(self.inbox.sweep, _SWEEP_AFTER)
                except Exception as exc:  # the server is away: the next round tries again
                    log.warning("inbox_failed", error=type(exc).__name__)
                    calls = []
                for call in calls:
                    nursery.start_soon(self._answer, call, answer)
                await self.drop_lost()

    async def drop_lost(self) -> None:
        """Stop the actors of sessions whose lease another node took over."""
        for sid in self.store.lost_sessions():
            await self.hub.drop(sid)

    async def _answer(self, call: Call, answer: Answer) -> None:
        log.info("call_received", call=call.kind, sender=call.sender, session_id=call.session_id)
        try:
            reply = await answer(call)
        except Exception as exc:
            log.error("call_failed", call=call.kind, error=type(exc).__name__)
            reply = {"status": 500, "body": {"error": {"code": "internal", "message": "internal"}}}
        try:
            await trio.to_thread.run_sync(self.inbox.reply, call, reply)
        except Exception as exc:  # the sender times out and looks again
            log.warning("reply_failed", call=call.kind, error=type(exc).__name__)

    async def call(
        self, target: str, session_id: str, kind: str, body: dict[str, Any], timeout: float = 30.0
    ) -> dict[str, Any]:
        """Hand ``kind`` for ``session_id`` to node ``target``; its reply.

        Raises:
            NotTaken: ``target`` did not claim the call within a few seconds
                (it was taken back; nothing was done), or claimed it and no
                longer owns the session.
            TimeoutError: claimed, but not answered within ``timeout``.

        Cancellation: the call may still be run by its target; its reply is
        left to the inbox's sweep.
        """
        call_id = await trio.to_thread.run_sync(self.inbox.post, target, session_id, kind, body)
        replied = self._replies[call_id] = trio.Event()
        if call_id in self._early:
            self._early.discard(call_id)
            replied.set()
        started = trio.current_time()
        log.info("call_sent", call=kind, target=target, session_id=session_id)
        try:
            while True:
                with trio.move_on_after(0.5):
                    await replied.wait()
                reply = await trio.to_thread.run_sync(self.inbox.take_reply, call_id)
                if reply is not None:
                    return reply
                waited = trio.current_time() - started
                if waited > _CLAIM_WITHIN:
                    if await trio.to_thread.run_sync(self.inbox.withdraw, call_id):
                        raise NotTaken(target)
                    if await self.owner_elsewhere(session_id) != target:
                        raise NotTaken(target)  # claimed, then the session moved
                if waited > timeout:
                    raise TimeoutError(f"node {target!r} did not answer within {timeout}s")
        finally:
            del self._replies[call_id]

    async def owner_elsewhere(self, session_id: str) -> str | None:
        """The live node other than this one that owns ``session_id``;
        ``None``: none (no lease, an expired one, a dead or unknown node's,
        this node's, or a lease of a process that is no node)."""
        if self.store.holds(session_id):
            await trio.lowlevel.checkpoint()
            return None  # (no round trip for the sessions this node owns)
        lease = await self.store.owner(session_id)
        if lease is None or not lease.live or lease.node is None or lease.node == self.node_id:
            return None
        return lease.node
