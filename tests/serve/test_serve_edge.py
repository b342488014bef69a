"""The HTTP edge of ``turnledger serve``, over real sockets: who may ask
(loopback ``Host`` and ``Origin`` without a token, the bearer token with
one), what a POST must be (strict JSON, within its size), questions refused
for their shape changing nothing, and connections that end when they cannot
carry another request (after a stream, after an early answer), so that a
SIGTERM is prompt."""

from __future__ import annotations

import signal
import socket
import sqlite3
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import h11
import httpx
import pytest

from serve._harness import Serve, loopback, post_turn, running, serve_command, sse_events
from turnledger.testing import LoopbackServer

pytestmark = [pytest.mark.loopback]


@pytest.fixture(scope="module")
def provider() -> Iterator[LoopbackServer]:
    with loopback() as server:
        yield server


@pytest.fixture(scope="module")
def db(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("edge") / "edge.db"


@pytest.fixture(scope="module")
def service(provider: LoopbackServer, db: Path) -> Iterator[Serve]:
    with running(
        db,
        provider.openai_base_url,
        "--max-request-bytes",
        "2000",
        "--max-body-bytes",
        "10000",
        "--allow-origin",
        "http://Trusted.example:3000/",
    ) as serve:
        yield serve


def _counts(db: Path) -> tuple[int, int]:
    """Events and sessions in the store."""
    con = sqlite3.connect(db)
    try:
        row = con.execute("select count(*), count(distinct session_id) from events").fetchone()
    finally:
        con.close()
    return int(row[0]), int(row[1])


def _error(r: httpx.Response, status: int, code: str) -> dict[str, Any]:
    assert r.status_code == status, (r.status_code, r.text)
    error: dict[str, Any] = r.json()["error"]
    assert error["code"] == code, error
    return error


def _port(serve: Serve) -> int:
    return int(serve.url.rsplit(":", 1)[1])


# -- who may ask -----------------------------------------------------------


def test_a_post_that_is_not_json_is_refused_and_writes_nothing(service: Serve, db: Path) -> None:
    with service.client() as c:
        before = _counts(db)
        body = b'{"question": "planted"}'
        for kind in ("text/plain", "application/x-www-form-urlencoded", "multipart/form-data", ""):
            headers = {"Content-Type": kind} if kind else {}
            r = c.post("/v1/sessions/ct-1/turns", content=body, headers=headers)
            _error(r, 415, "unsupported_media_type")
        _error(c.post("/v1/sessions/ct-1/turns/r/cancel"), 415, "unsupported_media_type")
        ok = c.post(
            "/v1/sessions/ct-1/turns",
            content=body,
            headers={"Content-Type": "Application/JSON; charset=utf-8"},
        )
        assert ok.status_code == 200 and ok.headers["content-type"].startswith("text/event-stream")
        assert _counts(db)[0] > before[0]  # the JSON one went through


def test_a_foreign_host_is_refused_on_every_route(service: Serve, db: Path) -> None:
    with service.client() as c:
        post_turn(c, "rebind", "hello", rid="r1")
        before = _counts(db)
        for host in ("attacker.example", "attacker.example:8421", "127.0.0.1.nip.io", "10.0.0.1"):
            headers = {"Host": host}
            for method, path in [
                ("GET", "/v1/sessions/rebind"),
                ("GET", "/v1/sessions/rebind/events"),
                ("GET", "/v1/sessions"),
                ("GET", "/"),
                ("POST", "/v1/sessions/rebind/turns"),
            ]:
                r = c.request(method, path, json={"question": "q"}, headers=headers)
                error = _error(r, 403, "forbidden_origin")
                assert "hello" not in r.text and "Host" in error["message"]
        assert _counts(db) == before
        for host in ("127.0.0.1", f"localhost:{_port(service)}", "[::1]:1", "LOCALHOST"):
            assert c.get("/v1/sessions/rebind", headers={"Host": host}).status_code == 200


def test_an_origin_other_than_the_services_own_is_refused(service: Serve, db: Path) -> None:
    port = _port(service)
    with service.client() as c:
        before = _counts(db)
        for origin in (
            f"http://localhost:{port + 1}",  # another page on this machine
            f"http://localhost:{port}",  # the service under another name
            "http://attacker.example",
            "null",
        ):
            r = c.post(
                "/v1/sessions/origin-1/turns", json={"question": "q"}, headers={"Origin": origin}
            )
            _error(r, 403, "forbidden_origin")
            _error(c.get("/v1/sessions", headers={"Origin": origin}), 403, "forbidden_origin")
        assert _counts(db) == before
    with service.client(headers={"Origin": f"http://127.0.0.1:{port}"}) as own:
        status, events = post_turn(own, "origin-1", "hi")
        assert status == 200 and events[-1]["data"]["kind"] == "committed"


def test_an_allowed_origin_passes_and_gets_cors_headers(service: Serve) -> None:
    trusted = {"Origin": "http://trusted.example:3000"}
    with service.client() as c:
        pre = c.options(
            "/v1/sessions/cors/turns",
            headers={**trusted, "Access-Control-Request-Method": "POST"},
        )
        assert pre.status_code == 204
        assert pre.headers["access-control-allow-origin"] == "http://trusted.example:3000"
        assert "content-type" in pre.headers["access-control-allow-headers"].lower()
        r = c.get("/v1/sessions", headers=trusted)
        assert r.status_code == 200
        assert r.headers["access-control-allow-origin"] == "http://trusted.example:3000"
        # another origin gets no CORS grant and no preflight answer
        other = {"Origin": "http://trusted.example:3001", "Access-Control-Request-Method": "POST"}
        refused = c.options("/v1/sessions/cors/turns", headers=other)
        assert refused.status_code == 403
        assert "access-control-allow-origin" not in refused.headers


@pytest.mark.parametrize(
    "value", ["*", "http://x.example/path", "ftp://x.example", "x.example", "http://u@x.example"]
)
def test_an_allow_origin_that_is_not_an_origin_is_refused_at_startup(
    tmp_path: Path, value: str
) -> None:
    import subprocess

    cmd = serve_command(str(tmp_path / "x.db"), "http://127.0.0.1:9/v1", "--allow-origin", value)
    done = subprocess.run(cmd, capture_output=True, timeout=60)
    assert done.returncode == 2 and b"--allow-origin" in done.stderr
    assert not (tmp_path / "x.db").exists()


# -- the bearer token ------------------------------------------------------


def test_the_token_is_checked_as_rfc_7235_says(provider: LoopbackServer, tmp_path: Path) -> None:
    env = {"TL_EDGE_TOKEN": "s3cret-token"}
    with (
        running(
            tmp_path / "t.db", provider.openai_base_url, "--token-env", "TL_EDGE_TOKEN", env=env
        ) as serve,
        serve.client() as c,
    ):
        for auth in (None, "Bearer wrong", "Basic s3cret-token", "Bearers3cret-token"):
            headers = {} if auth is None else {"Authorization": auth}
            r = c.get("/v1/sessions", headers=headers)
            _error(r, 401, "unauthorized")
            assert r.headers["www-authenticate"] == "Bearer"
        for scheme in ("Bearer", "bearer", "BEARER"):
            auth = {"Authorization": f"{scheme} s3cret-token"}
            assert c.get("/v1/sessions", headers=auth).status_code == 200
        # with a token, any Host is served (behind a proxy, say)
        both = {"Authorization": "Bearer s3cret-token", "Host": "api.example"}
        assert c.get("/v1/sessions", headers=both).status_code == 200
        two = [("Authorization", "Bearer s3cret-token"), ("Authorization", "Bearer x")]
        _error(c.get("/v1/sessions", headers=two), 400, "bad_authorization")
        same = [("Authorization", "Bearer s3cret-token")] * 2
        _error(c.get("/v1/sessions", headers=same), 400, "bad_authorization")


@pytest.mark.parametrize("token", ["", "   ", "\t", " padded", "two words", "ctl\x01"])
def test_a_blank_or_unsendable_token_is_refused_at_startup(tmp_path: Path, token: str) -> None:
    import os
    import subprocess

    cmd = serve_command(
        str(tmp_path / "x.db"), "http://127.0.0.1:9/v1", "--token-env", "TL_EDGE_TOKEN"
    )
    done = subprocess.run(
        cmd, capture_output=True, timeout=60, env={**os.environ, "TL_EDGE_TOKEN": token}
    )
    assert done.returncode == 2 and b"--token-env" in done.stderr
    assert not (tmp_path / "x.db").exists()


def test_tokens_are_compared_in_constant_time() -> None:
    # The comparison is hmac.compare_digest's; checked where it is made.
    import inspect

    from turnledger.serve import _app

    assert "hmac.compare_digest(" in inspect.getsource(_app._bearer)


# -- what a POST must be ---------------------------------------------------


def test_a_body_with_a_duplicate_key_is_refused(service: Serve, db: Path) -> None:
    with service.client() as c:
        before = _counts(db)
        for body in (
            b'{"question": "harmless", "question": "planted"}',
            b'{"question": "q", "request_id": "a", "request_id": "b"}',
            b'{"question": "q", "q\\u003Ax": 1, "q:x": 2}',
            b'{"question": "\\ud800"}',  # a lone surrogate
            b'{"question": "q"} {"question": "r"}',
        ):
            r = c.post(
                "/v1/sessions/dup/turns", content=body, headers={"Content-Type": "application/json"}
            )
            _error(r, 400, "bad_json")
        assert _counts(db) == before


def test_a_chunked_body_over_the_limit_is_refused_as_it_arrives(service: Serve, db: Path) -> None:
    sent = 0

    def body() -> Iterator[bytes]:
        # No Content-Length: httpx sends a generator chunked.
        nonlocal sent
        yield b'{"question": "'
        for _ in range(100):  # 100 KiB in all, ten times the limit
            sent += 1024
            yield b"x" * 1024
        yield b'"}'

    with service.client() as c:
        before = _counts(db)
        r = c.post(
            "/v1/sessions/chunked/turns",
            content=body(),
            headers={"Content-Type": "application/json"},
        )
        assert "content-length" not in r.request.headers
        assert r.request.headers["transfer-encoding"] == "chunked"
        _error(r, 413, "body_too_large")
        assert r.headers["connection"] == "close"
        assert _counts(db) == before
        # within the limit, the same way, it is taken
        small = c.post(
            "/v1/sessions/chunked/turns",
            content=iter([b'{"question": ', b'"hello"}']),
            headers={"Content-Type": "application/json"},
        )
        assert small.status_code == 200 and "committed" in small.text


# -- refused questions change nothing ----------------------------------------


def test_questions_refused_for_their_shape_write_nothing_and_create_no_session(
    service: Serve, db: Path
) -> None:
    with service.client() as c:
        before = _counts(db)
        for i in range(20):
            _error(
                c.post(f"/v1/sessions/new-{i}/turns", json={"question": ""}), 400, "empty_question"
            )
            r = c.post(f"/v1/sessions/new-{i}/turns", json={"question": " \n\t "})
            _error(r, 400, "empty_question")
            r = c.post(f"/v1/sessions/new-{i}/turns", json={"question": "x" * 5000})
            error = _error(r, 413, "over_budget")
            assert "the budget is 2000" in error["message"]
        assert _counts(db) == before
        for i in range(20):
            _error(c.get(f"/v1/sessions/new-{i}"), 404, "unknown_session")
        # a session that exists: the same refusals, and nothing appended
        post_turn(c, "old", "hello", rid="o1")
        before = _counts(db)
        _error(c.post("/v1/sessions/old/turns", json={"question": ""}), 400, "empty_question")
        r = c.post("/v1/sessions/old/turns", json={"question": "x" * 5000, "request_id": "o2"})
        _error(r, 413, "over_budget")
        assert _counts(db) == before
        # the refused id was not recorded: it may be asked again, well formed
        status, events = post_turn(c, "old", "again", rid="o2")
        assert status == 200 and events[-1]["data"]["kind"] == "committed"


def test_a_busy_refusal_writes_nothing(service: Serve, db: Path) -> None:
    with service.client() as c, service.client() as other:
        turns = "/v1/sessions/busy-1/turns"
        with c.stream("POST", turns, json={"question": "slow 40", "request_id": "b1"}) as r:
            sse_events(r, stop_after_deltas=1)
            before = _counts(db)
            for i in range(10):
                q = {"question": f"second {i}", "request_id": f"b2-{i}"}
                _error(other.post(turns, json=q), 409, "busy")
            _error(other.post(turns, json={"question": "no id"}), 409, "busy")
            assert _counts(db) == before
            # the turn in flight, asked again by its id, is joined, not refused
            with other.stream("POST", turns, json={"question": "slow 40", "request_id": "b1"}) as j:
                assert j.status_code == 200
                assert sse_events(j)[-1]["data"]["kind"] == "committed"
            sse_events(r)


# -- query parameters -----------------------------------------------------


def test_after_and_at_take_the_documented_maximum(service: Serve) -> None:
    with service.client() as c:
        post_turn(c, "edges", "hello", rid="e1")
        top = str(10**18)
        assert c.get("/v1/sessions", params={"after": top}).json()["sessions"] == []
        assert c.get("/v1/sessions/edges/events", params={"after": top}).json()["events"] == []
        _error(c.get("/v1/sessions/edges/state", params={"at": top}), 404, "unknown_seq")
        over = str(10**18 + 1)
        for path, name in [
            ("/v1/sessions", "after"),
            ("/v1/sessions/edges/events", "after"),
            ("/v1/sessions/edges/state", "at"),
        ]:
            error = _error(c.get(path, params={name: over}), 400, "bad_parameter")
            assert str(10**18) in error["message"] or "1000000000000000000" in error["message"]
            _error(c.get(path, params={name: "9" * 40}), 400, "bad_parameter")


# -- connections -----------------------------------------------------------


def _h11_request(
    sock: socket.socket, conn: h11.Connection, method: str, target: str, body: bytes = b""
) -> tuple[h11.Response, bytes]:
    headers = [("Host", "127.0.0.1"), ("Content-Type", "application/json")]
    if body:
        headers.append(("Content-Length", str(len(body))))
    sock.sendall(conn.send(h11.Request(method=method, target=target, headers=headers)) or b"")
    if body:
        sock.sendall(conn.send(h11.Data(data=body)) or b"")
    sock.sendall(conn.send(h11.EndOfMessage()) or b"")
    response: h11.Response | None = None
    data = b""
    while True:
        event = conn.next_event()
        if event is h11.NEED_DATA:
            conn.receive_data(sock.recv(65536))
            continue
        if isinstance(event, h11.Response):
            response = event
        elif isinstance(event, h11.Data):
            data += bytes(event.data)
        elif isinstance(event, h11.EndOfMessage):
            assert response is not None
            return response, data


def _header(response: h11.Response, name: bytes) -> bytes | None:
    return next((v for k, v in response.headers if k == name), None)


def test_a_stream_ends_its_connection(service: Serve) -> None:
    with socket.create_connection(("127.0.0.1", _port(service)), timeout=10) as sock:
        conn = h11.Connection(h11.CLIENT)
        response, body = _h11_request(
            sock, conn, "POST", "/v1/sessions/sse-close/turns", b'{"question": "hello"}'
        )
        assert b"event: outcome" in body
        assert _header(response, b"connection") == b"close"
        assert conn.our_state is h11.MUST_CLOSE
        assert sock.recv(1) == b""  # and the server closed it
    with socket.create_connection(("127.0.0.1", _port(service)), timeout=10) as sock:
        conn = h11.Connection(h11.CLIENT)
        response, _ = _h11_request(sock, conn, "GET", "/healthz")
        assert _header(response, b"connection") is None  # a plain answer keeps it
        conn.start_next_cycle()
        again, _ = _h11_request(sock, conn, "GET", "/healthz")
        assert again.status_code == 200


def test_an_answer_before_the_body_was_read_closes_and_the_next_request_works(
    service: Serve,
) -> None:
    big = b'{"question": "' + b"x" * 20_000 + b'"}'
    with service.client() as c:
        for i in range(20):
            r = c.post(
                "/v1/sessions/early/turns",
                content=big,
                headers={"Content-Type": "application/json"},
            )
            _error(r, 413, "body_too_large")
            assert r.headers["connection"] == "close"
            # the same client's next request, on the pool's connection
            assert c.get("/healthz").status_code == 200, i
            r = c.post(
                "/v1/sessions/early/turns", content=big, headers={"Content-Type": "text/plain"}
            )
            _error(r, 415, "unsupported_media_type")
            assert r.headers["connection"] == "close"
            assert c.get("/healthz").status_code == 200, i


def test_a_half_sent_request_is_dropped_after_the_header_timeout(
    provider: LoopbackServer, tmp_path: Path
) -> None:
    with running(tmp_path / "h.db", provider.openai_base_url, "--header-timeout", "0.5") as serve:
        with socket.create_connection(("127.0.0.1", _port(serve)), timeout=10) as sock:
            started = time.monotonic()
            sock.sendall(b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\n")  # no blank line
            assert sock.recv(1024) == b""  # closed, well before the 10 s timeout
            waited = time.monotonic() - started
        assert 0.4 < waited < 5, waited
        with serve.client() as c:
            assert c.get("/healthz").status_code == 200


def test_sigterm_with_an_idle_keep_alive_client_exits_within_the_grace(
    provider: LoopbackServer, tmp_path: Path
) -> None:
    grace = 1.0
    with (
        running(tmp_path / "term.db", provider.openai_base_url, "--grace", str(grace)) as serve,
        serve.client() as c,
    ):
        # a streamed turn and a plain request, then the client keeps its
        # connections open and says nothing
        status, events = post_turn(c, "term", "hello")
        assert status == 200 and events[-1]["data"]["kind"] == "committed"
        assert c.get("/healthz").status_code == 200
        with socket.create_connection(("127.0.0.1", _port(serve)), timeout=10) as idle:
            conn = h11.Connection(h11.CLIENT)
            _h11_request(idle, conn, "POST", "/v1/sessions/term/turns", b'{"question": "hi"}')
            started = time.monotonic()
            serve.proc.send_signal(signal.SIGTERM)
            code = serve.proc.wait(30)
            took = time.monotonic() - started
    assert code == 0
    assert took < grace + 2, f"exit took {took:.2f} s with --grace {grace}"


@pytest.mark.parametrize(
    ("raw", "status"),
    [
        (b"GARBAGE\r\n\r\n", 400),
        (b"GET /v1/ses\x00sions HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n", 400),
        (b"GET /a b HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n", 400),
        (b"GET /healthz HTTP/1.1\r\n\r\n", 400),
        (
            b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Big: " + b"a" * 100_000 + b"\r\n\r\n",
            431,
        ),
    ],
    ids=["request-line", "nul-in-path", "space-in-path", "no-host", "100-kb-header"],
)
def test_protocol_errors_are_answered_as_the_docs_list_them(
    service: Serve, raw: bytes, status: int
) -> None:
    with socket.create_connection(("127.0.0.1", _port(service)), timeout=10) as sock:
        sock.sendall(raw)
        data = b""
        while chunk := sock.recv(65536):
            data += chunk
    head, _, body = data.partition(b"\r\n\r\n")
    assert head.startswith(f"HTTP/1.1 {status} ".encode()), head
    assert b"connection: close" in head.lower() and body == b""


def test_a_question_over_the_window_alone_is_refused_at_the_edge(
    provider: LoopbackServer, tmp_path: Path
) -> None:
    # No caps: only the model's context window (the fallback 8,192 tokens
    # here) bounds a question, for a session that exists and for a new one.
    db = tmp_path / "w.db"
    huge = "word " * 40_000  # about 50,000 tokens by the estimate
    with running(db, provider.openai_base_url) as serve, serve.client() as c:
        post_turn(c, "exists", "hello", rid="e1")
        before = _counts(db)
        r = c.post("/v1/sessions/exists/turns", json={"question": huge})
        error = _error(r, 413, "over_budget")
        assert "tokens; the budget is" in error["message"]
        assert _counts(db) == before  # measured with the session's window: nothing written
        # A new session: measured with the window it would get; not created.
        r = c.post("/v1/sessions/fresh/turns", json={"question": huge})
        error = _error(r, 413, "over_budget")
        assert "tokens; the budget is" in error["message"]
        assert _counts(db) == before
        assert c.get("/v1/sessions/fresh/events").status_code == 404
        # Within the window, the same new session is created and answers.
        status, _ = post_turn(c, "fresh", "hello", rid="f1")
        assert status == 200


def test_questions_racing_into_one_session_are_one_turn_and_refusals_that_write_nothing(
    service: Serve, db: Path
) -> None:
    from concurrent.futures import ThreadPoolExecutor

    def ask(i: int) -> int:
        with service.client() as c:
            status, _ = post_turn(c, "race", "slow 20", rid=f"race-{i}")
            return status

    with ThreadPoolExecutor(8) as pool:
        statuses = list(pool.map(ask, range(8)))
    with service.client() as c:
        tags = [e["tag"] for e in c.get("/v1/sessions/race/events").json()["events"]]
    assert tags.count("turn_rejected") == 0, tags
    assert tags.count("turn_submitted") == statuses.count(200) >= 1
    assert sorted(set(statuses)) in ([200], [200, 409]), statuses


@pytest.mark.parametrize(
    ("given", "origin"),
    [
        ("http://Localhost:3000/", "http://localhost:3000"),
        ("http://localhost:80", "http://localhost"),  # as a browser writes it
        ("https://App.example:443", "https://app.example"),
        ("http://[::1]:8080", "http://[::1]:8080"),
    ],
)
def test_an_allowed_origin_is_written_as_a_browser_sends_it(given: str, origin: str) -> None:
    from turnledger.serve._app import check_origin

    assert check_origin(given) == origin
