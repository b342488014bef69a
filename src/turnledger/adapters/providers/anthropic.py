"""``AnthropicChat``: Anthropic's Messages API (``POST /v1/messages``, SSE).

Also the gateways and servers that imitate it. The key goes in
``x-api-key`` (never logged, never in a message or repr, like the OpenAI
key), with ``anthropic-version``.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from typing import Any

import httpx

from ...wire._anthropic_events import AnthropicStreamDecoder
from ...wire._limits import StreamLimits
from ...wire._requests import AnthropicEncoder
from ._http import HTTPChatProvider, merge_extra
from ._retry import RetryPolicy
from .openai import DEFAULT_TIMEOUT

__all__ = ["ANTHROPIC_VERSION", "DEFAULT_MAX_TOKENS", "AnthropicChat"]

#: The API version sent in ``anthropic-version``.
ANTHROPIC_VERSION = "2023-06-01"
#: The answer's token cap when none is given (the API requires one; every
#: Claude model since Claude 3 can write at least this many).
DEFAULT_MAX_TOKENS = 4096


def _messages_url(base: str) -> str:
    # ANTHROPIC_BASE_URL is the host (the SDK adds /v1/messages); a base
    # that already ends in /v1 is taken as meant.
    base = base.rstrip("/")
    return base + ("/messages" if base.endswith("/v1") else "/v1/messages")


class AnthropicChat(HTTPChatProvider):
    """A :class:`~turnledger.sessions.Provider` for Anthropic's Messages API.

    Streams Server-Sent Events through the same byte, UTF-8, SSE and JSON
    layers as :class:`~turnledger.adapters.providers.OpenAIChat`; a turn
    commits only after ``message_stop`` with ``stop_reason`` ``end_turn`` or
    ``stop_sequence`` (see :mod:`turnledger.wire._anthropic_events`). Tool
    calls are ``tool_use`` blocks; results go back as ``tool_result`` blocks.

    The API does not report a model's context window: the session takes it
    from ``context_window`` or the table of known models
    (:data:`turnledger.sessions.FALLBACK_WINDOWS`).

    Args:
        base_url: e.g. ``https://api.anthropic.com`` (the default); falls
            back to ``ANTHROPIC_BASE_URL``. ``/v1/messages`` is added.
        api_key: sent as ``x-api-key``; falls back to ``ANTHROPIC_API_KEY``.
        max_tokens: the answer's token cap (default :data:`DEFAULT_MAX_TOKENS`).
        temperature: sent only if given.
        stop: ``stop_sequences``.
        cache: mark the system prompt and the end of each request with
            ``cache_control`` so the next request reads the unchanged prefix
            (system prompt, older turns) from Anthropic's prompt cache.
        version: the ``anthropic-version`` header.
        extra, headers, timeout, limits, retry, read_size, client, trust_env:
            as for :class:`~turnledger.adapters.providers.OpenAIChat`.
    """

    _name = "anthropic"
    default_timeout = DEFAULT_TIMEOUT
    _auth = ("x-api-key", "")
    _stream_media_type = "text/event-stream"
    _stream_decoder = AnthropicStreamDecoder
    _json_decoder = AnthropicStreamDecoder  # (this provider always streams)

    def __init__(
        self,
        *,
        base_url: str | None = None,
        api_key: str | None = None,
        max_tokens: int | None = None,
        temperature: float | None = None,
        stop: str | Sequence[str] | None = None,
        cache: bool = False,
        version: str = ANTHROPIC_VERSION,
        extra: Mapping[str, Any] | None = None,
        headers: Mapping[str, str] | None = None,
        timeout: httpx.Timeout | float | None = DEFAULT_TIMEOUT,
        limits: StreamLimits | None = None,
        retry: RetryPolicy | None = None,
        read_size: int | None = None,
        client: httpx.AsyncClient | None = None,
        trust_env: bool = True,
    ) -> None:
        base = base_url or os.environ.get("ANTHROPIC_BASE_URL") or "https://api.anthropic.com"
        cap = DEFAULT_MAX_TOKENS if max_tokens is None else max_tokens
        fields: dict[str, Any] = {}
        if temperature is not None:
            fields["temperature"] = temperature
        if stop is not None:
            fields["stop_sequences"] = [stop] if isinstance(stop, str) else list(stop)
        fields = merge_extra(fields, extra)
        self._max_output_tokens = cap
        self._reports_usage = True
        super().__init__(
            url=_messages_url(base),
            api_key=api_key if api_key is not None else os.environ.get("ANTHROPIC_API_KEY"),
            stream=True,
            fields={},
            headers={"anthropic-version": version, **(headers or {})},
            timeout=timeout,
            limits=limits,
            retry=retry,
            read_size=read_size,
            client=client,
            trust_env=trust_env,
        )
        self._encoder = AnthropicEncoder(cap, fields, cache)

    async def _discover(self, model: str) -> tuple[int | None, str]:
        return None, "the Anthropic API does not report context windows"
