"""``turnledger serve`` over real HTTP: a child process on SQLite, the
loopback provider server behind it."""

from __future__ import annotations

import base64
import hashlib
import json
import signal
import sqlite3
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from serve._harness import (
    ODD_IDS,
    Serve,
    answer_for,
    loopback,
    post_turn,
    running,
    serve_command,
    sse_events,
    two_serving,
)
from turnledger.serve import quote_id
from turnledger.testing import LoopbackServer

pytestmark = [pytest.mark.loopback]


@pytest.fixture(scope="module")
def provider() -> Iterator[LoopbackServer]:
    with loopback() as server:
        yield server


@pytest.fixture(scope="module")
def service(provider: LoopbackServer, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Serve]:
    db = tmp_path_factory.mktemp("serve") / "serve.db"
    with running(
        db,
        provider.openai_base_url,
        "--idle-timeout",
        "1",
        "--max-request-bytes",
        "2000",
        "--max-body-bytes",
        "10000",
    ) as serve:
        yield serve


def _tags(client: httpx.Client, session: str) -> list[tuple[str, dict[str, Any]]]:
    r = client.get(f"/v1/sessions/{session}/events", params={"limit": 1000})
    assert r.status_code == 200
    return [(e["tag"], e["payload"]) for e in r.json()["events"]]


def _wait_for_tag(client: httpx.Client, session: str, tag: str, rid: str) -> dict[str, Any]:
    deadline = time.monotonic() + 15
    while time.monotonic() < deadline:
        for t, payload in _tags(client, session):
            if t == tag and payload.get("request_id") == rid:
                return payload
        time.sleep(0.05)
    raise AssertionError(f"no {tag} for {rid}: {_tags(client, session)}")


def test_a_turn_streams_deltas_numbered_and_commits(service: Serve) -> None:
    with service.client() as c:
        status, events = post_turn(c, "stream-1", "slow 8", rid="r1")
        assert status == 200
        assert events[0] == {
            "event": "turn",
            "data": {"session_id": "stream-1", "request_id": "r1"},
        }
        deltas = [e for e in events if e["event"] == "delta"]
        assert [d["id"] for d in deltas] == [str(i) for i in range(1, 9)]
        outcome = events[-1]
        assert outcome["event"] == "outcome"
        assert outcome["data"]["kind"] == "committed"
        assert outcome["data"]["answer"] == "".join(d["data"]["text"] for d in deltas)
        assert outcome["data"]["answer"] == answer_for("slow 8")
        assert outcome["data"]["finish_reason"] == "stop"
        # the same request id again: the recorded outcome, not a second turn
        status, again = post_turn(c, "stream-1", "slow 8", rid="r1")
        assert status == 200 and again[-1]["data"]["kind"] == "committed"
        assert again[-1]["data"]["repeated"] is True
        session = c.get("/v1/sessions/stream-1").json()
        assert session["turns"] == [
            {"request_id": "r1", "question": "slow 8", "answer": answer_for("slow 8")}
        ]
        assert [t for t, _ in _tags(c, "stream-1")].count("turn_submitted") == 1
        # usage is passed through
        _, quick = post_turn(c, "stream-1", "hello", rid="r2")
        assert quick[-1]["data"]["usage"] == {
            "prompt_tokens": 9,
            "completion_tokens": 4,
            "total_tokens": 13,
        }


def test_reconnect_with_last_event_id_gets_the_rest_once_and_the_same_outcome(
    service: Serve,
) -> None:
    with service.client() as c:
        k = 4
        status, first = post_turn(c, "resume-1", "slow 30", rid="r1", stop_after_deltas=k)
        assert status == 200
        seen = [e for e in first if e["event"] == "delta"]
        assert [d["id"] for d in seen] == ["1", "2", "3", "4"]
        # the first connection is closed now; the turn goes on
        with c.stream(
            "GET", "/v1/sessions/resume-1/turns/r1/stream", headers={"Last-Event-ID": str(k)}
        ) as r:
            assert r.status_code == 200
            rest = sse_events(r)
        deltas = [e for e in rest if e["event"] == "delta"]
        assert [int(d["id"]) for d in deltas] == list(range(k + 1, 31))
        outcome = rest[-1]["data"]
        assert outcome["kind"] == "committed"
        text = "".join(d["data"]["text"] for d in seen + deltas)
        assert text == outcome["answer"] == answer_for("slow 30")
        # after the end: just the outcome, the same one
        with c.stream(
            "GET", "/v1/sessions/resume-1/turns/r1/stream", headers={"Last-Event-ID": "2"}
        ) as r:
            after = sse_events(r)
        assert [e["event"] for e in after] == ["outcome"]
        assert after[0]["data"]["answer"] == outcome["answer"]


