"""``OpenAIChat``: any OpenAI-compatible ``/v1/chat/completions`` endpoint.

OpenAI itself, llama.cpp's server, vLLM, LM Studio, Ollama's ``/v1``,
LiteLLM... Streaming (SSE) or not (one JSON body).
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from typing import Any

import httpx

from ...wire._limits import StreamLimits
from ...wire._openai_chunks import OpenAIResponseDecoder, OpenAIStreamDecoder
from ._http import HTTPChatProvider, merge_extra, window_from
from ._retry import RetryPolicy

__all__ = ["DEFAULT_TIMEOUT", "OpenAIChat", "discover_openai_window"]

#: Connect within 10 s; a read may wait 60 s (the gap between two chunks,
#: or before the first one while a long prompt is processed; servers that
#: generate for long send keep-alive comments every 15 s). The overall
#: deadline of a turn belongs to the session.
DEFAULT_TIMEOUT = httpx.Timeout(connect=10.0, read=60.0, write=30.0, pool=10.0)


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
    return merge_extra(fields, extra)


class OpenAIChat(HTTPChatProvider):
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
        include_usage: ask for a usage frame (``stream_options``, on by
            default: the session calibrates its token estimate from it);
            servers that ignore it still work, usage is optional.
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

    _name = "openai"
    default_timeout = DEFAULT_TIMEOUT
    _stream_media_type = "text/event-stream"
    _stream_decoder = OpenAIStreamDecoder
    _json_decoder = OpenAIResponseDecoder

    def __init__(
        self,
        *,
        base_url: str | None = None,
        api_key: str | None = None,
        stream: bool = True,
        temperature: float | None = None,
        max_tokens: int | None = None,
        stop: str | Sequence[str] | None = None,
        include_usage: bool = True,
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
        self._base = base.rstrip("/")
        self._max_output_tokens = max_tokens
        self._reports_usage = True if include_usage or not stream else None
        super().__init__(
            url=base.rstrip("/") + "/chat/completions",
            api_key=api_key if api_key is not None else os.environ.get("OPENAI_API_KEY"),
            stream=stream,
            fields=request_fields(
                temperature=temperature,
                max_tokens=max_tokens,
                stop=stop,
                stream_options={"include_usage": True} if include_usage and stream else None,
                extra=extra,
            ),
            headers=headers,
            timeout=timeout,
            limits=limits,
            retry=retry,
            read_size=read_size,
            client=client,
            trust_env=trust_env,
        )

    async def _discover(self, model: str) -> tuple[int | None, str]:
        return await discover_openai_window(self, self._base, model)


async def discover_openai_window(
    provider: HTTPChatProvider, base: str, model: str
) -> tuple[int | None, str]:
    """Ask an OpenAI-style server (base URL ``.../v1``) for the model's
    window, the first that answers:

    - ``GET /v1/models``: vLLM's ``max_model_len``, LM Studio's and
      others' ``max_context_length`` / ``context_length`` for the model;
    - ``GET /props`` (llama.cpp's server): ``n_ctx``, or
      ``default_generation_settings.n_ctx``;
    - ``GET /api/v0/models/<model>`` (LM Studio): ``max_context_length``.

    OpenAI itself answers none of them: the fallback table applies.
    """
    root = base[: -len("/v1")] if base.endswith("/v1") else base
    problems: list[str] = []

    def note(why: str) -> None:
        if why:
            problems.append(why)

    listing, why = await provider._probe("GET", base + "/models")
    note(why)
    window, why = window_from(_in_model_list(listing, model))
    note(why)
    if window is not None:
        return window, ""
    props, why = await provider._probe("GET", root + "/props")
    note(why)
    if isinstance(props, dict):
        n_ctx = props.get("n_ctx")
        settings = props.get("default_generation_settings")
        if n_ctx is None and isinstance(settings, dict):
            n_ctx = settings.get("n_ctx")
        window, why = window_from(n_ctx)
        note(why)
        if window is not None:
            return window, ""
    lm, why = await provider._probe("GET", f"{root}/api/v0/models/{model}")
    note(why)
    if isinstance(lm, dict):
        window, why = window_from(lm.get("max_context_length"))
        note(why)
        if window is not None:
            return window, ""
    implausible = [p for p in problems if "window" in p]
    return None, (implausible or ["the server does not report a context window"])[0]


def _in_model_list(listing: object, model: str) -> object:
    # {"data": [{"id": ..., "max_model_len": ...}, ...]} (OpenAI's list shape).
    if not isinstance(listing, dict) or not isinstance(listing.get("data"), list):
        return None
    for entry in listing["data"]:
        if isinstance(entry, dict) and entry.get("id") == model:
            for key in ("max_model_len", "max_context_length", "context_length"):
                if entry.get(key) is not None:
                    return entry[key]
    return None
