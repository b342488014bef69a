"""Turn previews through PostgreSQL: the owner of a turn publishes its deltas,
any process on the same database follows them (``turnledger serve`` with
``--node-id``; see docs/cluster.md).

Table. ``<table>_previews`` (beside the events table): one row per delta,
``(session_id, request_id, seq)`` the key, ``seq`` the delta's number in its
turn (1, 2, ...: the SSE ``id`` every node sends), ``kind`` ``delta`` or
``end`` (written once the turn's outcome is known, ``seq`` one past the last
delta), ``text`` the delta's UTF-8 bytes (``bytea``: any text the model sent,
U+0000 and lone surrogates too, reads back exactly), ``created_at`` on the
database's clock.

Publishing, batched. ``publish``/``end`` only queue a row. One task per
process takes every row queued (every turn's) and writes them in ONE
statement, an ``INSERT ... SELECT unnest(...)`` whose same statement sends one
``NOTIFY`` per turn in the batch (channel ``<table>_previews``, payload
``<key>:<last seq>``, the key a 16-hex-digit hash of the two ids, so a payload
stays small whatever the ids). While one batch is written the next gathers:
a slow stream costs a round trip per delta (no added wait), a fast one or many
at once cost one round trip per batch (see benchmarks/cluster_previews.py).

Following. One listening connection per process (``LISTEN`` before anything
is read) wakes the followers whose key a notification names. A follower
registers its key first, then reads the rows after ``after_seq``, then
reads again after each notification (and at least every ``poll_interval``):
it only ever asks for ``seq > last``, so the switch from reading to listening
has no gap (registered before the first read) and no duplicate. Reads waiting
together are one statement and one hop to the reading thread. A lost
listening connection is opened again, and every follower reads once more (a
notification sent meanwhile is not lost).

Retention. Rows are kept while the turn runs and ``retain_after_end`` seconds
(default 30) after its ``end`` row; a turn without an ``end`` row (its owner
died) is dropped ``orphan_after`` seconds (default 600) after its last row.
Every process sweeps every ``sweep_every`` seconds (one DELETE); the table
thus holds the running turns plus about half a minute of finished ones.
"""

from __future__ import annotations

import contextlib
import hashlib
import threading
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import TYPE_CHECKING, Any, Final

import attrs
import structlog
import trio

from ..._errors import StoreError
from ._io_thread import Call as _Call
from ._io_thread import Request as _Request
from ._io_thread import Thread as _Thread
from ._pg_sql import map_error

if TYPE_CHECKING:
    import psycopg
    from psycopg import sql

    from .postgres import PostgresStore

__all__ = ["PreviewDelta", "Previews", "open_previews", "preview_key"]

log = structlog.get_logger("turnledger.previews")

#: The most rows one publishing statement writes (more wait for the next).
_MAX_BATCH: Final = 4096


@attrs.frozen
class PreviewDelta:
    """One delta of a turn, as published by its owner."""

    #: The delta's number in its turn (1, 2, ...): the SSE ``id``.
    seq: int
    text: str


def preview_key(session_id: str, request_id: str) -> str:
    """The short key a notification names a turn by (16 hex digits)."""
    sid = session_id.encode("utf-8", "surrogatepass")
    h = hashlib.blake2b(digest_size=8)
    h.update(len(sid).to_bytes(8, "big"))  # (an id may hold any character, NUL too)
    h.update(sid)
    h.update(request_id.encode("utf-8", "surrogatepass"))
    return h.hexdigest()


def _bytes(text: str) -> bytes:
    return text.encode("utf-8", "surrogatepass")


def _text(data: bytes) -> str:
    return bytes(data).decode("utf-8", "surrogatepass")


