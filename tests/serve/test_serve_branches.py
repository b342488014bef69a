"""Edit, regenerate, switch and branches through ``turnledger serve`` over
real HTTP: a child process on SQLite, the loopback OpenAI-compatible server
behind it."""

from __future__ import annotations

import sqlite3
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from serve._harness import Serve, loopback, post_turn, running, sse_events

pytestmark = [pytest.mark.loopback]


@pytest.fixture(scope="module")
def service(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Serve, Path]]:
    db = tmp_path_factory.mktemp("branches") / "serve.db"
    with loopback() as provider, running(db, provider.openai_base_url) as serve:
        yield serve, db


def _post(c: httpx.Client, path: str, body: dict[str, Any]) -> tuple[int, Any]:
    with c.stream("POST", path, json=body) as r:
        if r.headers["content-type"].startswith("text/event-stream"):
            return r.status_code, sse_events(r)
        r.read()
        return r.status_code, r.json()


def _questions(c: httpx.Client, session: str) -> list[str]:
    return [t["question"] for t in c.get(f"/v1/sessions/{session}").json()["turns"]]


def _error(status_and_body: tuple[int, Any], status: int, code: str) -> None:
    got, body = status_and_body
    assert (got, body["error"]["code"]) == (status, code), body


def _events(db: Path) -> int:
    con = sqlite3.connect(db)
    try:
        (n,) = con.execute("select count(*) from events").fetchone()
    finally:
        con.close()
    return int(n)


def test_edit_regenerate_and_switch_over_http(service: tuple[Serve, Path]) -> None:
    serve, _ = service
    with serve.client() as c:
        for q in ("one", "two"):
            status, events = post_turn(c, "s", q)
            assert status == 200 and events[-1]["data"]["kind"] == "committed"
        status, events = _post(
            c, "/v1/sessions/s/edit", {"turn_index": 1, "question": "deux", "request_id": "e1"}
        )
        assert status == 200
        assert events[0]["data"] == {"session_id": "s", "request_id": "e1"}
        assert events[-1]["data"]["kind"] == "committed"
        assert events[-1]["data"]["answer"] == "echo: deux"
        assert _questions(c, "s") == ["one", "deux"]
        status, events = _post(c, "/v1/sessions/s/regenerate", {})
        assert status == 200 and events[-1]["data"]["answer"] == "echo: deux"
        listed = c.get("/v1/sessions/s/branches").json()
        assert listed["active_branch"] == "b2"
        assert [(b["branch_id"], b["parent"], b["at_turn"], b["kind"], b["length"])
                for b in listed["branches"]] == [
            ("main", None, 0, None, 2),
            ("b1", "main", 1, "edit", 2),
            ("b2", "b1", 1, "regenerate", 2),
        ]  # fmt: skip
        status, body = _post(c, "/v1/sessions/s/switch", {"branch": "main"})
        assert status == 200 and body["active_branch"] == "main"
        assert _questions(c, "s") == ["one", "two"]
        # main goes on from its own turns
        status, events = post_turn(c, "s", "three")
        assert events[-1]["data"]["kind"] == "committed"
        assert _questions(c, "s") == ["one", "two", "three"]
        timeline = c.get("/v1/sessions/s/timeline").json()
        assert [b["branch_id"] for b in timeline["branches"]] == ["main", "b1", "b2"]
        assert timeline["active_branch"] == "main"


def test_bad_branch_input_is_400_or_404_and_writes_nothing(service: tuple[Serve, Path]) -> None:
    serve, db = service
    with serve.client() as c:
        _status, events = post_turn(c, "bad", "one")
        assert events[-1]["data"]["kind"] == "committed"
        before = _events(db)
        _error(_post(c, "/v1/sessions/bad/edit", {"turn_index": 5, "question": "q"}), 404,
               "unknown_turn")  # fmt: skip
        _error(_post(c, "/v1/sessions/bad/edit", {"turn_index": -1, "question": "q"}), 404,
               "unknown_turn")  # fmt: skip
        _error(_post(c, "/v1/sessions/bad/switch", {"branch": "b9"}), 404, "unknown_branch")
        _error(_post(c, "/v1/sessions/nobody/edit", {"turn_index": 0, "question": "q"}), 404,
               "unknown_session")  # fmt: skip
        _error(_post(c, "/v1/sessions/nobody/regenerate", {}), 404, "unknown_session")
        _error(_post(c, "/v1/sessions/nobody/switch", {"branch": "main"}), 404, "unknown_session")
        assert c.get("/v1/sessions/nobody/branches").status_code == 404
        _error(_post(c, "/v1/sessions/bad/edit", {"turn_index": "0", "question": "q"}), 400,
               "bad_field")  # fmt: skip
        _error(_post(c, "/v1/sessions/bad/edit", {"turn_index": 0}), 400, "bad_field")
        _error(_post(c, "/v1/sessions/bad/switch", {"branch": 3}), 400, "bad_field")
        _error(_post(c, "/v1/sessions/bad/switch", {"branch": "main", "x": 1}), 400, "bad_field")
        _error(_post(c, "/v1/sessions/bad/regenerate", {"question": "q"}), 400, "bad_field")
        assert _events(db) == before
        assert c.get("/v1/sessions/nobody").status_code == 404


