"""The httpx shell shared by the chat providers.

Sends one request (with the opt-in retry before the first byte), refuses a
non-2xx status or a wrong media type before reading the body, feeds the body
to a pure response decoder, delivers preview text to the sink, and maps every
httpx failure to a discard reason at this boundary::

    httpx.ConnectTimeout / ReadTimeout /
      WriteTimeout / PoolTimeout          -> timeout       "connect timeout", ...
    httpx.DecodingError                   -> malformed     (bad content encoding)
    any other httpx.HTTPError             -> transport     "connect error", "read error", ...
    status outside 2xx                    -> http_status   "HTTP 429"
    a 4xx/5xx saying the prompt is longer
      than the model's context window     -> context_overflow
    wrong media type                      -> protocol

An error body is read (at most ``max_error_body_bytes``) only to recognise a
context overflow by a few known markers; it is then thrown away, so nothing
of it reaches a message, an event or a log line.

Messages never contain the response body, the URL's query, or a header.
"""

from __future__ import annotations

import functools
import json
import random
import ssl
import time
from collections.abc import Callable, Mapping
from types import TracebackType
from typing import Any, ClassVar, Self

import httpx
import trio

from ..._errors import DecodeError, ProviderError, StreamProtocolError
from ..._logging import library_logger
from ...sessions._ports import ChatRequest, Completion, ModelInfo, StreamSink
from ...sessions._request import JsonChatEncoder, RequestEncoder, ToolFormat
from ...sessions._windows import plausible_window
from ...wire._limits import StreamLimits
from ...wire._stream import MEDIA_TYPES, BodyDecoder, ResponseDecoder, describe
from ._retry import RetryPolicy

__all__ = [
    "DESCRIBE_TIMEOUT",
    "ChatTransport",
    "Secret",
    "is_context_overflow",
    "map_httpx_error",
    "window_from",
]

logger = library_logger("turnledger.providers")

_TIMEOUTS: Mapping[type[httpx.TimeoutException], str] = {
    httpx.ConnectTimeout: "connect timeout",
    httpx.ReadTimeout: "read timeout",
    httpx.WriteTimeout: "write timeout",
    httpx.PoolTimeout: "pool timeout",
}
_TRANSPORT: tuple[tuple[type[httpx.HTTPError], str], ...] = (
    (httpx.ConnectError, "connect error"),
    (httpx.ReadError, "read error"),
    (httpx.WriteError, "write error"),
    (httpx.CloseError, "close error"),
    (httpx.RemoteProtocolError, "the server broke the HTTP exchange"),
    (httpx.LocalProtocolError, "local HTTP protocol error"),
    (httpx.ProxyError, "proxy error"),
    (httpx.UnsupportedProtocol, "unsupported URL scheme"),
    (httpx.TooManyRedirects, "too many redirects"),
)
# Failures after which the request surely did not reach the model.
_RETRYABLE = (httpx.ConnectError, httpx.ConnectTimeout, httpx.PoolTimeout)


def map_httpx_error(exc: httpx.HTTPError) -> ProviderError:
    """The typed failure for an httpx error (the most specific class first)."""
    if isinstance(exc, httpx.TimeoutException):
        for timeout_cls, detail in _TIMEOUTS.items():
            if isinstance(exc, timeout_cls):
                return ProviderError(detail, reason="timeout")
        return ProviderError("timeout", reason="timeout")
    if isinstance(exc, httpx.DecodingError):
        return DecodeError("the response's content encoding is invalid")
    for cls, detail in _TRANSPORT:
        if isinstance(exc, cls):
            return ProviderError(detail, reason="transport")
    return ProviderError("transport error", reason="transport")


class Secret:
    """A string that never shows itself in a repr, str or log line."""

    __slots__ = ("_value",)

    def __init__(self, value: str) -> None:
        self._value = value

    def reveal(self) -> str:
        return self._value

    def __repr__(self) -> str:
        return "Secret('***')"

    __str__ = __repr__

    def __reduce__(self) -> Any:
        msg = "a Secret cannot be pickled"
        raise TypeError(msg)


def _quotes(exc: BaseException, secret: str) -> bool:
    # Whether the message of ``exc`` or of an exception in its chain holds ``secret``.
    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        if secret in str(current) or secret in repr(current.args):
            return True
        current = current.__cause__ or current.__context__
    return False


def media_type(response: httpx.Response) -> str:
    value: str = response.headers.get("content-type", "")
    return value.partition(";")[0].strip().lower()


