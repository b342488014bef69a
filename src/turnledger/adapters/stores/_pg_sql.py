"""The PostgreSQL store's SQL: its tables (created, checked and migrated on
open), every statement it runs, how a payload becomes its two columns, and
what the server's errors mean. The store, its I/O threads and its leases
(``postgres``, ``_pg_threads``, ``_pg_leases``) run these; the reasons behind
the statements (positions from transaction ids, fenced leases, the mark a
takeover looks for) are in the ``postgres`` module's notes.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import socket
from typing import TYPE_CHECKING, Any, Final

from ..._errors import SessionOwnedElsewhere, StoreError, StoreFull, StoreUnavailable
from ._payloads import dumps_payload

if TYPE_CHECKING:
    import psycopg
    from psycopg import sql

__all__ = [
    "MAX_ROWS",
    "SCHEMA_VERSION",
    "SHIFT",
    "ClusterStatements",
    "Statements",
    "application_name",
    "channel",
    "check_schema",
    "connect",
    "create_schema",
    "map_error",
    "not_committed",
    "owned_elsewhere",
    "payload_columns",
]

#: Schema version this release writes (the ``<table>_meta`` table).
SCHEMA_VERSION: Final = 2

# Advisory lock class of the two-int form, taken only while creating or
# migrating the schema.
_DDL_CLASS: Final = 0x544C0001

#: A position is ``transaction id << SHIFT | index of the row in it``.
SHIFT: Final = 20
MAX_ROWS: Final = 1 << SHIFT

_UNSAFE_FOR_JSONB: Final = re.compile("[\x00\ud800-\udfff]")


def _hash(text: str, size: int) -> int:
    digest = hashlib.blake2b(text.encode("utf-8", "surrogatepass"), digest_size=size).digest()
    return int.from_bytes(digest, "big", signed=True)


def _jsonb_safe(value: Any) -> Any:
    if type(value) is str:
        return _UNSAFE_FOR_JSONB.sub("\ufffd", value)
    if type(value) is dict:
        return {_jsonb_safe(k): _jsonb_safe(v) for k, v in value.items()}
    if type(value) is list:
        return [_jsonb_safe(v) for v in value]
    return value


def payload_columns(payload: Any) -> tuple[str, str | None]:
    """The ``jsonb`` text and, when that had to differ, the exact text."""
    text = dumps_payload(payload)
    if "\\u0000" not in text and "\\ud" not in text:
        return text, None
    safe = dumps_payload(_jsonb_safe(json.loads(text)))
    return safe, (None if safe == text else text)


def map_error(exc: Exception, msg: str) -> StoreError:
    import psycopg
    from psycopg import errors

    if isinstance(exc, StoreError):
        return exc
    error: StoreError
    if isinstance(exc, errors.DiskFull):
        error = StoreFull(f"{msg}: {exc}")
    elif isinstance(exc, psycopg.OperationalError):  # includes the pool's timeouts
        error = StoreUnavailable(f"{msg}: {exc}")
    else:
        error = StoreError(f"{msg}: {exc}")
    error.__cause__ = exc  # the server's own words, for describe_store_error
    return error


def application_name() -> str:
    return f"turnledger pid={os.getpid()} host={socket.gethostname()}"[:63]


def connect(dsn: str, timeout: float, *, autocommit: bool) -> psycopg.Connection[Any]:
    """A connection of its own (not from the pool), named for ``pg_stat_activity``."""
    import psycopg

    return psycopg.connect(
        dsn,
        autocommit=autocommit,
        connect_timeout=max(1, round(timeout)),
        application_name=application_name(),
    )


# Which connection holds a lease: while it is open, the lease is live.
_MY_BACKEND: Final = (
    " backend = pg_backend_pid(), backend_start = ("
    "SELECT backend_start FROM pg_stat_activity WHERE pid = pg_backend_pid())"
)

# A lease naming a node is live only while that node is: its row in the
# nodes table heartbeated within its TTL (the server's clock). A node id the
# table does not know is a dead node.
_NODE_LIVE: Final = (
    "(l.node IS NULL OR EXISTS (SELECT 1 FROM {nodes} AS n"
    " WHERE n.node_id = l.node AND n.expires_at > now()))"
)

# Take the leases of sessions (an array) that no other store holds live:
# new rows at epoch 1, expired or released ones bumped. Returns those taken.
_TAKE: Final = (
    "INSERT INTO {leases} AS l (session_id, epoch, owner, host, pid, backend, backend_start,"
    " expires_at, node) SELECT s, 1, %s, %s, %s, pg_backend_pid(), (SELECT backend_start"
    " FROM pg_stat_activity WHERE pid = pg_backend_pid()),"
    " now() + make_interval(secs => %s), %s FROM unnest(%s::text[]) AS s"
    " ON CONFLICT (session_id) DO UPDATE SET epoch = l.epoch + 1, owner = excluded.owner,"
    " host = excluded.host, pid = excluded.pid, backend = excluded.backend,"
    " backend_start = excluded.backend_start, expires_at = excluded.expires_at,"
    " node = excluded.node"
    " WHERE l.owner IS NULL OR l.expires_at <= now() OR NOT EXISTS ("
    "SELECT 1 FROM pg_stat_activity a WHERE a.pid = l.backend"
    " AND a.backend_start = l.backend_start) OR NOT " + _NODE_LIVE + ""
    " RETURNING session_id, epoch"
)

# End (waiting up to 2 s for each) the backends of other stores that hold the
# append mark of an expired lease's owner among the sessions (an array).
_BREAK: Final = (
    "SELECT pg_terminate_backend(k.pid, 2000) FROM {} AS l JOIN pg_locks AS k"
    " ON k.locktype = 'advisory' AND k.granted AND k.objsubid = 1"
    " AND k.database = (SELECT oid FROM pg_database WHERE datname = current_database())"
    " AND k.classid::text::int8 = (hashtextextended(l.owner, 0) >> 32) & 4294967295"
    " AND k.objid::text::int8 = hashtextextended(l.owner, 0) & 4294967295"
    " WHERE l.session_id = ANY(%s) AND l.owner IS NOT NULL AND l.owner <> %s"
    " AND l.expires_at <= now() AND k.pid <> pg_backend_pid()"
)

# A lease row and whether it is live: unexpired, and its holder's connection
# still open (the same backend pid started at the same time).
_LEASE_STATE: Final = (
    "SELECT l.session_id, l.host, l.pid, l.epoch, l.expires_at,"
    " l.owner IS NOT NULL AND l.expires_at > now() AND EXISTS ("
    "SELECT 1 FROM pg_stat_activity a WHERE a.pid = l.backend"
    " AND a.backend_start = l.backend_start) AND " + _NODE_LIVE + ", l.owner, l.node"
    " FROM {leases} AS l"
)


def not_committed(exc: Exception, committing: bool, conn: psycopg.Connection[Any] | None) -> bool:
    """Whether a failed transaction surely wrote nothing and its connection
    is to be replaced: the connection broke before COMMIT was sent, or the
    server ended it for idling in the transaction."""
    from psycopg import errors

    if isinstance(exc, errors.IdleInTransactionSessionTimeout):
        return True
    lost = conn is None or conn.broken or conn.closed
    return lost and isinstance(exc, errors.OperationalError) and not committing


def owned_elsewhere(row: tuple[Any, ...]) -> SessionOwnedElsewhere:
    sid, host, pid, epoch, expires_at, live, _, node = row
    if not live:
        return SessionOwnedElsewhere(sid, "its owner just let go; try again")
    on = "" if node is None else f" node={node}"
    return SessionOwnedElsewhere(
        sid,
        f"held by turnledger{on} pid={pid} host={host} (lease epoch {epoch},"
        f" expires {expires_at.isoformat(timespec='seconds')})",
    )


class Statements:
    """Every statement a store runs on its table ``schema.table`` and its
    leases table, composed once when the store opens.

    Attributes are plain (not frozen) so that a test can put a statement of
    its own in the place of one.
    """

    def __init__(self, schema: str, table: str, lock_wait_ms: int) -> None:
        from psycopg import sql

        t = sql.Identifier(schema, table)
        lt = sql.Identifier(schema, f"{table}_leases")
        nt = sql.Identifier(schema, f"{table}_nodes")
        # The leases of the owned sessions (key-share-locked until commit:
        # a takeover waits) and the versions of the sessions asked for.
        self.check = sql.SQL(
            "WITH f AS (SELECT session_id, epoch FROM {} WHERE session_id = ANY(%b::text[])"
            " FOR KEY SHARE) SELECT 'f', session_id, epoch FROM f UNION ALL"
            " SELECT 'v', session_id, max(seq) FROM {} WHERE session_id = ANY(%b::text[])"
            " GROUP BY session_id"
        ).format(lt, t)
        # One statement for the whole group, a column of values each; the
        # position is this transaction's id << 20 plus the row's index.
        self.insert = sql.SQL(
            "INSERT INTO {} (position, session_id, seq, tag, schema_version, payload,"
            " payload_text, recorded_at) SELECT (pg_current_xact_id()::text::int8 << {})"
            " + n - 1, s, q, t, v, j::jsonb, x, r FROM unnest(%b::text[], %b::int4[],"
            " %b::text[], %b::int4[], %b::text[], %b::text[], %b::float8[])"
            " WITH ORDINALITY AS u(s, q, t, v, j, x, r, n)"
        ).format(t, sql.Literal(SHIFT))
        cols = sql.SQL(
            "SELECT position, session_id, seq, tag, schema_version,"
            " coalesce(payload_text, payload::text), recorded_at FROM {}"
        ).format(t)
        self.read = sql.SQL("{} WHERE session_id = %s AND seq > %s ORDER BY seq").format(cols)
        # The replay path: payload text as UTF-8 bytes, for the JSON parser.
        self.read_json = sql.SQL(
            "SELECT seq, tag, schema_version,"
            " convert_to(coalesce(payload_text, payload::text), 'UTF8') FROM {}"
            " WHERE session_id = %s AND seq > %s ORDER BY seq"
        ).format(t)
        # The same for many (session, after) pairs, each row tagged with the
        # pair's place (from 1), in that order.
        self.read_json_many = sql.SQL(
            "SELECT r.i, e.seq, e.tag, e.schema_version,"
            " convert_to(coalesce(e.payload_text, e.payload::text), 'UTF8')"
            " FROM unnest(%b::text[], %b::int4[]) WITH ORDINALITY AS r(s, a, i)"
            " JOIN {} AS e ON e.session_id = r.s AND e.seq > r.a ORDER BY r.i, e.seq"
        ).format(t)
        self.read_all = sql.SQL(
            "{} WHERE position > %s"
            " AND position < (pg_snapshot_xmin(pg_current_snapshot())::text::int8 << {})"
            " ORDER BY position LIMIT %s"
        ).format(cols, sql.Literal(SHIFT))
        self.sessions = sql.SQL("SELECT session_id FROM {} WHERE seq = 1 ORDER BY position").format(
            t
        )
        # A takeover waits this long for the lease rows (see acquire_group).
        self.lock_wait = sql.SQL("SET LOCAL lock_timeout = {}").format(lock_wait_ms)
        self.take = sql.SQL(_TAKE).format(leases=lt, nodes=nt)
        self.lock_leases = sql.SQL("SELECT 1 FROM {} WHERE session_id = ANY(%s) FOR UPDATE").format(
            lt
        )
        # Every append transaction that locks lease rows first takes this
        # store's shared advisory lock, so that a takeover can tell which
        # backend holds the rows of an expired lease, and end it.
        self.xid = sql.SQL("SELECT pg_current_xact_id()::text::int8")
        self.mark = sql.SQL(
            "SELECT pg_current_xact_id()::text::int8,"
            " pg_advisory_xact_lock_shared(hashtextextended(%s, 0))"
        )
        self.break_ = sql.SQL(_BREAK).format(lt)
        self.holders = sql.SQL(_LEASE_STATE + " WHERE l.session_id = ANY(%s)").format(
            leases=lt, nodes=nt
        )
        self.renew = sql.SQL(
            "UPDATE {} AS l SET expires_at = now() + make_interval(secs => %s),"
            + _MY_BACKEND
            + " FROM unnest(%s::text[], %s::int8[]) AS m(session_id, epoch)"
            " WHERE l.session_id = m.session_id AND l.epoch = m.epoch"
            " AND l.owner = %s RETURNING l.session_id"
        ).format(lt)
        self.release = sql.SQL(
            "UPDATE {} AS l SET owner = NULL, expires_at = now()"
            " FROM unnest(%s::text[], %s::int8[]) AS m(session_id, epoch)"
            " WHERE l.session_id = m.session_id AND l.epoch = m.epoch"
            " AND l.owner = %s"
        ).format(lt)
        et = sql.Identifier(schema, f"{table}_erasures")
        self.count = sql.SQL("SELECT count(*) FROM {} WHERE session_id = %s").format(t)
        self.lock_lease = sql.SQL(
            "SELECT epoch FROM {} WHERE session_id = %s AND owner = %s FOR UPDATE"
        ).format(lt)
        self.delete = sql.SQL("DELETE FROM {} WHERE session_id = %s").format(t)
        self.delete_lease = sql.SQL("DELETE FROM {} WHERE session_id = %s").format(lt)
        self.record_erasure = sql.SQL(
            "INSERT INTO {} (session_sha256, erased_at, events, kept) VALUES (%s, %s, %s, %s)"
        ).format(et)
        self.erasures = sql.SQL(
            "SELECT session_sha256, erased_at, events, kept FROM {} ORDER BY id"
        ).format(et)
        self.owners = sql.SQL(
            _LEASE_STATE + " WHERE l.owner IS NOT NULL ORDER BY l.session_id"
        ).format(leases=lt, nodes=nt)
        self.cluster = ClusterStatements(schema, table, lt, nt)


def _read_version(conn: psycopg.Connection[Any], meta: sql.Identifier) -> int:
    from psycopg import sql

    row = conn.execute(
        sql.SQL("SELECT value FROM {} WHERE key = 'schema_version'").format(meta)
    ).fetchone()
    return int(row[0]) if row else 0


def check_schema(conn: psycopg.Connection[Any], schema: str, table: str) -> None:
    from psycopg import sql

    meta = sql.Identifier(schema, f"{table}_meta")
    row = conn.execute("SELECT to_regclass(%s)", (f'"{schema}"."{table}_meta"',)).fetchone()
    if row is None or row[0] is None:
        raise StoreUnavailable(f"{schema}.{table}: no turnledger events table here")
    version = _read_version(conn, meta)
    # Version 1 reads the same; only the way positions are given changed.
    if version not in (1, SCHEMA_VERSION):
        raise StoreUnavailable(
            f"{schema}.{table}: schema version {version}; this release reads 1 and {SCHEMA_VERSION}"
        )
    conn.rollback()


def create_schema(conn: psycopg.Connection[Any], schema: str, table: str) -> None:
    from psycopg import sql

    meta = sql.Identifier(schema, f"{table}_meta")
    with conn.transaction():
        # Two processes creating the same table at once would race in the
        # catalogs; serialize them.
        conn.execute(
            "SELECT pg_advisory_xact_lock(%s::int4, %s::int4)",
            (_DDL_CLASS, _hash(f"ddl:{schema}.{table}", 4)),
        )
        conn.execute(sql.SQL("CREATE SCHEMA IF NOT EXISTS {}").format(sql.Identifier(schema)))
        conn.execute(
            sql.SQL(
                "CREATE TABLE IF NOT EXISTS {} (key text PRIMARY KEY, value text NOT NULL)"
            ).format(meta)
        )
        version = _read_version(conn, meta)
        if version > SCHEMA_VERSION:
            raise StoreUnavailable(
                f"{schema}.{table}: schema version {version} was written by a newer "
                f"turnledger; this release knows versions up to {SCHEMA_VERSION}"
            )
        # The erasure records (content-free: the id's SHA-256, the time, the
        # counts); made here, not by a version step, on any table it lacks.
        conn.execute(
            sql.SQL(
                """
                CREATE TABLE IF NOT EXISTS {} (
                    id             bigserial        PRIMARY KEY,
                    session_sha256 text             NOT NULL,
                    erased_at      double precision NOT NULL,
                    events         integer          NOT NULL,
                    kept           integer          NOT NULL
                )
                """
            ).format(sql.Identifier(schema, f"{table}_erasures"))
        )
        if version != SCHEMA_VERSION:
            _create_tables(conn, schema, table, version)
        _create_cluster_tables(conn, schema, table)


def _create_tables(conn: psycopg.Connection[Any], schema: str, table: str, version: int) -> None:
    from psycopg import sql

    t = sql.Identifier(schema, table)
    meta = sql.Identifier(schema, f"{table}_meta")
    conn.execute(
        sql.SQL(
            """
            CREATE TABLE IF NOT EXISTS {} (
                position       bigint           PRIMARY KEY,
                session_id     text             NOT NULL,
                seq            integer          NOT NULL CHECK (seq >= 1),
                tag            text             NOT NULL,
                schema_version integer          NOT NULL,
                payload        jsonb            NOT NULL,
                payload_text   text,
                recorded_at    double precision NOT NULL,
                UNIQUE (session_id, seq)
            )
            """
        ).format(t)
    )
    if version == 1:
        _migrate_from_1(conn, t)
    conn.execute(
        sql.SQL("CREATE INDEX IF NOT EXISTS {} ON {} (position) WHERE seq = 1").format(
            sql.Identifier(f"{table}_first"), t
        )
    )
    conn.execute(
        sql.SQL(
            """
            CREATE TABLE IF NOT EXISTS {} (
                session_id    text        PRIMARY KEY,
                epoch         bigint      NOT NULL DEFAULT 0,
                owner         text,
                host          text,
                pid           integer,
                backend       integer,
                backend_start timestamptz,
                expires_at    timestamptz NOT NULL DEFAULT now()
            )
            """
        ).format(sql.Identifier(schema, f"{table}_leases"))
    )
    conn.execute(
        sql.SQL(
            "INSERT INTO {} (key, value) VALUES ('schema_version', %s)"
            " ON CONFLICT (key) DO UPDATE SET value = excluded.value"
        ).format(meta),
        (str(SCHEMA_VERSION),),
    )


def _create_cluster_tables(conn: psycopg.Connection[Any], schema: str, table: str) -> None:
    """The tables of nodes (``serve --node-id``): made here, not by a version
    step, on any table that lacks them (an older release ignores them and the
    ``node`` column of the leases, which it leaves NULL: a lease it takes
    names no node and is judged as before)."""
    from psycopg import sql

    leases = f"{table}_leases"
    row = conn.execute(
        "SELECT 1 FROM information_schema.columns WHERE table_schema = %s"
        " AND table_name = %s AND column_name = 'node'",
        (schema, leases),
    ).fetchone()
    if row is None:
        conn.execute(
            sql.SQL("ALTER TABLE {} ADD COLUMN IF NOT EXISTS node text").format(
                sql.Identifier(schema, leases)
            )
        )
    conn.execute(
        sql.SQL(
            """
            CREATE TABLE IF NOT EXISTS {} (
                node_id      text             PRIMARY KEY,
                token        text             NOT NULL,
                host         text             NOT NULL,
                pid          integer          NOT NULL,
                address      text,
                started_at   timestamptz      NOT NULL DEFAULT now(),
                heartbeat_at timestamptz      NOT NULL DEFAULT now(),
                expires_at   timestamptz      NOT NULL,
                renewals     bigint           NOT NULL DEFAULT 0,
                lag_ms       double precision NOT NULL DEFAULT 0,
                stopping     boolean          NOT NULL DEFAULT false,
                sessions     integer          NOT NULL DEFAULT 0
            )
            """
        ).format(sql.Identifier(schema, f"{table}_nodes"))
    )
    conn.execute(
        sql.SQL(
            """
            CREATE TABLE IF NOT EXISTS {} (
                id         bigserial   PRIMARY KEY,
                target     text        NOT NULL,
                sender     text        NOT NULL,
                session_id text        NOT NULL,
                kind       text        NOT NULL,
                body       jsonb       NOT NULL,
                created_at timestamptz NOT NULL DEFAULT now(),
                claimed_at timestamptz,
                reply      jsonb
            )
            """
        ).format(sql.Identifier(schema, f"{table}_inbox"))
    )
    conn.execute(
        sql.SQL("CREATE INDEX IF NOT EXISTS {} ON {} (target, id) WHERE claimed_at IS NULL").format(
            sql.Identifier(f"{table}_inbox_open"), sql.Identifier(schema, f"{table}_inbox")
        )
    )


def channel(schema: str, table: str, node_id: str) -> str:
    """The ``LISTEN`` channel of a node: an identifier (at most 63 bytes)
    whatever the node's id, one per table and node."""
    return (
        "tl_" + hashlib.blake2b(f"{schema}.{table}:{node_id}".encode(), digest_size=16).hexdigest()
    )


