"""``OllamaChat``: Ollama's native ``/api/chat`` (NDJSON streaming)."""

from __future__ import annotations

import os
from collections.abc import Mapping
from types import TracebackType
from typing import Any

import httpx

from ...sessions._ports import ChatRequest, Completion, StreamSink
from ...sessions._request import JsonChatEncoder
from ._http import ChatTransport, Secret
from ._limits import StreamLimits
from ._ollama_chunks import OllamaResponseDecoder, OllamaStreamDecoder
from ._retry import RetryPolicy

__all__ = ["DEFAULT_OLLAMA_TIMEOUT", "OllamaChat"]

#: Ollama loads a model on first use, which can take minutes on a laptop
#: before the first byte; hence a longer read timeout than for hosted APIs.
DEFAULT_OLLAMA_TIMEOUT = httpx.Timeout(connect=10.0, read=300.0, write=30.0, pool=10.0)

_OWNED = ("model", "messages", "stream")


def _base_url(value: str | None) -> str:
    base = value or os.environ.get("OLLAMA_HOST") or "http://127.0.0.1:11434"
    if "://" not in base:
        base = "http://" + base  # OLLAMA_HOST is often host:port
    return base.rstrip("/")


class OllamaChat:
    """A :class:`~turnledger.sessions.Provider` for Ollama's ``/api/chat``.

    Streams ``application/x-ndjson`` through the same byte and UTF-8 layers
    as the SSE provider, with NDJSON framing; ``done: true`` with
    ``done_reason: "stop"`` is the only answer the session commits.

    Args:
        base_url: e.g. ``http://127.0.0.1:11434`` (the default); falls back
            to ``OLLAMA_HOST`` (``host:port`` is accepted).
        api_key: a bearer token for an Ollama behind an authenticating proxy
            (falls back to ``OLLAMA_API_KEY``); never logged.
        stream: stream NDJSON, or ask for one JSON object.
        options: Ollama's ``options`` (``temperature``, ``num_predict``, ``num_ctx``...).
        keep_alive: how long Ollama keeps the model loaded (``"5m"``, ``0``...).
        extra: further top-level request fields (``think``, ``format``...).
        headers, timeout, limits, retry, read_size, client, trust_env: as for
            :class:`~turnledger.adapters.providers.OpenAIChat` (the default
            timeout is :data:`DEFAULT_OLLAMA_TIMEOUT`).
    """

    def __init__(
        self,
        *,
        base_url: str | None = None,
        api_key: str | None = None,
        stream: bool = True,
        options: Mapping[str, Any] | None = None,
        keep_alive: str | int | None = None,
        extra: Mapping[str, Any] | None = None,
        headers: Mapping[str, str] | None = None,
        timeout: httpx.Timeout | float | None = DEFAULT_OLLAMA_TIMEOUT,
        limits: StreamLimits | None = None,
        retry: RetryPolicy | None = None,
        read_size: int | None = None,
        client: httpx.AsyncClient | None = None,
        trust_env: bool = True,
    ) -> None:
        key = api_key if api_key is not None else os.environ.get("OLLAMA_API_KEY")
        fields: dict[str, Any] = {}
        if options is not None:
            fields["options"] = dict(options)
        if keep_alive is not None:
            fields["keep_alive"] = keep_alive
        for name, value in (extra or {}).items():
            if name in _OWNED:
                msg = f"extra field {name!r} is set by the session, not the provider"
                raise ValueError(msg)
            fields[name] = value
        self._stream = stream
        self._encoder = JsonChatEncoder(stream=stream, extra=fields)
        self._owns_client = client is None
        self._client = client or httpx.AsyncClient(timeout=timeout, trust_env=trust_env)
        self._limits = limits or StreamLimits()
        accept = "application/x-ndjson" if stream else "application/json"
        self._transport = ChatTransport(
            provider="ollama",
            url=_base_url(base_url) + "/api/chat",
            headers={"Content-Type": "application/json", "Accept": accept, **(headers or {})},
            api_key=Secret(key) if key else None,
            client=self._client,
            limits=self._limits,
            retry=retry,
            read_size=read_size,
        )

    @property
    def encoder(self) -> JsonChatEncoder:
        """The encoder whose bytes are sent; the projection measures with it."""
        return self._encoder

    @property
    def url(self) -> str:
        return self._transport.url

    @property
    def limits(self) -> StreamLimits:
        return self._limits

    async def complete(self, request: ChatRequest, sink: StreamSink) -> Completion:
        """Send ``request``; stream the answer's text into ``sink``.

        As :meth:`OpenAIChat.complete <turnledger.adapters.providers.OpenAIChat.complete>`,
        with media type ``application/x-ndjson`` (``application/json`` when
        not streaming) and ``done_reason`` as the finish reason.

        Cancellation: closes the response and its connection; no result.
        """
        body = self._encoder.encode(request.model, request.messages)
        if self._stream:
            return await self._transport.post(
                request,
                body,
                sink,
                media_types=("application/x-ndjson",),
                decoder=OllamaStreamDecoder,
            )
        return await self._transport.post(
            request, body, sink, media_types=("application/json",), decoder=OllamaResponseDecoder
        )

    async def aclose(self) -> None:
        """Close the owned HTTP client (a client passed in is left open)."""
        if self._owns_client:
            await self._client.aclose()

    async def __aenter__(self) -> OllamaChat:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.aclose()

    def __repr__(self) -> str:
        return f"OllamaChat(url={self.url!r}, stream={self._stream})"
