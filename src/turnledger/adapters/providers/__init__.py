"""Provider adapters: chat models behind HTTP, through a strict streaming boundary.

The pure decoders live in :mod:`turnledger.wire` (re-exported here); this
package holds the httpx shells that drive them. The layers::

    bytes --Utf8Decoder--> text --SSEDecoder / NDJSONDecoder--> frames
          --loads_object--> JSON --a protocol's validator--> turn

The stream decoders compose them (bytes in, preview text out, a
``Completion`` or a typed error at the end). The httpx providers, one per
protocol, are imported lazily so that importing a pure layer does not import
httpx: :class:`OpenAIChat` (chat completions), :class:`OllamaChat`,
:class:`AnthropicChat` (Messages) and :class:`OpenAIResponses` (Responses).
:data:`PROVIDER_KINDS` names them for the command line, and
:func:`open_provider` builds one from a protocol name and a few settings
(:class:`ProviderSettings` holds them as one value).
"""

from __future__ import annotations

from typing import TYPE_CHECKING as _TYPE_CHECKING
from typing import Any as _Any

from ...wire import (
    AnthropicEncoder,
    AnthropicEventValidator,
    AnthropicStreamDecoder,
    NDJSONDecoder,
    OllamaLineValidator,
    OllamaResponseDecoder,
    OllamaStreamDecoder,
    OpenAIChunkValidator,
    OpenAIResponseDecoder,
    OpenAIStreamDecoder,
    ResponseDecoder,
    ResponsesEncoder,
    ResponsesEventValidator,
    ResponsesStreamDecoder,
    ServerSentEvent,
    SSEDecoder,
    StreamLimits,
    Utf8Decoder,
    loads_object,
    loads_strict,
    parse_openai_completion,
)
from ._factory import Endpoint, ProviderSettings, configured_endpoint, open_provider
from ._kinds import PROVIDER_KINDS, ProviderKind
from ._retry import RetryPolicy, parse_retry_after

if _TYPE_CHECKING:
    from ._http import map_httpx_error
    from .anthropic import AnthropicChat
    from .ollama import OllamaChat
    from .openai import OpenAIChat
    from .responses import OpenAIResponses

__all__ = [
    "PROVIDER_KINDS",
    "AnthropicChat",
    "AnthropicEncoder",
    "AnthropicEventValidator",
    "AnthropicStreamDecoder",
    "Endpoint",
    "NDJSONDecoder",
    "OllamaChat",
    "OllamaLineValidator",
    "OllamaResponseDecoder",
    "OllamaStreamDecoder",
    "OpenAIChat",
    "OpenAIChunkValidator",
    "OpenAIResponseDecoder",
    "OpenAIResponses",
    "OpenAIStreamDecoder",
    "ProviderKind",
    "ProviderSettings",
    "ResponseDecoder",
    "ResponsesEncoder",
    "ResponsesEventValidator",
    "ResponsesStreamDecoder",
    "RetryPolicy",
    "SSEDecoder",
    "ServerSentEvent",
    "StreamLimits",
    "Utf8Decoder",
    "configured_endpoint",
    "loads_object",
    "loads_strict",
    "map_httpx_error",
    "open_provider",
    "parse_openai_completion",
    "parse_retry_after",
]

_LAZY = {
    "AnthropicChat": ".anthropic",
    "OpenAIChat": ".openai",
    "OpenAIResponses": ".responses",
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