class _Statements:
    def __init__(self, schema: str, table: str) -> None:
        from psycopg import sql

        p = sql.Identifier(schema, f"{table}_previews")
        self.channel = f"{table}_previews"
        self.create = sql.SQL(
            "CREATE TABLE IF NOT EXISTS {} (session_id text NOT NULL, request_id text NOT NULL,"
            " seq integer NOT NULL, kind text NOT NULL CHECK (kind IN ('delta', 'end')),"
            " text bytea NOT NULL, created_at timestamptz NOT NULL DEFAULT now(),"
            " PRIMARY KEY (session_id, request_id, seq))"
        ).format(p)
        # The rows, and one notification per turn: sent at the statement's
        # commit (autocommit), so a follower woken by it reads the rows.
        self.publish = sql.SQL(
            "WITH ins AS (INSERT INTO {} (session_id, request_id, seq, kind, text)"
            " SELECT * FROM unnest(%s::text[], %s::text[], %s::int[], %s::text[], %s::bytea[])"
            " ON CONFLICT DO NOTHING)"
            " SELECT count(pg_notify(%s, n)::text) FROM unnest(%s::text[]) AS n"
        ).format(p)
        self.read = sql.SQL(
            "SELECT k.i, p.seq, p.kind, p.text FROM unnest(%s::text[], %s::text[], %s::int[])"
            " WITH ORDINALITY AS k(s, r, a, i) JOIN {} AS p ON p.session_id = k.s"
            " AND p.request_id = k.r AND p.seq > k.a ORDER BY k.i, p.seq"
        ).format(p)
        # Whole turns whose end is older than the window; rows of turns
        # without an end (an owner that died) older than the orphan age.
        self.sweep = sql.SQL(
            "WITH d AS (DELETE FROM {0} AS p WHERE EXISTS (SELECT 1 FROM {0} AS e"
            " WHERE e.session_id = p.session_id AND e.request_id = p.request_id"
            " AND e.kind = 'end' AND e.created_at < now() - make_interval(secs => %s))"
            " OR p.created_at < now() - make_interval(secs => %s) RETURNING 1)"
            " SELECT count(*) FROM d"
        ).format(p)
        self.listen = sql.SQL("LISTEN {}").format(sql.Identifier(self.channel))


_Rows = list[tuple[int, str, str]]  # (seq, kind, text)


class _PendingRead:
    __slots__ = ("after", "done", "error", "request_id", "rows", "session_id")

    def __init__(self, session_id: str, request_id: str, after: int) -> None:
        self.session_id = session_id
        self.request_id = request_id
        self.after = after
        self.rows: _Rows = []
        self.error: StoreError | None = None
        self.done = trio.Event()


class _Db(_Thread[Any]):
    """A connection of its own on a thread, fed statements as calls."""

    def __init__(self, name: str, connect: Callable[[], psycopg.Connection[Any]]) -> None:
        self.connect = connect
        #: Statements run (a group of reads is one).
        self.statements = 0
        #: Set before the thread's last call is queued: nothing queued
        #: after it would ever be answered.
        self.closed = False
        super().__init__(name)

    async def call(self, request: _Request) -> Any:
        if self.closed:
            await trio.lowlevel.checkpoint()
            raise StoreError("the previews are closed")
        return await super().call(request)

    async def shutdown(self) -> None:
        if not self.closed:
            self.closed = True
            await super().call(_Call(lambda _: self.close(), last=True))

    def run(self, stmt: sql.Composed, args: tuple[Any, ...]) -> list[tuple[Any, ...]]:
        import psycopg

        for attempt in (1, 2):
            try:
                if self.conn is None or self.conn.closed or self.conn.broken:
                    if self.conn is not None:
                        self.conn.close()
                    self.conn = self.connect()
                self.statements += 1
                cur = self.conn.execute(stmt, args, binary=True)
                return cur.fetchall() if cur.description else []
            except psycopg.Error as exc:
                # Every statement here may run twice: a row written twice is
                # skipped (ON CONFLICT), a read or a sweep is the same again.
                lost = self.conn is not None and (self.conn.broken or self.conn.closed)
                if attempt == 1 and lost:
                    continue
                raise map_error(exc, "previews") from exc
        raise AssertionError("unreachable")  # pragma: no cover

    def statement(self, stmt: sql.Composed, args: tuple[Any, ...]) -> _Call:
        """A call that runs ``stmt`` with ``args`` on this thread."""
        return _Call(lambda _: self.run(stmt, args))

    def handle(self, req: _Request) -> _Request | None:  # pragma: no cover - calls only
        raise AssertionError(f"unexpected request {req!r}")

    def close(self) -> None:
        if self.conn is not None:
            self.conn.close()


