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

from ..._errors import LeaseLost
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
            with contextlib.suppress(Exception):  # the next round tries again
                self.renew()

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
        """Stop renewing, release every lease and close the connection."""
        self.stop_renewing()
        with contextlib.suppress(Exception):  # the leases run out by themselves
            self.release(list(self.held))
        with self.lock:
            self.held.clear()
            self.closed = True
            if self._conn is not None:
                self._conn.close()
                self._conn = None
