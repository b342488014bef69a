"""``turnledger serve`` on an encrypted store with snapshots: real HTTP, a
real child process, restarted; no question or answer in any file beside the
database, and the sessions come back from their sealed snapshots."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest

from turnledger.adapters.encryption import new_key_line
from turnledger.testing import LoopbackServer

from ._harness import loopback, post_turn, running

pytestmark = [pytest.mark.loopback]
CANARY = "okapi-canary-51d2"


@pytest.fixture(scope="module")
def provider() -> Iterator[LoopbackServer]:
    with loopback() as server:
        yield server


def test_serve_with_a_key_file_and_snapshots(provider: LoopbackServer, tmp_path: Path) -> None:
    keys = tmp_path / "keys.txt"
    keys.write_text(new_key_line("k1") + "\n")
    db = tmp_path / "store" / "s.db"
    db.parent.mkdir()
    opts = ("--key-file", str(keys), "--snapshot-every", "4")
    with running(db, provider.openai_base_url, *opts, log_dir=tmp_path / "logs") as serve:
        with serve.client() as c:
            for i in range(5):
                status, _ = post_turn(c, "s1", f"{CANARY} {i}")
                assert status == 200
            state = c.get("/v1/sessions/s1").json()
        assert serve.stop() == 0
    assert len(state["turns"]) == 5
    files = sorted(p.name for p in db.parent.iterdir())
    assert "s.db.keys" in files and "s.db.snapshots" in files
    for p in db.parent.iterdir():
        assert CANARY.encode() not in p.read_bytes(), p.name

    # Restarted: the session reopens from its sealed snapshot.
    with running(db, provider.openai_base_url, *opts, log_dir=tmp_path / "logs2") as serve:
        with serve.client() as c:
            again = c.get("/v1/sessions/s1").json()
            status, _ = post_turn(c, "s1", "one more")
            assert status == 200
        assert serve.stop() == 0
        lines = [json.loads(x) for x in serve.log.read_text().splitlines() if x]
    assert again["turns"] == state["turns"]
    assert not [x for x in lines if x.get("event") == "snapshot_ignored"]

    # Without the key, serve's reads say the content is encrypted (no crash).
    with running(db, provider.openai_base_url, log_dir=tmp_path / "logs3") as serve:
        with serve.client() as c:
            r = c.get("/v1/sessions/s1")
            assert r.status_code == 503 and CANARY not in r.text
            assert r.json()["error"]["code"] == "content_encrypted"
            assert c.get("/healthz").status_code == 200
        serve.stop()
