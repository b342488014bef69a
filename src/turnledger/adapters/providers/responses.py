"""``OpenAIResponses``: OpenAI's Responses API (``POST /v1/responses``, SSE).

OpenAI itself, vLLM and the other servers that speak it. Turnledger sends
the projected history with every request (``store: false``, no
``previous_response_id``): the ledger stays the single source of truth.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from typing import Any

import httpx

from ...wire._limits import StreamLimits
from ...wire._requests import ResponsesEncoder
from ...wire._responses_events import ResponsesStreamDecoder
from ._http import HTTPChatProvider, merge_extra
from ._retry import RetryPolicy
from .openai import DEFAULT_TIMEOUT, discover_openai_window

__all__ = ["OpenAIResponses"]


class OpenAIResponses(HTTPChatProvider):
    """A :class:`~turnledger.sessions.Provider` for the OpenAI Responses API.

    A turn commits only on ``response.completed`` whose output holds the
    streamed text (see :mod:`turnledger.wire._responses_events`); function
    calls are tool rounds. The window is asked of the server as
    :class:`~turnledger.adapters.providers.OpenAIChat` does (vLLM reports
    it), else the table of known models applies.

    Args:
        base_url: e.g. ``https://api.openai.com/v1`` (the default); falls
            back to ``OPENAI_BASE_URL``. ``/responses`` is added.
        api_key: a bearer token; falls back to ``OPENAI_API_KEY``.
        temperature: sent only if given.
        max_tokens: sent as ``max_output_tokens``.
        stop: refused: the Responses API has no stop sequences.
        extra, headers, timeout, limits, retry, read_size, client, trust_env:
            as for :class:`~turnledger.adapters.providers.OpenAIChat`.
    """

    _name = "openai-responses"
    default_timeout = DEFAULT_TIMEOUT
    _stream_media_type = "text/event-stream"
    _stream_decoder = ResponsesStreamDecoder
    _json_decoder = ResponsesStreamDecoder  # (this provider always streams)

    def __init__(
        self,
        *,
        base_url: str | None = None,
        api_key: str | None = None,
        temperature: float | None = None,
        max_tokens: int | None = None,
        stop: str | Sequence[str] | None = None,
        extra: Mapping[str, Any] | None = None,
        headers: Mapping[str, str] | None = None,
        timeout: httpx.Timeout | float | None = DEFAULT_TIMEOUT,
        limits: StreamLimits | None = None,
        retry: RetryPolicy | None = None,
        read_size: int | None = None,
        client: httpx.AsyncClient | None = None,
        trust_env: bool = True,
    ) -> None:
        if stop is not None:
            msg = "the Responses API has no stop sequences"
            raise ValueError(msg)
        base = base_url or os.environ.get("OPENAI_BASE_URL") or "https://api.openai.com/v1"
        self._base = base.rstrip("/")
        fields: dict[str, Any] = {}
        if temperature is not None:
            fields["temperature"] = temperature
        if max_tokens is not None:
            fields["max_output_tokens"] = max_tokens
        fields = merge_extra(fields, extra)
        self._max_output_tokens = max_tokens
        self._reports_usage = True
        super().__init__(
            url=self._base + "/responses",
            api_key=api_key if api_key is not None else os.environ.get("OPENAI_API_KEY"),
            stream=True,
            fields={},
            headers=headers,
            timeout=timeout,
            limits=limits,
            retry=retry,
            read_size=read_size,
            client=client,
            trust_env=trust_env,
        )
        self._encoder = ResponsesEncoder(fields)

    async def _discover(self, model: str) -> tuple[int | None, str]:
        return await discover_openai_window(self, self._base, model)
