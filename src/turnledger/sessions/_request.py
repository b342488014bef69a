"""The request encoder: the exact bytes a provider adapter sends.

The projection measures requests with the same encoder the adapter uses to
serialize them, so the budget is the real wire size. Encoders expose their
layout so sizes can be summed linearly: a body is a fixed frame (envelope and
separators, depending only on the model and the number of messages) plus each
message encoded on its own.
"""

from __future__ import annotations

import functools
import json
from collections.abc import Mapping, Sequence
from json.encoder import encode_basestring
from typing import Any, Final, Literal, Protocol, TypeAlias

import attrs

from ..events import ToolCall, ToolSpec

__all__ = ["ChatMessage", "JsonChatEncoder", "RequestEncoder", "Role", "ToolFormat"]

Role: TypeAlias = Literal["system", "user", "assistant", "tool"]
#: How tool calls and results are spelled: OpenAI's (call ids, arguments as
#: JSON text) or Ollama's (no ids, arguments as a JSON object).
ToolFormat: TypeAlias = Literal["openai", "ollama"]


@attrs.frozen
class ChatMessage:
    """One message of a chat request.

    An ``assistant`` message may carry ``tool_calls``; a ``tool`` message is
    the result of the call ``tool_call_id`` (of the tool ``name``).
    """

    role: Role
    content: str
    tool_calls: tuple[ToolCall, ...] = ()
    tool_call_id: str = ""
    name: str = ""


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

    def encode(
        self,
        model: str,
        messages: Sequence[ChatMessage],
        tools: Sequence[ToolSpec] = (),
        tool_choice: str = "auto",
    ) -> bytes:
        """The request body, exactly as it goes on the wire (with the tool
        definitions and ``tool_choice``, if there are tools)."""
        ...

    def tools_size(self, tools: Sequence[ToolSpec], tool_choice: str = "auto") -> int:
        """Bytes the tool definitions add to a body (0 for none)."""
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
    if type(value) is str:
        # What json.dumps does for a string with ensure_ascii=False, without
        # building a JSONEncoder on every call.
        return encode_basestring(value)
    return json.dumps(value, ensure_ascii=False, separators=(",", ":"), allow_nan=False)


def _text_size(value: str) -> int:
    """UTF-8 bytes of ``_dumps(value)`` for a string. A lone surrogate
    raises ``UnicodeEncodeError`` exactly as measuring ``_dumps(value)``
    would."""
    quoted = encode_basestring(value)
    return len(quoted) if quoted.isascii() else len(quoted.encode())


#: '{"role":' + R + ',"content":' + '}' for each role.
_PLAIN_FRAME: Final = {r: 20 + len(_dumps(r)) for r in ("system", "user", "assistant", "tool")}


@functools.lru_cache(maxsize=256)
def _model_size(model: str) -> int:
    return _text_size(model)


def _copy_mapping(m: Mapping[str, Any]) -> dict[str, Any]:
    return dict(m)


def _openai_call(c: ToolCall) -> str:
    return (
        f'{{"id":{_dumps(c.call_id)},"type":"function","function":'
        f'{{"name":{_dumps(c.name)},"arguments":{_dumps(c.arguments)}}}}}'
    )


def _ollama_call(c: ToolCall) -> str:
    # Arguments are a validated, compact JSON object: spliced as they are.
    return f'{{"function":{{"name":{_dumps(c.name)},"arguments":{c.arguments}}}}}'


def tool_definitions(tools: Sequence[ToolSpec]) -> str:
    """The ``tools`` array of a request, as compact JSON text."""
    return (
        "["
        + ",".join(
            f'{{"type":"function","function":{{"name":{_dumps(t.name)},'
            f'"description":{_dumps(t.description)},"parameters":{t.parameters}}}}}'
            for t in tools
        )
        + "]"
    )


def _tools_text(tool_format: str, tools: Sequence[ToolSpec], tool_choice: str) -> str:
    out = f',"tools":{tool_definitions(tools)}'
    if tool_format == "openai":
        out += f',"tool_choice":{_dumps(tool_choice)}'
    return out


@functools.lru_cache(maxsize=64)
def _tools_size(tool_format: str, tools: tuple[ToolSpec, ...], tool_choice: str) -> int:
    # A session sends the same tools with every request: measured once.
    return len(_tools_text(tool_format, tools, tool_choice).encode())


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
    tool_format: ToolFormat = "openai"
    _suffix: bytes = attrs.field(init=False, repr=False, eq=False)

    def __attrs_post_init__(self) -> None:
        tail = "".join(f",{_dumps(k)}:{_dumps(v)}" for k, v in self.extra.items())
        suffix = f'],"stream":{"true" if self.stream else "false"}{tail}}}'
        object.__setattr__(self, "_suffix", suffix.encode())

    @property
    def cache_key(self) -> object:
        # Every JsonChatEncoder encodes a plain message the same way; tool
        # messages depend on the format.
        return JsonChatEncoder if self.tool_format == "openai" else (JsonChatEncoder, "ollama")

    @property
    def separator_size(self) -> int:
        return 1

    def encode(
        self,
        model: str,
        messages: Sequence[ChatMessage],
        tools: Sequence[ToolSpec] = (),
        tool_choice: str = "auto",
    ) -> bytes:
        for key in self.extra:
            if key in ("model", "messages", "stream"):
                raise ValueError(f"extra field {key!r} would replace a field the encoder owns")
        body = (
            f'{{"model":{_dumps(model)},"messages":['
            + ",".join(self._message(m) for m in messages)
            + self._suffix.decode()
        )
        if tools:
            body = body[:-1] + _tools_text(self.tool_format, tools, tool_choice) + "}"
        return body.encode()

    def tools_size(self, tools: Sequence[ToolSpec], tool_choice: str = "auto") -> int:
        if not tools:
            return 0
        return _tools_size(self.tool_format, tuple(tools), tool_choice)

    def _message(self, m: ChatMessage) -> str:
        out = f'{{"role":{_dumps(m.role)},"content":{_dumps(m.content)}'
        if m.tool_calls:
            call = _openai_call if self.tool_format == "openai" else _ollama_call
            out += ',"tool_calls":[' + ",".join(call(c) for c in m.tool_calls) + "]"
        if m.role == "tool":
            if self.tool_format == "openai":
                out += f',"tool_call_id":{_dumps(m.tool_call_id)}'
            else:
                out += f',"tool_name":{_dumps(m.name)}'
        return out + "}"

    def message_size(self, message: ChatMessage) -> int:
        if message.tool_calls or message.role == "tool":
            return len(self._message(message).encode())
        # '{"role":' + R + ',"content":' + C + '}'
        frame = _PLAIN_FRAME.get(message.role)
        if frame is None:
            frame = 20 + _text_size(message.role)
        return frame + _text_size(message.content)

    def frame_size(self, model: str, n_messages: int) -> int:
        # '{"model":' + M + ',"messages":[' + commas + suffix
        prefix = 9 + _model_size(model) + 13
        return prefix + max(n_messages - 1, 0) + len(self._suffix)
