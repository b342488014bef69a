"""What DB names: PostgreSQL in either DSN form, never a file named after a
password, and a clear refusal for a directory or a device."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from ._run import tl

pytestmark = pytest.mark.slow


def _keyword_dsn(url: str, **fields: str) -> str:
    from psycopg.conninfo import conninfo_to_dict, make_conninfo

    return make_conninfo(**{**conninfo_to_dict(url), **fields})  # type: ignore[arg-type]


def test_a_libpq_keyword_dsn_goes_to_postgresql_and_no_password_is_shown(
    tmp_path: Path, pg_dsn: str
) -> None:
    # The server trusts the connection, so the password is never needed: it
    # only has to stay out of every file name and message.
    secret = "kwSECRET'pw"
    dsn = _keyword_dsn(pg_dsn, password=secret)
    assert dsn.startswith(("host=", "user=", "dbname=", "port=", "options=")), dsn
    r = tl("chat", "--db", dsn, "--session", "kw", cwd=tmp_path, stdin="q1\n")
    assert r.returncode == 0, r.stderr
    replay = tl("replay", dsn, "--json", cwd=tmp_path)
    assert replay.returncode == 0, replay.stderr
    assert [t["question"] for t in json.loads(replay.stdout)["turns"]] == ["q1"]
    assert list(tmp_path.iterdir()) == []  # no SQLite file named after the DSN
    for output in (r, replay):
        assert "kwSECRET" not in output.stdout + output.stderr


@pytest.mark.parametrize(
    "db",
    [
        "host=127.0.0.1 port=1 dbname=test user=postgres password=kwSECRET",
        "host=127.0.0.1 port=1 password='kwSECRET with blanks' dbname=test",
        "postgresql://postgres:kwSECRET@127.0.0.1:1/test",
        "postgresql://127.0.0.1:1/test?user=postgres&password=kwSECRET",
        "host=127.0.0.1 port=1 dbname=test",  # with PGPASSWORD=kwSECRET
    ],
)
def test_no_password_reaches_a_message_whatever_the_dsn_form(tmp_path: Path, db: str) -> None:
    env = {**os.environ, "PGPASSWORD": "kwSECRET", "PGCONNECT_TIMEOUT": "5"}
    for args in (["replay", db], ["log", db], ["sessions", db], ["chat", "--db", db]):
        r = subprocess.run(
            [sys.executable, "-m", "turnledger", *args],
            cwd=tmp_path, input="q\n", capture_output=True, text=True, timeout=60, env=env,
        )  # fmt: skip
        assert r.returncode == 3, (args, r.stderr)  # nothing listens on port 1
        assert "kwSECRET" not in r.stdout + r.stderr, (args, r.stderr)
        assert "cannot open" in r.stderr and "Traceback" not in r.stderr
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("special", ["directory", "/dev/null"])
def test_a_directory_or_a_device_as_db_is_named_as_such(tmp_path: Path, special: str) -> None:
    if special == "directory":
        db, what = str(tmp_path / "folder.db"), "is a directory"
        os.mkdir(db)
    else:
        db, what = special, "is a device"
    for args in (["chat", "--db", db], ["demo", "--db", db], ["replay", db], ["sessions", db]):
        r = tl(*args, cwd=tmp_path, stdin="q\n")
        assert r.returncode == 2, (args, r.stderr)
        assert what in r.stderr and "disk I/O" not in r.stderr, (args, r.stderr)
    assert [p.name for p in tmp_path.iterdir()] == (["folder.db"] if special == "directory" else [])