class _Follower:
    __slots__ = ("last", "wake")

    def __init__(self, last: int) -> None:
        self.last = last
        self.wake = trio.Event()


class Previews:
    """A process's preview channel: it publishes the deltas of the turns it
    runs and follows those of turns running anywhere. Open it with
    :func:`open_previews`."""

    def __init__(
        self,
        connect: Callable[[], psycopg.Connection[Any]],
        statements: _Statements,
        *,
        retain_after_end: float,
        orphan_after: float,
        sweep_every: float,
    ) -> None:
        self._connect = connect
        self._sql = statements
        #: The store whose leases say who owns a session.
        self.store: PostgresStore | None = None
        self.retain_after_end = retain_after_end
        self.orphan_after = orphan_after
        self.sweep_every = sweep_every
        self._pending: list[tuple[str, str, int, str, bytes]] = []
        self._has_pending = trio.Event()
        self._reads: list[_PendingRead] = []
        self._reads_waiting = trio.Event()
        self._followers: dict[str, set[_Follower]] = {}
        self._token = trio.lowlevel.current_trio_token()
        self._notified: list[str] = []
        self._notified_lock = threading.Lock()
        self._stop_listening = threading.Event()
        self._writer = _Db("turnledger-previews-writer", connect)
        self._reader = _Db("turnledger-previews-reader", connect)
        #: Batches written, rows in them, and notifications received
        #: (for benchmarks and tests).
        self.batches = 0
        self.rows_published = 0
        self.notifications = 0
        self.publish_errors = 0

    @property
    def reads(self) -> int:
        """Statements that read rows for followers (reads waiting together
        are one)."""
        return self._reader.statements

    @property
    def following(self) -> int:
        """Followers waiting in this process now."""
        return sum(len(f) for f in self._followers.values())

    # -- publishing ----------------------------------------------------------

    def publish(self, session_id: str, request_id: str, seq: int, text: str) -> None:
        """Queue delta ``seq`` of a turn (written with the next batch)."""
        self._queue((session_id, request_id, seq, "delta", _bytes(text)))

    def end(self, session_id: str, request_id: str, seq: int) -> None:
        """Queue the turn's ``end`` row (``seq``: one past its last delta),
        once its outcome is known (recorded in the log, or not at all)."""
        self._queue((session_id, request_id, seq, "end", b""))

    def _queue(self, row: tuple[str, str, int, str, bytes]) -> None:
        self._pending.append(row)
        self._has_pending.set()

    async def _publish_forever(self) -> None:
        while True:
            await self._has_pending.wait()
            batch, self._pending = self._pending[:_MAX_BATCH], self._pending[_MAX_BATCH:]
            if not self._pending:
                self._has_pending = trio.Event()
            await self._write(batch)

    async def _write(self, batch: list[tuple[str, str, int, str, bytes]]) -> None:
        last: dict[tuple[str, str], int] = {}
        for sid, rid, seq, _, _ in batch:
            last[sid, rid] = max(seq, last.get((sid, rid), 0))
        payloads = [f"{preview_key(s, r)}:{n}" for (s, r), n in last.items()]
        columns = tuple(list(c) for c in zip(*batch, strict=True))
        args = (*columns, self._sql.channel, payloads)
        writer = self._writer
        for pause in (0.1, 0.5, None):
            try:
                await writer.call(_Call(lambda _: writer.run(self._sql.publish, args)))
                break
            except StoreError as exc:
                # Tried again a few times (a row written twice is skipped),
                # then given up: a preview is not history, and followers
                # end with the outcome from the log, whose answer is whole.
                self.publish_errors += 1
                log.warning("preview_publish_failed", rows=len(batch), error=type(exc).__name__)
                if pause is None:
                    return
                await trio.sleep(pause)
        self.batches += 1
        self.rows_published += len(batch)

    async def flushed(self) -> None:
        """Wait until every row queued so far is written (or given up on).

        Cancellation: only the wait ends; the rows are written anyway.
        """
        writer = self._writer
        while self._pending:
            await trio.sleep(0.001)
        # The writer's queue is in order: past this, the last batch is written.
        await writer.call(_Call(lambda _: None))

    # -- retention -----------------------------------------------------------

    async def sweep(self) -> int:
        """Delete the rows past their retention now; how many went.

        Cancellation: the DELETE runs to its end either way.
        """
        writer = self._writer
        args = (self.retain_after_end, self.orphan_after)

        rows = await writer.call(_Call(lambda _: writer.run(self._sql.sweep, args)))
        return int(rows[0][0])

    async def _sweep_forever(self) -> None:
        while True:
            try:
                n = await self.sweep()
                if n:
                    log.debug("previews_swept", rows=n)
            except StoreError as exc:
                log.warning("previews_sweep_failed", error=type(exc).__name__)
            await trio.sleep(self.sweep_every)

    # -- following -----------------------------------------------------------

    async def owner_live(self, session_id: str) -> bool:
        """Whether a live owner holds the session's lease (see
        :meth:`PostgresStore.owner`); ``False`` when nobody does.

        Cancellation: nothing was changed.
        """
        assert self.store is not None
        lease = await self.store.owner(session_id)
        return lease is not None and lease.live

    async def read(self, session_id: str, request_id: str, after: int) -> _Rows:
        """The turn's rows after ``after``, in order: ``(seq, kind, text)``.

        Cancellation: the read finishes on its thread; its rows are dropped.
        """
        if self._reader.closed:
            await trio.lowlevel.checkpoint()
            raise StoreError("the previews are closed")
        wish = _PendingRead(session_id, request_id, after)
        self._reads.append(wish)
        self._reads_waiting.set()
        await wish.done.wait()
        if wish.error is not None:
            raise wish.error
        return wish.rows

    async def _read_forever(self) -> None:
        # The reads that wait together are one statement, and one hop to
        # the reader's thread: a hundred followers woken by one batch cost
        # one round trip and one thread wake-up, not a hundred.
        reader = self._reader
        stmt = self._sql.read
        while True:
            await self._reads_waiting.wait()
            group, self._reads = self._reads[:_MAX_BATCH], self._reads[_MAX_BATCH:]
            if not self._reads:
                self._reads_waiting = trio.Event()
            args = (
                [r.session_id for r in group],
                [r.request_id for r in group],
                [r.after for r in group],
            )
            try:
                rows = await reader.call(reader.statement(stmt, args))
            except StoreError as exc:
                for r in group:
                    r.error = exc
                    r.done.set()
                continue
            for i, seq, kind, data in rows:
                group[i - 1].rows.append((seq, kind, _text(data)))
            for r in group:
                r.done.set()

    async def follow(
        self,
        session_id: str,
        request_id: str,
        after_seq: int = 0,
        *,
        ended: Callable[[], Awaitable[bool]],
        poll_interval: float = 1.0,
        end_grace: float = 2.0,
    ) -> AsyncIterator[list[PreviewDelta]]:
        """The turn's deltas after ``after_seq``, each once and in order, in
        batches (what one read found); it ends at the turn's ``end`` row.

        ``ended()`` is asked at least every ``poll_interval`` seconds while
        nothing arrives: ``True`` once the turn's outcome is in the log. The
        follower then waits at most ``end_grace`` more seconds for the
        ``end`` row (an owner writes it just after the outcome) and ends
        with what it found: a turn whose owner died, closed by a takeover
        as ``interrupted``, ends this way.

        Raises:
            StoreError: the database could not be read.

        Cancellation: the follower stops; nothing was changed.
        """
        key = preview_key(session_id, request_id)
        me = _Follower(after_seq)
        # Registered before the first read: a notification for rows this
        # read misses wakes it after.
        self._followers.setdefault(key, set()).add(me)
        give_up: float | None = None
        try:
            while True:
                me.wake = trio.Event()
                rows = await self.read(session_id, request_id, me.last)
                batch = [PreviewDelta(seq, text) for seq, kind, text in rows if kind == "delta"]
                if rows:
                    me.last = rows[-1][0]
                if batch:
                    yield batch
                if any(kind == "end" for _, kind, _ in rows):
                    return
                now = trio.current_time()
                if give_up is not None and now >= give_up:
                    return
                wait = poll_interval if give_up is None else min(0.05, give_up - now)
                with trio.move_on_after(wait) as waited:
                    await me.wake.wait()
                if waited.cancelled_caught and give_up is None and await ended():
                    give_up = trio.current_time() + end_grace
        finally:
            waiting = self._followers.get(key)
            if waiting is not None:
                waiting.discard(me)
                if not waiting:
                    del self._followers[key]

    # -- the listening connection --------------------------------------------

    def _listen_forever(self) -> None:
        import psycopg

        while not self._stop_listening.is_set():
            conn = None
            try:
                conn = self._connect()
                conn.execute(self._sql.listen)
                # Anything notified while no connection listened: read again.
                self._notify_all()
                while not self._stop_listening.is_set():
                    for n in conn.notifies(timeout=0.25):
                        self._notified_soon(n.payload)
            except psycopg.Error as exc:
                log.warning("previews_listen_lost", error=type(exc).__name__)
                self._stop_listening.wait(0.2)
            finally:
                if conn is not None:
                    conn.close()

    def _notified_soon(self, payload: str) -> None:
        with self._notified_lock:
            first = not self._notified
            self._notified.append(payload)
        if first:
            with contextlib.suppress(trio.RunFinishedError):
                self._token.run_sync_soon(self._dispatch)

    def _notify_all(self) -> None:
        self._notified_soon("*")

    def _dispatch(self) -> None:
        with self._notified_lock:
            payloads, self._notified = self._notified, []
        self.notifications += len(payloads)
        for payload in payloads:
            if payload == "*":
                for waiting in self._followers.values():
                    for f in waiting:
                        f.wake.set()
                continue
            key, _, seq = payload.partition(":")
            for f in self._followers.get(key, ()):
                if not seq.isdigit() or int(seq) > f.last:
                    f.wake.set()

    async def _aclose(self) -> None:
        self._stop_listening.set()
        for r in self._reads:  # (the reading task has stopped)
            r.error = StoreError("the previews are closed")
            r.done.set()
        self._reads.clear()
        with trio.CancelScope(shield=True):
            await self._writer.shutdown()
            await self._reader.shutdown()