#: What servers say when a prompt does not fit the model's context window
#: (lower case): OpenAI, vLLM and LiteLLM's error code; llama.cpp's server;
#: Ollama's error texts; Anthropic's "prompt is too long".
OVERFLOW_MARKERS: tuple[bytes, ...] = (
    b"context_length_exceeded",
    b"exceeds the available context size",
    b"exceed_context_size_error",
    b"maximum context length",
    b"exceeds the context length",
    b"input length exceeds",
    b"context length exceeded",
    b"prompt is too long",
)
_OVERFLOW_STATUSES = frozenset({400, 413, 422, 500})


async def _drain(response: httpx.Response, cap: int) -> bytes:
    # Read a small error body so the connection may be reused, and return
    # its start (to classify, never to show); a bigger or slower one just
    # closes the connection.
    if cap <= 0:
        return b""
    parts: list[bytes] = []
    seen = 0
    with trio.move_on_after(1.0):
        try:
            async for chunk in response.aiter_raw():
                parts.append(chunk)
                seen += len(chunk)
                if seen >= cap:
                    break
        except (httpx.HTTPError, httpx.StreamError):
            pass
    return b"".join(parts)[:cap]


def is_context_overflow(status: int, body: bytes) -> bool:
    """Whether an error response says the prompt exceeds the context window."""
    if status not in _OVERFLOW_STATUSES:
        return False
    text = body.lower()
    return any(marker in text for marker in OVERFLOW_MARKERS)


class ChatTransport:
    """One endpoint: where to POST, with which headers, how to read the answer."""

    def __init__(
        self,
        *,
        provider: str,
        url: str,
        headers: Mapping[str, str],
        api_key: Secret | None,
        client: httpx.AsyncClient,
        limits: StreamLimits,
        retry: RetryPolicy | None,
        read_size: int | None,
        auth: tuple[str, str] = ("Authorization", "Bearer "),
    ) -> None:
        if read_size is not None and read_size < 1:
            msg = "read_size must be positive"
            raise ValueError(msg)
        parsed = httpx.URL(url)
        self.provider = provider
        self.url = url
        self._where = {"host": parsed.host, "port": parsed.port, "path": parsed.path}
        self._headers = dict(headers)
        self._api_key = api_key
        self._auth = auth
        self._client = client
        self._limits = limits
        self._retry = retry
        self._read_size = read_size
        self._rng = random.Random()

    async def post(
        self,
        request: ChatRequest,
        body: bytes,
        sink: StreamSink,
        *,
        media_types: tuple[str, ...],
        decoder: Callable[[StreamLimits], ResponseDecoder],
    ) -> Completion:
        log = logger.bind(provider=self.provider, request_id=request.request_id)
        headers = self._headers
        if self._api_key is not None:
            name, prefix = self._auth
            headers = {**headers, name: prefix + self._api_key.reveal()}
        attempt = 0
        while True:
            attempt += 1
            log.debug("provider_request", attempt=attempt, request_bytes=len(body), **self._where)
            retry_after: str | None = None
            streaming = False
            hidden = False
            try:
                async with self._client.stream(
                    "POST", self.url, content=body, headers=headers
                ) as response:
                    status = response.status_code
                    kind = media_type(response)
                    log.debug(
                        "provider_response",
                        attempt=attempt,
                        status=status,
                        media_type=describe(kind, "media type", MEDIA_TYPES),
                    )
                    if not 200 <= status < 300:
                        retry_after = response.headers.get("retry-after")
                        head = await _drain(response, self._limits.max_error_body_bytes)
                        if is_context_overflow(status, head):
                            raise ProviderError(
                                f"HTTP {status}: the prompt exceeds the model's context window",
                                reason="context_overflow",
                            )
                        failure = ProviderError(f"HTTP {status}", reason="http_status")
                        if self._retry is None or status not in self._retry.statuses:
                            raise failure
                    elif kind not in media_types:
                        raise StreamProtocolError(
                            f"unexpected media type {describe(kind, 'media type', MEDIA_TYPES)}, "
                            f"expected {' or '.join(media_types)}"
                        )
                    else:
                        streaming = True
                        return await self._consume(response, sink, decoder(self._limits), log)
            except httpx.HTTPError as exc:
                failure = map_httpx_error(exc)
                if streaming or self._retry is None or not isinstance(exc, _RETRYABLE):
                    if self._api_key is None or not _quotes(exc, self._api_key.reveal()):
                        raise failure from exc
                    hidden = True
            if hidden or self._retry is None:
                # h11 quotes a malformed header it received: a server that
                # echoes the key there must not get it into a traceback, so
                # the failure is raised outside the handler, with no chain.
                raise failure
            delay = self._retry.delay(
                attempt, retry_after=retry_after, now=time.time(), uniform=self._rng.random()
            )
            if delay is None:
                log.info(
                    "provider_retries_exhausted",
                    attempt=attempt,
                    reason=failure.reason,
                    detail=str(failure),
                )
                raise failure
            log.info(
                "provider_retry",
                attempt=attempt,
                delay=round(delay, 3),
                reason=failure.reason,
                detail=str(failure),
            )
            await trio.sleep(delay)

    async def _consume(
        self,
        response: httpx.Response,
        sink: StreamSink,
        decoder: ResponseDecoder,
        log: Any,
    ) -> Completion:
        await sink.started()
        feed = decoder.feed
        deliver = sink.delta
        cap = self._read_size
        async for data in response.aiter_bytes():
            # read_size caps what the decoders get per call (1 and 7 bytes in
            # the boundary tests); unlike aiter_bytes(chunk_size) it never
            # holds bytes back waiting for a full chunk.
            if cap is None or len(data) <= cap:
                reads: Any = (data,)
            else:
                reads = (data[i : i + cap] for i in range(0, len(data), cap))
            for chunk in reads:
                for piece in feed(chunk):
                    await deliver(piece)
                if decoder.error is not None:
                    raise decoder.error
        completion = decoder.finish()
        if isinstance(decoder, BodyDecoder) and completion.answer:
            await deliver(completion.answer)
        log.debug(
            "provider_response_ended",
            bytes=decoder.bytes_read,
            answer_chars=len(completion.answer),
            finish_reason=completion.finish_reason,
            **decoder.metadata(),
        )
        return completion


