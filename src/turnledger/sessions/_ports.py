"""The ``Provider`` port: what a session needs from a model server.

Adapters (``turnledger.adapters.providers``) implement it; the session runtime
calls it from the request task. Providers never decide whether a turn
commits: they report what the server said, typed.
"""

from __future__ import annotations

from typing import Protocol, runtime_checkable

import attrs

from ..events import RequestId, ToolCall, ToolSpec, Usage, WindowSource
from ._request import ChatMessage, RequestEncoder

__all__ = [
    "AnswersAtOnce",
    "ChatRequest",
    "Completion",
    "DescribesModels",
    "ModelInfo",
    "Provider",
    "StreamSink",
]


@attrs.frozen
class ChatRequest:
    """One request, as projected by the session."""

    request_id: RequestId
    model: str
    messages: tuple[ChatMessage, ...]
    #: The session's tools, sent with the request (none: a plain chat).
    tools: tuple[ToolSpec, ...] = ()
    tool_choice: str = "auto"
    #: The round of the turn (0: its first request).
    round: int = 0


@attrs.frozen
class Completion:
    """A stream that ended well formed (the session still judges it)."""

    answer: str
    #: As reported by the server (``stop``, ``length``, ...); ``None`` if absent.
    finish_reason: str | None
    usage: Usage | None = None
    #: Tool calls the model asked for, arguments as compact JSON object text.
    tool_calls: tuple[ToolCall, ...] = ()


class StreamSink(Protocol):
    """Where a provider reports progress while it streams."""

    async def started(self) -> None:
        """The server accepted the request (2xx, right media type)."""
        ...

    async def delta(self, text: str) -> None:
        """A piece of preview text arrived (may be empty)."""
        ...


@runtime_checkable
class Provider(Protocol):
    """A chat model behind some protocol."""

    @property
    def encoder(self) -> RequestEncoder:
        """The encoder whose bytes this provider sends; the projection measures with it."""
        ...

    async def complete(self, request: ChatRequest, sink: StreamSink) -> Completion:
        """Send ``request`` and stream the answer into ``sink``.

        Returns:
            The completion, once the stream ended well formed.

        Raises:
            ProviderError: the request failed; ``exc.reason`` is one of
                :data:`turnledger.events.DISCARD_REASONS`. Messages never
                contain secrets or provider error bodies.

        Cancellation: cancelling closes the HTTP response and the connection
        it used; no result is reported.
        """
        ...


@runtime_checkable
class AnswersAtOnce(Protocol):
    """The optional part of the port: a provider that can answer some
    requests without waiting for anything (a canned or cached answer, a
    test double).

    The hub asks it first, from the session's own task, for every request it
    sends: a completion is recorded as a stream that began and ended at once
    (the same events ``complete`` would have caused, without the request
    task's round trip, about half a turn's scheduling); ``None`` sends the
    request through :meth:`Provider.complete` as usual.
    """

    def answer_now(self, request: ChatRequest) -> Completion | None:
        """The completion of ``request`` if it needs no wait, else ``None``.

        Must not block or wait for I/O (it is not a coroutine: it runs
        inside the session's turn) and must not stream: an answer with
        preview text goes through :meth:`Provider.complete`.

        Raises:
            ProviderError: the request failed, as from ``complete``.
        """
        ...


@attrs.frozen
class ModelInfo:
    """What a provider can tell about a model (see :class:`DescribesModels`)."""

    #: The context window in tokens (prompt + answer); ``None``: unknown.
    context_window: int | None = None
    #: ``discovered`` (the server said) or ``fallback`` (a known model
    #: family, or the default); ``user`` when the caller gave the window.
    source: WindowSource = "fallback"
    #: Whether the server reports token usage; ``None``: not known.
    reports_usage: bool | None = None
    #: The answer's token cap the provider sends (``max_tokens``), if any.
    max_output_tokens: int | None = None
    #: Why the window is a fallback (never server text); empty when discovered.
    detail: str = ""


@runtime_checkable
class DescribesModels(Protocol):
    """The optional part of the port: a provider that can describe a model.

    The hub asks once per model when it creates a session; a provider without
    it gets the fallback window.
    """

    async def describe(self, model: str, *, context_window: int | None = None) -> ModelInfo:
        """What the provider knows about ``model``.

        With ``context_window`` the caller has decided the window: the
        provider only configures itself for it (Ollama sends it as
        ``options.num_ctx``) and asks the server nothing about the window.

        Must be quick (a short timeout), cached per model, and must not
        raise for a server that cannot tell: it returns a fallback instead.
        """
        ...