class ClusterStatements:
    """The statements of nodes and their inbox (see ``_pg_cluster``)."""

    def __init__(
        self, schema: str, table: str, leases: sql.Identifier, nodes: sql.Identifier
    ) -> None:
        from psycopg import sql

        inbox = sql.Identifier(schema, f"{table}_inbox")
        # Register or heartbeat, one statement: a row of this store's (its
        # token) is renewed, with how late this beat came (lag: the time
        # since the last one beyond the interval); an expired row of another
        # process is taken; a live one of another process is left (nothing
        # returned: the id is in use).
        self.beat = sql.SQL(
            "INSERT INTO {} AS n (node_id, token, host, pid, address, expires_at)"
            " VALUES (%(node)s, %(token)s, %(host)s, %(pid)s, %(address)s,"
            " now() + make_interval(secs => %(ttl)s))"
            " ON CONFLICT (node_id) DO UPDATE SET"
            " lag_ms = CASE WHEN n.token = excluded.token THEN greatest(0,"
            " extract(epoch FROM now() - n.heartbeat_at) * 1000 - %(every_ms)s) ELSE 0 END,"
            " renewals = CASE WHEN n.token = excluded.token THEN n.renewals + 1 ELSE 0 END,"
            " started_at = CASE WHEN n.token = excluded.token THEN n.started_at ELSE now() END,"
            " token = excluded.token, host = excluded.host, pid = excluded.pid,"
            " address = excluded.address, heartbeat_at = now(), expires_at = excluded.expires_at,"
            " sessions = %(sessions)s, stopping = n.stopping AND n.token = excluded.token"
            " WHERE n.token = excluded.token OR n.expires_at <= now()"
            " RETURNING node_id"
        ).format(nodes)
        self.node = sql.SQL(
            "SELECT host, pid, expires_at > now() FROM {} WHERE node_id = %s"
        ).format(nodes)
        self.stopping = sql.SQL(
            "UPDATE {} SET stopping = true WHERE node_id = %s AND token = %s"
        ).format(nodes)
        self.leave = sql.SQL("DELETE FROM {} WHERE node_id = %s AND token = %s").format(nodes)
        self.nodes = sql.SQL(
            "SELECT n.node_id, n.host, n.pid, n.address, n.started_at, n.heartbeat_at,"
            " n.expires_at, n.renewals, n.lag_ms, n.stopping, n.expires_at > now(),"
            " extract(epoch FROM now() - n.heartbeat_at) * 1000, count(l.session_id),"
            " coalesce((array_agg(l.session_id ORDER BY l.session_id)"
            " FILTER (WHERE l.session_id IS NOT NULL))[1:%s], '{{}}')"
            " FROM {} AS n LEFT JOIN {} AS l ON l.node = n.node_id AND l.owner IS NOT NULL"
            " AND l.expires_at > now() WHERE %s OR n.expires_at > now()"
            " GROUP BY n.node_id ORDER BY n.node_id"
        ).format(nodes, leases)
        self.post = sql.SQL(
            "WITH i AS (INSERT INTO {} (target, sender, session_id, kind, body)"
            " VALUES (%s, %s, %s, %s, %s::jsonb) RETURNING id)"
            " SELECT id, pg_notify(%s, 'call') FROM i"
        ).format(inbox)
        self.claim = sql.SQL(
            "UPDATE {0} SET claimed_at = now() WHERE id IN (SELECT id FROM {0}"
            " WHERE target = %s AND claimed_at IS NULL ORDER BY id LIMIT 256"
            " FOR UPDATE SKIP LOCKED) RETURNING id, sender, session_id, kind, body::text"
        ).format(inbox)
        self.reply = sql.SQL(
            "WITH u AS (UPDATE {} SET reply = %s::jsonb WHERE id = %s RETURNING id)"
            " SELECT pg_notify(%s, 'reply:' || id) FROM u"
        ).format(inbox)
        self.take_reply = sql.SQL(
            "DELETE FROM {} WHERE id = %s AND reply IS NOT NULL RETURNING reply::text"
        ).format(inbox)
        self.withdraw = sql.SQL(
            "DELETE FROM {} WHERE id = %s AND claimed_at IS NULL RETURNING id"
        ).format(inbox)
        # Calls whose sender stopped waiting long ago (it died, say).
        self.sweep = sql.SQL(
            "DELETE FROM {} WHERE created_at < now() - make_interval(secs => %s)"
        ).format(inbox)


def _migrate_from_1(conn: psycopg.Connection[Any], t: sql.Identifier) -> None:
    """Version 1 gave positions from an identity column. Drop the identity
    (positions are given by the writer now); every old position must lie
    below the new ones, which start at this transaction's id << 20."""
    from psycopg import sql

    conn.execute(sql.SQL("LOCK TABLE {} IN ACCESS EXCLUSIVE MODE").format(t))
    conn.execute(sql.SQL("ALTER TABLE {} ALTER COLUMN position DROP IDENTITY IF EXISTS").format(t))
    row = conn.execute(
        sql.SQL(
            "SELECT coalesce(max(position), 0), pg_current_xact_id()::text::int8 << {} FROM {}"
        ).format(sql.Literal(SHIFT), t)
    ).fetchone()
    assert row is not None
    if row[0] >= row[1]:
        raise StoreUnavailable(
            f"cannot migrate: the highest position {row[0]} is not below the first new one"
            f" ({row[1]}); this table needs renumbering first"
        )