def test_a_disconnect_alone_never_cancels(service: Serve) -> None:
    with service.client() as c:
        _, first = post_turn(c, "detach-1", "slow 12", rid="r1", stop_after_deltas=2)
        assert [e["event"] for e in first] == ["turn", "delta", "delta"]
        committed = _wait_for_tag(c, "detach-1", "turn_committed", "r1")
        assert committed["answer"] == answer_for("slow 12")
        assert "turn_discarded" not in [t for t, _ in _tags(c, "detach-1")]


def test_cancel_wins_while_streaming_and_loses_after_the_answer(service: Serve) -> None:
    with (
        service.client() as c,
        c.stream(
            "POST", "/v1/sessions/cancel-1/turns", json={"question": "slow 40", "request_id": "r1"}
        ) as r,
    ):
        head = sse_events(r, stop_after_deltas=2)
        assert head[0]["event"] == "turn"
        with service.client() as other:
            won = other.post("/v1/sessions/cancel-1/turns/r1/cancel", json={})
        rest = sse_events(r)
    assert won.status_code == 200
    assert won.json()["kind"] == "discarded" and won.json()["reason"] == "cancelled"
    assert won.json()["preview_chars"] >= 8
    assert rest[-1]["event"] == "outcome" and rest[-1]["data"] == won.json()
    with service.client() as c:
        _, done = post_turn(c, "cancel-1", "hello", rid="r2")
        assert done[-1]["data"]["kind"] == "committed"
        lost = c.post("/v1/sessions/cancel-1/turns/r2/cancel", json={})
        assert lost.status_code == 200
        assert lost.json()["kind"] == "committed"  # the answer won the race
        assert [p["request_id"] for _, p in _tags(c, "cancel-1") if "answer" in p] == ["r2"]


def _error(r: httpx.Response, status: int, code: str) -> None:
    assert r.status_code == status, r.text
    assert r.headers["content-type"] == "application/json"
    assert r.json()["error"]["code"] == code
    assert "Traceback" not in r.text


