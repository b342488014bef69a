"""The telemetry wrappers of turnledger.adapters.otel (see the package docstring)."""

from __future__ import annotations

import collections
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any, TypeVar
from urllib.parse import urlsplit

import attrs
import structlog

try:
    from opentelemetry import metrics, trace
except ImportError as exc:  # pragma: no cover - depends on the environment
    raise ImportError(
        "turnledger.adapters.otel needs opentelemetry-api: pip install 'turnledger[otel]'"
    ) from exc

from ...events import Erasure, EventDecoder, EventStore, StoredEvent
from ...sessions import ChatRequest, Completion, Provider, RequestEncoder, StreamSink

__all__ = ["SEMCONV_VERSION", "Telemetry"]

#: The version of the OpenTelemetry semantic conventions the names follow.
SEMCONV_VERSION = "1.44.0"
_SCHEMA_URL = f"https://opentelemetry.io/schemas/{SEMCONV_VERSION}"
_SCOPE = "turnledger"
#: Ended turns remembered, per Telemetry, to link late completions to.
_REMEMBERED = 10_000

Key = tuple[str | None, str]
_T = TypeVar("_T")
_R = TypeVar("_R")


@attrs.define
class _Turn:
    span: Any
    started_ns: int
    attributes: dict[str, Any]
    first_chunk_ns: int | None = None


def _now() -> int:
    return time.time_ns()


def _request_options(provider: Provider) -> dict[str, Any]:
    extra: Mapping[str, Any] = getattr(provider.encoder, "extra", None) or {}
    options: Mapping[str, Any] = extra.get("options") or {}  # Ollama's
    found: dict[str, Any] = {}
    max_tokens = extra.get("max_tokens", extra.get("max_completion_tokens"))
    if max_tokens is None:
        max_tokens = options.get("num_predict")
    if max_tokens is not None:
        found["gen_ai.request.max_tokens"] = max_tokens
    temperature = extra.get("temperature", options.get("temperature"))
    if temperature is not None:
        found["gen_ai.request.temperature"] = temperature
    stop = extra.get("stop", options.get("stop"))
    if stop is not None:
        found["gen_ai.request.stop_sequences"] = [stop] if isinstance(stop, str) else list(stop)
    return found


def _provider_attributes(provider: Provider, name: str | None) -> dict[str, Any]:
    if name is None:
        kind = type(provider).__name__.lower()
        name = "ollama" if "ollama" in kind else "openai" if "openai" in kind else kind
    found: dict[str, Any] = {"gen_ai.provider.name": name}
    url = getattr(provider, "url", None)
    if isinstance(url, str):
        parts = urlsplit(url)
        if parts.hostname:
            found["server.address"] = parts.hostname
            port = parts.port or (443 if parts.scheme == "https" else 80)
            found["server.port"] = port
    found.update(_request_options(provider))
    return found


