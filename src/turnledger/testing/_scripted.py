"""An in-process provider that plays a script per request.

It implements :class:`~turnledger.sessions.Provider` with no network, so
tests of code built on the hub can force every race::

    provider = ScriptedProvider(lambda req: [Chunk("Hel"), Chunk("lo"), Finish()])

A script is a function of the :class:`~turnledger.sessions.ChatRequest`
returning the steps (a list, any iterable, or an async iterable such as a
trio memory channel). With ``steered=True`` every request instead reads its
steps from a channel the test holds (:meth:`ScriptedProvider.steer`), so the
test decides, step by step and across sessions, what each provider does and
when. :class:`InSequence` places a step at a position of a
:class:`trio.testing.Sequencer`.

Steps:

- :class:`Begin` — the server accepted the request (``sink.started()``).
  ``Chunk`` and ``Finish`` begin first if nothing did.
- :class:`Chunk` — a preview delta, optionally after a delay.
- :class:`Pause` — sleep (use with ``autojump_clock``).
- :class:`Hook` / :class:`InSequence` — await a test's function.
- :class:`Finish` — return a completion (default answer: the chunks so far).
- :class:`Fail` — raise :class:`~turnledger.ProviderError` with a reason.
- :class:`Hang` — wait until cancelled.

A script that runs out of steps fails with reason ``incomplete_stream``.
The provider records each request, and in ``closed`` every request whose
``complete()`` exited (the equivalent of closing the HTTP response), with
those that exited by cancellation also in ``cancelled``.
"""

from __future__ import annotations

import math
from collections.abc import AsyncIterable, Awaitable, Callable, Iterable
from typing import Any, TypeAlias

import attrs
import trio
import trio.testing

from .._errors import ProviderError
from ..events import DiscardReason, RequestId, Usage
from ..sessions import ChatRequest, Completion, JsonChatEncoder, RequestEncoder, StreamSink

__all__ = [
    "Begin",
    "Chunk",
    "Fail",
    "Finish",
    "Hang",
    "Hook",
    "InSequence",
    "Pause",
    "Script",
    "ScriptedProvider",
    "Step",
    "echo_script",
]


@attrs.frozen
class Begin:
    """The server accepted the request: ``await sink.started()``."""


@attrs.frozen
class Chunk:
    """A delta of preview text, after ``delay`` seconds."""

    text: str
    delay: float = 0.0


@attrs.frozen
class Pause:
    """Sleep for ``seconds``."""

    seconds: float


@attrs.frozen
class Hook:
    """Await ``fn(request)`` (any test code: an Event, a Sequencer, a check)."""

    fn: Callable[[ChatRequest], Awaitable[Any]]


@attrs.frozen
class InSequence:
    """Pass through position ``position`` of ``sequencer``."""

    sequencer: trio.testing.Sequencer
    position: int


@attrs.frozen
class Finish:
    """Return a completion. ``answer=None`` joins the chunks sent so far."""

    answer: str | None = None
    finish_reason: str | None = "stop"
    usage: Usage | None = None


@attrs.frozen
class Fail:
    """Raise ``ProviderError(detail, reason=reason)``."""

    reason: DiscardReason
    detail: str = ""


@attrs.frozen
class Hang:
    """Wait until cancelled."""


Step: TypeAlias = Begin | Chunk | Pause | Hook | InSequence | Finish | Fail | Hang
Script: TypeAlias = Callable[[ChatRequest], Iterable[Step] | AsyncIterable[Step]]


def echo_script(request: ChatRequest) -> list[Step]:
    """The default script: streams ``echo: <the question>`` and finishes."""
    question = request.messages[-1].content
    return [Begin(), Chunk("echo: "), Chunk(question), Finish()]


