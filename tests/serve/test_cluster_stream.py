"""Any node streams any turn: two ``turnledger serve --node-id`` processes on
one PostgreSQL schema; a turn runs on one, its stream is followed on the
other through the database (previews table + LISTEN/NOTIFY)."""

from __future__ import annotations

import signal
import subprocess
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx
import psycopg
import pytest

from serve._harness import (
    Serve,
    answer_for,
    loopback,
    post_turn,
    running,
    serve_command,
    sse_events,
)
from turnledger.testing import LoopbackServer

pytestmark = [pytest.mark.loopback, pytest.mark.postgres]


@pytest.fixture(scope="module")
def provider() -> Iterator[LoopbackServer]:
    with loopback() as server:
        yield server


@contextmanager
def _nodes(
    dsn: str, base_url: str, log_dir: Path, *extra: str
) -> Iterator[tuple[Serve, Serve, httpx.Client, httpx.Client]]:
    with (
        running(dsn, base_url, "--node-id", "n1", *extra, log_dir=log_dir / "n1") as one,
        running(dsn, base_url, "--node-id", "n2", *extra, log_dir=log_dir / "n2") as two,
        one.client() as a,
        two.client() as b,
    ):
        yield one, two, a, b


def _reattach(client: httpx.Client, session: str, rid: str, after: int) -> list[dict[str, Any]]:
    with client.stream(
        "GET",
        f"/v1/sessions/{session}/turns/{rid}/stream",
        headers={"Last-Event-ID": str(after)},
    ) as r:
        assert r.status_code == 200, r.read()
        return sse_events(r)


def _tags(client: httpx.Client, session: str) -> list[str]:
    r = client.get(f"/v1/sessions/{session}/events", params={"limit": 1000})
    assert r.status_code == 200
    return [e["tag"] for e in r.json()["events"]]


def _preview_rows(dsn: str, session: str) -> int:
    with psycopg.connect(dsn) as conn:
        row = conn.execute(
            "SELECT count(*) FROM turnledger_events_previews WHERE session_id = %s", (session,)
        ).fetchone()
    assert row is not None
    return int(row[0])


def test_a_client_reattaches_to_another_node_and_gets_the_rest_once(
    provider: LoopbackServer, pg_dsn: str, tmp_path: Path
) -> None:
    with _nodes(pg_dsn, provider.openai_base_url, tmp_path) as (_, _, a, b):
        k = 5
        status, first = post_turn(a, "x-1", "slow 30 0.1", rid="r1", stop_after_deltas=k)
        assert status == 200
        seen = [e for e in first if e["event"] == "delta"]
        assert [d["id"] for d in seen] == ["1", "2", "3", "4", "5"]
        # The first connection is closed (never a cancel); the client comes
        # back on the other node, which does not run the turn.
        assert b.get("/healthz").json()["relays"] == 0
        rest = _reattach(b, "x-1", "r1", k)
        deltas = [e for e in rest if e["event"] == "delta"]
        assert [int(d["id"]) for d in deltas] == list(range(k + 1, 31))
        outcome = rest[-1]
        assert outcome["event"] == "outcome", rest[-3:]
        assert outcome["data"]["kind"] == "committed"
        text = "".join(d["data"]["text"] for d in seen + deltas)
        assert text == outcome["data"]["answer"] == answer_for("slow 30")
        # The outcome is readable on both nodes, the same.
        for c in (a, b):
            assert [e["event"] for e in _reattach(c, "x-1", "r1", 2)] == ["outcome"]
            turns = c.get("/v1/sessions/x-1").json()["turns"]
            assert turns == [{"request_id": "r1", "question": "slow 30 0.1", "answer": text}]
        assert _tags(b, "x-1").count("turn_submitted") == 1
        # What names no turn is refused on the other node too, and writes nothing.
        for path, code in (
            ("/v1/sessions/x-1/turns/nope/stream", "unknown_request"),
            ("/v1/sessions/nobody/turns/r1/stream", "unknown_session"),
        ):
            r = b.get(path)
            assert (r.status_code, r.json()["error"]["code"]) == (404, code)
        r = b.get("/v1/sessions/x-1/turns/r1/stream", headers={"Last-Event-ID": "-1"})
        assert (r.status_code, r.json()["error"]["code"]) == (400, "bad_last_event_id")
        assert len(_tags(a, "x-1")) == len(_tags(b, "x-1"))
        assert b.get("/v1/sessions/nobody").status_code == 404
        # The owner published in batches; the other node followed, and
        # has no follower left.
        deadline = time.monotonic() + 10
        while (published := a.get("/healthz").json()["previews"])["rows"] < 31:
            assert time.monotonic() < deadline, published  # 30 deltas and the end row
            time.sleep(0.05)
        assert published["rows"] == 31 and 1 <= published["batches"] <= 31
        assert published["publish_errors"] == 0
        followed = b.get("/healthz").json()["previews"]
        assert followed["notifications"] >= 1 and followed["following"] == 0


