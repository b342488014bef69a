"""The request encoder: the exact bytes a provider adapter sends.

The projection measures requests with the same encoder the adapter uses to
serialize them, so the budget is the real wire size. Encoders expose their
layout so sizes can be summed linearly: a body is a fixed frame (envelope and
separators, depending only on the model and the number of messages) plus each
message encoded on its own.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any, Literal, Protocol, TypeAlias

import attrs

__all__ = ["ChatMessage", "JsonChatEncoder", "RequestEncoder", "Role"]

Role: TypeAlias = Literal["system", "user", "assistant"]


@attrs.frozen
class ChatMessage:
    """One message of a chat request."""

    role: Role
    content: str


class RequestEncoder(Protocol):
    """Serializes chat requests and reports the size of each part.

    For any model and messages::

        frame_size(model, len(messages)) + sum(map(message_size, messages))
            == len(encode(model, messages))
    """

    @property
    def cache_key(self) -> object:
        """Equal for encoders that encode a single message identically."""
        ...

    def encode(self, model: str, messages: Sequence[ChatMessage]) -> bytes:
        """The request body, exactly as it goes on the wire."""
        ...

    def message_size(self, message: ChatMessage) -> int:
        """Bytes of one encoded message inside the body."""
        ...

    def frame_size(self, model: str, n_messages: int) -> int:
        """Bytes of everything in the body except the messages themselves.

        For ``n >= 1`` it must equal
        ``frame_size(model, 1) + (n - 1) * separator_size``.
        """
        ...

    @property
    def separator_size(self) -> int:
        """Bytes between two consecutive messages."""
        ...


def _dumps(value: Any) -> str:
    return json.dumps(value, ensure_ascii=False, separators=(",", ":"), allow_nan=False)


def _copy_mapping(m: Mapping[str, Any]) -> dict[str, Any]:
    return dict(m)


@attrs.frozen
class JsonChatEncoder:
    """The body of an OpenAI-compatible ``/v1/chat/completions`` request
    (also Ollama's ``/api/chat``, which has the same shape)::

        {"model":M,"messages":[{"role":R,"content":C},...],"stream":true,<extra>}

    serialized with ``ensure_ascii=False`` and no spaces, so the size is the
    UTF-8 length the server receives.

    Args:
        stream: the value of ``"stream"``.
        extra: further top-level fields, in order (``temperature``,
            ``max_tokens``, ``stream_options``, ``options`` ...).
    """

    stream: bool = True
    extra: Mapping[str, Any] = attrs.field(factory=dict, converter=_copy_mapping)
    _suffix: bytes = attrs.field(init=False, repr=False, eq=False)

    def __attrs_post_init__(self) -> None:
        tail = "".join(f",{_dumps(k)}:{_dumps(v)}" for k, v in self.extra.items())
        suffix = f'],"stream":{"true" if self.stream else "false"}{tail}}}'
        object.__setattr__(self, "_suffix", suffix.encode())

    @property
    def cache_key(self) -> object:
        # Every JsonChatEncoder encodes a single message the same way.
        return JsonChatEncoder

    @property
    def separator_size(self) -> int:
        return 1

    def encode(self, model: str, messages: Sequence[ChatMessage]) -> bytes:
        body: dict[str, Any] = {
            "model": model,
            "messages": [{"role": m.role, "content": m.content} for m in messages],
            "stream": self.stream,
        }
        for key, value in self.extra.items():
            if key in body:
                raise ValueError(f"extra field {key!r} would replace a field the encoder owns")
            body[key] = value
        return _dumps(body).encode()

    def message_size(self, message: ChatMessage) -> int:
        # '{"role":' + R + ',"content":' + C + '}'
        return 20 + len(_dumps(message.role).encode()) + len(_dumps(message.content).encode())

    def frame_size(self, model: str, n_messages: int) -> int:
        # '{"model":' + M + ',"messages":[' + commas + suffix
        prefix = 9 + len(_dumps(model).encode()) + 13
        return prefix + max(n_messages - 1, 0) + len(self._suffix)