def test_every_error_has_its_status_and_code_and_changes_nothing(service: Serve) -> None:
    with service.client() as c:
        turns = "/v1/sessions/errors-1/turns"
        as_json = {"Content-Type": "application/json"}
        _error(c.post(turns, content=b"{not json", headers=as_json), 400, "bad_json")
        _error(c.post(turns, content=b'{"question": "q"}'), 415, "unsupported_media_type")
        _error(c.post(turns, json=["a list"]), 400, "bad_json")
        _error(c.post(turns, json={"question": 7}), 400, "bad_field")
        _error(c.post(turns, json={"question": "q", "extra": 1}), 400, "bad_field")
        _error(c.post(turns, json={"question": "q", "request_id": ""}), 400, "bad_request_id")
        _error(c.post(turns, json={"question": "q", "request_id": 7}), 400, "bad_request_id")
        for segment in ("%FF", "~", "%2e%2E"):  # not UTF-8, no id, a bare dot segment
            bad = c.post(f"/v1/sessions/{segment}/turns", json={"question": "q"})
            _error(bad, 400, "bad_session_id")
        _error(
            c.post(turns, content=b'{"question": "' + b"x" * 20_000 + b'"}', headers=as_json),
            413,
            "body_too_large",
        )
        _error(c.get("/v1/sessions/errors-1"), 404, "unknown_session")  # nothing was created
        _error(c.post(turns, json={"question": ""}), 400, "empty_question")
        _error(c.post(turns, json={"question": "x" * 5000}), 413, "over_budget")
        # the refused questions created nothing
        _error(c.get("/v1/sessions/errors-1/turns/nope/stream"), 404, "unknown_session")
        _error(c.post("/v1/sessions/errors-1/turns/nope/cancel", json={}), 404, "unknown_session")
        _error(c.get("/v1/sessions/nope/turns/r/stream"), 404, "unknown_session")
        _error(c.get("/v1/sessions/errors-1/events", params={"after": "-1"}), 400, "bad_parameter")
        _error(
            c.get("/v1/sessions/errors-1/turns/x/stream", headers={"Last-Event-ID": "z"}),
            400,
            "bad_last_event_id",
        )
        _error(c.get("/nowhere"), 404, "not_found")
        _error(c.delete("/v1/sessions/errors-1/turns"), 405, "method_not_allowed")
        with c.stream("POST", turns, json={"question": "slow 30", "request_id": "b1"}) as r:
            sse_events(r, stop_after_deltas=1)
            _error(c.post(turns, json={"question": "second", "request_id": "b2"}), 409, "busy")
        _error(c.get("/v1/sessions/errors-1/turns/nope/stream"), 404, "unknown_request")
        _error(c.post("/v1/sessions/errors-1/turns/nope/cancel", json={}), 404, "unknown_request")
        state = c.get("/v1/sessions/errors-1").json()
        # no refusal is in its log: the empty and over-budget questions and
        # the busy one were refused before the hub, like malformed requests
        tags = [t for t, _ in _tags(c, "errors-1")]
        assert tags.count("turn_rejected") == 0
        assert tags[0] == "session_started" and tags.count("turn_submitted") == 1
        assert state["turns"] == [] or state["turns"][0]["request_id"] == "b1"


def test_sessions_events_and_state_are_paged_and_validated(service: Serve) -> None:
    with service.client() as c:
        for i in range(3):
            post_turn(c, f"page-{i}", "hello", rid=f"p{i}")
        listing = c.get("/v1/sessions", params={"limit": 2}).json()
        assert len(listing["sessions"]) == 2 and listing["next"] == 2
        rest = c.get("/v1/sessions", params={"after": listing["next"], "limit": 1000}).json()
        ids = [s["session_id"] for s in listing["sessions"] + rest["sessions"]]
        assert {"page-0", "page-1", "page-2"} <= set(ids) and len(ids) == len(set(ids))
        row = next(s for s in rest["sessions"] + listing["sessions"] if s["session_id"] == "page-2")
        assert row["turns"] == 1 and row["phase"] == "committed"
        assert row["last_outcome"] == "committed"
        events = c.get("/v1/sessions/page-0/events", params={"limit": 2}).json()
        assert [e["seq"] for e in events["events"]] == [1, 2] and events["next"] == 2
        more = c.get("/v1/sessions/page-0/events", params={"after": 2}).json()
        assert [e["tag"] for e in more["events"]] == ["stream_started", "turn_committed"]
        at2 = c.get("/v1/sessions/page-0/state", params={"at": 2}).json()
        assert at2["phase"] == "pending" and at2["in_flight"] == "p0" and at2["turns"] == []
        assert c.get("/v1/sessions/page-0/state").json()["phase"] == "committed"
        _error(c.get("/v1/sessions/page-0/state", params={"at": 99}), 404, "unknown_seq")
        assert c.get("/healthz").json()["ok"] is True


def test_access_log_lines_are_structured(provider: LoopbackServer, tmp_path: Path) -> None:
    with running(tmp_path / "s.db", provider.openai_base_url) as serve:
        with serve.client() as c:
            assert c.get("/healthz").status_code == 200
            post_turn(c, "log-1", "hello", rid="secret-question-id")
        assert serve.stop() == 0
        lines = [json.loads(x) for x in serve.log.read_text().splitlines() if x]
    access = [x for x in lines if x.get("event") == "http_request"]
    assert {k: access[0][k] for k in ("method", "path", "status")} == {
        "method": "GET",
        "path": "/healthz",
        "status": 200,
    }
    assert any(x["path"] == "/v1/sessions/log-1/turns" and x["status"] == 200 for x in access)
    assert all("duration_ms" in x for x in access)
    assert "echo: hello" not in json.dumps(lines)  # answers never reach a log line


