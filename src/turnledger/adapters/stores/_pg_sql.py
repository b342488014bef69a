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
    "Statements",
    "application_name",
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

# Take the leases of sessions (an array) that no other store holds live:
# new rows at epoch 1, expired or released ones bumped. Returns those taken.
_TAKE: Final = (
    "INSERT INTO {0} AS l (session_id, epoch, owner, host, pid, backend, backend_start,"
    " expires_at) SELECT s, 1, %s, %s, %s, pg_backend_pid(), (SELECT backend_start"
    " FROM pg_stat_activity WHERE pid = pg_backend_pid()),"
    " now() + make_interval(secs => %s) FROM unnest(%s::text[]) AS s"
    " ON CONFLICT (session_id) DO UPDATE SET epoch = l.epoch + 1, owner = excluded.owner,"
    " host = excluded.host, pid = excluded.pid, backend = excluded.backend,"
    " backend_start = excluded.backend_start, expires_at = excluded.expires_at"
    " WHERE l.owner IS NULL OR l.expires_at <= now() OR NOT EXISTS ("
    "SELECT 1 FROM pg_stat_activity a WHERE a.pid = l.backend"
    " AND a.backend_start = l.backend_start)"
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
    " AND a.backend_start = l.backend_start), l.owner FROM {} AS l"
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
    sid, host, pid, epoch, expires_at, live, _ = row
    if not live:
        return SessionOwnedElsewhere(sid, "its owner just let go; try again")
    return SessionOwnedElsewhere(
        sid,
        f"held by turnledger pid={pid} host={host} (lease epoch {epoch},"
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
        self.take = sql.SQL(_TAKE).format(lt)
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
        self.holders = sql.SQL(_LEASE_STATE + " WHERE l.session_id = ANY(%s)").format(lt)
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
        ).format(lt)


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

    t = sql.Identifier(schema, table)
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
        if version == SCHEMA_VERSION:
            return
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
