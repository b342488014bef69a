"""What a PostgreSQL store owns: the epoch of each session lease it holds,
the sessions found taken over, the thread that renews the leases, and their
release. The writer thread takes leases (``_pg_threads``); everything else
about them is here. Why leases are fenced and how a takeover works is in the
``postgres`` module's notes.
"""

from __future__ import annotations

import contextlib
import os
import socket
import threading
import uuid
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from ..._errors import LeaseLost, StoreError
from ._pg_sql import Statements, map_error

if TYPE_CHECKING:
    import psycopg

__all__ = ["Leases"]


class Leases:
    """The leases one store holds, shared by the store, its writer thread
    and its renewal thread; ``held`` and ``lost`` change only under ``lock``."""

    def __init__(
        self,
        connect: Callable[[], psycopg.Connection[Any]],
        sql: Statements,
        seconds: float,
        renew_every: float,
        name: str,
        node: str | None = None,
        address: str | None = None,
    ) -> None:
        #: Opens the autocommit connection renewals and releases run on.
        self.connect = connect
        self.sql = sql
        #: Seconds a lease lasts without renewal.
        self.seconds = seconds
        self.renew_every = renew_every
        self.name = name
        self.host = socket.gethostname()
        self.pid = os.getpid()
        #: This store's name in the leases table (and the key of its mark).
        self.token = uuid.uuid4().hex
        #: The node id this store records in its leases (``serve --node-id``),
        #: heartbeated with every renewal; ``None``: no node.
        self.node = node
        self.address = address
        #: Heartbeats that failed since the last one that went through.
        self.missed_beats = 0
        #: session id -> the epoch of the lease this store holds on it
        self.held: dict[str, int] = {}
        #: sessions whose lease was found taken over: refused until acquired
        self.lost: dict[str, LeaseLost] = {}
        self.lock = threading.Lock()
        self.closed = False
        self._conn: psycopg.Connection[Any] | None = None
        self._stop = threading.Event()
        self._renewer: threading.Thread | None = None

    def _connection(self) -> psycopg.Connection[Any]:
        conn = self._conn
        if conn is None or conn.closed or conn.broken:
            if conn is not None:
                conn.close()
            conn = self._conn = self.connect()
        return conn

    def start_renewing(self) -> None:
        """Start the renewal thread, once (after the first lease was taken)."""
        if self._renewer is None:
            self._renewer = threading.Thread(
                target=self._renew_loop, name=f"turnledger-postgres-leases:{self.name}", daemon=True
            )
            self._renewer.start()

    def stop_renewing(self) -> None:
        """Stop the renewal thread and wait for it to end."""
        self._stop.set()
        if self._renewer is not None:
            self._renewer.join()

    def _renew_loop(self) -> None:
        while not self._stop.wait(self.renew_every):
            if self.node is not None:
                try:
                    self.beat()
                except Exception:  # the next round tries again
                    self.missed_beats += 1
            with contextlib.suppress(Exception):  # the next round tries again
                self.renew()

    def beat(self) -> None:
        """The node's heartbeat (register it, the first time): its row in
        the nodes table is live for ``seconds`` more, by the server's clock.

        Raises:
            StoreError: another live process holds this node id, or the
                server failed.
        """
        import psycopg

        assert self.node is not None
        args = {
            "node": self.node,
            "token": self.token,
            "host": self.host,
            "pid": self.pid,
            "address": self.address,
            "ttl": self.seconds,
            "every_ms": self.renew_every * 1000,
            "sessions": len(self.held),
        }
        with self.lock:
            try:
                conn = self._connection()
                if conn.execute(self.sql.cluster.beat, args).fetchone() is None:
                    row = conn.execute(self.sql.cluster.node, (self.node,)).fetchone()
                    where = "" if row is None else f" (pid {row[1]} on {row[0]})"
                    raise StoreError(
                        f"node id {self.node!r} is in use by another live process{where}"
                    )
            except psycopg.Error as exc:
                raise map_error(exc, "cannot heartbeat the node") from exc
        self.missed_beats = 0

    def mark_stopping(self) -> None:
        """Show the node as stopping (``GET /v1/nodes``); it stays live."""
        import psycopg

        if self.node is None:
            return
        with self.lock:
            try:
                self._connection().execute(self.sql.cluster.stopping, (self.node, self.token))
            except psycopg.Error as exc:
                raise map_error(exc, "cannot mark the node stopping") from exc

    def renew(self) -> list[str]:
        """Extend every held lease (one UPDATE); returns the sessions found
        taken over, forgotten here."""
        import psycopg

        with self.lock:
            if not self.held or self.closed:
                return []
            ids = list(self.held)
            epochs = [self.held[sid] for sid in ids]
            try:
                rows = (
                    self._connection()
                    .execute(self.sql.renew, (self.seconds, ids, epochs, self.token))
                    .fetchall()
                )
            except psycopg.Error as exc:
                raise map_error(exc, "cannot renew the leases") from exc
            kept = {r[0] for r in rows}
            gone = [sid for sid in ids if sid not in kept]
        held = dict(zip(ids, epochs, strict=True))
        for sid in gone:
            self.forget(LeaseLost(sid, held[sid], None))
        return gone

    def forget(self, lost: LeaseLost) -> None:
        """Another store took the session over: stop renewing it, and refuse
        appends to it until it is acquired again."""
        with self.lock:
            if self.held.get(lost.session_id) == lost.epoch:
                del self.held[lost.session_id]
                self.lost[lost.session_id] = lost

    def release(self, session_ids: list[str]) -> None:
        """Give up the leases held on ``session_ids`` (one UPDATE)."""
        import psycopg

        with self.lock:
            mine = [(sid, self.held.pop(sid)) for sid in session_ids if sid in self.held]
            if not mine:
                return
            try:
                self._connection().execute(
                    self.sql.release,
                    ([s for s, _ in mine], [e for _, e in mine], self.token),
                )
            except psycopg.Error as exc:
                raise map_error(exc, "cannot release sessions") from exc

    def close(self) -> None:
        """Stop renewing, release every lease, leave the nodes table and
        close the connection."""
        self.stop_renewing()
        with contextlib.suppress(Exception):  # the leases run out by themselves
            self.release(list(self.held))
        if self.node is not None:
            with contextlib.suppress(Exception), self.lock:  # (the row expires anyway)
                self._connection().execute(self.sql.cluster.leave, (self.node, self.token))
        with self.lock:
            self.held.clear()
            self.closed = True
            if self._conn is not None:
                self._conn.close()
                self._conn = None
