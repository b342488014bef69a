"""The wire: pure decoders from a model server's bytes to a checked turn.

Each layer is separately usable and imports no trio, httpx, sqlite3 or
structlog (``tests/test_architecture.py`` checks every module of this
folder)::

    bytes --Utf8Decoder--> text --SSEDecoder / NDJSONDecoder--> frames
          --loads_object--> JSON --a protocol's validator--> turn

The validators: ``OpenAIChunkValidator`` (chat completions),
``OllamaLineValidator``, ``AnthropicEventValidator`` (Messages) and
``ResponsesEventValidator`` (OpenAI Responses). ``OpenAIStreamDecoder``,
``OllamaStreamDecoder``, ``AnthropicStreamDecoder`` and
``ResponsesStreamDecoder`` compose the layers (bytes in, preview text out, a
:class:`~turnledger.sessions.Completion` or a typed error at the end);
``AnthropicEncoder`` and ``ResponsesEncoder`` write the request bodies.
Every layer is bounded by :class:`StreamLimits` and fails closed. The HTTP
shells that drive these decoders live in :mod:`turnledger.adapters.providers`.

Modules: ``_utf8`` (strict incremental UTF-8), ``_lines`` (line ends across
reads), ``_sse`` (WHATWG event streams), ``_ndjson`` (newline-delimited
JSON), ``_strict_json`` (RFC 8259 plus duplicate keys, depth, trailing data),
``_limits``, ``_stream`` (the shared decoder shape and discard reasons),
``_openai_chunks``, ``_ollama_chunks``, ``_anthropic_events`` and
``_responses_events`` (each protocol's turn validator), ``_tool_calls``
(tool-call assembly), ``_requests`` (the Anthropic and Responses bodies).
"""

from ._anthropic_events import AnthropicEventValidator, AnthropicStreamDecoder
from ._limits import StreamLimits
from ._ndjson import NDJSONDecoder
from ._ollama_chunks import OllamaLineValidator, OllamaResponseDecoder, OllamaStreamDecoder
from ._openai_chunks import (
    OpenAIChunkValidator,
    OpenAIResponseDecoder,
    OpenAIStreamDecoder,
    parse_openai_completion,
)
from ._requests import AnthropicEncoder, ResponsesEncoder
from ._responses_events import ResponsesEventValidator, ResponsesStreamDecoder
from ._sse import ServerSentEvent, SSEDecoder
from ._stream import ResponseDecoder
from ._strict_json import loads_object, loads_strict
from ._utf8 import Utf8Decoder

__all__ = [
    "AnthropicEncoder",
    "AnthropicEventValidator",
    "AnthropicStreamDecoder",
    "NDJSONDecoder",
    "OllamaLineValidator",
    "OllamaResponseDecoder",
    "OllamaStreamDecoder",
    "OpenAIChunkValidator",
    "OpenAIResponseDecoder",
    "OpenAIStreamDecoder",
    "ResponseDecoder",
    "ResponsesEncoder",
    "ResponsesEventValidator",
    "ResponsesStreamDecoder",
    "SSEDecoder",
    "ServerSentEvent",
    "StreamLimits",
    "Utf8Decoder",
    "loads_object",
    "loads_strict",
    "parse_openai_completion",
]
