"""Who writes a summary, and when the hub asks for one.

A summary is written outside every session's turn: by a function of the
user's, or by the session's own model with a named prompt, in the caller's
task (:meth:`Hub.summarize`) or in a task of the hub's (a
:class:`SummaryPolicy`). Only its result goes through the session's actor, as
one ``RecordSummary`` message, whenever it is ready; a turn never waits for
it, and a summarizer that fails, times out or is cancelled records nothing.
"""

from __future__ import annotations

import math
from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import Final, TypeAlias

import attrs
import trio

from .._errors import SummaryFailed
from ..events import RequestId, SummaryOrigin, TurnSubmitted, Usage
from ..sessions._history import Turn
from ..sessions._machine import SessionState
from ..sessions._ports import ChatRequest, Provider
from ..sessions._projection import covers_dropped
from ..sessions._request import ChatMessage

__all__ = [
    "PROMPTS",
    "ModelSummarizer",
    "Summarizer",
    "SummaryFunction",
    "SummaryPolicy",
    "policy_range",
    "run_summarizer",
    "transcript",
]

#: A summarizer of one's own: the turns to summarize in, the summary's text out.
SummaryFunction: TypeAlias = Callable[[Sequence[Turn]], Awaitable[str]]

#: The named prompts a :class:`ModelSummarizer` knows.
PROMPTS: Final[Mapping[str, str]] = {
    "concise": (
        "Summarize the conversation below for the assistant that continues it. "
        "Keep every fact, name, number, decision and open question; drop "
        "pleasantries. Write at most 200 words, in the conversation's language. "
        "Begin with 'Summary of the earlier conversation:'."
    ),
    "facts": (
        "List, as short bullet points, the facts, names, numbers and decisions "
        "stated in the conversation below that the assistant must remember. "
        "Begin with 'Facts from the earlier conversation:'."
    ),
}


@attrs.frozen
class ModelSummarizer:
    """The session's own model, asked with the prompt named ``prompt_name``
    (one of :data:`PROMPTS`, or ``prompt`` given with a name of one's own)."""

    prompt_name: str = "concise"
    prompt: str | None = None

    @property
    def text(self) -> str:
        """The prompt's text.

        Raises:
            SummaryFailed: a name :data:`PROMPTS` does not have, and no text.
        """
        if self.prompt is not None:
            return self.prompt
        prompt = PROMPTS.get(self.prompt_name)
        if prompt is None:
            known = ", ".join(sorted(PROMPTS))
            raise SummaryFailed(f"no summary prompt {self.prompt_name!r}; known: {known}")
        return prompt


Summarizer: TypeAlias = ModelSummarizer | SummaryFunction


def _positive(_: object, attribute: attrs.Attribute[float | None], value: float | None) -> None:
    if value is not None and not value > 0:
        raise ValueError(f"{attribute.name} must be positive or None, got {value!r}")


@attrs.frozen(kw_only=True)
class SummaryPolicy:
    """When the hub writes a summary by itself, in a task of its own.

    After a question is submitted, if the request dropped more than
    ``after_dropped`` turns, or its estimated prompt tokens are over
    ``window_fraction`` of the session's context window, and no summary on
    the session's path already covers the dropped turns with room to spare,
    the hub summarizes the active branch's turns from the first to the
    dropped ones plus half of those sent (so the next few requests, which
    drop a little more, can still send it). One summary runs per session at
    a time; one that fails is logged (``summary_failed``) and tried again on
    a later question, no sooner than ``retry_after`` seconds.
    """

    after_dropped: int | None = attrs.field(default=None)
    window_fraction: float | None = attrs.field(default=None, validator=_positive)
    summarizer: Summarizer = attrs.field(factory=ModelSummarizer)
    timeout: float = attrs.field(default=60.0, validator=attrs.validators.gt(0))
    retry_after: float = attrs.field(default=30.0, validator=attrs.validators.ge(0))

    @after_dropped.validator
    def _check_dropped(self, _attr: object, value: int | None) -> None:
        if value is not None and (type(value) is not int or value < 0):
            raise ValueError(f"after_dropped must be an integer >= 0 or None, got {value!r}")


def transcript(turns: Sequence[Turn]) -> str:
    """The turns as the text a model summarizes (questions and answers)."""
    return "\n\n".join(f"User: {t.question}\nAssistant: {t.answer}" for t in turns)


class _NoPreview:
    async def started(self) -> None:
        pass

    async def delta(self, text: str) -> None:
        pass


def _origin(summarizer: Summarizer) -> tuple[SummaryOrigin, str]:
    if isinstance(summarizer, ModelSummarizer):
        return "model", summarizer.prompt_name
    return "function", getattr(summarizer, "__qualname__", None) or type(summarizer).__name__


async def run_summarizer(
    summarizer: Summarizer,
    provider: Provider,
    model: str,
    turns: Sequence[Turn],
    request_id: RequestId,
    timeout: float | None,
) -> tuple[str, SummaryOrigin, str, Usage | None]:
    """Write the summary of ``turns``: its text, origin, origin's name and
    the usage its request reported.

    Raises:
        SummaryFailed: the summarizer raised, gave no text, or took longer
            than ``timeout`` seconds (its message names the cause's type,
            never what a server answered).

    Cancellation: a cancelled summary stops its request (the provider closes
    the connection) and gives nothing.
    """
    origin, name = _origin(summarizer)
    usage: Usage | None = None
    with trio.move_on_after(math.inf if timeout is None else timeout) as scope:
        try:
            if isinstance(summarizer, ModelSummarizer):
                messages = (
                    ChatMessage("system", summarizer.text),
                    ChatMessage("user", transcript(turns)),
                )
                done = await provider.complete(
                    ChatRequest(request_id, model, messages), _NoPreview()
                )
                if done.finish_reason != "stop" or done.tool_calls:
                    raise SummaryFailed(
                        "the model's summary did not end well (finish_reason is not stop)"
                    )
                text, usage = done.answer, done.usage
            else:
                text = await summarizer(tuple(turns))
        except SummaryFailed:
            raise
        except Exception as exc:
            raise SummaryFailed(f"the summarizer failed ({type(exc).__name__})") from None
    if scope.cancelled_caught:
        raise SummaryFailed(f"the summarizer took more than {timeout} seconds")
    if not isinstance(text, str) or not text.strip():
        raise SummaryFailed("the summarizer gave no text")
    return text, origin, name, usage


def policy_range(
    policy: SummaryPolicy, state: SessionState, submitted: TurnSubmitted
) -> tuple[int, int] | None:
    """The turns of the active branch ``policy`` summarizes after
    ``submitted`` (``state``: the session right after it), or ``None``."""
    dropped = submitted.turns_dropped
    if dropped <= 0:
        return None
    over = policy.after_dropped is not None and dropped > policy.after_dropped
    config = state.config
    window = None if config is None else config.context_window
    tokens = submitted.estimated_prompt_tokens
    if (
        not over
        and policy.window_fraction is not None
        and window is not None
        and tokens is not None
    ):
        over = tokens > policy.window_fraction * window
    if not over:
        return None
    n = len(state.turns)
    first_sent = n - submitted.turns_sent
    end = min(n, first_sent + max(1, submitted.turns_sent // 2))
    # A summary that already covers the dropped turns and goes on past them
    # does the job: none is written again.
    for s in state.summaries:
        if s.end > first_sent and covers_dropped(s, state.turns, state.context_start, s.end):
            return None
    return 0, end
