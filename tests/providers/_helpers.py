"""Shared helpers: driving one turn through the pure session core, splits."""

from __future__ import annotations

import random
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import attrs
import trio

from turnledger import ProviderError
from turnledger.adapters.providers import ResponseDecoder, StreamLimits
from turnledger.events import DISCARD_REASONS, Event, RequestId, Usage
from turnledger.sessions import (
    Budget,
    Cancel,
    ChatRequest,
    Completed,
    Completion,
    Failed,
    Failure,
    Provider,
    ResponseStarted,
    SessionState,
    Start,
    Submit,
    Turn,
    decide,
    evolve,
    initial_state,
    request_messages,
)
from turnledger.sessions import Pending as PendingState

MODEL = "loopback-model"
SYSTEM = "You answer briefly."


def decode_reads(
    decoder_class: Callable[[StreamLimits | None], ResponseDecoder],
    reads: Sequence[bytes],
    limits: StreamLimits | None = None,
) -> tuple[str, Completion | str]:
    """Feed ``reads`` to a new response decoder as a provider does:
    (the preview delivered, the completion or the failure's reason)."""
    decoder = decoder_class(limits)
    preview: list[str] = []
    try:
        for read in reads:
            preview.extend(decoder.feed(read))
            decoder.check()
        return "".join(preview), decoder.finish()
    except ProviderError as exc:
        assert exc.reason in DISCARD_REASONS
        return "".join(preview), exc.reason


def splits(data: bytes, size: int) -> list[bytes]:
    return [data[i : i + size] for i in range(0, len(data), size)]


def every_split(data: bytes) -> Iterator[list[bytes]]:
    """The whole, then one byte at a time, then every two-way split."""
    yield [data]
    yield splits(data, 1)
    for i in range(1, len(data)):
        yield [data[:i], data[i:]]


def random_splits(data: bytes, rng: random.Random, n: int = 20) -> Iterator[list[bytes]]:
    for _ in range(n):
        cuts = sorted(rng.sample(range(1, len(data)), min(len(data) - 1, rng.randint(1, 12))))
        yield [data[a:b] for a, b in zip([0, *cuts], [*cuts, len(data)], strict=True)]


@attrs.define
class Sink:
    """A StreamSink that records what the provider reported and can cancel
    the turn after some preview characters."""

    cancel_after_chars: int | None = None
    scope: trio.CancelScope | None = None
    started_calls: int = 0
    deltas: list[str] = attrs.field(factory=list)
    on_started: Any = None

    @property
    def chars(self) -> int:
        return sum(len(d) for d in self.deltas)

    async def started(self) -> None:
        self.started_calls += 1
        if self.on_started is not None:
            self.on_started()

    async def delta(self, text: str) -> None:
        assert text, "providers deliver only non-empty deltas"
        self.deltas.append(text)
        if (
            self.cancel_after_chars is not None
            and self.chars >= self.cancel_after_chars
            and self.scope is not None
        ):
            self.scope.cancel()


@attrs.define
class TurnResult:
    before: SessionState
    after: SessionState
    events: list[Event]
    sink: Sink
    error: ProviderError | None
    request_bytes: int


def seeded_state(history: Sequence[tuple[str, str]] = (("Hi?", "Hello."),)) -> SessionState:
    """A session with some committed turns, built by the pure core."""
    state: SessionState = initial_state()
    for ev in decide(state, Start(SYSTEM, MODEL)):
        state = evolve(state, ev)
    for i, (q, a) in enumerate(history):
        rid = RequestId(f"seed-{i}")
        for msg in (Submit(rid, q), Completed(rid, a, "stop")):
            for ev in decide(state, msg):
                state = evolve(state, ev)
    return state


async def run_turn(
    provider: Provider,
    state: SessionState,
    question: str,
    request_id: str,
    *,
    cancel_after_chars: int | None = None,
) -> TurnResult:
    """Submit ``question``, let ``provider`` answer it, feed the outcome back
    to the pure core (decide/evolve) exactly as the session runtime does."""
    before = state
    log: list[Event] = []
    budget = Budget(encoder=provider.encoder)
    rid = RequestId(request_id)

    def apply(message: Any, preview: int = 0) -> None:
        nonlocal state
        for ev in decide(state, message, budget=budget, preview_chars=preview):
            state = evolve(state, ev)
            log.append(ev)

    apply(Submit(rid, question))
    assert isinstance(state, PendingState), state
    request = ChatRequest(rid, MODEL, tuple(request_messages(state)))
    sink = Sink(
        cancel_after_chars=cancel_after_chars, on_started=lambda: apply(ResponseStarted(rid))
    )
    error: ProviderError | None = None
    with trio.CancelScope() as scope:
        sink.scope = scope
        try:
            completion = await provider.complete(request, sink)
        except ProviderError as exc:
            assert exc.reason in DISCARD_REASONS, exc.reason
            error = exc
            apply(Failed(rid, Failure(exc.reason, str(exc))), sink.chars)  # type: ignore[arg-type]
        else:
            apply(
                Completed(
                    rid,
                    completion.answer,
                    completion.finish_reason,
                    completion.usage,
                    tool_calls=completion.tool_calls,
                )
            )
    if scope.cancelled_caught:
        apply(Cancel(rid), sink.chars)
    submitted = log[0]
    return TurnResult(before, state, log, sink, error, submitted.request_bytes)  # type: ignore[union-attr]


def turns(state: SessionState) -> list[tuple[str, str]]:
    return [(t.question, t.answer) for t in state.turns]


def outcome(result: TurnResult) -> str:
    """``commit`` or the discard reason of the turn's last event."""
    last = result.events[-1]
    name = type(last).__name__
    if name == "TurnCommitted":
        return "commit"
    assert name == "TurnDiscarded", name
    return last.reason  # type: ignore[union-attr,no-any-return]


__all__ = [
    "MODEL",
    "SYSTEM",
    "Sink",
    "Turn",
    "TurnResult",
    "Usage",
    "every_split",
    "outcome",
    "random_splits",
    "run_turn",
    "seeded_state",
    "splits",
    "turns",
]
