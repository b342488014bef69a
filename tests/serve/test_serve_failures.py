"""``turnledger serve`` when a store write fails or a session is taken over
under a streaming turn: the client gets the turn's recorded outcome or a
precise error, never ``shutting_down`` while the service runs, and no relay
of a finished turn stays in memory. And the memory kept for reconnects,
bounded in bytes."""

from __future__ import annotations

import sqlite3
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from _tmpfs import Disk
from serve._harness import (
    loopback,
    post_turn,
    running,
    serve_command,
    sse_events,
    two_serving,
)
from turnledger.testing import LoopbackServer

pytestmark = [pytest.mark.loopback]

SQLITE_FULL = "StoreFull: database or disk is full (SQLITE_FULL)"


@pytest.fixture(scope="module")
def provider() -> Iterator[LoopbackServer]:
    with loopback() as server:
        yield server


def _health(c: httpx.Client) -> dict[str, Any]:
    r = c.get("/healthz")
    assert r.status_code == 200
    body: dict[str, Any] = r.json()
    return body


def _events(c: httpx.Client, session: str) -> list[dict[str, Any]]:
    r = c.get(f"/v1/sessions/{session}/events", params={"limit": 1000})
    assert r.status_code == 200
    events: list[dict[str, Any]] = r.json()["events"]
    return events


def _ended(c: httpx.Client, session: str, rid: str) -> dict[str, Any] | None:
    for e in _events(c, session):
        if e["tag"] in ("turn_committed", "turn_discarded") and e["payload"]["request_id"] == rid:
            return e
    return None


def _reattach(c: httpx.Client, session: str, rid: str) -> dict[str, Any]:
    r = c.get(f"/v1/sessions/{session}/turns/{rid}/stream")
    assert r.status_code == 200, r.text
    (outcome,) = [e for e in sse_events(r) if e["event"] in ("outcome", "error")]
    return outcome


def test_a_full_disk_under_a_stream_is_store_error_and_reattach_gets_the_outcome(
    provider: LoopbackServer, tmpfs: Disk
) -> None:
    db = tmpfs.path / "serve.db"
    with running(db, provider.openai_base_url, log_dir=tmpfs.path.parent) as serve:
        with serve.client() as c:
            _, first = post_turn(c, "full", "first", rid="r1")
            assert first[-1]["data"]["kind"] == "committed"
            # r2 streams a 200 KiB answer; the disk fills up after its first
            # delta, so its end cannot be written.
            body = {"question": "big 200 0.3", "request_id": "r2"}
            with c.stream("POST", "/v1/sessions/full/turns", json=body) as r:
                assert r.status_code == 200
                head = sse_events(r, stop_after_deltas=1)
                tmpfs.fill()
                rest = sse_events(r)
            end = rest[-1]
            assert [e["event"] for e in head + rest].count("error") == 0
            assert end["event"] == "outcome", end
            told = end["data"]
            assert (told["kind"], told["reason"], told["detail"]) == (
                "discarded",
                "store_error",
                SQLITE_FULL,
            )
            health = _health(c)
            assert health["relays"] == 0 and health["store_errors"] >= 1
            # Still full: a new question is refused with the cause, nothing written.
            r = c.post("/v1/sessions/full/turns", json={"question": "third", "request_id": "r3"})
            assert r.status_code == 503, r.text
            assert r.json()["error"]["code"] == "store_error"
            assert SQLITE_FULL in r.json()["error"]["message"]
            # Reattach and cancel report the turn's outcome meanwhile.
            assert _reattach(c, "full", "r2")["data"] == told
            tmpfs.free()
            # The service writes the discard by itself once space returns.
            deadline = time.monotonic() + 15
            while (recorded := _ended(c, "full", "r2")) is None:
                assert time.monotonic() < deadline, _events(c, "full")
                time.sleep(0.1)
            payload = recorded["payload"]
            assert (payload["reason"], payload["detail"], payload["preview_chars"]) == (
                told["reason"],
                told["detail"],
                told["preview_chars"],
            )
            _, repeat = post_turn(c, "full", "big 200 0.3", rid="r2")
            for outcome in (
                _reattach(c, "full", "r2")["data"],
                c.post("/v1/sessions/full/turns/r2/cancel", json={}).json(),
                repeat[-1]["data"],
            ):
                assert (outcome["kind"], outcome["reason"], outcome["detail"]) == (
                    "discarded",
                    "store_error",
                    SQLITE_FULL,
                )
            # The session works again; r3's id was never used.
            _, third = post_turn(c, "full", "third", rid="r3")
            assert third[-1]["data"]["kind"] == "committed"
            assert _health(c)["relays"] == 0
            assert [t["request_id"] for t in c.get("/v1/sessions/full").json()["turns"]] == [
                "r1",
                "r3",
            ]
        assert serve.stop() == 0
    with sqlite3.connect(db) as con:
        assert con.execute("PRAGMA integrity_check").fetchall() == [("ok",)]
        tags = [t for (t,) in con.execute("select tag from events order by position")]
    assert tags.count("turn_committed") == 2 and tags.count("turn_discarded") == 1


