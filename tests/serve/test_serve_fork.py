"""POST /v1/sessions/{id}/fork through ``turnledger serve`` over real HTTP: a
child process on SQLite, the loopback OpenAI-compatible server behind it."""

from __future__ import annotations

import sqlite3
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from serve._harness import Serve, loopback, post_turn, running

pytestmark = [pytest.mark.loopback]


@pytest.fixture(scope="module")
def service(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Serve, Path]]:
    db = tmp_path_factory.mktemp("forks") / "serve.db"
    with loopback() as provider, running(db, provider.openai_base_url) as serve:
        yield serve, db


def _post(c: httpx.Client, path: str, body: Any) -> tuple[int, Any]:
    r = c.post(path, json=body)
    return r.status_code, r.json()


def _error(status_and_body: tuple[int, Any], status: int, code: str) -> None:
    got, body = status_and_body
    assert (got, body["error"]["code"]) == (status, code), body


def _rows(db: Path) -> list[tuple[Any, ...]]:
    con = sqlite3.connect(db)
    try:
        return list(con.execute("select * from events order by 1"))
    finally:
        con.close()


def _questions(c: httpx.Client, session: str) -> list[str]:
    return [t["question"] for t in c.get(f"/v1/sessions/{session}").json()["turns"]]


def test_a_fork_over_http_shares_the_prefix(service: tuple[Serve, Path]) -> None:
    serve, db = service
    with serve.client() as c:
        for q in ("one", "two", "three"):
            _status, events = post_turn(c, "src", q)
            assert events[-1]["data"]["kind"] == "committed"
        before = _rows(db)
        status, body = _post(c, "/v1/sessions/src/fork", {"session_id": "fk", "at_turn": 2})
        assert status == 201
        assert body == {
            "session_id": "fk",
            "source": "src",
            "source_seq": 10,  # started, then three events per turn
            "branch": "main",
            "at_turn": 2,
        }
        after = _rows(db)
        assert after[: len(before)] == before and len(after) == len(before) + 2
        assert _questions(c, "fk") == ["one", "two"]
        _status, events = post_turn(c, "fk", "trois")
        assert events[-1]["data"]["kind"] == "committed"
        assert _questions(c, "fk") == ["one", "two", "trois"]
        assert _questions(c, "src") == ["one", "two", "three"]
        timeline = c.get("/v1/sessions/fk/timeline").json()
        assert [h[1] if isinstance(h, list) else h["question"] for h in timeline["history"]] == [
            "one",
            "two",
            "trois",
        ]
        state = c.get("/v1/sessions/fk/state", params={"at": 2}).json()
        assert [t["question"] for t in state["turns"]] == ["one", "two"]
        listed = {s["session_id"]: s["turns"] for s in c.get("/v1/sessions").json()["sessions"]}
        assert listed["fk"] == 3
        # the default keeps every turn
        status, body = _post(c, "/v1/sessions/fk/fork", {"session_id": "fk2"})
        assert status == 201 and body["at_turn"] == 3
        assert _questions(c, "fk2") == ["one", "two", "trois"]
        # erasing the source erases both forks
        assert c.delete("/v1/sessions/src").status_code == 200
        for sid in ("src", "fk", "fk2"):
            assert c.get(f"/v1/sessions/{sid}").status_code == 404


def test_bad_fork_input_is_400_or_404_and_writes_nothing(service: tuple[Serve, Path]) -> None:
    serve, db = service
    with serve.client() as c:
        _status, events = post_turn(c, "base", "one")
        assert events[-1]["data"]["kind"] == "committed"
        post_turn(c, "taken", "one")
        before = _rows(db)
        fork = "/v1/sessions/base/fork"
        _error(_post(c, "/v1/sessions/nobody/fork", {"session_id": "x"}), 404, "unknown_session")
        _error(_post(c, fork, {"session_id": "x", "at_turn": 2}), 404, "unknown_turn")
        _error(_post(c, fork, {"session_id": "x", "at_turn": -1}), 404, "unknown_turn")
        _error(_post(c, fork, {"session_id": "taken"}), 400, "session_exists")
        _error(_post(c, fork, {"session_id": "base"}), 400, "session_exists")
        _error(_post(c, fork, {"session_id": 3}), 400, "bad_field")
        _error(_post(c, fork, {"session_id": "x", "at_turn": "1"}), 400, "bad_field")
        _error(_post(c, fork, {"session_id": "x", "other": 1}), 400, "bad_field")
        _error(_post(c, fork, {}), 400, "bad_field")
        assert _rows(db) == before
        assert c.get("/v1/sessions/x").status_code == 404
