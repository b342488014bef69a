"""``OllamaChat``: Ollama's native ``/api/chat`` (NDJSON streaming)."""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from typing import Any

import httpx

from ...events import ToolSpec
from ...sessions._ports import ModelInfo
from ...sessions._request import ChatMessage, JsonChatEncoder
from ...wire._limits import StreamLimits
from ...wire._ollama_chunks import OllamaResponseDecoder, OllamaStreamDecoder
from ._http import HTTPChatProvider, merge_extra, window_from
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
            Without ``num_ctx``, each model's window (the session's, or the
            one ``POST /api/show`` reports) is sent as ``options.num_ctx``:
            Ollama silently truncates a prompt longer than the window it
            uses, and its default is smaller than most models' window.
        keep_alive: how long Ollama keeps the model loaded (``"5m"``, ``0``...).
        extra: further top-level request fields (``think``, ``format``...).
        headers, timeout, limits, retry, read_size, client, trust_env: as for
            :class:`~turnledger.adapters.providers.OpenAIChat` (the default
            timeout is :data:`DEFAULT_OLLAMA_TIMEOUT`).
    """

    _name = "ollama"
    default_timeout = DEFAULT_OLLAMA_TIMEOUT
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
        self._host = _base_url(base_url)
        self._fixed_window = (options or {}).get("num_ctx")
        predict = (options or {}).get("num_predict")
        self._max_output_tokens = predict if type(predict) is int and predict > 0 else None
        self._reports_usage = True
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
        self._encoder = _WindowedEncoder(stream, dict(fields))

    def _use_window(self, model: str, window: int) -> None:
        if self._fixed_window is None:
            assert isinstance(self._encoder, _WindowedEncoder)
            self._encoder.use(model, window)

    async def describe(self, model: str, *, context_window: int | None = None) -> ModelInfo:
        """As :meth:`HTTPChatProvider.describe`; a ``num_ctx`` given in
        ``options`` is the window of every model (and asks nothing)."""
        fixed = self._fixed_window
        if context_window is None and type(fixed) is int and fixed > 0:
            return await super().describe(model, context_window=fixed)
        return await super().describe(model, context_window=context_window)

    async def _discover(self, model: str) -> tuple[int | None, str]:
        """``POST /api/show``: the model's ``<architecture>.context_length``."""
        shown, why = await self._probe("POST", self._host + "/api/show", {"model": model})
        if shown is None:
            return None, why
        info = shown.get("model_info") if isinstance(shown, dict) else None
        if isinstance(info, dict):
            for key, value in info.items():
                if isinstance(key, str) and key.endswith(".context_length"):
                    window, why = window_from(value)
                    return window, why
        return None, "the server does not report a context length"


class _WindowedEncoder:
    """Ollama's request body with ``options.num_ctx`` set per model.

    Measures exactly what it encodes: each model's frame (with its
    ``num_ctx``) comes from its own :class:`JsonChatEncoder`; messages are
    encoded the same for every model.
    """

    def __init__(self, stream: bool, fields: dict[str, Any]) -> None:
        self._stream = stream
        self._fields = fields
        self._plain = JsonChatEncoder(stream=stream, extra=fields, tool_format="ollama")
        self._by_model: dict[str, JsonChatEncoder] = {}

    def use(self, model: str, window: int) -> None:
        options = dict(self._fields.get("options") or {})
        options["num_ctx"] = window
        self._by_model[model] = JsonChatEncoder(
            stream=self._stream, extra={**self._fields, "options": options}, tool_format="ollama"
        )

    def _for(self, model: str) -> JsonChatEncoder:
        return self._by_model.get(model, self._plain)

    @property
    def cache_key(self) -> object:
        return self._plain.cache_key

    @property
    def separator_size(self) -> int:
        return self._plain.separator_size

    def encode(
        self,
        model: str,
        messages: Sequence[ChatMessage],
        tools: Sequence[ToolSpec] = (),
        tool_choice: str = "auto",
    ) -> bytes:
        return self._for(model).encode(model, messages, tools, tool_choice)

    def tools_size(self, tools: Sequence[ToolSpec], tool_choice: str = "auto") -> int:
        return self._plain.tools_size(tools, tool_choice)

    def message_size(self, message: ChatMessage) -> int:
        return self._plain.message_size(message)

    def frame_size(self, model: str, n_messages: int) -> int:
        return self._for(model).frame_size(model, n_messages)
