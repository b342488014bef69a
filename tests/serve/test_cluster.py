"""``turnledger serve --node-id``: several real serve processes on one
PostgreSQL schema, each a node. A question, cancel or switch for a session
another live node owns is handed to that node; a session with no live owner
is taken by the node asked; a node killed, paused or stopped gives its
sessions up (see docs/cluster.md)."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path
from typing import Any

import httpx
import pytest

from turnledger.testing import LoopbackServer

from ._harness import Serve, answer_for, loopback, post_turn, running, serve_command, sse_events

pytestmark = [pytest.mark.postgres, pytest.mark.loopback]


@pytest.fixture(scope="module")
def provider() -> Iterator[LoopbackServer]:
    with loopback() as server:
        yield server


@contextmanager
def nodes(
    dsn: str, base_url: str, log_dir: Path, names: list[str], *extra: str
) -> Iterator[list[Serve]]:
    with ExitStack() as stack:
        yield [
            stack.enter_context(
                running(dsn, base_url, "--node-id", name, *extra, log_dir=log_dir / name)
            )
            for name in names
        ]


def _until(check: Callable[[], Any], timeout: float, what: str) -> Any:
    deadline = time.monotonic() + timeout
    while True:
        got = check()
        if got:
            return got
        assert time.monotonic() < deadline, f"not within {timeout}s: {what}"
        time.sleep(0.05)


def _events(c: httpx.Client, session: str) -> list[dict[str, Any]]:
    r = c.get(f"/v1/sessions/{session}/events", params={"limit": 1000})
    assert r.status_code == 200, r.text
    events: list[dict[str, Any]] = r.json()["events"]
    return events


def _asked(provider: LoopbackServer, question: str) -> int:
    return sum(1 for x in provider.exchanges if x.json()["messages"][-1]["content"] == question)


def _lease_node(c: httpx.Client, session: str) -> str | None:
    for node in c.get("/v1/nodes").json()["nodes"]:
        if session in node["sessions"]:
            return str(node["node_id"])
    return None


def _outcome(events: list[dict[str, Any]]) -> dict[str, Any]:
    assert events and events[-1]["event"] == "outcome", events
    data: dict[str, Any] = events[-1]["data"]
    return data


def test_a_question_for_another_nodes_session_runs_once_on_the_owner(
    provider: LoopbackServer, pg_dsn: str, tmp_path: Path
) -> None:
    with nodes(pg_dsn, provider.openai_base_url, tmp_path, ["n1", "n2", "n3"]) as (s1, s2, s3):
        with s1.client() as a, s2.client() as b, s3.client() as c:
            # n2 takes the session (the first question lands there).
            assert _outcome(post_turn(b, "own-1", "hello", rid="h1")[1])["kind"] == "committed"
            assert _lease_node(a, "own-1") == "n2"
            question = "slow 20 0.1"
            results: dict[str, Any] = {}

            def ask(name: str, client: httpx.Client) -> None:
                results[name] = post_turn(client, "own-1", question, rid="x1")

            # Asked on n1, and the same request id again on n3 while it runs.
            first = threading.Thread(target=ask, args=("n1", a))
            first.start()
            _until(
                lambda: any(e["tag"] == "turn_submitted" for e in _events(c, "own-1")[2:]),
                15,
                "the question reached the owner",
            )
            ask("n3", c)
            first.join(30)
            assert not first.is_alive()
        for name in ("n1", "n3"):
            status, events = results[name]
            assert status == 200
            assert events[0]["event"] == "turn"
            assert events[0]["data"] == {"session_id": "own-1", "request_id": "x1"}
            end = _outcome(events)
            assert (end["kind"], end["answer"]) == ("committed", answer_for(question)), name
        assert _outcome(results["n1"][1])["repeated"] is False  # the first ask
        # The model was asked once; the log holds the question once, run by n2.
        assert _asked(provider, question) == 1
        with s2.client() as b:
            tags = [(e["tag"], e["payload"].get("request_id")) for e in _events(b, "own-1")]
            assert tags.count(("turn_submitted", "x1")) == 1
            assert tags.count(("turn_committed", "x1")) == 1
            assert _lease_node(b, "own-1") == "n2"
            # A retry after the end returns the recorded outcome, from any node.
        with s1.client() as a:
            again = _outcome(post_turn(a, "own-1", question, rid="x1")[1])
            assert (again["kind"], again["answer"], again["repeated"]) == (
                "committed",
                answer_for(question),
                True,
            )
        assert _asked(provider, question) == 1
        # The owner's log lines name the node, and the hand-over.
        lines = [json.loads(x) for x in s2.log.read_text().splitlines() if x.startswith("{")]
        received = [x for x in lines if x.get("event") == "call_received"]
        assert received and all(x["node_id"] == "n2" for x in received)
        moves = [x for x in lines if x.get("event") == "transition"]
        assert any(x["to"] == "Committed" and x["session_id"] == "own-1" for x in moves)
        assert moves and all(x["node_id"] == "n2" for x in moves)


def test_a_cancel_sent_to_another_node_reaches_the_turn(
    provider: LoopbackServer, pg_dsn: str, tmp_path: Path
) -> None:
    with (
        nodes(pg_dsn, provider.openai_base_url, tmp_path, ["n1", "n2"]) as (s1, s2),
        s1.client() as a,
        s2.client() as b,
    ):
        body = {"question": "slow 60 0.1", "request_id": "c1"}
        with b.stream("POST", "/v1/sessions/cancel-1/turns", json=body) as r:
            assert sse_events(r, stop_after_deltas=1)[-1]["event"] == "delta"
            cancelled = a.post("/v1/sessions/cancel-1/turns/c1/cancel", json={})
            assert cancelled.status_code == 200, cancelled.text
            assert (cancelled.json()["kind"], cancelled.json()["reason"]) == (
                "discarded",
                "cancelled",
            )
            end = _outcome(sse_events(r))
        assert (end["kind"], end["reason"]) == ("discarded", "cancelled")
        tags = [e["tag"] for e in _events(a, "cancel-1")]
        assert tags.count("turn_discarded") == 1 and "turn_committed" not in tags


def test_edit_regenerate_switch_and_erase_through_another_node(
    provider: LoopbackServer, pg_dsn: str, tmp_path: Path
) -> None:
    with (
        nodes(pg_dsn, provider.openai_base_url, tmp_path, ["n1", "n2"]) as (s1, s2),
        s1.client() as a,
        s2.client() as b,
    ):
        assert _outcome(post_turn(b, "br-1", "first", rid="f1")[1])["kind"] == "committed"
        with a.stream(
            "POST",
            "/v1/sessions/br-1/edit",
            json={"turn_index": 0, "question": "first, again", "request_id": "e1"},
        ) as r:
            edited = _outcome(sse_events(r))
        assert (edited["kind"], edited["answer"]) == ("committed", "echo: first, again")
        with a.stream("POST", "/v1/sessions/br-1/regenerate", json={"request_id": "g1"}) as r:
            assert _outcome(sse_events(r))["kind"] == "committed"
        switched = a.post("/v1/sessions/br-1/switch", json={"branch": "main"})
        assert switched.status_code == 200, switched.text
        assert switched.json()["active_branch"] == "main"
        bad = a.post("/v1/sessions/br-1/switch", json={"branch": "nope"})
        assert (bad.status_code, bad.json()["error"]["code"]) == (404, "unknown_branch")
        assert _lease_node(a, "br-1") == "n2"
        assert b.get("/v1/sessions/br-1/branches").json()["active_branch"] == "main"
        # An erasure asked on n1 runs on the owner too.
        erased = a.delete("/v1/sessions/br-1")
        assert (erased.status_code, erased.json()["erased"]) == (200, True), erased.text
        assert b.get("/v1/sessions/br-1").status_code == 404


def test_a_node_killed_mid_turn_is_taken_over_and_the_turn_ends_interrupted(
    provider: LoopbackServer, pg_dsn: str, tmp_path: Path
) -> None:
    with nodes(pg_dsn, provider.openai_base_url, tmp_path, ["n1", "n2"], "--lease", "2") as (
        s1,
        s2,
    ):
        with s1.client() as a:
            assert _outcome(post_turn(a, "kill-1", "hello", rid="k0")[1])["kind"] == "committed"
        follower: list[dict[str, Any]] = []
        started = threading.Event()

        def follow() -> None:
            # Asked on n2, run by n1 (the owner): n2 follows the turn.
            with (
                s2.client() as b,
                b.stream(
                    "POST",
                    "/v1/sessions/kill-1/turns",
                    json={"question": "slow 200 0.1", "request_id": "k1"},
                ) as r,
            ):
                for event in sse_events(r, stop_after_deltas=None):
                    follower.append(event)
                    if event["event"] == "turn":
                        started.set()

        thread = threading.Thread(target=follow)
        thread.start()
        with s2.client() as b:
            _until(
                lambda: any(e["tag"] == "stream_started" for e in _events(b, "kill-1")[4:]),
                15,
                "the turn streams on n1",
            )
            s1.proc.send_signal(signal.SIGKILL)
            s1.proc.wait(10)
            thread.join(30)
            assert not thread.is_alive()
            end = _outcome(follower)
            assert (end["kind"], end["reason"]) == ("discarded", "interrupted")
            # n2 owns the session now, and goes on with it.
            assert _lease_node(b, "kill-1") == "n2"
            nxt = _outcome(post_turn(b, "kill-1", "after", rid="k2")[1])
            assert nxt["kind"] == "committed"
            tags = [(e["tag"], e["payload"].get("request_id")) for e in _events(b, "kill-1")]
            assert tags.count(("turn_discarded", "k1")) == 1
            assert ("turn_committed", "k1") not in tags
            # The dead node leaves the live nodes once its heartbeat runs out.
            _until(
                lambda: [n["node_id"] for n in b.get("/v1/nodes").json()["nodes"]] == ["n2"],
                10,
                "n1 is no longer live",
            )
            dead = b.get("/v1/nodes", params={"dead": 1}).json()["nodes"]
            assert [(n["node_id"], n["live"]) for n in dead] == [("n1", False), ("n2", True)]


def test_a_paused_node_is_fenced_and_drops_its_actors(
    provider: LoopbackServer, pg_dsn: str, tmp_path: Path
) -> None:
    with nodes(pg_dsn, provider.openai_base_url, tmp_path, ["n1", "n2"], "--lease", "2") as (
        s1,
        s2,
    ):
        with s1.client() as a:
            assert _outcome(post_turn(a, "stop-1", "hello", rid="p0")[1])["kind"] == "committed"
            body = {"question": "slow 60 0.1", "request_id": "p1"}
            with a.stream("POST", "/v1/sessions/stop-1/turns", json=body) as r:
                assert sse_events(r, stop_after_deltas=2)[-1]["event"] == "delta"
            # (a client leaving is no cancel: the turn goes on on n1)
        s1.proc.send_signal(signal.SIGSTOP)
        try:
            with s2.client() as b:
                # n2 is asked: n1 cannot take the call; once its lease and
                # heartbeat ran out, n2 takes the session over, ends n1's
                # turn as interrupted and answers.
                took = post_turn(b, "stop-1", "while paused", rid="p2")
                assert took[0] == 200, took
                assert _outcome(took[1])["kind"] == "committed", took
                before = _events(b, "stop-1")
                tags = [(e["tag"], e["payload"].get("request_id")) for e in before]
                assert ("turn_discarded", "p1") in tags
            s1.proc.send_signal(signal.SIGCONT)
            # n1 wakes with its turn still streaming from the model server; its
            # writes are refused (the epoch moved), and its actor is dropped.
            time.sleep(7)  # the rest of n1's stream, and more
            with s2.client() as b, s1.client() as a:
                assert _events(b, "stop-1") == before
                health = a.get("/healthz").json()
                assert health["actors"] == 0 and health["in_flight"] == 0
                # Asked on n1 now, the question goes to the owner, n2.
                again = _outcome(post_turn(a, "stop-1", "back", rid="p3")[1])
                assert again["kind"] == "committed"
                assert _lease_node(a, "stop-1") == "n2"
                after = _events(b, "stop-1")
                assert after[: len(before)] == before
                assert {e["payload"].get("request_id") for e in after[len(before) :]} == {"p3"}
        finally:
            s1.proc.send_signal(signal.SIGCONT)


def test_sigterm_hands_the_sessions_over_within_the_grace(
    provider: LoopbackServer, pg_dsn: str, tmp_path: Path
) -> None:
    # A lease far longer than the test: only a hand-over lets n2 in.
    extra = ("--lease", "60", "--grace", "10")
    with nodes(pg_dsn, provider.openai_base_url, tmp_path, ["n1", "n2"], *extra) as (s1, s2):
        with s1.client() as a:
            assert _outcome(post_turn(a, "idle-1", "hello", rid="i0")[1])["kind"] == "committed"
        busy: list[dict[str, Any]] = []

        def run_busy() -> None:
            with s1.client() as a:
                busy.extend(post_turn(a, "busy-1", "slow 30 0.1", rid="b1")[1])

        thread = threading.Thread(target=run_busy)
        thread.start()
        with s2.client() as b:
            _until(
                lambda: b.get("/v1/sessions/busy-1/state").json().get("in_flight") == "b1",
                15,
                "the busy turn runs on n1",
            )
            s1.proc.send_signal(signal.SIGTERM)
            t0 = time.monotonic()

            # The idle session is let go at once: n2 takes it within seconds.
            def answered() -> Any:
                got = post_turn(b, "idle-1", "moved", rid="i1")
                # (a 503 owner_unavailable would be a client's cue to retry)
                return got if got[0] != 503 else None

            moved = _until(answered, 8, "n2 answers for idle-1")
            assert _outcome(moved[1])["kind"] == "committed", moved
            assert time.monotonic() - t0 < 8
            assert _lease_node(b, "idle-1") == "n2"
            # The turn in flight ends on n1 within the grace, committed.
            thread.join(30)
            assert _outcome(busy)["kind"] == "committed"
            assert s1.proc.wait(20) == 0
            # ...and then n2 takes that session too.
            assert _outcome(post_turn(b, "busy-1", "next", rid="b2")[1])["kind"] == "committed"


def test_get_nodes_shows_live_nodes_sessions_renewals_and_lag(
    provider: LoopbackServer, pg_dsn: str, tmp_path: Path
) -> None:
    with ExitStack() as stack:
        s1 = stack.enter_context(
            running(
                pg_dsn,
                provider.openai_base_url,
                "--node-id",
                "n1",
                "--advertise",
                "http://10.0.0.1:8421",
                "--lease",
                "1.5",
                log_dir=tmp_path / "n1",
            )
        )
        s2 = stack.enter_context(
            running(
                pg_dsn,
                provider.openai_base_url,
                "--node-id",
                "n2",
                "--lease",
                "1.5",
                log_dir=tmp_path / "n2",
            )
        )
        with s1.client() as a, s2.client() as b:
            assert _outcome(post_turn(a, "nodes-a", "hi", rid="a1")[1])["kind"] == "committed"
            assert _outcome(post_turn(b, "nodes-b", "hi", rid="b1")[1])["kind"] == "committed"
            first = {n["node_id"]: n for n in b.get("/v1/nodes").json()["nodes"]}
            time.sleep(1.5)
            body = b.get("/v1/nodes").json()
            assert body["node_id"] == "n2"
            listed = {n["node_id"]: n for n in body["nodes"]}
            assert set(listed) == {"n1", "n2"}
            assert listed["n1"]["sessions"] == ["nodes-a"]
            assert listed["n2"]["sessions"] == ["nodes-b"]
            assert listed["n1"]["address"] == "http://10.0.0.1:8421"
            for name, node in listed.items():
                assert node["live"] is True and node["stopping"] is False
                assert node["renewals"] > first[name]["renewals"]  # heartbeats go on
                assert node["lag_ms"] >= 0 and node["heartbeat_age_ms"] < 1500
                assert node["expires_at"] > node["heartbeat_at"]
            assert a.get("/healthz").json()["node_id"] == "n1"


def test_clustering_flags_on_a_store_that_is_not_postgresql_are_refused(
    provider: LoopbackServer, tmp_path: Path
) -> None:
    for flags in (["--node-id", "n1"], ["--lease", "5"], ["--node-id", "n1", "--advertise", "x"]):
        cmd = serve_command(str(tmp_path / "s.db"), provider.openai_base_url, *flags)
        done = subprocess.run(cmd, capture_output=True, timeout=60)
        assert done.returncode == 2, done
        err = done.stderr.decode()
        assert "clustering needs a PostgreSQL store" in err, err
        assert flags[0] in err
    assert not (tmp_path / "s.db").exists()  # nothing was opened


def test_a_node_id_held_by_a_live_node_is_refused(
    provider: LoopbackServer, pg_dsn: str, tmp_path: Path
) -> None:
    with nodes(pg_dsn, provider.openai_base_url, tmp_path, ["twin"]):
        cmd = serve_command(pg_dsn, provider.openai_base_url, "--node-id", "twin")
        done = subprocess.run(cmd, capture_output=True, timeout=60)
        assert done.returncode == 2, done
        assert "node id 'twin' is in use by another live process" in done.stderr.decode()
    bad = serve_command(pg_dsn, provider.openai_base_url, "--node-id", " ")
    done = subprocess.run(bad, capture_output=True, timeout=60)
    assert done.returncode == 2 and "--node-id" in done.stderr.decode()


def test_sessions_command_shows_the_owning_node(
    provider: LoopbackServer, pg_dsn: str, tmp_path: Path
) -> None:
    with nodes(pg_dsn, provider.openai_base_url, tmp_path, ["n1"]) as (s1,):
        with s1.client() as a:
            assert _outcome(post_turn(a, "cli-1", "hi", rid="c1")[1])["kind"] == "committed"
        cmd = [sys.executable, "-m", "turnledger", "sessions", pg_dsn]
        text = subprocess.run(cmd, capture_output=True, timeout=60, check=True).stdout.decode()
        line = next(x for x in text.splitlines() if x.startswith("cli-1"))
        assert "node n1: " in line and "until" in line
        out = subprocess.run([*cmd, "--json"], capture_output=True, timeout=60, check=True)
        rows = [json.loads(x) for x in out.stdout.decode().splitlines()]
        owner = next(r for r in rows if r["session_id"] == "cli-1")["owner"]
        assert (owner["node"], owner["live"]) == ("n1", True)


def test_a_new_session_asked_on_two_nodes_at_once_gets_one_owner(
    provider: LoopbackServer, pg_dsn: str, tmp_path: Path
) -> None:
    with nodes(pg_dsn, provider.openai_base_url, tmp_path, ["n1", "n2"]) as (s1, s2):
        for round_ in range(3):
            sid = f"race-{round_}"
            got: dict[str, Any] = {}

            def ask(serve: Serve, rid: str, sid: str = sid, got: dict[str, Any] = got) -> None:
                with serve.client() as c:
                    got[rid] = post_turn(c, sid, f"slow 5 0.05 {rid}", rid=rid)

            threads = [
                threading.Thread(target=ask, args=(s, f"{name}-{round_}"))
                for s, name in ((s1, "a"), (s2, "b"))
            ]
            for t in threads:
                t.start()
            for t in threads:
                t.join(60)
                assert not t.is_alive()
            kinds = []
            for rid, (status, body) in got.items():
                if status == 200:
                    kinds.append(_outcome(body)["kind"])
                else:  # the other question was in flight: refused, nothing written
                    assert (status, body["error"]["code"]) == (409, "busy"), (rid, body)
            assert "committed" in kinds and set(kinds) == {"committed"}
            with s1.client() as a:
                tags = [e["tag"] for e in _events(a, sid)]
                assert tags.count("session_started") == 1
                assert tags.count("turn_submitted") == tags.count("turn_committed") == len(kinds)
                owner = _lease_node(a, sid)
                assert owner in ("n1", "n2")


def test_a_lease_naming_an_unknown_node_is_taken_by_the_node_asked(
    provider: LoopbackServer, pg_dsn: str, tmp_path: Path
) -> None:
    import psycopg

    with nodes(pg_dsn, provider.openai_base_url, tmp_path, ["n1", "n2"]) as (s1, s2):
        with s1.client() as a:
            assert _outcome(post_turn(a, "ghost-1", "hello", rid="g0")[1])["kind"] == "committed"
        # The lease names a node no table row knows (a typo in a migration,
        # a row deleted by hand): its owner counts as dead.
        with psycopg.connect(pg_dsn, autocommit=True) as conn:
            conn.execute(
                "UPDATE turnledger_events_leases SET node = 'ghost' WHERE session_id = 'ghost-1'"
            )
        with s2.client() as b:
            took = post_turn(b, "ghost-1", "mine now", rid="g1")
            assert took[0] == 200 and _outcome(took[1])["kind"] == "committed", took
            assert _lease_node(b, "ghost-1") == "n2"
            received = [
                x for x in s1.log.read_text().splitlines() if '"event":"call_received"' in x
            ]
            assert received == []  # taken over, not handed to n1
        with s1.client() as a:
            # n1 finds its lease gone and hands the next question to n2.
            again = post_turn(a, "ghost-1", "and again", rid="g2")
            assert _outcome(again[1])["kind"] == "committed", again
            tags = [(e["tag"], e["payload"].get("request_id")) for e in _events(a, "ghost-1")]
            assert [r for t, r in tags if t == "turn_committed"] == ["g0", "g1", "g2"]


def test_a_call_of_an_unknown_kind_is_refused_by_the_node(
    provider: LoopbackServer, pg_dsn: str, tmp_path: Path
) -> None:
    import trio

    from turnledger.adapters.stores import PostgresStore

    async def ask() -> dict[str, Any] | None:
        probe = await PostgresStore.open(pg_dsn, node_id="probe")
        try:
            assert probe.inbox is not None
            call = await trio.to_thread.run_sync(probe.inbox.post, "n1", "s", "bogus", {})
            with trio.fail_after(20):
                while True:
                    reply = await trio.to_thread.run_sync(probe.inbox.take_reply, call)
                    if reply is not None:
                        return reply
                    await trio.sleep(0.05)
        finally:
            await probe.aclose()

    with nodes(pg_dsn, provider.openai_base_url, tmp_path, ["n1"]) as (s1,):
        reply = trio.run(ask)
        assert reply is not None
        assert (reply["status"], reply["body"]["error"]["code"]) == (400, "bad_call")
        with s1.client() as a:
            assert a.get("/v1/sessions/s").status_code == 404  # nothing was run
