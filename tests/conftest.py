import os

from hypothesis import HealthCheck, settings

settings.register_profile(
    "ci",
    deadline=None,
    print_blob=True,
    suppress_health_check=[HealthCheck.too_slow],
)
settings.register_profile("dev", deadline=None, suppress_health_check=[HealthCheck.too_slow])
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "dev"))


# --- PostgreSQL ---------------------------------------------------------------
# Tests that need PostgreSQL take the `pg_dsn` fixture. The server comes from
# TURNLEDGER_TEST_PG_DSN; without it those tests skip. With TURNLEDGER_REQUIRE_PG=1
# (as in .ci/run) an unreachable server fails them instead of skipping.

import uuid  # noqa: E402
from collections.abc import Iterator  # noqa: E402
from urllib.parse import quote  # noqa: E402

import pytest  # noqa: E402


@pytest.fixture
def pg_dsn() -> Iterator[str]:
    """A DSN whose ``search_path`` is a fresh schema, dropped after the test."""
    base = os.environ.get("TURNLEDGER_TEST_PG_DSN")
    required = os.environ.get("TURNLEDGER_REQUIRE_PG") == "1"
    if not base:
        if required:
            pytest.fail("TURNLEDGER_REQUIRE_PG=1 but TURNLEDGER_TEST_PG_DSN is not set")
        pytest.skip("set TURNLEDGER_TEST_PG_DSN to run the PostgreSQL tests")
    try:
        import psycopg
        from psycopg.conninfo import conninfo_to_dict, make_conninfo
    except ImportError:
        if required:
            pytest.fail("TURNLEDGER_REQUIRE_PG=1 but psycopg is not installed")
        pytest.skip("psycopg is not installed")
    schema = f"tl_test_{uuid.uuid4().hex[:16]}"
    try:
        admin = psycopg.connect(base, autocommit=True, connect_timeout=5)
    except psycopg.Error as exc:
        if required:
            pytest.fail(f"PostgreSQL at TURNLEDGER_TEST_PG_DSN is unreachable: {exc}")
        pytest.skip(f"PostgreSQL is unreachable: {exc}")
    with admin:
        admin.execute(f'CREATE SCHEMA "{schema}"')
        if base.startswith(("postgresql://", "postgres://")):
            # Keep the URL form: open_store() recognises a store by it.
            sep = "&" if "?" in base else "?"
            dsn = f"{base}{sep}options={quote(f'-c search_path={schema}')}"
        else:
            options = conninfo_to_dict(base).get("options") or ""
            dsn = make_conninfo(base, options=f"{options} -c search_path={schema}".strip())
        try:
            yield dsn
        finally:
            admin.execute(f'DROP SCHEMA "{schema}" CASCADE')


# --- a full disk ----------------------------------------------------------------
# Tests that fill a disk take the `tmpfs` fixture: a small tmpfs of their own
# (mounting needs root; see tests/_tmpfs.py for when they skip or fail).

from _tmpfs import Disk, small_tmpfs  # noqa: E402


@pytest.fixture
def tmpfs(tmp_path: "os.PathLike[str]") -> Iterator[Disk]:
    from pathlib import Path

    with small_tmpfs(Path(tmp_path) / "disk") as disk:
        yield disk