#: Seconds each discovery request may take (the hub gives up sooner anyway).
DESCRIBE_TIMEOUT = 2.0
_MAX_DESCRIBE_BYTES = 1 << 20


def window_from(value: Any) -> tuple[int | None, str]:
    """A window a server reported, if it is believable: ``(window, "")`` or
    ``(None, why)`` (``(None, "")`` when there was no value at all)."""
    if value is None:
        return None, ""
    if plausible_window(value):
        return value, ""
    if type(value) is int:
        return None, f"the server reported an implausible window ({value})"
    return None, "the server reported a window that is not an integer"


_OWNED_FIELDS = ("model", "messages", "stream")


def merge_extra(fields: dict[str, Any], extra: Mapping[str, Any] | None) -> dict[str, Any]:
    """Add ``extra`` request fields to ``fields``, refusing the ones the session sets."""
    for key, value in (extra or {}).items():
        if key in _OWNED_FIELDS:
            msg = f"extra field {key!r} is set by the session, not the provider"
            raise ValueError(msg)
        fields[key] = value
    return fields


@functools.cache
def _ssl_context(trust_env: bool) -> ssl.SSLContext:
    # What httpx builds for every client (CA bundle, SSL_CERT_FILE and
    # SSL_CERT_DIR with trust_env), built once: loading the bundle takes
    # tens of milliseconds, and a context may serve any number of clients.
    return httpx.create_ssl_context(trust_env=trust_env)


