"""Provider adapters: chat models behind HTTP, through a strict streaming boundary.

The pure decoders live in :mod:`turnledger.wire` (re-exported here); this
package holds the httpx shells that drive them. The layers::

    bytes --Utf8Decoder--> text --SSEDecoder / NDJSONDecoder--> frames
          --loads_object--> JSON --OpenAIChunkValidator / OllamaLineValidator--> turn

``OpenAIStreamDecoder`` and ``OllamaStreamDecoder`` compose them (bytes in,
preview text out, a ``Completion`` or a typed error at the end). The httpx
providers, :class:`OpenAIChat` and :class:`OllamaChat`, are imported lazily
so that importing a pure layer does not import httpx.
"""

from __future__ import annotations

from typing import TYPE_CHECKING as _TYPE_CHECKING
from typing import Any as _Any

from ...wire import (
    NDJSONDecoder,
    OllamaLineValidator,
    OllamaResponseDecoder,
    OllamaStreamDecoder,
    OpenAIChunkValidator,
    OpenAIResponseDecoder,
    OpenAIStreamDecoder,
    ResponseDecoder,
    ServerSentEvent,
    SSEDecoder,
    StreamLimits,
    Utf8Decoder,
    loads_object,
    loads_strict,
    parse_openai_completion,
)
from ._retry import RetryPolicy, parse_retry_after

if _TYPE_CHECKING:
    from ._http import map_httpx_error
    from .ollama import OllamaChat
    from .openai import OpenAIChat

__all__ = [
    "NDJSONDecoder",
    "OllamaChat",
    "OllamaLineValidator",
    "OllamaResponseDecoder",
    "OllamaStreamDecoder",
    "OpenAIChat",
    "OpenAIChunkValidator",
    "OpenAIResponseDecoder",
    "OpenAIStreamDecoder",
    "ResponseDecoder",
    "RetryPolicy",
    "SSEDecoder",
    "ServerSentEvent",
    "StreamLimits",
    "Utf8Decoder",
    "loads_object",
    "loads_strict",
    "map_httpx_error",
    "parse_openai_completion",
    "parse_retry_after",
]

_LAZY = {
    "OpenAIChat": ".openai",
    "OllamaChat": ".ollama",
    "map_httpx_error": "._http",
}


def __getattr__(name: str) -> _Any:
    module = _LAZY.get(name)
    if module is None:
        msg = f"module {__name__!r} has no attribute {name!r}"
        raise AttributeError(msg)
    import importlib

    value = getattr(importlib.import_module(module, __name__), name)
    globals()[name] = value
    return value
