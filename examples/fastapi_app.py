"""A FastAPI app that streams each turn's preview as Server-Sent Events.

The same file runs both ways (docs/asyncio.md):

- on uvicorn (asyncio), through ``turnledger.aio``::

      uvicorn examples.fastapi_app:app

- on Hypercorn's trio worker, with the trio hub itself::

      hypercorn --worker-class trio examples.fastapi_app:app

Settings come from the environment: ``CHATS_DB`` (the SQLite file, default
``chats.db``), ``MODEL_URL`` (an OpenAI-compatible base URL, default
``http://127.0.0.1:8080/v1``) and ``MODEL`` (default ``llama3``).

``POST /chat/{session_id}`` with ``{"question": ..., "request_id": ...}``
answers with ``text/event-stream``: one ``delta`` event per preview chunk,
then one ``outcome`` event with the result as JSON. A client that goes away
mid-stream only stops reading: its turn still ends by the hub's rules
(committed, or discarded by a timeout), and a retry with the same
``request_id`` gets that outcome. ``GET /history/{session_id}`` returns the
committed turns.
"""

from __future__ import annotations

import json
import os
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import attrs
import sniffio
from fastapi import FastAPI, Request
from fastapi.responses import StreamingResponse
from pydantic import BaseModel

from turnledger import aio
from turnledger.adapters.providers import OpenAIChat
from turnledger.adapters.stores import SQLiteStore
from turnledger.sessions import open_hub

DB = os.environ.get("CHATS_DB", "chats.db")
MODEL_URL = os.environ.get("MODEL_URL", "http://127.0.0.1:8080/v1")
MODEL = os.environ.get("MODEL", "llama3")


@asynccontextmanager
async def lifespan(app: FastAPI) -> AsyncIterator[None]:
    if sniffio.current_async_library() == "trio":
        # Hypercorn's trio worker: the trio hub, nothing in between.
        store = await SQLiteStore.open(DB)
        try:
            async with (
                OpenAIChat(base_url=MODEL_URL) as provider,
                open_hub(store, provider, model=MODEL) as hub,
            ):
                app.state.hub = hub
                yield
        finally:
            await store.aclose()
    else:
        # asyncio (uvicorn): trio runs as a guest on uvicorn's loop. The store
        # and the provider are opened (and closed) on the trio side.
        async with aio.open_hub(
            lambda: SQLiteStore.open(DB), lambda: OpenAIChat(base_url=MODEL_URL), model=MODEL
        ) as hub:
            app.state.hub = hub
            yield


app = FastAPI(lifespan=lifespan)


class Ask(BaseModel):
    question: str
    request_id: str | None = None


def sse(event: str, data: Any) -> str:
    return f"event: {event}\ndata: {json.dumps(data)}\n\n"


@app.post("/chat/{session_id}")
async def chat(session_id: str, ask: Ask, request: Request) -> StreamingResponse:
    hub = request.app.state.hub
    turn = await hub.submit(session_id, ask.question, request_id=ask.request_id)

    async def events() -> AsyncIterator[str]:
        # If the client disconnects, this generator is cancelled: that stops
        # the reading, never the turn (only turn.cancel() cancels a turn).
        async for delta in turn.preview():
            yield sse("delta", delta)
        result = await turn.outcome()
        yield sse("outcome", {"kind": result.kind, **attrs.asdict(result)})

    return StreamingResponse(events(), media_type="text/event-stream")


@app.get("/history/{session_id}")
async def history(session_id: str, request: Request) -> list[dict[str, str]]:
    turns = await request.app.state.hub.history(session_id)
    return [{"request_id": t.request_id, "question": t.question, "answer": t.answer} for t in turns]