def _in_flight(c: httpx.Client, session: str) -> str:
    deadline = time.monotonic() + 15
    while time.monotonic() < deadline:
        state = c.get(f"/v1/sessions/{session}").json()
        if state["in_flight"] and state["phase"] == "streaming":
            return str(state["in_flight"])
        time.sleep(0.05)
    raise AssertionError("no turn streaming")


def test_a_switch_while_a_turn_is_in_flight_is_409(service: tuple[Serve, Path]) -> None:
    serve, db = service
    with serve.client() as c, serve.client() as other:
        post_turn(c, "busy", "one")
        _post(c, "/v1/sessions/busy/edit", {"turn_index": 0, "question": "uno"})
        # a question the model never answers; its stream stays open
        with other.stream("POST", "/v1/sessions/busy/turns", json={"question": "hang"}) as r:
            assert r.status_code == 200
            rid = _in_flight(c, "busy")
            before = _events(db)
            _error(_post(c, "/v1/sessions/busy/switch", {"branch": "main"}), 409, "busy")
            _error(_post(c, "/v1/sessions/busy/regenerate", {}), 409, "busy")
            _error(_post(c, "/v1/sessions/busy/edit", {"turn_index": 0, "question": "x"}), 409,
                   "busy")  # fmt: skip
            assert _events(db) == before
            assert c.post(f"/v1/sessions/busy/turns/{rid}/cancel", json={}).status_code == 200
        assert _questions(c, "busy") == ["uno"]
        status, _body = _post(c, "/v1/sessions/busy/switch", {"branch": "main"})
        assert status == 200 and _questions(c, "busy") == ["one"]


def test_a_session_without_a_turn_has_none_to_edit_or_ask_again(
    service: tuple[Serve, Path],
) -> None:
    serve, db = service
    with serve.client() as c:
        # the session's only question never committed (cancelled mid-stream)
        with c.stream("POST", "/v1/sessions/none/turns", json={"question": "hang"}) as r:
            assert r.status_code == 200
            rid = _in_flight(c, "none")
            assert c.post(f"/v1/sessions/none/turns/{rid}/cancel", json={}).status_code == 200
        assert _questions(c, "none") == []
        before = _events(db)
        _error(_post(c, "/v1/sessions/none/regenerate", {}), 404, "unknown_turn")
        _error(_post(c, "/v1/sessions/none/edit", {"turn_index": 0, "question": "q"}), 404,
               "unknown_turn")  # fmt: skip
        assert _events(db) == before
        # an edit whose question is empty is refused before the hub: no branch
        post_turn(c, "none", "one")
        before = _events(db)
        _error(_post(c, "/v1/sessions/none/edit", {"turn_index": 0, "question": " \n"}), 400,
               "empty_question")  # fmt: skip
        assert _events(db) == before
        listed = c.get("/v1/sessions/none/branches").json()
        assert [b["branch_id"] for b in listed["branches"]] == ["main"]


def _answer(c: httpx.Client, path: str, body: dict[str, Any]) -> str:
    status, events = _post(c, path, body)
    assert status == 200 and events[-1]["data"]["kind"] == "committed", events
    return str(events[-1]["data"]["answer"])


def test_the_branch_routes_against_the_built_in_loopback_model(tmp_path: Path) -> None:
    # serve without --base-url: the built-in loopback model server, whose
    # answer says what the request held, so each answer shows the branch's path.
    with running(tmp_path / "lb.db", None) as serve, serve.client() as c:
        turns = "/v1/sessions/lb/turns"
        assert "held 0 earlier" in _answer(c, turns, {"question": "one"})
        assert "held 1 earlier" in _answer(c, turns, {"question": "two"})
        edited = _answer(c, "/v1/sessions/lb/edit", {"turn_index": 1, "question": "deux"})
        assert "You said: 'deux'. The request held 1 earlier" in edited
        again = _answer(c, "/v1/sessions/lb/regenerate", {})
        assert "You said: 'deux'. The request held 1 earlier" in again
        status, body = _post(c, "/v1/sessions/lb/switch", {"branch": "main"})
        assert status == 200 and body["active_branch"] == "main"
        assert "You said: 'three'. The request held 2 earlier" in _answer(
            c, turns, {"question": "three"}
        )
        assert _questions(c, "lb") == ["one", "two", "three"]
        _post(c, "/v1/sessions/lb/switch", {"branch": "b1"})
        assert _questions(c, "lb") == ["one", "deux"]
        _error(_post(c, "/v1/sessions/lb/switch", {"branch": "b7"}), 404, "unknown_branch")


def test_a_repeated_edit_gets_its_outcome_again_and_writes_nothing(
    service: tuple[Serve, Path],
) -> None:
    serve, db = service
    with serve.client() as c:
        post_turn(c, "again", "one")
        body = {"turn_index": 0, "question": "uno", "request_id": "edit-once"}
        first = _answer(c, "/v1/sessions/again/edit", body)
        written = _events(db)
        status, events = _post(c, "/v1/sessions/again/edit", body)
        assert status == 200 and events[-1]["data"]["answer"] == first
        assert events[-1]["data"]["repeated"] is True
        assert _events(db) == written
        listed = c.get("/v1/sessions/again/branches").json()["branches"]
        assert [b["branch_id"] for b in listed] == ["main", "b1"]
