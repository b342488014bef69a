"""Seed 002's 22 streaming-boundary cases over a real loopback connection,
each read 1 byte, 7 bytes and as delivered: 6 commit exactly one pair, 16 fail
or cancel with the right reason and leave history unchanged."""

from __future__ import annotations

from collections.abc import Iterator

import httpx
import pytest

from turnledger.adapters.providers import OpenAIChat, StreamLimits
from turnledger.testing import Exchange, LoopbackServer, Reply, error_reply

from ._helpers import outcome, run_turn, seeded_state, turns
from .seed_cases import CASES, ONE_BYTE, QUESTION, Case

pytestmark = pytest.mark.loopback

BY_NAME = {c.name: c for c in CASES}


def _route(exchange: Exchange) -> Reply:
    # /seed/<case>/v1/chat/completions
    parts = exchange.path.split("/")
    case = BY_NAME.get(parts[2]) if len(parts) > 2 else None
    return case.reply if case else error_reply(404, "no such case")


@pytest.fixture(scope="module")
def seed_server() -> Iterator[LoopbackServer]:
    # One server for the module, in its own thread (trio fixtures must be
    # function-scoped; this one is plain sync).
    with LoopbackServer(_route).start_in_thread() as server:
        yield server


@pytest.mark.parametrize("read_size", [1, 7, None], ids=["read1", "read7", "readall"])
@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
async def test_seed_case(seed_server: LoopbackServer, case: Case, read_size: int | None) -> None:
    timeout = httpx.Timeout(5.0, read=case.read_timeout or 5.0)
    provider = OpenAIChat(
        base_url=f"{seed_server.base_url}/seed/{case.name}/v1",
        api_key="sk-seed",
        limits=StreamLimits.seed(),
        read_size=read_size,
        timeout=timeout,
        trust_env=False,
    )
    before = seeded_state()
    seen = len(seed_server.exchanges)
    async with provider:
        result = await run_turn(
            provider,
            before,
            QUESTION,
            f"{case.name}-{read_size}",
            cancel_after_chars=case.cancel_after_chars,
        )
    assert outcome(result) == case.expect, (result.error, result.events[-1])
    if case.expect == "commit":
        assert turns(result.after) == [*turns(before), (QUESTION, case.answer)]
        assert "\ufffd" not in result.after.turns[-1].answer
    else:
        assert result.after.turns == before.turns
        assert turns(result.after) == turns(before)
    # the request went out once, exactly as projected and measured
    mine = [e for e in seed_server.exchanges[seen:] if e.path.startswith(f"/seed/{case.name}/")]
    assert len(mine) == 1
    assert len(mine[0].body) == result.request_bytes
    if case.name == "cancelled":
        # cancelling closed the connection: the server saw the client go
        await mine[0].wait_ended()
        assert mine[0].client_disconnected
        assert result.sink.deltas == ["Java"]
    if case.name == "read_timeout":
        assert result.error is not None and str(result.error) == "read timeout"


def test_the_one_byte_fixture_needs_a_stateful_decoder() -> None:
    # Decoding every byte on its own (a fresh decoder per read) mangles each
    # multibyte character; the seed counts 13 replacement characters.
    naive = "".join(bytes([b]).decode("utf-8", errors="replace") for b in ONE_BYTE)
    assert naive.count("\ufffd") == 13
    assert "你好" not in naive
