"""``OpenAIChat``: any OpenAI-compatible ``/v1/chat/completions`` endpoint.

OpenAI itself, llama.cpp's server, vLLM, LM Studio, Ollama's ``/v1``,
LiteLLM... Streaming (SSE) or not (one JSON body).
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from types import TracebackType
from typing import Any

import httpx

from ...sessions._ports import ChatRequest, Completion, StreamSink
from ...sessions._request import JsonChatEncoder
from ._http import ChatTransport, Secret
from ._limits import StreamLimits
from ._openai_chunks import OpenAIResponseDecoder, OpenAIStreamDecoder
from ._retry import RetryPolicy

__all__ = ["DEFAULT_TIMEOUT", "OpenAIChat"]

#: Connect within 10 s; a read may wait 60 s (the gap between two chunks,
#: or before the first one while a long prompt is processed; servers that
#: generate for long send keep-alive comments every 15 s). The overall
#: deadline of a turn belongs to the session.
DEFAULT_TIMEOUT = httpx.Timeout(connect=10.0, read=60.0, write=30.0, pool=10.0)

_OWNED = ("model", "messages", "stream")


def request_fields(
    *,
    temperature: float | None,
    max_tokens: int | None,
    stop: str | Sequence[str] | None,
    stream_options: Mapping[str, Any] | None,
    extra: Mapping[str, Any] | None,
) -> dict[str, Any]:
    fields: dict[str, Any] = {}
    if temperature is not None:
        fields["temperature"] = temperature
    if max_tokens is not None:
        fields["max_tokens"] = max_tokens
    if stop is not None:
        fields["stop"] = stop if isinstance(stop, str) else list(stop)
    if stream_options is not None:
        fields["stream_options"] = dict(stream_options)
    for key, value in (extra or {}).items():
        if key in _OWNED:
            msg = f"extra field {key!r} is set by the session, not the provider"
            raise ValueError(msg)
        fields[key] = value
    return fields


class OpenAIChat:
    """A :class:`~turnledger.sessions.Provider` for OpenAI-compatible chat servers.

    The model comes from the request (the session's model): the body sent is
    exactly ``self.encoder.encode(request.model, request.messages)``, the
    bytes the projection measured.

    Args:
        base_url: e.g. ``https://api.openai.com/v1`` (the default) or
            ``http://127.0.0.1:8080/v1``; falls back to ``OPENAI_BASE_URL``.
        api_key: sent as a bearer token; falls back to ``OPENAI_API_KEY``;
            none is sent if neither is set (local servers). Never logged,
            never in a message or repr.
        stream: stream the answer (SSE) or ask for one JSON body.
        temperature, max_tokens, stop: request fields, sent only if given.
        include_usage: ask for a usage frame (``stream_options``); servers
            that ignore it still work, usage is optional.
        extra: further top-level request fields, sent after the ones above.
        headers: further HTTP headers.
        timeout: httpx timeouts (default :data:`DEFAULT_TIMEOUT`).
        limits: stream limits (default :class:`StreamLimits`).
        retry: opt-in retry before the first byte (default: none).
        read_size: cap on the bytes handed to the decoders per read (tests
            use 1 and 7); ``None``: as they come off the socket.
        client: an httpx client to use (not closed by :meth:`aclose`);
            by default the provider owns one.
        trust_env: let an owned client read proxy settings from the environment.
    """

    def __init__(
        self,
        *,
        base_url: str | None = None,
        api_key: str | None = None,
        stream: bool = True,
        temperature: float | None = None,
        max_tokens: int | None = None,
        stop: str | Sequence[str] | None = None,
        include_usage: bool = False,
        extra: Mapping[str, Any] | None = None,
        headers: Mapping[str, str] | None = None,
        timeout: httpx.Timeout | float | None = DEFAULT_TIMEOUT,
        limits: StreamLimits | None = None,
        retry: RetryPolicy | None = None,
        read_size: int | None = None,
        client: httpx.AsyncClient | None = None,
        trust_env: bool = True,
    ) -> None:
        base = base_url or os.environ.get("OPENAI_BASE_URL") or "https://api.openai.com/v1"
        key = api_key if api_key is not None else os.environ.get("OPENAI_API_KEY")
        self._stream = stream
        self._encoder = JsonChatEncoder(
            stream=stream,
            extra=request_fields(
                temperature=temperature,
                max_tokens=max_tokens,
                stop=stop,
                stream_options={"include_usage": True} if include_usage and stream else None,
                extra=extra,
            ),
        )
        self._owns_client = client is None
        self._client = client or httpx.AsyncClient(timeout=timeout, trust_env=trust_env)
        self._limits = limits or StreamLimits()
        accept = "text/event-stream" if stream else "application/json"
        self._transport = ChatTransport(
            provider="openai",
            url=base.rstrip("/") + "/chat/completions",
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

        ``sink.started()`` is awaited once the server answered 2xx with the
        right media type (``text/event-stream``, or ``application/json``
        when not streaming); ``sink.delta(text)`` for every non-empty piece
        of content, in order (once, with the whole answer, when not
        streaming).

        Returns:
            The completion once the stream ended well formed (``[DONE]``
            after a finish_reason); the session judges its finish_reason.

        Raises:
            ProviderError: ``exc.reason`` is one of
                :data:`turnledger.events.DISCARD_REASONS` (``http_status``,
                ``timeout``, ``transport``, ``protocol``, ``malformed``,
                ``incomplete_stream``, ``provider_error``, ``limit``);
                ``str(exc)`` is a short detail without secrets or bodies.

        Cancellation: closes the response and its connection (the server
        sees the disconnect); no result.
        """
        body = self._encoder.encode(request.model, request.messages)
        if self._stream:
            return await self._transport.post(
                request, body, sink, media_types=("text/event-stream",), decoder=OpenAIStreamDecoder
            )
        return await self._transport.post(
            request, body, sink, media_types=("application/json",), decoder=OpenAIResponseDecoder
        )

    async def aclose(self) -> None:
        """Close the owned HTTP client (a client passed in is left open)."""
        if self._owns_client:
            await self._client.aclose()

    async def __aenter__(self) -> OpenAIChat:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.aclose()

    def __repr__(self) -> str:
        return f"OpenAIChat(url={self.url!r}, stream={self._stream})"