class ScriptedProvider:
    """A :class:`~turnledger.sessions.Provider` that plays scripts.

    Args:
        script: steps per request (default :func:`echo_script`).
        steered: read each request's steps from :meth:`steer` instead.
        encoder: the request encoder budgets are measured with
            (default :class:`~turnledger.sessions.JsonChatEncoder`).
        at_once: answer scripts without a wait (a ``Finish`` or a ``Fail``
            after ``Begin`` steps) from :meth:`answer_now`, without a
            request task, as :meth:`instant` does; off, every request goes
            through :meth:`complete`.
    """

    def __init__(
        self,
        script: Script | None = None,
        *,
        steered: bool = False,
        encoder: RequestEncoder | None = None,
        at_once: bool = False,
    ) -> None:
        if steered and at_once:
            raise ValueError("a steered provider cannot answer at once")
        self._at_once = at_once
        self._script: Script = echo_script if script is None else script
        self._steered = steered
        self._encoder: RequestEncoder = JsonChatEncoder() if encoder is None else encoder
        self._channels: dict[
            str, tuple[trio.MemorySendChannel[Step], trio.MemoryReceiveChannel[Step]]
        ] = {}
        #: Every request received, in order.
        self.requests: list[ChatRequest] = []
        #: Request ids whose ``complete()`` exited, however (the response closed).
        self.closed: list[RequestId] = []
        #: Request ids whose ``complete()`` exited by cancellation.
        self.cancelled: list[RequestId] = []
        #: ``complete()`` calls in progress.
        self.open = 0
        #: The last request answer_now() left to complete(), and its steps.
        self._asked: tuple[ChatRequest, Iterable[Step] | AsyncIterable[Step]] | None = None

    @classmethod
    def instant(cls, answer: str = "ok") -> ScriptedProvider:
        """Answers ``answer`` at once, from :meth:`answer_now` (the turn's
        events are those of one ``started()`` and no deltas)."""
        steps = (Finish(answer),)
        return cls(lambda _request: steps, at_once=True)

    @property
    def encoder(self) -> RequestEncoder:
        return self._encoder

    def answer_now(self, request: ChatRequest) -> Completion | None:
        """With ``at_once``, answer at once a script that is a list or tuple
        of a ``Finish`` or a ``Fail``, after ``Begin`` steps if any: the hub
        then records the turn without running ``complete()``
        (:class:`~turnledger.sessions.AnswersAtOnce`). ``None`` for every
        other script, which :meth:`complete` plays, and always without
        ``at_once``."""
        if not self._at_once:
            return None
        steps = self._script(request)
        if type(steps) is list or type(steps) is tuple:
            for step in steps:
                if isinstance(step, Begin):
                    continue
                if not isinstance(step, (Finish, Fail)):
                    break
                # Recorded as complete() records a request that it answered.
                self.requests.append(request)
                self.closed.append(request.request_id)
                if isinstance(step, Fail):
                    raise ProviderError(step.detail or step.reason, reason=step.reason)
                return _answer(step, None)
        # complete() plays these very steps: a script is called once per request.
        self._asked = (request, steps)
        return None

    def steer(self, request_id: str) -> trio.MemorySendChannel[Step]:
        """The channel feeding request ``request_id`` (``steered=True``).

        May be called before the request arrives; the buffer is unbounded, so
        ``send_nowait`` always works. Closing it ends the script.
        """
        pair = self._channels.get(request_id)
        if pair is None:
            pair = self._channels[request_id] = trio.open_memory_channel[Step](math.inf)
        return pair[0]

    async def complete(self, request: ChatRequest, sink: StreamSink) -> Completion:
        """Play the request's script. See the module docstring."""
        rid = request.request_id
        self.requests.append(request)
        self.open += 1
        try:
            await trio.lowlevel.checkpoint()
            if self._steered:
                self.steer(rid)
                steps: Iterable[Step] | AsyncIterable[Step] = self._channels[rid][1]
            else:
                asked = self._asked
                if asked is not None and asked[0] is request:
                    self._asked = None
                    steps = asked[1]
                else:
                    steps = self._script(request)
            if type(steps) is list or type(steps) is tuple:
                # The usual script, walked here as ``for`` would walk it but
                # without an iterator, and without a _Run (what the steps so
                # far did) until a step other than a Finish: an instant
                # answer needs none.
                run: _Run | None = None
                i = 0
                while i < len(steps):
                    step = steps[i]
                    i += 1
                    if isinstance(step, Finish):
                        if run is None or not run.begun:
                            await sink.started()
                        return _answer(step, run)
                    if run is None:
                        run = _Run(sink)
                    done = await run.play(step, request)
                    if done is not None:
                        return done
            else:
                done = await _Run(sink).play_all(steps, request)
                if done is not None:
                    return done
            raise ProviderError("the script ended without a result", reason="incomplete_stream")
        except trio.Cancelled:
            self.cancelled.append(rid)
            raise
        finally:
            self.open -= 1
            self.closed.append(rid)


def _answer(step: Finish, run: _Run | None) -> Completion:
    answer = step.answer
    if answer is None:  # by default, the chunks sent so far
        answer = "" if run is None else "".join(run.parts)
    return Completion(answer, step.finish_reason, step.usage)


class _Run:
    """What the steps of one request did so far: whether it began, and the
    chunks it sent."""

    __slots__ = ("begun", "parts", "sink")

    def __init__(self, sink: StreamSink) -> None:
        self.sink = sink
        self.begun = False
        self.parts: list[str] = []

    async def _begin(self) -> None:
        if not self.begun:
            self.begun = True
            await self.sink.started()

    async def play_all(
        self, steps: Iterable[Step] | AsyncIterable[Step], request: ChatRequest
    ) -> Completion | None:
        """Play ``steps`` until one ends the request."""
        if isinstance(steps, AsyncIterable):
            async for step in steps:
                done = await self.play(step, request)
                if done is not None:
                    return done
        else:
            for step in steps:
                done = await self.play(step, request)
                if done is not None:
                    return done
        return None

    async def play(self, step: Step, request: ChatRequest) -> Completion | None:
        # The step types are disjoint: the most frequent are tested first.
        if isinstance(step, Finish):
            await self._begin()
            return _answer(step, self)
        if isinstance(step, Begin):
            await self._begin()
        elif isinstance(step, Chunk):
            if step.delay:
                await trio.sleep(step.delay)
            await self._begin()
            self.parts.append(step.text)
            await self.sink.delta(step.text)
        elif isinstance(step, Pause):
            await trio.sleep(step.seconds)
        elif isinstance(step, Hook):
            await step.fn(request)
        elif isinstance(step, InSequence):
            async with step.sequencer(step.position):
                pass
        elif isinstance(step, Fail):
            raise ProviderError(step.detail or step.reason, reason=step.reason)
        elif isinstance(step, Hang):
            await trio.sleep_forever()
        else:
            raise TypeError(f"not a script step: {step!r}")
        return None