def test_with_a_token_every_route_requires_it(provider: LoopbackServer, tmp_path: Path) -> None:
    env = {"TL_TEST_TOKEN": "s3cret-token"}
    with running(
        tmp_path / "t.db", provider.openai_base_url, "--token-env", "TL_TEST_TOKEN", env=env
    ) as serve:
        with serve.client() as c:
            for method, path in [
                ("GET", "/"),
                ("GET", "/healthz"),
                ("GET", "/v1/sessions"),
                ("POST", "/v1/sessions/t/turns"),
            ]:
                _error(c.request(method, path, json={"question": "q"}), 401, "unauthorized")
            _error(
                c.get("/healthz", headers={"Authorization": "Bearer wrong"}), 401, "unauthorized"
            )
            _error(c.post("/v1/sessions/t/turns", json={"question": "q"}), 401, "unauthorized")
        with serve.client(headers={"Authorization": "Bearer s3cret-token"}) as c:
            assert c.get("/healthz").status_code == 200
            status, events = post_turn(c, "t", "hello")
            assert status == 200 and events[-1]["data"]["kind"] == "committed"
    # the failed posts changed nothing: the session holds one turn
    con = sqlite3.connect(tmp_path / "t.db")
    assert con.execute("select count(*) from events where tag='turn_submitted'").fetchone() == (1,)


@pytest.mark.parametrize(
    ("options", "message"),
    [
        (("--host", "0.0.0.0"), b"requires a token"),  # beyond loopback, no token
        (("--max-starting", "-1"), b"--max-starting"),
        (("--start-hold", "0"), b"--start-hold"),
    ],
)
def test_bad_serve_options_are_refused_before_anything_is_created(
    tmp_path: Path, options: tuple[str, ...], message: bytes
) -> None:
    import subprocess

    cmd = serve_command(str(tmp_path / "x.db"), "http://127.0.0.1:9/v1", *options)
    done = subprocess.run(cmd, capture_output=True, timeout=60)
    assert done.returncode == 2
    assert message in done.stderr
    assert not (tmp_path / "x.db").exists()


def test_sigterm_lets_a_short_turn_end_and_interrupts_a_hung_one(
    provider: LoopbackServer, tmp_path: Path
) -> None:
    db = tmp_path / "term.db"
    # now signal with both kinds in flight
    with running(db, provider.openai_base_url, "--grace", "1") as serve, serve.client() as c:
        with c.stream(
            "POST",
            "/v1/sessions/term-c/turns",
            json={"question": "slow 10 0.05", "request_id": "c"},
        ) as short:
            sse_events(short, stop_after_deltas=1)
            c2 = serve.client()
            hung = c2.send(
                c2.build_request(
                    "POST",
                    "/v1/sessions/term-d/turns",
                    json={"question": "hang", "request_id": "d"},
                ),
                stream=True,
            )
            assert hung.status_code == 200
            serve.proc.send_signal(signal.SIGTERM)
            rest = sse_events(short)
            assert rest[-1]["event"] == "outcome" and rest[-1]["data"]["kind"] == "committed"
            hung_events = sse_events(hung)
            hung.close()
            c2.close()
        assert serve.proc.wait(30) == 0
    # the hung turn's stream ends with its outcome when the grace runs out
    assert hung_events[-1]["event"] == "outcome", hung_events
    assert hung_events[-1]["data"]["reason"] == "interrupted"
    con = sqlite3.connect(db)
    rows = dict(
        con.execute(
            "select json_extract(payload, '$.request_id'), tag from events "
            "where tag in ('turn_committed','turn_discarded')"
        ).fetchall()
    )
    assert rows["c"] == "turn_committed"
    assert rows["d"] == "turn_discarded"
    reason = con.execute(
        "select json_extract(payload,'$.reason') from events "
        "where tag='turn_discarded' and payload like '%\"d\"%'"
    ).fetchone()
    assert reason == ("interrupted",)