def test_a_retry_on_another_node_joins_the_turn_and_never_asks_twice(
    provider: LoopbackServer, pg_dsn: str, tmp_path: Path
) -> None:
    with _nodes(pg_dsn, provider.openai_base_url, tmp_path) as (_, _, a, b):
        asked = len(provider.exchanges)
        post_turn(a, "x-2", "slow 20 0.1", rid="j1", stop_after_deltas=2)
        # The same request on the other node: it joins the turn from its
        # first delta, through PostgreSQL.
        status, joined = post_turn(b, "x-2", "slow 20 0.1", rid="j1")
        assert status == 200
        assert joined[0] == {"event": "turn", "data": {"session_id": "x-2", "request_id": "j1"}}
        deltas = [e for e in joined if e["event"] == "delta"]
        assert [int(d["id"]) for d in deltas] == list(range(1, 21))
        assert joined[-1]["event"] == "outcome"
        assert joined[-1]["data"]["answer"] == "".join(d["data"]["text"] for d in deltas)
        assert len(provider.exchanges) == asked + 1  # the model was asked once
        assert _tags(a, "x-2").count("turn_submitted") == 1


def test_rows_stay_while_the_turn_runs_and_go_after_the_window(
    provider: LoopbackServer, pg_dsn: str, tmp_path: Path
) -> None:
    with _nodes(pg_dsn, provider.openai_base_url, tmp_path, "--preview-retention", "3") as (
        _,
        _,
        a,
        b,
    ):
        with a.stream(
            "POST", "/v1/sessions/x-3/turns", json={"question": "slow 20 0.1", "request_id": "w1"}
        ) as r:
            sse_events(r, stop_after_deltas=3)
            # Running: its rows are there (a sweep runs every 5 s meanwhile).
            time.sleep(0.5)
            assert _preview_rows(pg_dsn, "x-3") >= 3
            rest = sse_events(r)
        assert rest[-1]["event"] == "outcome"
        ended = time.monotonic()
        # Just after the end the rows are still there for reattaching
        # clients (21: 20 deltas and the end row, written just after the
        # outcome)...
        while (n := _preview_rows(pg_dsn, "x-3")) < 21 and time.monotonic() < ended + 2.5:
            time.sleep(0.05)
        assert n == 21
        # ...and a sweep (every 5 s, by either node) drops them after the 3 s window.
        deadline = ended + 25
        while _preview_rows(pg_dsn, "x-3") and time.monotonic() < deadline:
            time.sleep(0.2)
        assert _preview_rows(pg_dsn, "x-3") == 0
        assert time.monotonic() - ended >= 3.0
        # A reattach after that gets the outcome from the log.
        assert _reattach(b, "x-3", "w1", 0)[-1]["data"]["kind"] == "committed"


def test_a_follower_of_a_killed_owner_ends_with_interrupted(
    provider: LoopbackServer, pg_dsn: str, tmp_path: Path
) -> None:
    with _nodes(pg_dsn, provider.openai_base_url, tmp_path) as (one, _, a, b):
        post_turn(a, "x-4", "slow 200 0.1", rid="k1", stop_after_deltas=3)
        with b.stream(
            "GET", "/v1/sessions/x-4/turns/k1/stream", headers={"Last-Event-ID": "3"}
        ) as r:
            head = sse_events(r, stop_after_deltas=2)
            assert [int(e["id"]) for e in head] == [4, 5]
            killed = time.monotonic()
            one.proc.send_signal(signal.SIGKILL)
            one.proc.wait(10)
            rest = sse_events(r)
        took = time.monotonic() - killed
        end = rest[-1]
        assert end["event"] == "outcome", rest[-3:]
        assert (end["data"]["kind"], end["data"]["reason"]) == ("discarded", "interrupted")
        # The deltas it got were the owner's, in order, once.
        ids = [int(e["id"]) for e in head + rest if e["event"] == "delta"]
        assert ids == list(range(4, 4 + len(ids)))
        # Bounded: the owner's connection closed with it, so its lease is
        # dead at once; the follower notices within its poll (1 s).
        assert took < 10, took
        tags = _tags(b, "x-4")
        assert tags.count("turn_discarded") == 1 and "turn_committed" not in tags


