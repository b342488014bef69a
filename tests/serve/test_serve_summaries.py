"""Summaries and pinned items through ``turnledger serve`` over real HTTP: a
child process on SQLite, the loopback OpenAI-compatible server behind it."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from serve._harness import Serve, loopback, post_turn, running
from serve.test_serve_branches import _events
from turnledger.runtime import PROMPTS
from turnledger.testing import LoopbackServer

pytestmark = [pytest.mark.loopback]


@pytest.fixture(scope="module")
def service(
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[tuple[Serve, Path, LoopbackServer]]:
    db = tmp_path_factory.mktemp("summaries") / "serve.db"
    with loopback() as provider, running(db, provider.openai_base_url) as serve:
        yield serve, db, provider


def _error(r: httpx.Response, status: int, code: str) -> None:
    assert (r.status_code, r.json()["error"]["code"]) == (status, code), r.text


def test_summarize_over_http_and_bad_input(service: tuple[Serve, Path, LoopbackServer]) -> None:
    serve, db, provider = service
    with serve.client() as c:
        for q in ("one", "two", "three"):
            status, events = post_turn(c, "s", q)
            assert status == 200 and events[-1]["data"]["kind"] == "committed"
        before = _events(db)
        base = "/v1/sessions/s"
        _error(c.post("/v1/sessions/nobody/summarize", json={}), 404, "unknown_session")
        _error(c.post(f"{base}/summarize", json={"end": 9}), 404, "unknown_turn")
        _error(c.post(f"{base}/summarize", json={"start": 2, "end": 2}), 404, "unknown_turn")
        _error(c.post(f"{base}/summarize", json={"branch": "b4"}), 404, "unknown_branch")
        _error(c.post(f"{base}/summarize", json={"start": "0"}), 400, "bad_field")
        _error(c.post(f"{base}/summarize", json={"prompt": "poem"}), 400, "bad_field")
        _error(c.post(f"{base}/summarize", json={"text": "mine"}), 400, "bad_field")
        assert _events(db) == before
        asked = len(provider.exchanges)
        r = c.post(f"{base}/summarize", json={"end": 2, "prompt": "facts"})
        assert r.status_code == 201, r.text
        summary = r.json()["summary"]
        assert (summary["summary_id"], summary["start"], summary["end"]) == ("s1", 0, 2)
        assert (summary["origin"], summary["origin_name"]) == ("model", "facts")
        assert summary["usage"] == {"prompt_tokens": 9, "completion_tokens": 4, "total_tokens": 13}
        # the model was asked with the named prompt and the two turns as text
        sent = provider.exchanges[asked].json()["messages"]
        assert sent[0]["content"] == PROMPTS["facts"]
        assert (
            sent[1]["content"]
            == "User: one\nAssistant: echo: one\n\nUser: two\nAssistant: echo: two"
        )
        assert summary["text"] == "echo: " + sent[1]["content"]
        listed = c.get(f"{base}/summaries").json()["summaries"]
        assert listed == [summary]
        assert _events(db) == before + 1
        _error(c.get("/v1/sessions/nobody/summaries"), 404, "unknown_session")
        # history is what it was
        turns = c.get(base).json()["turns"]
        assert [t["question"] for t in turns] == ["one", "two", "three"]


def test_pins_over_http(service: tuple[Serve, Path, LoopbackServer]) -> None:
    serve, db, provider = service
    with serve.client() as c:
        base = "/v1/sessions/p"
        _error(
            c.post(f"{base}/pins", json={"text": "t", "origin": "memory"}), 404, "unknown_session"
        )
        status, _ = post_turn(c, "p", "hello")
        assert status == 200
        r = c.post(f"{base}/pins", json={"text": "The user is Ada.", "origin": "memory"})
        assert r.status_code == 201, r.text
        assert r.json()["pins"] == [
            {"pin_id": "p1", "text": "The user is Ada.", "origin": "memory"}
        ]
        before = _events(db)
        _error(c.post(f"{base}/pins", json={"text": "", "origin": "memory"}), 400, "bad_request")
        _error(c.post(f"{base}/pins", json={"text": 3, "origin": "memory"}), 400, "bad_field")
        _error(
            c.post(f"{base}/pins", json={"text": "t", "origin": "m", "pin_id": "p1"}),
            400,
            "bad_request",
        )
        _error(c.delete(f"{base}/pins/p9"), 404, "unknown_pin")
        assert _events(db) == before
        status, events = post_turn(c, "p", "who am I?")
        assert status == 200 and events[-1]["data"]["kind"] == "committed"
        sent = [m["content"] for m in provider.exchanges[-1].json()["messages"]]
        assert sent[:1] == ["The user is Ada."] and sent[-1] == "who am I?"
        assert c.get(f"{base}/pins").json()["pins"][0]["pin_id"] == "p1"
        r = c.delete(f"{base}/pins/p1")
        assert r.status_code == 200 and r.json()["pins"] == []
        status, _ = post_turn(c, "p", "and now?")
        sent = [m["content"] for m in provider.exchanges[-1].json()["messages"]]
        assert "The user is Ada." not in sent
