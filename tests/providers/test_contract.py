"""The provider contract, one table for every wire protocol: the seed's
streaming failure table (seed 002's 22 cases, and a few more) replayed in
each protocol's terms (OpenAI chat completions, Ollama, Anthropic Messages,
OpenAI Responses) over a real loopback connection, each stream read 1 byte,
7 bytes and as delivered.
Only a complete, accepted answer commits; everything else leaves history as
it was, with the reason the table says. The request that went out is the
one the session measured, byte for byte."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import attrs
import httpx
import pytest
import trio

from turnledger import ProviderError
from turnledger.adapters.providers import StreamLimits
from turnledger.adapters.stores import MemoryStore
from turnledger.cli._demo import _Uninterruptible
from turnledger.events import DEFAULT_CODEC, CompletionIgnored, RequestId
from turnledger.sessions import (
    ChatMessage,
    ChatRequest,
    CommittedResult,
    DiscardedResult,
    open_hub,
)
from turnledger.testing import (
    Abort,
    Exchange,
    LoopbackServer,
    Reply,
    Stall,
    WritePause,
    chat_messages,
    chat_responder,
    error_reply,
    open_loopback_server,
)

from ._helpers import Sink, outcome, run_turn, seeded_state, turns
from ._wires import BY_NAME, WIRES, Wire

pytestmark = pytest.mark.loopback

QUESTION = "Say hello in Chinese, then Java and a sprout."
KEY = "sk-contract-0123456789"


@attrs.frozen
class Case:
    name: str
    #: The reply, in the wire's terms.
    reply: Callable[[Wire], Reply]
    #: "commit" or the discard reason.
    expect: str
    answer: str = ""
    cancel_after_chars: int | None = None
    read_timeout: float | None = None
    #: Only for these protocols (SSE framing rules, say); all if empty.
    only: frozenset[str] = frozenset()
    #: The client went away before the response ended.
    disconnects: bool = False


def stream(*parts: Any, framing: Any = "chunked") -> Callable[[Wire], Reply]:
    """A 200 in the wire's media type; each part is bytes, a function of
    the wire giving bytes or a list of them, or a pause/stall/abort."""

    def build(w: Wire) -> Reply:
        body: list[Any] = []
        for p in parts:
            value = p(w) if callable(p) else p
            body.extend(value if isinstance(value, list) else [value])
        return Reply(media_type=w.media_type, body=tuple(body), framing=framing)

    return build


def eol(sep: bytes) -> Callable[[Wire], list[bytes]]:
    # The JSON is compact (no raw newline inside), so every "\n" is framing.
    return lambda w: [f.replace(b"\n", sep) for f in w.frames("你好，", "Java 🌱")]


def cut_last(w: Wire) -> list[bytes]:
    frames = w.frames("looks finished")
    return [*frames[:-1], frames[-1][:-1]]  # the last event or line never ends


def text_after_end(w: Wire) -> list[bytes]:
    frames = w.frames("Hi")
    at = len(frames) - w.closing
    return [*frames[:at], w.text(" more"), *frames[at:]]


def multiline(w: Wire) -> list[bytes]:
    # One event's JSON on two data lines (joined with "\n": still one object).
    split = w.text("hello").replace(b"data: {", b"data: {\ndata: ", 1)
    frames = w.frames("hello")
    return [split if f == w.text("hello") else f for f in frames]


SSE = frozenset({"openai", "anthropic", "openai-responses"})
ONE_BYTE_ANSWER = "你好，Java 🌱"

CASES = [
    # -- complete: history grows by one pair
    Case("one_byte", stream(lambda w: w.frames("你好，", "Java 🌱")), "commit", ONE_BYTE_ANSWER),
    Case(
        "seven_byte",
        stream(lambda w: w.frames("Seven-byte reads ", "split 字节 ", "and 🌊 waves.")),
        "commit",
        "Seven-byte reads split 字节 and 🌊 waves.",
    ),
    Case("crlf", stream(eol(b"\r\n")), "commit", ONE_BYTE_ANSWER, only=SSE),
    Case("bare_cr", stream(eol(b"\r")), "commit", ONE_BYTE_ANSWER, only=SSE),
    Case("multiline_data", stream(multiline), "commit", "hello", only=SSE),
    Case(
        "bom_heartbeat",
        stream(
            b"\xef\xbb\xbf: ping - 2024-01-01T00:00:00Z\n\n",
            lambda w: [
                f for frame in w.frames("你好，", "Java 🌱") for f in (frame, b": ping\n\n")
            ],
        ),
        "commit",
        ONE_BYTE_ANSWER,
        only=SSE,
    ),
    # -- fail: history unchanged
    Case(
        "missing_end", stream(lambda w: w.frames("partial preview", end=False)), "incomplete_stream"
    ),
    Case("unterminated_end", stream(cut_last), "incomplete_stream"),
    Case(
        "end_without_finish",  # [DONE] with no finish_reason, message_stop with no stop_reason
        stream(lambda w: [*w.frames("cut short")[:-2], w.frames("cut short")[-1]]),
        "incomplete_stream",
        only=frozenset({"openai", "anthropic"}),
    ),
    Case(
        "close_before_end",
        stream(lambda w: w.frames("cut", end=False), framing="close"),
        "incomplete_stream",
    ),
    Case("text_after_end", stream(text_after_end), "protocol"),
    Case("tool_call_without_tools", stream(lambda w: w.tool_call()), "protocol"),
    Case(
        "token_cap",
        stream(lambda w: w.frames("The whole test string is visible.", truncated=True)),
        "incomplete_finish",
    ),
    Case(
        "provider_error",
        stream(lambda w: w.head(), lambda w: w.text("Hal"), lambda w: w.error),
        "provider_error",
    ),
    Case(
        "malformed_json",
        stream(lambda w: w.head(), lambda w: w.raw(b'{"type":"x","choices":[{"index":0')),
        "malformed",
    ),
    Case(
        "duplicate_key",
        stream(lambda w: w.head(), lambda w: w.raw(b'{"type":"ping","type":"ping"}')),
        "malformed",
    ),
    Case(
        "invalid_utf8",
        stream(lambda w: w.head(), lambda w: w.text("ok "), lambda w: w.raw(b'{"t":"\xc0\xaf"}')),
        "malformed",
    ),
    Case("oversized_line", stream(lambda w: w.frames("x" * 9000)), "limit"),
    Case("oversized_output", stream(lambda w: w.frames(*["y" * 1000] * 5)), "limit"),
    Case(
        "wrong_media_type",
        lambda w: Reply(media_type="text/html", body=tuple(w.frames("hi"))),
        "protocol",
    ),
    Case(
        "http_503",
        lambda w: error_reply(503, '{"error":"/srv/app/server.py line 42"}'),
        "http_status",
    ),
    Case("http_401", lambda w: error_reply(401, f'{{"error":"bad key {KEY}"}}'), "http_status"),
    Case(
        "abort_mid_body",
        stream(lambda w: w.head(), lambda w: w.text("cut"), Abort()),
        "transport",
    ),
    Case(
        "cancelled",
        stream(
            lambda w: w.head(),
            lambda w: w.text("Java"),
            WritePause(0.2),
            lambda w: w.text(" keeps going"),
            Stall(),
        ),
        "cancelled",
        cancel_after_chars=3,
        disconnects=True,
    ),
    Case(
        "read_timeout_before_headers",
        lambda w: Reply(media_type=w.media_type, body=tuple(w.frames("late")), headers_delay=0.4),
        "timeout",
        read_timeout=0.1,
        disconnects=True,
    ),
    Case(
        "read_timeout_mid_stream",
        stream(lambda w: w.head(), lambda w: w.text("partial"), Stall()),
        "timeout",
        read_timeout=0.15,
        disconnects=True,
    ),
]

BY_CASE = {c.name: c for c in CASES}
TABLE = [
    pytest.param(w, c, id=f"{w.name}-{c.name}")
    for w in WIRES
    for c in CASES
    if not c.only or w.name in c.only
]


def _route(exchange: Exchange) -> Reply:
    # /c/<case>/<protocol>/...
    parts = exchange.path.split("/")
    if len(parts) > 3 and parts[2] in BY_CASE and parts[3] in BY_NAME:
        return BY_CASE[parts[2]].reply(BY_NAME[parts[3]])
    return error_reply(404, "no such case")


@pytest.fixture(scope="module")
def contract_server() -> Iterator[LoopbackServer]:
    with LoopbackServer(_route).start_in_thread() as server:
        yield server


@pytest.mark.parametrize("read_size", [1, 7, None], ids=["read1", "read7", "readall"])
@pytest.mark.parametrize(("wire", "case"), TABLE)
async def test_contract(
    contract_server: LoopbackServer, wire: Wire, case: Case, read_size: int | None
) -> None:
    prefix = f"/c/{case.name}/{wire.name}"
    provider = wire.provider(
        wire.url(contract_server, prefix),
        api_key=KEY,
        limits=StreamLimits.seed(),
        read_size=read_size,
        timeout=httpx.Timeout(5.0, read=case.read_timeout or 5.0),
    )
    before = seeded_state()
    seen = len(contract_server.exchanges)
    async with provider:
        result = await run_turn(
            provider, before, QUESTION, f"{case.name}-{read_size}",
            cancel_after_chars=case.cancel_after_chars,
        )  # fmt: skip
    assert outcome(result) == case.expect, (result.error, result.events[-1])
    if case.expect == "commit":
        assert turns(result.after) == [*turns(before), (QUESTION, case.answer)]
        assert "".join(result.sink.deltas) == case.answer
    else:
        assert result.after.turns == before.turns
    if case.expect in ("http_status", "protocol") and case.name != "text_after_end":
        assert result.sink.started_calls == (
            0 if "http" in case.name or "media" in case.name else 1
        )
    if result.error is not None:
        assert KEY not in str(result.error) and KEY not in repr(result.error)
    # the request went out once, exactly as the session measured it
    mine = [e for e in contract_server.exchanges[seen:] if e.path.startswith(prefix + "/")]
    assert len(mine) == 1
    assert len(mine[0].body) == result.request_bytes
    assert mine[0].json()["stream"] is True
    if case.disconnects:
        await mine[0].wait_ended()
        assert mine[0].client_disconnected
    # the preview before a fault was delivered, whatever the read size
    preview = {"cancelled": "Java", "provider_error": "Hal", "read_timeout_mid_stream": "partial"}
    if case.name in preview:
        assert "".join(result.sink.deltas) == preview[case.name]


async def test_connection_refused_is_transport_for_every_protocol() -> None:
    async with open_loopback_server() as server:
        url = server.base_url  # the server is gone once the block ends
    request = ChatRequest(RequestId("refused"), "m", (ChatMessage("user", QUESTION),))
    for wire in WIRES:
        async with wire.provider(url + "/gone") as provider:
            with pytest.raises(ProviderError) as info:
                await provider.complete(request, Sink())
        assert (info.value.reason, str(info.value)) == ("transport", "connect error")


@pytest.mark.parametrize("wire", WIRES, ids=[w.name for w in WIRES])
async def test_a_late_completion_changes_nothing(
    contract_server: LoopbackServer, wire: Wire
) -> None:
    contract_server.enqueue(
        Reply(media_type=wire.media_type, body=tuple(wire.frames("first"))),
        Reply(media_type=wire.media_type, body=tuple(wire.frames("too late")), headers_delay=0.5),
    )
    store = MemoryStore()
    provider = wire.provider(wire.url(contract_server, "/late"), api_key=KEY)
    async with (
        provider,
        open_hub(
            store, _Uninterruptible(provider), model="m", turn_deadline=0.2, idle_timeout=None
        ) as hub,
    ):
        first = await (await hub.submit("s", "one")).outcome()
        assert isinstance(first, CommittedResult) and first.answer == "first"
        handle = await hub.submit("s", "two")
        late = await handle.outcome()
        assert isinstance(late, DiscardedResult) and late.reason == "timeout"
        with trio.fail_after(5):
            while True:
                events = [DEFAULT_CODEC.decode(e) for e in await store.read("s")]
                if isinstance(events[-1], CompletionIgnored):
                    break
                await trio.sleep(0.02)
        assert [t.answer for t in await hub.history("s")] == ["first"]
    assert events[-1].request_id == handle.request_id


def test_the_one_byte_case_needs_a_stateful_decoder() -> None:
    # Decoding every byte on its own (a fresh decoder per read) mangles each
    # multibyte character; the seed counts 13 replacement characters.
    data = b"".join(BY_NAME["openai"].frames("你好，", "Java 🌱"))
    naive = "".join(bytes([b]).decode("utf-8", errors="replace") for b in data)
    assert naive.count("\ufffd") == 13
    assert "你好" not in naive


QUESTIONS = ["What is 2+2?", "And times 3?", "Say it in 中文 🌱"]


def _answer(messages: list[dict[str, Any]]) -> str:
    # Deterministic, and proof of what the server got: the turn number and
    # the question it answers.
    users = [m["content"] for m in messages if m["role"] == "user"]
    return f"Answer {len(users)} to «{users[-1]}»"


@pytest.mark.parametrize(
    ("wire", "stream"),
    [(w, True) for w in WIRES] + [(BY_NAME["openai"], False), (BY_NAME["ollama"], False)],
    ids=[w.name for w in WIRES] + ["openai-whole", "ollama-whole"],
)
async def test_a_three_turn_conversation_commits_the_same_way(wire: Wire, stream: bool) -> None:
    async with open_loopback_server(chat_responder(_answer, chunk_size=3)) as server:
        kw = {} if stream else {"stream": False}
        state = seeded_state(history=())
        sizes = []
        async with wire.provider(wire.url(server, ""), **kw) as p:
            for i, q in enumerate(QUESTIONS):
                result = await run_turn(p, state, q, f"{wire.name}-{i}")
                assert outcome(result) == "commit"
                state = result.after
                sizes.append(result.request_bytes)
        exchanges = server.exchanges
    assert turns(state) == [(q, f"Answer {i + 1} to «{q}»") for i, q in enumerate(QUESTIONS)]
    # what was measured is what went over the wire, and history went with it
    assert [len(e.body) for e in exchanges] == sizes
    sent = [chat_messages(wire.name, e.json()) for e in exchanges]
    assert [len(m) for m in sent] == [2, 4, 6]
    assert [m["role"] for m in sent[-1]] == [
        "system",
        "user",
        "assistant",
        "user",
        "assistant",
        "user",
    ]
