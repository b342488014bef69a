"""Request bodies of the Anthropic Messages and OpenAI Responses APIs.

Pure: imports no I/O library.

Both encoders keep the :class:`~turnledger.sessions.RequestEncoder`
contract (the sizes of the parts add up to the body, byte for byte), so the
projection measures exactly what goes on the wire. Each message is encoded
on its own:

- Anthropic: the system prompt is the top-level ``system`` field, written
  before ``messages``; it counts as the one message that needs no separator
  (its ``"system":S,`` replaces a comma between two messages). A tool call
  is a ``tool_use`` block of the assistant message; a result is a user
  message holding one ``tool_result`` block (the API joins consecutive user
  messages into one turn). With ``cache`` every message is written as
  content blocks, and ``cache_control`` marks the system prompt and the last
  block of the request: the next request reads the unchanged prefix (system
  prompt and older turns) from Anthropic's prompt cache.
- Responses: messages are ``input`` items; a tool call is a
  ``function_call`` item after its assistant message, a result a
  ``function_call_output`` item. ``store`` is false and no
  ``previous_response_id`` is sent: the ledger is the only history.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, Final

import attrs

from ..events import ToolCall, ToolSpec
from ..sessions._request import ChatMessage, _dumps, _model_size, _text_size

__all__ = ["AnthropicEncoder", "ResponsesEncoder"]

_MARK: Final = ',"cache_control":{"type":"ephemeral"}'
#: tool_choice in Anthropic's words.
_ANTHROPIC_CHOICE: Final = {"auto": "auto", "required": "any", "none": "none"}


def _copy_mapping(m: Mapping[str, Any]) -> dict[str, Any]:
    return dict(m)


def _tail(fields: Mapping[str, Any], owned: tuple[str, ...]) -> str:
    for key in fields:
        if key in owned:
            raise ValueError(f"extra field {key!r} would replace a field the encoder owns")
    return "".join(f",{_dumps(k)}:{_dumps(v)}" for k, v in fields.items())


def _text_block(text: str) -> str:
    return f'{{"type":"text","text":{_dumps(text)}}}'


def _tool_use(c: ToolCall) -> str:
    # Arguments are a validated, compact JSON object: spliced as they are.
    return (
        f'{{"type":"tool_use","id":{_dumps(c.call_id)},"name":{_dumps(c.name)},'
        f'"input":{c.arguments}}}'
    )


@attrs.frozen
class AnthropicEncoder:
    """The body of a streamed ``POST /v1/messages``::

        {"model":M,["system":S,]"messages":[...],"stream":true,"max_tokens":N,<extra>}

    Args:
        max_tokens: the answer's token cap (the API requires one).
        extra: further top-level fields, in order (``temperature``,
            ``stop_sequences``...).
        cache: mark the stable prefix for prompt caching (see the module).
    """

    max_tokens: int = 4096
    extra: Mapping[str, Any] = attrs.field(factory=dict, converter=_copy_mapping)
    cache: bool = False
    _suffix: str = attrs.field(init=False, repr=False, eq=False)

    def __attrs_post_init__(self) -> None:
        owned = ("model", "system", "messages", "stream", "max_tokens", "tools", "tool_choice")
        tail = _tail(self.extra, owned)
        suffix = f'],"stream":true,"max_tokens":{int(self.max_tokens)}{tail}}}'
        object.__setattr__(self, "_suffix", suffix)

    @property
    def cache_key(self) -> object:
        return (AnthropicEncoder, self.cache)

    @property
    def separator_size(self) -> int:
        return 1

    def _system(self, text: str) -> str:
        if self.cache:
            return f'"system":[{{"type":"text","text":{_dumps(text)}{_MARK}}}]'
        return f'"system":{_dumps(text)}'

    def _message(self, m: ChatMessage) -> str:
        if m.role == "system":
            return self._system(m.content)
        if m.role == "tool":
            block = (
                f'{{"type":"tool_result","tool_use_id":{_dumps(m.tool_call_id)},'
                f'"content":{_dumps(m.content)}}}'
            )
            return f'{{"role":"user","content":[{block}]}}'
        if m.tool_calls:
            blocks = [_text_block(m.content)] if m.content else []
            blocks += map(_tool_use, m.tool_calls)
            return f'{{"role":"assistant","content":[{",".join(blocks)}]}}'
        if self.cache:
            return f'{{"role":{_dumps(m.role)},"content":[{_text_block(m.content)}]}}'
        return f'{{"role":{_dumps(m.role)},"content":{_dumps(m.content)}}}'

    def encode(
        self,
        model: str,
        messages: Sequence[ChatMessage],
        tools: Sequence[ToolSpec] = (),
        tool_choice: str = "auto",
    ) -> bytes:
        head = f'{{"model":{_dumps(model)},'
        if messages and messages[0].role == "system":
            if len(messages) == 1:
                raise ValueError("a request needs a message besides the system prompt")
            head += self._system(messages[0].content) + ","
            messages = messages[1:]
        if any(m.role == "system" for m in messages):
            raise ValueError("the system prompt can only be the first message")
        parts = [self._message(m) for m in messages]
        if self.cache and parts:
            parts[-1] = parts[-1][:-3] + _MARK + "}]}"  # the last block of the request
        body = head + '"messages":[' + ",".join(parts) + self._suffix
        if tools:
            body = body[:-1] + self._tools(tools, tool_choice) + "}"
        return body.encode()

    def _tools(self, tools: Sequence[ToolSpec], tool_choice: str) -> str:
        choice = _ANTHROPIC_CHOICE.get(tool_choice)
        if choice is None:
            raise ValueError(f"tool_choice {tool_choice!r} is not one of auto, required, none")
        specs = ",".join(
            f'{{"name":{_dumps(t.name)},'
            + (f'"description":{_dumps(t.description)},' if t.description else "")
            + f'"input_schema":{t.parameters}}}'
            for t in tools
        )
        return f',"tools":[{specs}],"tool_choice":{{"type":"{choice}"}}'

    def tools_size(self, tools: Sequence[ToolSpec], tool_choice: str = "auto") -> int:
        return len(self._tools(tools, tool_choice).encode()) if tools else 0

    def message_size(self, message: ChatMessage) -> int:
        if message.role in ("user", "assistant") and not message.tool_calls and not self.cache:
            # '{"role":' + R + ',"content":' + C + '}'
            return 20 + _text_size(message.role) + _text_size(message.content)
        return len(self._message(message).encode())

    def frame_size(self, model: str, n_messages: int) -> int:
        # '{"model":' + M + ',"messages":[' + commas + suffix (+ the cache mark)
        mark = len(_MARK) if self.cache and n_messages else 0
        return 9 + _model_size(model) + 13 + max(n_messages - 1, 0) + len(self._suffix) + mark


@attrs.frozen
class ResponsesEncoder:
    """The body of a streamed ``POST /v1/responses``::

        {"model":M,"input":[...],"stream":true,"store":false,<extra>}

    Args:
        extra: further top-level fields, in order (``temperature``,
            ``max_output_tokens``, ``reasoning``...).
    """

    extra: Mapping[str, Any] = attrs.field(factory=dict, converter=_copy_mapping)
    _suffix: str = attrs.field(init=False, repr=False, eq=False)

    def __attrs_post_init__(self) -> None:
        owned = ("model", "input", "stream", "store", "previous_response_id", "tools")
        tail = _tail(self.extra, owned)
        object.__setattr__(self, "_suffix", f'],"stream":true,"store":false{tail}}}')

    @property
    def cache_key(self) -> object:
        return ResponsesEncoder

    @property
    def separator_size(self) -> int:
        return 1

    def _message(self, m: ChatMessage) -> str:
        if m.role == "tool":
            return (
                f'{{"type":"function_call_output","call_id":{_dumps(m.tool_call_id)},'
                f'"output":{_dumps(m.content)}}}'
            )
        plain = f'{{"role":{_dumps(m.role)},"content":{_dumps(m.content)}}}'
        if not m.tool_calls:
            return plain
        items = [plain] if m.content else []
        items += (
            f'{{"type":"function_call","call_id":{_dumps(c.call_id)},'
            f'"name":{_dumps(c.name)},"arguments":{_dumps(c.arguments)}}}'
            for c in m.tool_calls
        )
        return ",".join(items)

    def encode(
        self,
        model: str,
        messages: Sequence[ChatMessage],
        tools: Sequence[ToolSpec] = (),
        tool_choice: str = "auto",
    ) -> bytes:
        body = (
            f'{{"model":{_dumps(model)},"input":['
            + ",".join(self._message(m) for m in messages)
            + self._suffix
        )
        if tools:
            body = body[:-1] + self._tools(tools, tool_choice) + "}"
        return body.encode()

    def _tools(self, tools: Sequence[ToolSpec], tool_choice: str) -> str:
        specs = ",".join(
            f'{{"type":"function","name":{_dumps(t.name)},"description":{_dumps(t.description)},'
            f'"parameters":{t.parameters},"strict":false}}'
            for t in tools
        )
        return f',"tools":[{specs}],"tool_choice":{_dumps(tool_choice)}'

    def tools_size(self, tools: Sequence[ToolSpec], tool_choice: str = "auto") -> int:
        return len(self._tools(tools, tool_choice).encode()) if tools else 0

    def message_size(self, message: ChatMessage) -> int:
        if message.role != "tool" and not message.tool_calls:
            return 20 + _text_size(message.role) + _text_size(message.content)
        return len(self._message(message).encode())

    def frame_size(self, model: str, n_messages: int) -> int:
        # '{"model":' + M + ',"input":[' + commas + suffix
        return 9 + _model_size(model) + 10 + max(n_messages - 1, 0) + len(self._suffix)
