"""The FastAPI recipe (examples/fastapi_app.py) in a real server process.

200 HTTP clients each stream one turn from a uvicorn process (asyncio, through
turnledger.aio) and from a Hypercorn trio-worker process (the trio hub), with
the SQLite store and the loopback provider server. 50 of them disconnect
mid-stream: their turns still commit. The SQLite log replays to the history
the server returned, and no server log line speaks of a cancel scope or of an
async context.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
from pathlib import Path
from typing import Any

import httpx
import pytest
import trio

from _pytest_guards import import_or_skip
from turnledger.adapters.stores import SQLiteStore
from turnledger.sessions import replay_sessions
from turnledger.testing import chat_responder, open_loopback_server

import_or_skip("fastapi", required_by="TURNLEDGER_REQUIRE_FASTAPI")

ROOT = Path(__file__).parents[1]
CLIENTS = 200
LEAVING = 50


def answer_for(messages: list[dict[str, Any]]) -> str:
    return f"the answer to {messages[-1]['content']}, at some length"


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def server_command(kind: str, port: int) -> list[str]:
    if kind == "uvicorn":
        return [sys.executable, "-m", "uvicorn", "fastapi_app:app", "--port", str(port)]
    return [
        sys.executable,
        "-m",
        "hypercorn",
        "--worker-class",
        "trio",
        "--bind",
        f"127.0.0.1:{port}",
        "fastapi_app:app",
    ]


async def wait_up(client: httpx.AsyncClient, proc: subprocess.Popen[bytes]) -> None:
    with trio.fail_after(30):
        while True:
            assert proc.poll() is None, "the server exited at startup"
            try:
                if (await client.get("/history/none")).status_code == 200:
                    return
            except httpx.TransportError:
                pass
            await trio.sleep(0.1)


async def stream_one(client: httpx.AsyncClient, i: int, out: dict[int, Any]) -> None:
    body = {"question": f"q{i}", "request_id": f"r{i}"}
    deltas: list[str] = []
    async with client.stream("POST", f"/chat/c{i}", json=body) as response:
        assert response.status_code == 200
        assert response.headers["content-type"].startswith("text/event-stream")
        event = None
        async for line in response.aiter_lines():
            if line.startswith("event: "):
                event = line[len("event: ") :]
            elif line.startswith("data: "):
                data = json.loads(line[len("data: ") :])
                if event == "delta":
                    deltas.append(data)
                    if i < LEAVING:
                        out[i] = ("left", "".join(deltas))
                        return  # the client goes away mid-stream
                else:
                    out[i] = (data, "".join(deltas))
                    return


async def committed(client: httpx.AsyncClient, i: int) -> list[dict[str, str]]:
    with trio.fail_after(30):
        while True:
            turns: list[dict[str, str]] = (await client.get(f"/history/c{i}")).json()
            if turns:
                return turns
            await trio.sleep(0.05)


@pytest.mark.loopback
@pytest.mark.slow
@pytest.mark.parametrize("kind", ["uvicorn", "hypercorn"])
async def test_streams_from_a_real_server(kind: str, tmp_path: Path) -> None:
    db = tmp_path / "chats.db"
    log = tmp_path / "server.log"
    port = free_port()
    responder = chat_responder(answer_for, chunk_size=6, pause=0.02)
    async with open_loopback_server(responder) as model:
        env = {
            **os.environ,
            "PYTHONPATH": str(ROOT / "examples"),
            "CHATS_DB": str(db),
            "MODEL_URL": model.openai_base_url,
            "MODEL": "loopback",
        }
        with log.open("wb") as out:
            proc = subprocess.Popen(
                server_command(kind, port), env=env, stdout=out, stderr=subprocess.STDOUT
            )
        try:
            limits = httpx.Limits(max_connections=None, max_keepalive_connections=None)
            async with httpx.AsyncClient(
                base_url=f"http://127.0.0.1:{port}", limits=limits, timeout=30
            ) as client:
                await wait_up(client, proc)
                results: dict[int, Any] = {}
                async with trio.open_nursery() as nursery:
                    for i in range(CLIENTS):
                        nursery.start_soon(stream_one, client, i, results)
                histories = {}
                for i in range(CLIENTS):
                    histories[f"c{i}"] = await committed(client, i)
        finally:
            proc.send_signal(signal.SIGINT)
            await trio.to_thread.run_sync(proc.wait, 30)

    text = log.read_text(errors="replace")
    for bad in (
        "cancel scope",
        "must be called from async context",
        "Traceback",
        "never retrieved",
    ):
        assert bad not in text, text[-3000:]

    assert len(results) == CLIENTS
    for i in range(CLIENTS):
        expected = f"the answer to q{i}, at some length"
        status, streamed = results[i]
        if i < LEAVING:
            assert status == "left" and expected.startswith(streamed) and streamed != expected
        else:
            assert status["kind"] == "committed" and status["answer"] == expected
            assert streamed == expected
        assert histories[f"c{i}"] == [
            {"request_id": f"r{i}", "question": f"q{i}", "answer": expected}
        ]

    store = await SQLiteStore.open(db)
    try:
        states = await replay_sessions(store, list(histories))
        for session_id, state in states.items():
            turns = [
                {"request_id": t.request_id, "question": t.question, "answer": t.answer}
                for t in state.turns
            ]
            assert turns == histories[session_id]
            tags = [e.tag for e in await store.read(session_id)]
            assert "turn_discarded" not in tags
    finally:
        await store.aclose()