@contextlib.asynccontextmanager
async def open_previews(
    store: PostgresStore,
    *,
    retain_after_end: float = 30.0,
    orphan_after: float = 600.0,
    sweep_every: float = 5.0,
) -> AsyncIterator[Previews]:
    """The preview channel beside a PostgreSQL store's table (created if
    needed), with its publishing, listening and sweeping running until the
    block ends (the rows queued by then are written first).

    Args:
        store: the store whose database and table name the previews share.
        retain_after_end: seconds a finished turn's rows stay after its end.
        orphan_after: seconds after which rows of a turn that never ended
            (its owner died) go; keep it above the longest turn.
        sweep_every: seconds between sweeps.

    Raises:
        StoreUnavailable: the database cannot be reached.
        ValueError: a duration is not positive.

    Cancellation: the channel closes; rows not yet written are dropped.
    """
    if not (retain_after_end > 0 and orphan_after > 0 and sweep_every > 0):
        raise ValueError("retain_after_end, orphan_after and sweep_every must be positive")
    connect = store._connect  # a connection of its own, as the store's threads have
    statements = _Statements(store.schema, store.table)

    def create() -> None:
        import psycopg

        try:
            with connect(autocommit=True) as conn:
                conn.execute(statements.create)
        except psycopg.Error as exc:
            raise map_error(exc, "cannot create the previews table") from exc

    await trio.to_thread.run_sync(create)
    previews = Previews(
        lambda: connect(autocommit=True),
        statements,
        retain_after_end=retain_after_end,
        orphan_after=orphan_after,
        sweep_every=sweep_every,
    )
    previews.store = store
    listener = threading.Thread(
        target=previews._listen_forever, name="turnledger-previews-listener", daemon=True
    )
    listener.start()
    try:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(previews._publish_forever)
            nursery.start_soon(previews._sweep_forever)
            nursery.start_soon(previews._read_forever)
            try:
                yield previews
            finally:
                with trio.move_on_after(5) as scope:
                    scope.shield = True
                    await previews.flushed()
                nursery.cancel_scope.cancel()
    finally:
        await previews._aclose()
        await trio.to_thread.run_sync(listener.join, 5.0)