class Telemetry:
    """Spans and metrics for the turns of the hubs that use its wrappers.

    Args:
        tracer_provider, meter_provider: where spans and measurements go;
            the global ones (as the application configured them) by default.

    One span per turn, named ``chat {model}``, kind CLIENT, from the Submit
    to the turn's end, with events ``turnledger.stream_started`` and
    ``turnledger.first_chunk``. A late completion is a short span of its own
    (``turnledger.late_completion``), linked to its turn's span. Metrics:
    ``gen_ai.client.operation.duration`` and
    ``gen_ai.client.operation.time_to_first_chunk`` (seconds).
    """

    def __init__(self, *, tracer_provider: Any = None, meter_provider: Any = None) -> None:
        self._tracer = trace.get_tracer(
            _SCOPE, tracer_provider=tracer_provider, schema_url=_SCHEMA_URL
        )
        meter = metrics.get_meter(_SCOPE, meter_provider=meter_provider, schema_url=_SCHEMA_URL)
        self._duration = meter.create_histogram(
            "gen_ai.client.operation.duration", unit="s", description="GenAI operation duration"
        )
        self._ttfc = meter.create_histogram(
            "gen_ai.client.operation.time_to_first_chunk",
            unit="s",
            description="Time to receive the first chunk of a streamed answer",
        )
        self._models: dict[str, str] = {}
        self._turns: dict[Key, _Turn] = {}
        self._ended: collections.OrderedDict[Key, tuple[Any, str]] = collections.OrderedDict()

    def store(self, store: EventStore) -> EventStore:
        """``store``, reporting the turns whose events go through it."""
        return _TracedStore(store, self)

    def provider(self, provider: Provider, *, name: str | None = None) -> Provider:
        """``provider``, reporting its address, request options and first chunks.

        Args:
            name: ``gen_ai.provider.name``; by default ``openai`` or
                ``ollama`` from the adapter's class.
        """
        return _TracedProvider(provider, self, _provider_attributes(provider, name))

    # -- what the store saw -------------------------------------------------

    def _read(self, session_id: str, events: Sequence[Any]) -> None:
        for event in events[:1]:
            model = getattr(event, "model", None)
            if isinstance(model, str):
                self._models[session_id] = model

    def _appended(self, events: Sequence[StoredEvent], started_ns: int) -> None:
        for stored in events:
            handler = self._handlers.get(stored.tag)
            if handler is not None:
                handler(self, stored, started_ns)

    def _session_started(self, stored: StoredEvent, _: int) -> None:
        self._models[stored.session_id] = stored.payload["model"]

    def _submitted(self, stored: StoredEvent, started_ns: int) -> None:
        payload = stored.payload
        model = self._models.get(stored.session_id)
        attributes: dict[str, Any] = {"gen_ai.operation.name": "chat"}
        if model is not None:
            attributes["gen_ai.request.model"] = model
        span = self._tracer.start_span(
            f"chat {model}" if model else "chat",
            kind=trace.SpanKind.CLIENT,
            start_time=started_ns,
            attributes={
                **attributes,
                "turnledger.session_id": stored.session_id,
                "turnledger.request_id": payload["request_id"],
                "turnledger.turns_sent": payload["turns_sent"],
                "turnledger.turns_dropped": payload["turns_dropped"],
                "turnledger.request_bytes": payload["request_bytes"],
            },
        )
        key = (stored.session_id, payload["request_id"])
        self._turns[key] = _Turn(span, started_ns, attributes)

    def _committed(self, stored: StoredEvent, _: int) -> None:
        payload = stored.payload
        turn = self._end_of(stored)
        if turn is None:
            return
        span = turn.span
        span.set_attribute("gen_ai.response.finish_reasons", [payload["finish_reason"]])
        usage = payload.get("usage") or {}
        if usage.get("prompt_tokens") is not None:
            span.set_attribute("gen_ai.usage.input_tokens", usage["prompt_tokens"])
        if usage.get("completion_tokens") is not None:
            span.set_attribute("gen_ai.usage.output_tokens", usage["completion_tokens"])
        self._finish(stored, turn, "committed", None)

    def _discarded(self, stored: StoredEvent, _: int) -> None:
        turn = self._end_of(stored)
        if turn is None:
            return
        reason = stored.payload["reason"]
        turn.span.set_attribute("error.type", reason)
        turn.span.set_status(trace.Status(trace.StatusCode.ERROR, reason))
        self._finish(stored, turn, "discarded", reason)

    def _ignored(self, stored: StoredEvent, _: int) -> None:
        key = (stored.session_id, stored.payload["request_id"])
        remembered = self._ended.get(key)
        links = [trace.Link(remembered[0])] if remembered is not None else []
        span = self._tracer.start_span(
            "turnledger.late_completion",
            kind=trace.SpanKind.INTERNAL,
            links=links,
            attributes={
                "turnledger.session_id": stored.session_id,
                "turnledger.request_id": key[1],
            },
        )
        span.add_event(
            "turnledger.late_completion",
            {
                "turnledger.outcome": stored.payload["outcome"],
                "turnledger.turn_outcome": remembered[1] if remembered else "unknown",
            },
        )
        span.end()

    _handlers: Mapping[str, Callable[[Telemetry, StoredEvent, int], None]] = {
        "session_started": _session_started,
        "turn_submitted": _submitted,
        "turn_committed": _committed,
        "turn_discarded": _discarded,
        "completion_ignored": _ignored,
    }

    def _end_of(self, stored: StoredEvent) -> _Turn | None:
        return self._turns.pop((stored.session_id, stored.payload["request_id"]), None)

    def _finish(self, stored: StoredEvent, turn: _Turn, outcome: str, error: str | None) -> None:
        span = turn.span
        span.set_attribute("turnledger.outcome", outcome)
        span.end()
        ended = _now()
        attributes = dict(turn.attributes)
        if error is not None:
            attributes["error.type"] = error
        self._duration.record((ended - turn.started_ns) / 1e9, attributes)
        key = (stored.session_id, stored.payload["request_id"])
        self._ended[key] = (span.get_span_context(), outcome)
        while len(self._ended) > _REMEMBERED:
            self._ended.popitem(last=False)

    # -- what the provider saw ----------------------------------------------

    def _sent(self, key: Key, provider: Mapping[str, Any]) -> _Turn | None:
        turn = self._turns.get(key)
        if turn is not None:
            turn.attributes.update(
                (k, v) for k, v in provider.items() if not k.startswith("gen_ai.request.")
            )
            turn.span.set_attributes(provider)
        return turn

    def _first_chunk(self, turn: _Turn) -> None:
        now = turn.first_chunk_ns = _now()
        turn.span.add_event("turnledger.first_chunk", timestamp=now)
        self._ttfc.record((now - turn.started_ns) / 1e9, turn.attributes)


