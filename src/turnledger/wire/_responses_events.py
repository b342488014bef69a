"""OpenAI Responses stream events to a turn.

Pure: imports no I/O library.

The protocol of ``POST /v1/responses`` with ``"stream": true``
(https://platform.openai.com/docs/api-reference/responses-streaming), as
OpenAI and vLLM send it: SSE events whose data is a JSON object with a
``type`` (and, from OpenAI, an event name equal to it)::

    response.created
      response.output_item.added            an item: message, function_call, reasoning...
        response.content_part.added
        response.output_text.delta*         the answer
        response.output_text.done           its whole text
        response.function_call_arguments.delta* / .done
      response.output_item.done
    response.completed | response.incomplete | response.failed

with ``error`` ending the stream anywhere. Items are numbered by
``output_index`` from 0. Reasoning items, refusal text and the events of
hosted tools are never answer text; event types this module does not know
are skipped (OpenAI adds them), but text can only come from the events
above.

A turn completes only on ``response.completed`` whose ``output`` holds
exactly the text and function calls that were streamed (the output text is
complete). What the provider reports:

==============================================  =======================
stream                                          outcome
==============================================  =======================
``response.completed``                          :class:`Completion`
                                                (``stop``, ``tool_calls``
                                                with function calls,
                                                ``refusal`` after refusal
                                                text)
``response.incomplete``                         its reason
                                                (``max_output_tokens``,
                                                ``content_filter``): the
                                                session discards it
``response.failed``, ``error``                  ``provider_error``
an event before ``response.created``, a second
one, a delta for an item that never started,
items out of order, text that differs from the
completed output, an event after the end        ``protocol``
the end of the body before the last event       ``incomplete_stream``
not JSON, wrong field types                     ``malformed``
over a :class:`StreamLimits` limit              ``limit``
==============================================  =======================
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any, Final

import attrs

from ..events import ToolCall, Usage
from ..sessions._ports import Completion
from ._limits import StreamLimits
from ._sse import ServerSentEvent
from ._stream import (
    ROLES,
    SSEStreamDecoder,
    TypedEventValidator,
    describe,
    incomplete,
    int_field,
    known_finish_reason,
    malformed,
    object_field,
    protocol,
    provider_error,
    string_field,
    typed_event,
    usage_from,
)
from ._tool_calls import arguments_text

__all__ = ["ResponsesEventValidator", "ResponsesStreamDecoder"]


class _Item:
    """One output item as streamed."""

    __slots__ = ("args", "call_id", "done", "id", "kind", "name", "parts")

    def __init__(self, kind: str, item_id: Any) -> None:
        self.kind = kind
        self.id = item_id
        self.done = False
        self.parts: dict[int, list[str]] = {}  # a message's output_text parts
        self.call_id = ""
        self.name = ""
        self.args: list[str] | None = None  # a function call's argument pieces


def _usage(response: dict[str, Any]) -> Usage | None:
    usage = response.get("usage")
    if usage is None:
        return None
    if type(usage) is not dict:
        raise malformed("usage is not an object")
    return usage_from(
        usage.get("input_tokens"), usage.get("output_tokens"), usage.get("total_tokens")
    )


class ResponsesEventValidator(TypedEventValidator):
    """Validates the events of one streamed Responses answer.

    :meth:`feed` returns the answer text an event adds (``""`` for none);
    :meth:`finish` returns the completion at the end of the stream.
    """

    __slots__ = ("_created", "_end", "_finish", "_items", "_refused", "_usage")

    def __init__(self, limits: StreamLimits | None = None) -> None:
        super().__init__(limits)
        self._created = False
        self._end = ""  # the type of the last event once it came
        self._items: list[_Item] = []
        self._refused = False
        self._finish: str | None = None
        self._usage: Usage | None = None

    def feed(self, event: ServerSentEvent) -> str:
        if self._end:
            raise protocol(f"an event after {self._end}")
        kind, obj = typed_event(event, self._depth)
        handler = _HANDLERS.get(kind)
        if handler is None:
            return ""  # reasoning summaries, hosted tools, events added later
        if not self._created and kind not in ("response.created", "error"):
            raise protocol(f"a {kind} event before response.created")
        return handler(self, obj)

    def _item(self, obj: dict[str, Any], kind: str) -> _Item:
        # The open item an event is about, of the kind it must be.
        index = int_field(obj, "output_index")
        if not 0 <= index < len(self._items):
            raise protocol("an event for an output item that never started")
        item = self._items[index]
        if item.kind != kind or item.done:
            raise protocol(f"an event for a {kind} item that is not open")
        item_id = obj.get("item_id")
        if item_id is not None and item.id is not None and item_id != item.id:
            raise protocol("an event whose item_id differs from its item's")
        return item

    def _created_(self, obj: dict[str, Any]) -> str:
        if self._created:
            raise protocol("a second response.created")
        object_field(obj, "response", "response.created")
        self._created = True
        return ""

    def _progress(self, obj: dict[str, Any]) -> str:
        return ""

    def _item_added(self, obj: dict[str, Any]) -> str:
        if int_field(obj, "output_index") != len(self._items):
            raise protocol("an output item out of order")
        item = object_field(obj, "item", "response.output_item.added")
        kind = item.get("type")
        if type(kind) is not str:
            raise malformed("an output item has no string type")
        added = _Item(kind, item.get("id"))
        if kind == "message":
            role = item.get("role")
            if role != "assistant":
                raise protocol(f"a message with role {describe(role, 'role', ROLES)}")
        elif kind == "function_call":
            call_id, name = item.get("call_id"), item.get("name")
            if type(call_id) is not str or type(name) is not str or not call_id or not name:
                raise protocol("a function call without a call_id or a name")
            added.call_id, added.name = call_id, name
            args = item.get("arguments", "")
            if type(args) is not str:
                raise malformed("a function call's arguments are not a string")
            added.args = [args] if args else []
        self._items.append(added)
        return ""

    def _text_delta(self, obj: dict[str, Any]) -> str:
        item = self._item(obj, "message")
        text = string_field(obj, "delta", "an output_text delta")
        self._count(len(text))
        item.parts.setdefault(int_field(obj, "content_index"), []).append(text)
        self._parts.append(text)
        return text

    def _text_done(self, obj: dict[str, Any]) -> str:
        item = self._item(obj, "message")
        text = string_field(obj, "text", "output_text.done's text")
        if text != "".join(item.parts.get(int_field(obj, "content_index"), ())):
            raise protocol("output_text.done differs from the streamed text")
        return ""

    def _refusal(self, obj: dict[str, Any]) -> str:
        self._item(obj, "message")
        self._count(len(string_field(obj, "delta", "a refusal delta")))
        self._refused = True
        return ""

    def _args_delta(self, obj: dict[str, Any]) -> str:
        item = self._item(obj, "function_call")
        piece = string_field(obj, "delta", "a function call arguments delta")
        self._count(len(piece))
        assert item.args is not None
        item.args.append(piece)
        return ""

    def _args_done(self, obj: dict[str, Any]) -> str:
        item = self._item(obj, "function_call")
        self._settle_args(item, string_field(obj, "arguments", "a function call's arguments"))
        return ""

    def _settle_args(self, item: _Item, args: str) -> None:
        # Arguments given whole must be the pieces streamed, if any were.
        assert item.args is not None
        if item.args and "".join(item.args) != args:
            raise protocol("a function call's arguments differ from the streamed ones")
        item.args = [args]

    def _item_done(self, obj: dict[str, Any]) -> str:
        index = int_field(obj, "output_index")
        if not 0 <= index < len(self._items) or self._items[index].done:
            raise protocol("output_item.done for an item that is not open")
        item = self._items[index]
        done = object_field(obj, "item", "response.output_item.done")
        if done.get("type") != item.kind:
            raise protocol("an output item changed its type")
        if item.kind == "function_call":
            if done.get("call_id") != item.call_id or done.get("name") != item.name:
                raise protocol("a function call changed its call_id or name")
            args = done.get("arguments")
            if args is not None:
                if type(args) is not str:
                    raise malformed("a function call's arguments are not a string")
                self._settle_args(item, args)
        item.done = True
        return ""

    def _completed(self, obj: dict[str, Any]) -> str:
        self._end = "response.completed"
        response = object_field(obj, "response", "response.completed")
        if response.get("status", "completed") != "completed":
            raise protocol("response.completed whose status is not completed")
        output = response.get("output")
        if type(output) is not list:
            raise malformed("the completed response has no output list")
        texts: list[Any] = []
        calls: list[tuple[Any, Any, Any]] = []
        for entry in output:
            if type(entry) is not dict:
                raise malformed("an output item is not an object")
            if entry.get("type") == "message" and type(entry.get("content")) is list:
                texts += [
                    part.get("text")
                    for part in entry["content"]
                    if type(part) is dict and part.get("type") == "output_text"
                ]
            elif entry.get("type") == "function_call":
                calls.append((entry.get("call_id"), entry.get("name"), entry.get("arguments")))
        if any(type(t) is not str for t in texts) or "".join(texts) != "".join(self._parts):
            raise protocol("the completed response's text differs from the streamed text")
        streamed = [
            (i.call_id, i.name, "".join(i.args or ()))
            for i in self._items
            if i.kind == "function_call"
        ]
        if calls != streamed:
            raise protocol("the completed response's function calls differ from the streamed ones")
        self._usage = _usage(response)
        self._finish = "refusal" if self._refused else "tool_calls" if streamed else "stop"
        return ""

    def _incomplete(self, obj: dict[str, Any]) -> str:
        self._end = "response.incomplete"
        response = object_field(obj, "response", "response.incomplete")
        details = response.get("incomplete_details")
        reason = details.get("reason") if type(details) is dict else None
        if type(reason) is not str:
            raise malformed("response.incomplete has no reason")
        self._finish = known_finish_reason(reason)
        self._usage = _usage(response)
        return ""

    def _failed(self, obj: dict[str, Any]) -> str:
        response = obj.get("response")
        raise provider_error(response.get("error") if type(response) is dict else None)

    def _error(self, obj: dict[str, Any]) -> str:
        raise provider_error({"code": obj.get("code")})

    def finish(self, *, dropped: bool = False) -> Completion:
        if not self._end:
            if dropped:
                raise incomplete(
                    "the stream ended inside an unterminated event, before response.completed"
                )
            if not self._created:
                raise incomplete("the stream ended before response.created")
            raise incomplete("the stream ended before response.completed")
        calls = tuple(
            ToolCall(i.call_id, i.name, arguments_text("".join(i.args or ()), self._depth))
            for i in self._items
            if i.kind == "function_call"
        )
        return Completion("".join(self._parts), self._finish, self._usage, calls)


_Handler = Callable[[ResponsesEventValidator, dict[str, Any]], str]
_HANDLERS: Final[Mapping[str, _Handler]] = {
    "response.created": ResponsesEventValidator._created_,
    "response.in_progress": ResponsesEventValidator._progress,
    "response.queued": ResponsesEventValidator._progress,
    "response.output_item.added": ResponsesEventValidator._item_added,
    "response.output_text.delta": ResponsesEventValidator._text_delta,
    "response.output_text.done": ResponsesEventValidator._text_done,
    "response.refusal.delta": ResponsesEventValidator._refusal,
    "response.function_call_arguments.delta": ResponsesEventValidator._args_delta,
    "response.function_call_arguments.done": ResponsesEventValidator._args_done,
    "response.output_item.done": ResponsesEventValidator._item_done,
    "response.completed": ResponsesEventValidator._completed,
    "response.incomplete": ResponsesEventValidator._incomplete,
    "response.failed": ResponsesEventValidator._failed,
    "error": ResponsesEventValidator._error,
}


class ResponsesStreamDecoder(SSEStreamDecoder):
    """Bytes of a streamed ``/v1/responses`` response to preview and completion.

    The closing events (``output_text.done``, ``content_part.done``,
    ``output_item.done``, ``response.completed``) each repeat the whole
    answer on one line, so the line and event limits are raised to hold an
    answer of ``max_output_chars`` written with JSON's longest escapes (6
    characters each) and 64 KiB besides; every other limit is as given.
    """

    __slots__ = ()
    _validator_class = ResponsesEventValidator

    def __init__(self, limits: StreamLimits | None = None) -> None:
        lim = limits or StreamLimits()
        whole = 6 * lim.max_output_chars + 65_536
        super().__init__(
            attrs.evolve(
                lim,
                max_line_chars=max(lim.max_line_chars, whole),
                max_event_chars=max(lim.max_event_chars, whole),
            )
        )
