"""Each wire protocol's bytes for the shared provider contract: a whole
answer, one cut short, one at the token cap, a text frame, a raw frame, an
error mid-stream; and the provider that speaks it."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import attrs

from turnledger.adapters.providers import PROVIDER_KINDS
from turnledger.events import ToolCall
from turnledger.testing import (
    LoopbackServer,
    WireProtocol,
    anthropic_error_event,
    anthropic_sse_events,
    media_type_of,
    ollama_ndjson_lines,
    openai_error_event,
    openai_sse_chunks,
    responses_error_event,
    responses_sse_events,
    sse_event,
    tool_call_reply,
)


def _ndjson(obj: Any) -> bytes:
    return sse_event(obj)[6:-1]  # the compact JSON text and one "\n"


@attrs.frozen
class Wire:
    """One protocol, as the contract needs it."""

    name: WireProtocol
    #: ``(pieces, truncated, end) -> frames``: the text in those pieces;
    #: ``truncated``: at the token cap; ``end``: with the last event.
    _frames: Callable[[Sequence[str], bool, bool], list[bytes]]
    #: One frame of answer text.
    text: Callable[[str], bytes]
    #: A frame of the given data text (JSON, or not).
    raw: Callable[[bytes], bytes]
    #: An error the server sends after the 200.
    error: bytes
    #: Frames of the whole answer that come after its end marker may go
    #: before this many last frames (0: after everything).
    closing: int

    @property
    def sse(self) -> bool:
        return self.name != "ollama"

    @property
    def media_type(self) -> str:
        return media_type_of(self.name)

    def frames(self, *pieces: str, truncated: bool = False, end: bool = True) -> list[bytes]:
        return self._frames(pieces, truncated, end)

    def head(self) -> list[bytes]:
        """The frames before any text (none for NDJSON)."""
        whole = self.frames("x")
        return whole[: whole.index(self.text("x"))] if self.text("x") in whole else []

    def tool_call(self) -> list[bytes]:
        reply = tool_call_reply((ToolCall("call_1", "lookup", '{"q":"x"}'),), protocol=self.name)
        return [p for p in reply.body if isinstance(p, bytes)]

    def url(self, server: LoopbackServer, prefix: str) -> str:
        return f"{server.base_url}{prefix}{PROVIDER_KINDS[self.name].loopback_path}"

    def provider(self, base_url: str, **kw: Any) -> Any:
        return PROVIDER_KINDS[self.name].provider_class()(base_url=base_url, trust_env=False, **kw)


def _openai(pieces: Sequence[str], truncated: bool, end: bool) -> list[bytes]:
    finish = "length" if truncated else "stop"
    chunks = openai_sse_chunks("".join(pieces), finish_reason=finish, chunk_size=1 << 30)
    if len(pieces) != 1:  # one content chunk per piece
        chunks = [chunks[0], *map(_openai_text, pieces), *chunks[-2:]]
    return chunks if end else chunks[:-1]


def _openai_text(piece: str) -> bytes:
    return openai_sse_chunks(piece, chunk_size=1 << 30)[1]


def _ollama(pieces: Sequence[str], truncated: bool, end: bool) -> list[bytes]:
    reason = "length" if truncated else "stop"
    lines = ollama_ndjson_lines("".join(pieces), done_reason=reason, chunk_size=1 << 30)
    if len(pieces) != 1:
        lines = [*map(_ollama_text, pieces), lines[-1]]
    return lines if end else lines[:-1]


def _ollama_text(piece: str) -> bytes:
    return ollama_ndjson_lines(piece, chunk_size=1 << 30, done=False)[0]


def _anthropic(pieces: Sequence[str], truncated: bool, end: bool) -> list[bytes]:
    stop = "max_tokens" if truncated else "end_turn"
    events = anthropic_sse_events("".join(pieces), stop_reason=stop, chunk_size=1 << 30)
    if len(pieces) != 1:  # start, ping, block start, deltas, block stop, ...
        events = [*events[:3], *map(_anthropic_text, pieces), *events[4:]]
    return events if end else events[:-1]


def _anthropic_text(piece: str) -> bytes:
    return anthropic_sse_events(piece, chunk_size=1 << 30)[3]


def _responses(pieces: Sequence[str], truncated: bool, end: bool) -> list[bytes]:
    events = responses_sse_events(
        "".join(pieces),
        chunk_size=1 << 30,
        incomplete="max_output_tokens" if truncated else None,
        end=end,
    )
    if len(pieces) != 1:  # created, item added, part added, delta, text done, ...
        events = [*events[:3], *map(_responses_text, pieces), *events[4:]]
    return events


def _responses_text(piece: str) -> bytes:
    return responses_sse_events(piece, chunk_size=1 << 30)[3]


def _sse_raw(data: bytes) -> bytes:
    return b"data: " + data + b"\n\n"


WIRES = [
    Wire("openai", _openai, _openai_text, _sse_raw, openai_error_event(), 1),
    Wire("ollama", _ollama, _ollama_text, lambda d: d + b"\n", _ndjson({"error": "failed"}), 0),
    Wire("anthropic", _anthropic, _anthropic_text, _sse_raw, anthropic_error_event(), 1),
    Wire("openai-responses", _responses, _responses_text, _sse_raw, responses_error_event(), 0),
]
BY_NAME = {w.name: w for w in WIRES}