class HTTPChatProvider:
    """What the HTTP providers share: the client, the transport, the encoder,
    ``complete()``, closing. Subclasses say which endpoint and decoders."""

    _name: ClassVar[str]
    _stream_media_type: ClassVar[str]
    _stream_decoder: ClassVar[type[ResponseDecoder]]
    _json_decoder: ClassVar[type[ResponseDecoder]]
    _tool_format: ClassVar[ToolFormat] = "openai"
    #: The header that carries the API key, and what precedes the key in it.
    _auth: ClassVar[tuple[str, str]] = ("Authorization", "Bearer ")
    #: The httpx timeouts a provider of this class gets by default.
    default_timeout: ClassVar[httpx.Timeout]

    def __init__(
        self,
        *,
        url: str,
        api_key: str | None,
        stream: bool,
        fields: Mapping[str, Any],
        headers: Mapping[str, str] | None,
        timeout: httpx.Timeout | float | None,
        limits: StreamLimits | None,
        retry: RetryPolicy | None,
        read_size: int | None,
        client: httpx.AsyncClient | None,
        trust_env: bool,
    ) -> None:
        self._stream = stream
        self._encoder: RequestEncoder = JsonChatEncoder(
            stream=stream, extra=fields, tool_format=self._tool_format
        )
        self._described: dict[str, ModelInfo] = {}
        self._api_key_secret = Secret(api_key) if api_key else None
        self._owns_client = client is None
        self._client = client or httpx.AsyncClient(
            timeout=timeout, trust_env=trust_env, verify=_ssl_context(trust_env)
        )
        self._limits = limits or StreamLimits()
        self._media_types = (self._stream_media_type if stream else "application/json",)
        self._transport = ChatTransport(
            provider=self._name,
            url=url,
            headers={
                "Content-Type": "application/json",
                "Accept": self._media_types[0],
                **(headers or {}),
            },
            api_key=Secret(api_key) if api_key else None,
            client=self._client,
            limits=self._limits,
            retry=retry,
            read_size=read_size,
            auth=self._auth,
        )

    @property
    def encoder(self) -> RequestEncoder:
        """The encoder whose bytes are sent; the projection measures with it."""
        return self._encoder

    # -- describing models -------------------------------------------------

    #: The answer's token cap this provider sends, if any.
    _max_output_tokens: int | None = None
    #: Whether the server is asked for usage (and so reports it).
    _reports_usage: bool | None = None

    async def describe(self, model: str, *, context_window: int | None = None) -> ModelInfo:
        """What the server says about ``model``: its context window, asked
        once per model and cached (see :class:`~turnledger.sessions.DescribesModels`).

        Never raises for a server that cannot tell (an HTTP error, a timeout
        of :data:`DESCRIBE_TIMEOUT`, garbage, an implausible window): it
        returns a fallback saying why. With ``context_window`` it asks
        nothing and configures itself for that window.
        """
        if context_window is not None:
            self._use_window(model, context_window)
            return ModelInfo(context_window, "user", self._reports_usage, self._max_output_tokens)
        known = self._described.get(model)
        if known is None:
            window, detail = await self._discover(model)
            if window is None:
                known = ModelInfo(
                    None, "fallback", self._reports_usage, self._max_output_tokens, detail
                )
            else:
                self._use_window(model, window)
                known = ModelInfo(
                    window, "discovered", self._reports_usage, self._max_output_tokens
                )
            self._described[model] = known
        return known

    def _use_window(self, model: str, window: int) -> None:
        """Configure requests for ``model`` to use ``window`` (Ollama: ``num_ctx``)."""

    async def _discover(self, model: str) -> tuple[int | None, str]:
        """Ask the server for ``model``'s window: ``(window, "")`` or ``(None, why)``."""
        return None, "the server has no way to tell"

    async def _probe(self, method: str, url: str, body: Any = None) -> tuple[Any, str]:
        """One discovery request: ``(parsed JSON, "")`` or ``(None, why)``.

        The body is read up to 1 MiB and parsed; nothing of it is ever quoted.
        """
        headers = {"Accept": "application/json"}
        if self._api_key_secret is not None:
            name, prefix = self._auth
            headers[name] = prefix + self._api_key_secret.reveal()
        path = httpx.URL(url).path
        try:
            async with self._client.stream(
                method,
                url,
                headers=headers,
                json=body,
                timeout=DESCRIBE_TIMEOUT,
            ) as response:
                if not 200 <= response.status_code < 300:
                    await _drain(response, self._limits.max_error_body_bytes)
                    return None, f"{method} {path}: HTTP {response.status_code}"
                data = bytearray()
                async for chunk in response.aiter_bytes():
                    data += chunk
                    if len(data) > _MAX_DESCRIBE_BYTES:
                        return None, f"{method} {path}: the answer is too large"
        except httpx.HTTPError as exc:
            return None, f"{method} {path}: {map_httpx_error(exc)}"
        try:
            return json.loads(bytes(data)), ""
        except ValueError:  # UnicodeDecodeError included
            return None, f"{method} {path}: the answer is not JSON"

    @property
    def url(self) -> str:
        return self._transport.url

    @property
    def limits(self) -> StreamLimits:
        return self._limits

    async def complete(self, request: ChatRequest, sink: StreamSink) -> Completion:
        """Send ``request``; stream the answer's text into ``sink``.

        ``sink.started()`` is awaited once the server answered 2xx with the
        right media type; ``sink.delta(text)`` for every non-empty piece of
        content, in order (once, with the whole answer, when not streaming).

        Returns:
            The completion once the stream ended well formed; the session
            judges its finish reason.

        Raises:
            ProviderError: ``exc.reason`` is one of
                :data:`turnledger.events.DISCARD_REASONS` (``http_status``,
                ``timeout``, ``transport``, ``protocol``, ``malformed``,
                ``incomplete_stream``, ``provider_error``, ``limit``);
                ``str(exc)`` is a short detail without secrets or bodies.

        Cancellation: closes the response and its connection (the server
        sees the disconnect); no result.
        """
        body = self._encoder.encode(
            request.model, request.messages, request.tools, request.tool_choice
        )
        decoder = self._stream_decoder if self._stream else self._json_decoder
        return await self._transport.post(
            request, body, sink, media_types=self._media_types, decoder=decoder
        )

    async def aclose(self) -> None:
        """Close the owned HTTP client (a client passed in is left open)."""
        if self._owns_client:
            await self._client.aclose()

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.aclose()

    def __repr__(self) -> str:
        # A base URL may carry credentials or a key in its query: show neither.
        shown = httpx.URL(self.url).copy_with(username=None, password=None, query=None)
        return f"{type(self).__name__}(url={str(shown)!r}, stream={self._stream})"