def test_sigkill_loses_no_committed_turn_and_a_restart_closes_the_rest(
    provider: LoopbackServer, tmp_path: Path
) -> None:
    db = tmp_path / "kill.db"
    with running(db, provider.openai_base_url) as serve, serve.client() as c:
        _, events = post_turn(c, "kill-1", "hello", rid="k1")
        assert events[-1]["data"]["kind"] == "committed"
        with c.stream(
            "POST", "/v1/sessions/kill-1/turns", json={"question": "slow 50", "request_id": "k2"}
        ) as r:
            sse_events(r, stop_after_deltas=1)
            serve.proc.send_signal(signal.SIGKILL)
            serve.proc.wait(10)
    with running(db, provider.openai_base_url) as serve, serve.client() as c:
        assert c.get("/v1/sessions/kill-1").json()["turns"][0]["request_id"] == "k1"
        r = c.get("/v1/sessions/kill-1/turns/k2/stream", headers={"Last-Event-ID": "1"})
        outcome = [e for e in sse_events(r) if e["event"] == "outcome"]
        assert outcome[0]["data"]["kind"] == "discarded"
        assert outcome[0]["data"]["reason"] == "interrupted"
        assert [t["request_id"] for t in c.get("/v1/sessions/kill-1").json()["turns"]] == ["k1"]


@pytest.mark.postgres
def test_a_session_owned_by_another_serve_process_is_409(
    provider: LoopbackServer, pg_dsn: str, tmp_path: Path
) -> None:
    with two_serving(pg_dsn, provider.openai_base_url, tmp_path) as (_, _, a, b):
        _, events = post_turn(a, "owned-1", "hello", rid="o1")
        assert events[-1]["data"]["kind"] == "committed"
        # the first process's actor holds the session; the second may not write it
        _error(
            b.post("/v1/sessions/owned-1/turns", json={"question": "q2"}), 409, "owned_elsewhere"
        )
        assert [t for t, _ in _tags(b, "owned-1")].count("turn_submitted") == 1
        # reading is fine from anywhere
        assert b.get("/v1/sessions/owned-1").json()["turns"][0]["request_id"] == "o1"


def test_a_turn_beyond_max_starting_waits_for_a_slot(
    provider: LoopbackServer, tmp_path: Path
) -> None:
    import threading

    slot = ("--max-starting", "1", "--start-hold", "60")
    with running(tmp_path / "s.db", provider.openai_base_url, *slot) as s:
        hung: list[Any] = []
        queued_answered = threading.Event()
        queued: list[dict[str, Any]] = []

        def hang() -> None:
            # Its model server sends headers, then nothing: no first delta,
            # so the turn keeps the only slot until it ends.
            with s.client() as c:
                hung.extend(post_turn(c, "slot-a", "hang", rid="a1")[1])

        def wait_for_slot() -> None:
            body = {"question": "hi", "request_id": "b1"}
            with s.client() as c, c.stream("POST", "/v1/sessions/slot-b/turns", json=body) as r:
                queued_answered.set()
                queued.extend(sse_events(r))

        threads = [threading.Thread(target=hang), threading.Thread(target=wait_for_slot)]
        threads[0].start()
        with s.client() as c:  # the first turn is in flight: it holds the slot
            deadline = time.monotonic() + 15
            while c.get("/v1/sessions/slot-a/state").json().get("in_flight") != "a1":
                assert time.monotonic() < deadline
                time.sleep(0.05)
        threads[1].start()
        # The second turn gets no answer, not even its headers, while the
        # first holds the slot (however slow the machine, it cannot).
        assert not queued_answered.wait(1.0)
        with s.client() as c:
            cancelled = c.post("/v1/sessions/slot-a/turns/a1/cancel", json={})
        assert cancelled.json()["kind"] == "discarded"
        assert queued_answered.wait(15)
        for t in threads:
            t.join(15)
    assert queued[0]["event"] == "turn" and queued[-1]["data"]["kind"] == "committed"
    assert queued[-1]["data"]["answer"] == answer_for("hi")
    assert hung[-1]["event"] == "outcome" and hung[-1]["data"]["reason"] == "cancelled"


