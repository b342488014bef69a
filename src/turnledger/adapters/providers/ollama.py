"""``OllamaChat``: Ollama's native ``/api/chat`` (NDJSON streaming)."""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any

import httpx

from ._http import HTTPChatProvider, merge_extra
from ._limits import StreamLimits
from ._ollama_chunks import OllamaResponseDecoder, OllamaStreamDecoder
from ._retry import RetryPolicy

__all__ = ["DEFAULT_OLLAMA_TIMEOUT", "OllamaChat"]

#: Ollama loads a model on first use, which can take minutes on a laptop
#: before the first byte; hence a longer read timeout than for hosted APIs.
DEFAULT_OLLAMA_TIMEOUT = httpx.Timeout(connect=10.0, read=300.0, write=30.0, pool=10.0)


def _base_url(value: str | None) -> str:
    base = value or os.environ.get("OLLAMA_HOST") or "http://127.0.0.1:11434"
    if "://" not in base:
        base = "http://" + base  # OLLAMA_HOST is often host:port
    return base.rstrip("/")


class OllamaChat(HTTPChatProvider):
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

    _name = "ollama"
    _tool_format = "ollama"
    _stream_media_type = "application/x-ndjson"
    _stream_decoder = OllamaStreamDecoder
    _json_decoder = OllamaResponseDecoder

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
        fields: dict[str, Any] = {}
        if options is not None:
            fields["options"] = dict(options)
        if keep_alive is not None:
            fields["keep_alive"] = keep_alive
        super().__init__(
            url=_base_url(base_url) + "/api/chat",
            api_key=api_key if api_key is not None else os.environ.get("OLLAMA_API_KEY"),
            stream=stream,
            fields=merge_extra(fields, extra),
            headers=headers,
            timeout=timeout,
            limits=limits,
            retry=retry,
            read_size=read_size,
            client=client,
            trust_env=trust_env,
        )
