"""Tool calls in provider responses: assembled, parsed strictly, never quoted.

Pure: imports no I/O library.

OpenAI streams a call as ``delta.tool_calls[i]`` pieces: the first piece of
index ``i`` carries ``id`` and ``function.name``, later ones more of
``function.arguments`` (JSON text cut anywhere). A non-streamed response, and
Ollama (streamed or not), carry whole calls in ``message.tool_calls``; Ollama
gives ``arguments`` as an object and may give no id (one is made up from the
call's position, unique in the round).

Arguments must be one strict JSON object (the parser rules of every other
JSON here: no NaN, no duplicate keys, bounded depth); they are kept as compact
JSON text, the form they are sent back in. Every problem with a call is
``protocol``; whether the name is a registered tool and the ids are unique is the
session's judgement (it discards the turn as ``protocol`` too).
"""

from __future__ import annotations

import json
from typing import Any

from .._errors import DecodeError, LimitExceeded
from ..events import ToolCall
from ._stream import protocol
from ._strict_json import loads_object

__all__ = ["OpenAIToolCallAssembler", "ollama_tool_calls", "openai_tool_calls"]

_MAX_CALLS = 128


def _compact(value: dict[str, Any]) -> str:
    return json.dumps(value, ensure_ascii=False, separators=(",", ":"), allow_nan=False)


def arguments_text(text: str, max_depth: int) -> str:
    """Strict JSON object text to its compact form.

    Raises:
        ProviderError: ``protocol``; the message never quotes the text.
    """
    try:
        return _compact(loads_object(text, max_depth=max_depth))
    except DecodeError:
        raise protocol("tool call arguments are not a strict JSON object") from None


def _str_field(obj: dict[str, Any], key: str, what: str) -> str | None:
    value = obj.get(key)
    if value is not None and type(value) is not str:
        raise protocol(f"a tool call's {what} is not a string")
    return value


def _function(call: Any) -> dict[str, Any]:
    if type(call) is not dict:
        raise protocol("a tool call is not an object")
    function = call.get("function")
    if type(function) is not dict:
        raise protocol("a tool call has no function object")
    kind = call.get("type")
    if kind is not None and kind != "function":
        raise protocol("a tool call of a type other than function")
    return function


def _calls_list(value: Any) -> list[Any]:
    if type(value) is not list:
        raise protocol("tool_calls is not a list")
    if len(value) > _MAX_CALLS:
        raise protocol(f"more than {_MAX_CALLS} tool calls in a round")
    return value


def openai_tool_calls(value: Any, max_depth: int) -> tuple[ToolCall, ...]:
    """``message.tool_calls`` of a non-streamed OpenAI response."""
    out = []
    for call in _calls_list(value):
        function = _function(call)
        call_id = _str_field(call, "id", "id")
        name = _str_field(function, "name", "name")
        args = function.get("arguments")
        if not call_id or not name:
            raise protocol("a tool call without an id or a name")
        if type(args) is not str:
            raise protocol("tool call arguments are not JSON text")
        out.append(ToolCall(call_id, name, arguments_text(args, max_depth)))
    return tuple(out)


def ollama_tool_calls(value: Any, max_depth: int, first: int = 0) -> tuple[ToolCall, ...]:
    """``message.tool_calls`` of an Ollama line; calls without an id get
    ``call_<n>``, ``n`` counting from ``first`` (the calls already seen)."""
    out = []
    for i, call in enumerate(_calls_list(value), start=first):
        function = _function(call)
        name = _str_field(function, "name", "name")
        if not name:
            raise protocol("a tool call without a name")
        args = function.get("arguments", {})
        if type(args) is not dict:
            raise protocol("tool call arguments are not a JSON object")
        call_id = _str_field(call, "id", "id") or f"call_{i}"
        out.append(ToolCall(call_id, name, _compact(args)))
    return tuple(out)


class OpenAIToolCallAssembler:
    """Joins streamed ``delta.tool_calls`` pieces into whole calls."""

    __slots__ = ("_args", "_chars", "_depth", "_ids", "_max_chars", "_names")

    def __init__(self, max_chars: int, max_depth: int) -> None:
        self._ids: list[str] = []
        self._names: list[str] = []
        self._args: list[list[str]] = []
        self._chars = 0
        self._max_chars = max_chars
        self._depth = max_depth

    def __bool__(self) -> bool:
        return bool(self._ids)

    def feed(self, value: Any) -> None:
        """One delta's ``tool_calls`` list.

        Raises:
            ProviderError: ``malformed``, ``protocol`` or ``limit``.
        """
        for piece in _calls_list(value):
            function = _function(piece) if "function" in piece else {}
            index = piece.get("index")
            if type(index) is not int or index < 0:
                raise protocol("a tool call delta has no integer index")
            call_id = _str_field(piece, "id", "id")
            name = _str_field(function, "name", "name")
            args = _str_field(function, "arguments", "arguments")
            if index == len(self._ids):  # a new call starts
                if len(self._ids) >= _MAX_CALLS:
                    raise protocol(f"more than {_MAX_CALLS} tool calls in a round")
                if not call_id or not name:
                    raise protocol("a tool call starts without an id or a name")
                self._ids.append(call_id)
                self._names.append(name)
                self._args.append([])
            elif index < len(self._ids):
                if call_id and call_id != self._ids[index]:
                    raise protocol("a tool call changed its id")
                if name and name != self._names[index]:
                    raise protocol("a tool call changed its name")
            else:
                raise protocol("a tool call delta skipped an index")
            if args:
                self._chars += len(args)
                if self._chars > self._max_chars:
                    raise LimitExceeded(
                        f"tool call arguments are longer than {self._max_chars} characters"
                    )
                self._args[index].append(args)

    def calls(self) -> tuple[ToolCall, ...]:
        """The whole calls, arguments parsed and compacted.

        Raises:
            ProviderError: ``protocol`` for arguments that are not a strict
                JSON object.
        """
        return tuple(
            ToolCall(i, n, arguments_text("".join(a), self._depth))
            for i, n, a in zip(self._ids, self._names, self._args, strict=True)
        )