def test_kept_results_are_bounded_in_bytes_and_a_dropped_one_comes_from_the_store(
    provider: LoopbackServer, tmp_path: Path
) -> None:
    # Each answer echoes its ~1 KB question: three kept results need more
    # than 3,000 bytes, so at most two stay.
    limit = ("--keep-results-bytes", "3000")
    with (
        running(tmp_path / "kept.db", provider.openai_base_url, *limit) as serve,
        serve.client() as c,
    ):
        answers = {}
        for i in range(5):
            _, events = post_turn(c, "kept", f"q{i} " + "w" * 1000, rid=f"k{i}")
            assert events[-1]["data"]["kind"] == "committed"
            answers[f"k{i}"] = events[-1]["data"]["answer"]
        health = _health(c)
        assert health["relays"] == 0
        assert 1 <= health["kept_results"] <= 2
        assert health["kept_results_bytes"] <= 3000
        # The newest is kept (as the stream told it); the oldest went, and
        # its outcome comes from the store (recorded, so "repeated").
        newest = _reattach(c, "kept", "k4")["data"]
        assert (newest["answer"], newest["repeated"]) == (answers["k4"], False)
        oldest = _reattach(c, "kept", "k0")["data"]
        assert (oldest["kind"], oldest["answer"], oldest["repeated"]) == (
            "committed",
            answers["k0"],
            True,
        )
        cancelled = c.post("/v1/sessions/kept/turns/k0/cancel", json={}).json()
        assert (cancelled["kind"], cancelled["answer"]) == ("committed", answers["k0"])


def test_keep_results_bytes_is_an_option_with_help(tmp_path: Path) -> None:
    base = serve_command(str(tmp_path / "x.db"), "http://127.0.0.1:9/v1")
    shown = subprocess.run([*base[:4], "--help"], capture_output=True, timeout=60, text=True)
    text = " ".join(shown.stdout.split())  # as argparse wraps it
    assert "--keep-results-bytes N memory for finished turns' results" in text
    assert "64 MiB" in text
    done = subprocess.run([*base, "--keep-results-bytes", "-1"], capture_output=True, timeout=60)
    assert done.returncode == 2 and b"--keep-results-bytes" in done.stderr
    assert not (tmp_path / "x.db").exists()


def _terminate_lease(dsn: str, session: str) -> None:
    import psycopg

    with psycopg.connect(dsn, autocommit=True, connect_timeout=10) as conn:
        conn.execute(
            "SELECT pg_terminate_backend(backend) FROM turnledger_events_leases"
            " WHERE session_id = %s",
            (session,),
        )


@pytest.mark.postgres
def test_a_session_taken_over_under_a_stream_reports_the_recorded_outcome(
    provider: LoopbackServer, pg_dsn: str, tmp_path: Path
) -> None:
    with two_serving(pg_dsn, provider.openai_base_url, tmp_path) as (_, _, a, b):
        body = {"question": "slow 40 0.1", "request_id": "t1"}
        with a.stream("POST", "/v1/sessions/taken/turns", json=body) as r:
            sse_events(r, stop_after_deltas=1)
            # The first process's lease goes (its connection is cut, as by a
            # partition); the second takes the session over when a client
            # asks it about the turn, and records the turn as interrupted.
            for _ in range(5):
                _terminate_lease(pg_dsn, "taken")
                there = _reattach(b, "taken", "t1")
                if there["event"] == "outcome":
                    break
                time.sleep(0.2)  # the first renewed its lease in between
            assert there["event"] == "outcome", there
            assert (there["data"]["kind"], there["data"]["reason"]) == ("discarded", "interrupted")
            # The first finishes streaming; its write is refused (LeaseLost).
            rest = sse_events(r)
        end = rest[-1]
        assert end["event"] == "outcome", end
        assert (end["data"]["kind"], end["data"]["reason"]) == ("discarded", "interrupted")
        assert _health(a)["relays"] == 0
        # Afterwards the first process reports the same, and refuses to write.
        assert _reattach(a, "taken", "t1")["data"]["reason"] == "interrupted"
        assert (
            a.post("/v1/sessions/taken/turns/t1/cancel", json={}).json()["reason"] == "interrupted"
        )
        r2 = a.post("/v1/sessions/taken/turns", json={"question": "again"})
        assert (r2.status_code, r2.json()["error"]["code"]) == (409, "owned_elsewhere")
        tags = [e["tag"] for e in _events(b, "taken")]
        assert "turn_committed" not in tags and tags.count("turn_discarded") == 1
