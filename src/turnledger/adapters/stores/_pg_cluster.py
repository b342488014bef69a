"""Nodes on one PostgreSQL store: who is live, and the inbox through which
one node hands a call to another (``turnledger serve --node-id``).

A node is a store opened with ``node_id``: its row in ``<table>_nodes`` is
heartbeated by the lease renewal thread (``_pg_leases``) and is live while
its ``expires_at`` (the server's clock) lies ahead; its leases name it, and a
lease naming a node that is not live (or that the table does not know) is a
dead owner's. The inbox (``<table>_inbox``) holds calls: a row per call, for
its target node, woken by ``NOTIFY`` on the target's channel (``LISTEN`` on
a connection of its own, in a thread); the target claims the row, runs the
call and writes its reply into the row, then wakes the sender's channel. The
sender takes the reply (deleting the row). Notifications are only wake-ups:
a node that missed one finds the rows on its next poll.
"""

from __future__ import annotations

import datetime
import threading
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import attrs
import orjson

from ._pg_sql import ClusterStatements, channel, map_error

if TYPE_CHECKING:
    import psycopg
    from psycopg_pool import ConnectionPool

__all__ = ["Call", "Inbox", "NodeInfo"]


@attrs.frozen
class NodeInfo:
    """A node of the cluster, from :meth:`PostgresStore.nodes`."""

    node_id: str
    host: str
    pid: int
    #: What the node was told to show as its address (``--advertise``).
    address: str | None
    started_at: datetime.datetime
    #: The last heartbeat, and when the row runs out without another (the
    #: server's clock).
    heartbeat_at: datetime.datetime
    expires_at: datetime.datetime
    #: Heartbeats (each one also renews every lease the node holds).
    renewals: int
    #: How late the last heartbeat came, beyond the renewal interval (ms).
    lag_ms: float
    #: The node is shutting down (SIGTERM), handing its sessions over.
    stopping: bool
    live: bool
    #: Milliseconds since the last heartbeat, by the server's clock.
    age_ms: float
    #: Sessions whose unexpired lease names the node.
    session_count: int
    #: Those sessions (the first ones, in id order).
    sessions: tuple[str, ...]


@attrs.frozen
class Call:
    """A call in a node's inbox."""

    id: int
    #: The node waiting for the reply.
    sender: str
    session_id: str
    kind: str
    body: dict[str, Any]


class Inbox:
    """A node's side of the inbox: posting calls to other nodes, claiming and
    answering its own, and the thread that listens for wake-ups. Every method
    but :meth:`listen` blocks (run them on a worker thread)."""

    def __init__(
        self,
        pool: ConnectionPool[Any],
        connect: Callable[[], psycopg.Connection[Any]],
        sql: ClusterStatements,
        schema: str,
        table: str,
        node: str,
    ) -> None:
        self._pool = pool
        self._connect = connect
        self._sql = sql
        self._schema = schema
        self._table = table
        self.node = node
        self.channel = channel(schema, table, node)
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def _run(self, query: Any, args: tuple[Any, ...]) -> list[tuple[Any, ...]]:
        import psycopg

        try:
            with self._pool.connection() as conn:
                cur = conn.execute(query, args)
                rows = cur.fetchall() if cur.description is not None else []
                conn.commit()
                return rows
        except psycopg.Error as exc:
            raise map_error(exc, "inbox") from exc

    def post(self, target: str, session_id: str, kind: str, body: dict[str, Any]) -> int:
        """Put a call in ``target``'s inbox and wake it; the call's id."""
        wake = channel(self._schema, self._table, target)
        text = orjson.dumps(body).decode()
        rows = self._run(self._sql.post, (target, self.node, session_id, kind, text, wake))
        return int(rows[0][0])

    def claim(self) -> list[Call]:
        """Take the calls waiting for this node (each is taken once)."""
        rows = self._run(self._sql.claim, (self.node,))
        return [Call(r[0], r[1], r[2], r[3], orjson.loads(r[4])) for r in rows]

    def reply(self, call: Call, reply: dict[str, Any]) -> None:
        """Answer ``call`` and wake its sender."""
        wake = channel(self._schema, self._table, call.sender)
        self._run(self._sql.reply, (orjson.dumps(reply).decode(), call.id, wake))

    def take_reply(self, call_id: int) -> dict[str, Any] | None:
        """The reply to a call this node posted, once it is there (the row
        goes); ``None``: not answered yet."""
        rows = self._run(self._sql.take_reply, (call_id,))
        return None if not rows else dict(orjson.loads(rows[0][0]))

    def withdraw(self, call_id: int) -> bool:
        """Take back a call its target has not claimed; whether it was."""
        return bool(self._run(self._sql.withdraw, (call_id,)))

    def sweep(self, older_than: float) -> None:
        """Drop calls posted more than ``older_than`` seconds ago (their
        senders stopped waiting)."""
        self._run(self._sql.sweep, (older_than,))

    def listen(self, woken: Callable[[str], None]) -> None:
        """Start the thread that calls ``woken(payload)`` for every
        notification on this node's channel (``"call"``: calls are waiting;
        ``"reply:<id>"``: a reply is there). Once."""
        if self._thread is not None:
            return
        self._thread = threading.Thread(
            target=self._listen, args=(woken,), name=f"turnledger-node:{self.node}", daemon=True
        )
        self._thread.start()

    def _listen(self, woken: Callable[[str], None]) -> None:
        import psycopg
        from psycopg import sql

        conn: psycopg.Connection[Any] | None = None
        while not self._stop.is_set():
            try:
                if conn is None or conn.closed or conn.broken:
                    conn = self._connect()
                    conn.execute(sql.SQL("LISTEN {}").format(sql.Identifier(self.channel)))
                    woken("call")  # anything posted while not listening
                for note in conn.notifies(timeout=0.5):
                    woken(note.payload)
            except psycopg.Error:
                if conn is not None:
                    conn.close()
                conn = None
                self._stop.wait(0.5)
        if conn is not None:
            conn.close()

    def close(self) -> None:
        """Stop listening (waits for the thread)."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(5)
