"""ScriptedProvider on its own: what each kind of script does to the sink,
what it records, and that every request is one checkpoint at least."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from typing import Any

import pytest
import trio
import trio.testing

from turnledger import ProviderError
from turnledger.events import RequestId
from turnledger.sessions import ChatMessage, ChatRequest, Completion
from turnledger.testing import Begin, Chunk, Fail, Finish, Hang, ScriptedProvider, Step


class _Sink:
    def __init__(self) -> None:
        self.calls: list[str] = []

    async def started(self) -> None:
        self.calls.append("started")

    async def delta(self, text: str) -> None:
        self.calls.append(f"delta:{text}")


def _request(rid: str = "r1") -> ChatRequest:
    return ChatRequest(RequestId(rid), "m", (ChatMessage("user", "q"),))


async def _play(provider: ScriptedProvider, rid: str = "r1") -> tuple[Completion, list[str]]:
    sink = _Sink()
    with trio.testing.assert_checkpoints():
        completion = await provider.complete(_request(rid), sink)
    return completion, sink.calls


@pytest.mark.parametrize("shape", [list, tuple, iter])
async def test_each_kind_of_sequence_plays_the_same(shape: Any) -> None:
    steps: list[Step] = [Chunk("a"), Chunk("b"), Finish()]
    provider = ScriptedProvider(lambda _r: shape(steps))
    completion, calls = await _play(provider)
    assert completion == Completion("ab", "stop", None)
    assert calls == ["started", "delta:a", "delta:b"]
    assert (provider.closed, provider.cancelled, provider.open) == (["r1"], [], 0)
    assert [r.request_id for r in provider.requests] == ["r1"]


async def test_an_instant_answer_begins_once() -> None:
    provider = ScriptedProvider.instant("yes")
    for rid in ("r1", "r2"):
        assert await _play(provider, rid) == (Completion("yes", "stop", None), ["started"])
    assert provider.closed == ["r1", "r2"]
    assert await _play(ScriptedProvider(lambda _r: [Finish()])) == (
        Completion("", "stop", None),
        ["started"],
    )
    begun = ScriptedProvider(lambda _r: (Begin(), Begin(), Finish("x", None)))
    assert await _play(begun) == (Completion("x", None, None), ["started"])


async def test_a_generator_script_is_read_as_it_plays() -> None:
    seen: list[str] = []

    def script(_request: ChatRequest) -> Iterator[Step]:
        seen.append("first step drawn")
        yield Chunk("a")
        seen.append("second step drawn")
        yield Finish()

    sink = _Sink()

    async def delta(text: str) -> None:
        seen.append(f"delta:{text}")

    sink.delta = delta  # type: ignore[method-assign]
    completion = await ScriptedProvider(script).complete(_request(), sink)
    assert completion.answer == "a"
    assert seen == ["first step drawn", "delta:a", "second step drawn"]


async def test_an_async_script_and_a_steered_one() -> None:
    async def script(_request: ChatRequest) -> AsyncIterator[Step]:
        yield Chunk("x")
        yield Finish()

    provider = ScriptedProvider(script)
    assert await _play(provider) == (Completion("x", "stop", None), ["started", "delta:x"])

    steered = ScriptedProvider(steered=True)
    tx = steered.steer("r1")
    tx.send_nowait(Chunk("s"))
    tx.send_nowait(Finish("done"))
    assert await _play(steered) == (Completion("done", "stop", None), ["started", "delta:s"])


async def test_scripts_that_end_badly_are_recorded() -> None:
    scripts: list[Any] = [[], (Chunk("a"),), iter([Begin()])]
    for script in scripts:
        provider = ScriptedProvider(lambda _r, s=script: s)  # type: ignore[misc]
        with pytest.raises(ProviderError) as info:
            await provider.complete(_request(), _Sink())
        assert info.value.reason == "incomplete_stream"
        assert (provider.closed, provider.cancelled, provider.open) == (["r1"], [], 0)
    failing = ScriptedProvider(lambda _r: [Begin(), Fail("timeout", "slow")])
    with pytest.raises(ProviderError, match="slow"):
        await failing.complete(_request(), _Sink())
    with pytest.raises(TypeError, match="not a script step"):
        await ScriptedProvider(lambda _r: ["nope"]).complete(_request(), _Sink())  # type: ignore[list-item]


async def test_a_cancelled_request_is_closed_and_cancelled() -> None:
    provider = ScriptedProvider(lambda _r: (Begin(), Hang()))
    sink = _Sink()
    with trio.move_on_after(0.01):
        await provider.complete(_request(), sink)
    assert sink.calls == ["started"]
    assert (provider.closed, provider.cancelled, provider.open) == (["r1"], ["r1"], 0)
