"""The command line on an encrypted store: with the key everything reads;
without it every command says the content is encrypted, never shows
ciphertext and never crashes; rekey rotates without rewriting events."""

from __future__ import annotations

import sqlite3
from pathlib import Path

from turnledger.cli import EXIT_OK, EXIT_STORE

from ._run import tl


def rows(db: Path) -> list[str | bytes]:
    conn = sqlite3.connect(db)
    try:
        return [r[0] for r in conn.execute("SELECT payload FROM events ORDER BY rowid")]
    finally:
        conn.close()


def test_an_encrypted_store_on_the_command_line(tmp_path: Path) -> None:
    k1 = tl("keygen", "k1", cwd=tmp_path)
    assert k1.returncode == EXIT_OK and k1.stdout.startswith("k1:")
    keys = tmp_path / "keys.txt"
    keys.write_text(k1.stdout)
    demo = tl("demo", "--db", "d.db", "--key-file", str(keys), cwd=tmp_path, timeout=120)
    assert demo.returncode == EXIT_OK, demo.stderr
    db = (tmp_path / "d.db").read_bytes()
    sealed = rows(tmp_path / "d.db")
    # Every row sealed, as bytes (format 2): a format byte, nonce, ciphertext.
    assert len(sealed) > 20 and all(type(p) is bytes and p.startswith(b"\x01") for p in sealed)
    assert b"What does turnledger keep?" not in db
    assert (tmp_path / "d.db.keys").exists()

    first = (
        sqlite3.connect(tmp_path / "d.db").execute("SELECT session_id FROM events").fetchone()[0]
    )
    for cmd in (["log"], ["log", "--text"], ["replay"], ["sessions"], ["export", "-s", first]):
        out = tl(*cmd, "d.db", cwd=tmp_path)
        assert out.returncode == EXIT_STORE, (cmd, out.stderr)
        assert "content is encrypted" in out.stderr and "--key-file" in out.stderr
        assert "Traceback" not in out.stderr and "$enc" not in out.stdout + out.stderr
    for cmd in (["search", "d.db", "turnledger"],):
        out = tl(*cmd, cwd=tmp_path)
        assert out.returncode == EXIT_STORE, (cmd, out.stderr)
        assert "content is encrypted" in out.stderr and "--key-file" in out.stderr
        assert "Traceback" not in out.stderr and "$enc" not in out.stdout + out.stderr

    shown = tl("log", "d.db", "--text", "--key-file", str(keys), cwd=tmp_path)
    assert shown.returncode == EXIT_OK and "What does turnledger keep?" in shown.stdout
    found = tl("search", "d.db", "turnledger", cwd=tmp_path,
               env={"TURNLEDGER_KEY_FILE": str(keys)})  # fmt: skip
    assert found.returncode == EXIT_OK and found.stdout.strip()

    # Rotation: the new key first, the old one kept until rekey ends.
    k2 = tl("keygen", "k2", cwd=tmp_path).stdout
    both = tmp_path / "both.txt"
    both.write_text(k2 + k1.stdout)
    rekey = tl("rekey", "d.db", "--key-file", str(both), cwd=tmp_path)
    assert rekey.returncode == EXIT_OK and "under key 'k2'" in rekey.stdout
    assert rows(tmp_path / "d.db") == sealed
    new = tmp_path / "new.txt"
    new.write_text(k2)
    after = tl("log", "d.db", "--text", "--key-file", str(new), cwd=tmp_path)
    assert after.returncode == EXIT_OK and after.stdout == shown.stdout
    old = tl("log", "d.db", "--key-file", str(keys), cwd=tmp_path)
    assert old.returncode == EXIT_STORE and "not provided" in old.stderr

    bad = tl("log", "d.db", "--key-file", str(tmp_path / "missing"), cwd=tmp_path)
    assert bad.returncode != EXIT_OK and "cannot read the key file" in bad.stderr
