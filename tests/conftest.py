import os

import pytest
from hypothesis import HealthCheck, settings

# --- Hypothesis profiles ---------------------------------------------------------
# HYPOTHESIS_PROFILE (or --hypothesis-profile=NAME) picks one:
#
# - ``dev`` (the default): random examples, as many as each test asks for.
# - ``ci`` (.ci/run): Hypothesis's own ``ci`` profile (derandomized: the same
#   examples on every run, no example database, the failing blob printed),
#   with twice the examples. A red CI run is red again when rerun.
# - ``deep`` (nightly, by hand): random, twenty times the examples.
#
# Many tests ask for a number of examples of their own (``@settings(max_examples=N)``);
# the profile's EXAMPLES_FACTOR scales that number too, so ``deep`` is deeper
# everywhere, not only where a test left the count to the profile.

EXAMPLES_FACTOR = {"dev": 1, "ci": 2, "deep": 20}

settings.register_profile(
    "ci",
    settings.get_profile("ci"),
    max_examples=2 * settings.get_profile("ci").max_examples,
)
settings.register_profile("dev", deadline=None, suppress_health_check=[HealthCheck.too_slow])
# From Hypothesis's own defaults, not from the profile loaded now (with
# CI=true in the environment Hypothesis loads its "ci" profile by itself).
settings.register_profile(
    "deep",
    settings.get_profile("default"),
    derandomize=False,
    deadline=None,
    max_examples=20 * settings.get_profile("default").max_examples,
    suppress_health_check=[HealthCheck.too_slow],
    print_blob=True,
)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "dev"))

# A skipped trio test names its reason (see tests/_pytest_guards.py).
from _pytest_guards import pytest_runtest_makereport  # noqa: E402, F401


def _explicit_examples(test: object) -> int | None:
    """The ``max_examples`` a test's own ``@settings`` asked for, if any."""
    own = getattr(test, "_hypothesis_internal_use_settings", None)
    if own is None or own is settings.default:
        return None
    # Unset values are inherited from the profile; compare with it.
    return int(own.max_examples) if own.max_examples != settings.default.max_examples else None


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    # The profile is final here (the Hypothesis plugin loads --hypothesis-profile
    # at configure time).
    factor = EXAMPLES_FACTOR.get(settings._current_profile or "dev", 1)
    if factor == 1:
        return
    # A test with more examples may take longer: its timeout grows with them.
    per_test = float(config.getini("timeout") or 0)
    seen: set[int] = set()
    for item in items:
        test = getattr(item, "obj", None)
        hypothesis_test = getattr(test, "is_hypothesis_test", False)
        if hypothesis_test and per_test and item.get_closest_marker("timeout") is None:
            item.add_marker(pytest.mark.timeout(per_test * factor))
        if id(test) in seen:  # one function, several parameters: scale it once
            continue
        seen.add(id(test))
        asked = _explicit_examples(test)
        if asked is not None:
            test._hypothesis_internal_use_settings = settings(  # type: ignore[union-attr]
                test._hypothesis_internal_use_settings,  # type: ignore[union-attr]
                max_examples=asked * factor,
            )


# --- PostgreSQL ---------------------------------------------------------------
# Tests that need PostgreSQL take the `pg_dsn` fixture. The server comes from
# TURNLEDGER_TEST_PG_DSN; without it those tests skip. With TURNLEDGER_REQUIRE_PG=1
# (as in .ci/run) an unreachable server fails them instead of skipping.

import uuid  # noqa: E402
from collections.abc import Iterator  # noqa: E402
from urllib.parse import quote  # noqa: E402


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