def test_a_turn_gives_its_slot_back_after_start_hold(
    provider: LoopbackServer, tmp_path: Path
) -> None:
    # A model that sends nothing keeps its turn from its first delta, not
    # the other turns from starting: after --start-hold the slot is free.
    slot = ("--max-starting", "1", "--start-hold", "0.5")
    with running(tmp_path / "s.db", provider.openai_base_url, *slot) as s, s.client() as c:
        body = {"question": "hang", "request_id": "a1"}
        with c.stream("POST", "/v1/sessions/hold-a/turns", json=body) as hung:
            assert hung.status_code == 200
            started = time.monotonic()
            status, events = post_turn(c, "hold-b", "hi", rid="b1")
            waited = time.monotonic() - started
            # The first turn still hangs: the second got its slot from
            # the hold limit, not from the first turn's end.
            assert c.get("/v1/sessions/hold-a/state").json().get("in_flight") == "a1"
        assert status == 200
        assert events[-1]["data"]["kind"] == "committed"
        assert events[-1]["data"]["answer"] == answer_for("hi")
        assert waited < 30
        c.post("/v1/sessions/hold-a/turns/a1/cancel", json={})


def test_every_id_the_library_takes_is_addressable(service: Serve) -> None:
    with service.client() as c:
        for n, sid in enumerate(ODD_IDS):
            rid = ODD_IDS[-1 - n]
            path = f"/v1/sessions/{quote_id(sid)}"
            status, events = post_turn(c, quote_id(sid), f"question {n}", rid=rid)
            assert status == 200, (sid, events)
            assert events[0]["data"] == {"session_id": sid, "request_id": rid}
            assert events[-1]["data"]["answer"] == f"echo: question {n}"
            session = c.get(path).json()
            assert session["session_id"] == sid and session["turns"][0]["request_id"] == rid
            for view in ("timeline", "state", "events"):
                assert c.get(f"{path}/{view}").json()["session_id"] == sid, view
            turn = f"{path}/turns/{quote_id(rid)}"
            with c.stream("GET", f"{turn}/stream") as r:
                assert sse_events(r)[-1]["data"]["request_id"] == rid
            assert c.post(f"{turn}/cancel", json={}).json()["kind"] == "committed"
        # the same id however its characters are escaped: "~" as %7E too
        assert c.get("/v1/sessions/%7E%7Ehome").json()["session_id"] == "~home"
        listed = {s["session_id"] for s in c.get("/v1/sessions?limit=1000").json()["sessions"]}
        assert set(ODD_IDS) <= listed


def test_every_response_forbids_framing_sniffing_and_foreign_code(service: Serve) -> None:
    with service.client() as c:
        post_turn(c, "headers-1", "hello")
        page = c.get("/")
        policy = page.headers["content-security-policy"]
        # the page's own script and style, by the hash of what it serves
        html = page.text
        for tag, directive in (("script", "script-src"), ("style", "style-src")):
            body = html.split(f"<{tag}>", 1)[1].split(f"</{tag}>", 1)[0]
            digest = base64.b64encode(hashlib.sha256(body.encode()).digest()).decode()
            assert f"{directive} 'sha256-{digest}';" in policy
        assert "default-src 'none';" in policy and "frame-ancestors 'none'" in policy
        assert "connect-src 'self'" in policy and "unsafe" not in policy
        responses = [
            page,
            c.get("/v1/sessions"),
            c.get("/v1/sessions/headers-1/timeline"),
            c.get("/v1/sessions/nope/timeline"),
            c.get("/healthz"),
            c.post("/v1/sessions/headers-1/turns", json={"question": ""}),
        ]
        with c.stream("GET", "/v1/sessions/headers-1/follow") as follow:
            responses.append(follow)
        for r in responses:
            assert r.headers["x-content-type-options"] == "nosniff", r.url
            assert r.headers["x-frame-options"] == "DENY"
            assert r.headers["referrer-policy"] == "no-referrer"
            if r is not page:
                csp = r.headers["content-security-policy"]
                assert csp == "default-src 'none'; frame-ancestors 'none'"
