"""``DELETE /v1/sessions/{id}`` and the scheduled retention of ``turnledger
serve``: a child process on SQLite, the loopback provider server behind it."""

from __future__ import annotations

import json
import signal
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from serve._harness import loopback, post_turn, running, sse_events
from turnledger.testing import LoopbackServer

pytestmark = [pytest.mark.loopback]

CANARY = "CANARY-5e0c-SERVE-ERASE"


@pytest.fixture(scope="module")
def provider() -> Iterator[LoopbackServer]:
    with loopback() as server:
        yield server


def _canaries(folder: Path) -> int:
    return sum(p.read_bytes().count(CANARY.encode()) for p in folder.iterdir() if p.is_file())


def test_delete_erases_a_session_and_404s_an_unknown_one(
    provider: LoopbackServer, tmp_path: Path
) -> None:
    folder = tmp_path / "store"
    folder.mkdir()
    db = folder / "serve.db"
    with running(db, provider.openai_base_url, log_dir=tmp_path / "logs") as serve:
        with serve.client() as c:
            for sid in ("keep", "secret"):
                status, events = post_turn(c, sid, f"{CANARY} please" if sid == "secret" else "hi")
                assert status == 200 and events[-1]["data"]["kind"] == "committed"
            kept = c.get("/v1/sessions/keep/events").json()
            unknown = c.delete("/v1/sessions/nobody")
            assert unknown.status_code == 404
            assert unknown.json()["error"]["code"] == "unknown_session"
            assert [s["session_id"] for s in c.get("/v1/sessions").json()["sessions"]] == [
                "keep",
                "secret",
            ]
            assert _canaries(folder) > 0
            r = c.delete("/v1/sessions/secret")
            assert r.status_code == 200, r.text
            assert r.json()["erased"] is True and r.json()["events"] == 4
            for path in ("", "/events", "/timeline", "/state"):
                assert c.get(f"/v1/sessions/secret{path}").status_code == 404, path
            assert c.delete("/v1/sessions/secret").status_code == 404
            assert [s["session_id"] for s in c.get("/v1/sessions").json()["sessions"]] == ["keep"]
            assert c.get("/v1/sessions/keep/events").json() == kept
            assert _canaries(folder) == 0  # while the server still runs
        assert serve.stop(signal.SIGTERM) == 0
    assert _canaries(folder) == 0


def test_delete_during_a_turn_ends_it_as_erased(provider: LoopbackServer, tmp_path: Path) -> None:
    folder = tmp_path / "store"
    folder.mkdir()
    with running(folder / "serve.db", provider.openai_base_url, log_dir=tmp_path / "logs") as serve:
        with (
            serve.client() as c,
            c.stream(
                "POST",
                "/v1/sessions/busy/turns",
                json={"question": f"slow 400 0.05 {CANARY}", "request_id": "r1"},
            ) as r,
        ):
            head = sse_events(r, stop_after_deltas=2)
            assert head[0]["event"] == "turn"
            with serve.client() as other:
                gone = other.delete("/v1/sessions/busy")
            rest = sse_events(r)
        assert gone.status_code == 200, gone.text
        outcome = rest[-1]
        assert outcome["event"] == "outcome"
        assert outcome["data"]["kind"] == "discarded" and outcome["data"]["reason"] == "erased"
        with serve.client() as c:
            assert c.get("/v1/sessions/busy").status_code == 404
        assert serve.stop(signal.SIGTERM) == 0
    assert _canaries(folder) == 0


def test_serve_prunes_on_a_schedule(provider: LoopbackServer, tmp_path: Path) -> None:
    with running(
        tmp_path / "serve.db",
        provider.openai_base_url,
        "--prune-older-than",
        "1s",
        "--prune-every",
        "0.2",
    ) as serve:
        with serve.client() as c:
            status, _ = post_turn(c, "short-lived", "hi")
            assert status == 200
            deadline = time.monotonic() + 20
            while c.get("/v1/sessions").json()["sessions"]:
                assert time.monotonic() < deadline, "the session was never pruned"
                time.sleep(0.1)
        assert serve.stop(signal.SIGTERM) == 0
    lines = [json.loads(line) for line in serve.log.read_text().splitlines() if line.strip()]
    erased = [line for line in lines if line.get("event") == "session_erased"]
    assert [line["session_id"] for line in erased] == ["short-lived"]
