"""The ``Provider`` port: what a session needs from a model server.

Adapters (``turnledger.adapters.providers``) implement it; the session runtime
calls it from the request task. Providers never decide whether a turn
commits: they report what the server said, typed.
"""

from __future__ import annotations

from typing import Protocol, runtime_checkable

import attrs

from ..events import RequestId, ToolCall, ToolSpec, Usage
from ._request import ChatMessage, RequestEncoder

__all__ = ["ChatRequest", "Completion", "Provider", "StreamSink"]


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
