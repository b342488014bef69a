"""Tools an application registers: a definition the model sees and an async
function the session runs for each call.

Pure: the function is only called by the runtime. Definitions go into the
session's ``SessionStarted`` (as :class:`~turnledger.events.ToolSpec`); the
functions live with the hub, so a session recovered from its log runs the
functions registered now under the names it was started with.
"""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable, Mapping
from typing import Any

import attrs

from ..events import RequestId, ToolSpec

__all__ = ["Tool", "ToolError", "ToolInvocation", "result_text"]


class ToolError(Exception):
    """Raise it from a tool to give the model ``str(exc)`` as the call's
    error result. Any other exception reaches the model only as its type
    name (its message might carry what the model should not see)."""


@attrs.frozen
class ToolInvocation:
    """One call of a tool: which turn and call it belongs to (stable across
    retries, so a tool can be idempotent) and its arguments."""

    request_id: RequestId
    call_id: str
    name: str
    arguments: Mapping[str, Any]


def _schema(value: Mapping[str, Any] | str) -> str:
    if isinstance(value, str):
        value = json.loads(value)
    return json.dumps(value, ensure_ascii=False, separators=(",", ":"), allow_nan=False)


@attrs.frozen
class Tool:
    """A tool: ``run(invocation)`` returns text, or a JSON value sent as its
    compact JSON text.

    Args:
        name: 1-64 letters, digits, ``_`` or ``-``; unique in a session.
        run: the async function (trio) the session calls for each call; it
            is cancelled with the turn.
        description: what the tool does, for the model.
        parameters: the JSON Schema of the arguments (an object).
    """

    name: str
    run: Callable[[ToolInvocation], Awaitable[object]] = attrs.field(repr=False)
    description: str = ""
    parameters: str = attrs.field(default='{"type":"object","properties":{}}', converter=_schema)
    spec: ToolSpec = attrs.field(init=False, repr=False)

    @spec.default
    def _spec(self) -> ToolSpec:
        return ToolSpec(self.name, self.description, self.parameters)


def result_text(value: object) -> str:
    """A tool's return value as the text the model sees.

    Raises:
        TypeError, ValueError: the value is neither text nor JSON-serialisable.
    """
    if isinstance(value, str):
        return value
    return json.dumps(value, ensure_ascii=False, separators=(",", ":"), allow_nan=False)