class _TracedStore:
    """An :class:`EventStore` that reports to a :class:`Telemetry`, then delegates."""

    def __init__(self, store: EventStore, telemetry: Telemetry) -> None:
        self._store = store
        self._telemetry = telemetry

    async def append(
        self, session_id: str, events: Sequence[StoredEvent], expected_version: int
    ) -> int:
        started = _now()
        version = await self._store.append(session_id, events, expected_version)
        self._telemetry._appended(events, started)
        return version

    async def read_decoded(
        self, session_id: str, decoder: EventDecoder[_T], after: int = 0
    ) -> list[_T]:
        events = await self._store.read_decoded(session_id, decoder, after)
        if after == 0:
            self._telemetry._read(session_id, events)
        return events

    async def read(self, session_id: str, after: int = 0) -> list[StoredEvent]:
        return await self._store.read(session_id, after)

    async def read_decoded_many(
        self,
        session_ids: Sequence[str],
        decoder: EventDecoder[_T],
        fold: Callable[[str, list[_T]], _R],
    ) -> dict[str, _R]:
        return await self._store.read_decoded_many(session_ids, decoder, fold)

    async def read_all(self, after: int = 0, limit: int | None = None) -> list[StoredEvent]:
        return await self._store.read_all(after, limit)

    async def session_ids(self) -> list[str]:
        return await self._store.session_ids()

    async def acquire(self, session_id: str) -> None:
        await self._store.acquire(session_id)

    async def release(self, session_id: str) -> None:
        await self._store.release(session_id)

    async def erase(self, session_id: str, keep: Sequence[StoredEvent] = ()) -> Erasure:
        """The wrapped store's erasure.

        Cancellation: as the wrapped store's.
        """
        return await self._store.erase(session_id, keep)

    async def erasures(self) -> list[Erasure]:
        return await self._store.erasures()

    async def aclose(self) -> None:
        await self._store.aclose()


class _Sink:
    __slots__ = ("_sink", "_telemetry", "_turn")

    def __init__(self, sink: StreamSink, telemetry: Telemetry, turn: _Turn) -> None:
        self._sink = sink
        self._telemetry = telemetry
        self._turn = turn

    async def started(self) -> None:
        self._turn.span.add_event("turnledger.stream_started")
        await self._sink.started()

    async def delta(self, text: str) -> None:
        if self._turn.first_chunk_ns is None and text:
            self._telemetry._first_chunk(self._turn)
        await self._sink.delta(text)


class _TracedProvider:
    """A :class:`Provider` that reports to a :class:`Telemetry`, then delegates."""

    def __init__(self, provider: Provider, telemetry: Telemetry, attributes: dict[str, Any]):
        self._provider = provider
        self._telemetry = telemetry
        self._attributes = attributes

    @property
    def encoder(self) -> RequestEncoder:
        return self._provider.encoder

    async def complete(self, request: ChatRequest, sink: StreamSink) -> Completion:
        session_id = structlog.contextvars.get_contextvars().get("session_id")
        turn = self._telemetry._sent((session_id, request.request_id), self._attributes)
        if turn is not None:
            sink = _Sink(sink, self._telemetry, turn)
        return await self._provider.complete(request, sink)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._provider, name)