def test_node_id_needs_a_postgresql_store(provider: LoopbackServer, tmp_path: Path) -> None:
    cmd = serve_command(str(tmp_path / "s.db"), provider.openai_base_url, "--node-id", "n1")
    done = subprocess.run(cmd, capture_output=True, timeout=60)
    assert done.returncode == 2
    assert b"clustering needs a PostgreSQL store" in done.stderr
    assert not (tmp_path / "s.db").exists()
    for bad, says in (
        (("--node-id", " "), b"--node-id: "),
        (("--node-id", "n1", "--preview-retention", "0"), b"--preview-retention must be"),
    ):
        cmd = serve_command("postgresql://nobody@127.0.0.1:1/none", provider.openai_base_url)
        done = subprocess.run([*cmd, *bad], capture_output=True, timeout=60)
        assert done.returncode == 2 and says in done.stderr, done.stderr


def test_a_following_node_that_stops_never_cancels_the_turn(
    provider: LoopbackServer, pg_dsn: str, tmp_path: Path
) -> None:
    with _nodes(pg_dsn, provider.openai_base_url, tmp_path) as (_, two, a, b):
        post_turn(a, "x-5", "slow 60 0.1", rid="s1", stop_after_deltas=2)
        with b.stream(
            "GET", "/v1/sessions/x-5/turns/s1/stream", headers={"Last-Event-ID": "2"}
        ) as r:
            assert [int(e["id"]) for e in sse_events(r, stop_after_deltas=1)] == [3]
            stopped = time.monotonic()
            two.proc.send_signal(signal.SIGTERM)
            rest = sse_events(r)
        # The following node stops: its stream says so, within its grace...
        assert rest[-1] == {
            "event": "error",
            "data": {
                "code": "shutting_down",
                "message": "the service stopped before the turn ended",
            },
        }
        assert two.proc.wait(30) == 0
        assert time.monotonic() - stopped < 15
        # ...and the turn goes on on its owner, to its committed answer.
        end = _reattach(a, "x-5", "s1", 60)[-1]
        assert (end["event"], end["data"]["kind"]) == ("outcome", "committed")
        assert end["data"]["answer"] == answer_for("slow 60")


@pytest.mark.timeout(180)
def test_a_follower_of_a_paused_owner_ends_with_interrupted_after_its_lease(
    provider: LoopbackServer, pg_dsn: str, tmp_path: Path
) -> None:
    with _nodes(pg_dsn, provider.openai_base_url, tmp_path) as (one, _, a, b):
        post_turn(a, "x-6", "slow 600 0.1", rid="p1", stop_after_deltas=2)
        try:
            with b.stream(
                "GET", "/v1/sessions/x-6/turns/p1/stream", headers={"Last-Event-ID": "2"}
            ) as r:
                sse_events(r, stop_after_deltas=1)
                paused = time.monotonic()
                one.proc.send_signal(signal.SIGSTOP)
                # Its connection stays open: its lease is live until it runs
                # out (10 s), then the following node takes the session over.
                rest = sse_events(r)
            took = time.monotonic() - paused
        finally:
            one.proc.send_signal(signal.SIGCONT)
        end = rest[-1]
        assert end["event"] == "outcome", rest[-3:]
        assert (end["data"]["kind"], end["data"]["reason"]) == ("discarded", "interrupted")
        assert 8 < took < 60, took
        # The owner wakes up and streams on; nothing it writes lands.
        time.sleep(2)
        tags = _tags(b, "x-6")
        assert tags.count("turn_discarded") == 1 and "turn_committed" not in tags
