"""Streaming boundary benchmarks; every figure and ratio is measured in this run.

1. SSE decode + JSON parse of one 20,000-chunk stream of mixed CJK/emoji text:
   turnledger (strict UTF-8, WHATWG framing, strict JSON: duplicate keys,
   depth, NaN refused) against httpx-sse's decoder with ``json.loads``
   (which replaces invalid UTF-8 with U+FFFD and keeps the last duplicate
   key). Two read patterns: one read per event (a live stream) and 4 KiB
   reads (a backlog); and two ways to drive httpx-sse: its decoder classes
   directly, and its public ``EventSource.iter_sse()`` over an
   ``httpx.Response`` (ours then reads the same response's ``iter_bytes()``).

2. The typed-event protocols against their vendors' own SDKs, on the same
   recorded bytes (a stream the loopback builders write, mixed CJK/emoji
   text): Anthropic Messages decoded by turnledger (strict UTF-8, WHATWG
   SSE, strict JSON, the event-order checks of ``AnthropicEventValidator``)
   against the official ``anthropic`` SDK's parsing of the same stream
   (``messages.create(stream=True)``: its SSE decoder, ``json.loads`` and a
   typed event object per event; and ``messages.stream()``, which also
   accumulates the message); the OpenAI Responses API likewise against the
   official ``openai`` SDK (``responses.create(stream=True)`` and
   ``responses.stream()``). The SDKs read an in-memory HTTP response (their
   httpx's ``MockTransport``), so ours is measured over an
   ``httpx.Response`` of the same reads as well as fed directly.

3. One streamed turn end to end from a loopback server in another process:
   bare ``httpx`` ``aiter_bytes()`` (read and drop) against
   ``OpenAIChat.complete()`` with a no-op sink, and against a whole turn
   through a session hub (``open_hub`` with the in-memory store): submit,
   stream, validate, commit, append. Wall time and this process's CPU time.

Runs are interleaved (A, B, C, A, B, C, ...) and medians reported, so a
noisy machine biases every variant alike.

    python benchmarks/streaming.py [--rounds N] [--chunks N] [--sdk-events N] [--quick]

The paced run streams a twentieth of the chunks with a 0.5 ms pause after each.
"""

from __future__ import annotations

import argparse
import gc
import json
import multiprocessing
import random
import statistics
import sys
import time
from collections.abc import Callable
from typing import Any

import httpx
import structlog
import trio

from turnledger.adapters.providers import OpenAIChat, SSEDecoder, loads_strict
from turnledger.events import RequestId
from turnledger.sessions import ChatMessage, ChatRequest
from turnledger.testing import LoopbackServer, Reply, WritePause

try:
    import httpx_sse
    from httpx_sse._decoders import SSEDecoder as HttpxSSEDecoder
    from httpx_sse._decoders import SSELineDecoder
except ImportError:  # pragma: no cover
    sys.exit("benchmarks/streaming.py needs httpx-sse: pip install -e '.[bench]'")

CJK = (
    "你好世界的一是在不了有和人这中大为上个国我以要他时来用们生到"
    "作地于出就分对成会可主发年动同工也能下过子说产种面而方后多定"
    "行学法所民得经"
)
EMOJI = "🌱🚀😀👍🏽🌊🎉❤️🙂"
LATIN = 'Java Python streams bytes, "quotes" \\ back\\slash {braces} [x] <tag> & é ü '


def make_stream(n: int, seed: int = 1) -> tuple[list[bytes], str]:
    rng = random.Random(seed)
    alphabet = CJK * 2 + EMOJI + LATIN
    events, answer = [], []
    base = {
        "id": "chatcmpl-9xY",
        "object": "chat.completion.chunk",
        "created": 1700000000,
        "model": "gpt-4o-mini",
        "system_fingerprint": "fp_44709d6fcb",
    }
    events.append(
        base
        | {
            "choices": [
                {
                    "index": 0,
                    "delta": {"role": "assistant", "content": ""},
                    "logprobs": None,
                    "finish_reason": None,
                }
            ]
        }
    )
    for _ in range(n - 2):
        piece = "".join(rng.choice(alphabet) for _ in range(rng.randint(1, 6)))
        answer.append(piece)
        events.append(
            base
            | {
                "choices": [
                    {
                        "index": 0,
                        "delta": {"content": piece},
                        "logprobs": None,
                        "finish_reason": None,
                    }
                ]
            }
        )
    events.append(
        base | {"choices": [{"index": 0, "delta": {}, "logprobs": None, "finish_reason": "stop"}]}
    )
    wire = [
        f"data: {json.dumps(e, ensure_ascii=False, separators=(',', ':'))}\n\n".encode()
        for e in events
    ]
    wire.append(b"data: [DONE]\n\n")
    return wire, "".join(answer)


# --- 1. decode + parse -------------------------------------------------------------


def ours(reads: list[bytes]) -> int:
    decoder = SSEDecoder()
    n = 0
    for read in reads:
        for event in decoder.decode(read):
            if event.data != "[DONE]":
                loads_strict(event.data)
                n += 1
    decoder.flush()
    return n


def httpx_sse_decoders(reads: list[bytes]) -> int:
    # What httpx-sse's EventSource does per line, without the generator layers.
    text = httpx._decoders.TextDecoder()
    lines = SSELineDecoder()
    decoder = HttpxSSEDecoder()
    n = 0
    for read in reads:
        for line in lines.decode(text.decode(read)):
            event = decoder.decode(line)
            if event is not None and event.data != "[DONE]":
                json.loads(event.data)
                n += 1
    return n


def _response(reads: list[bytes]) -> httpx.Response:
    return httpx.Response(200, headers={"content-type": "text/event-stream"}, content=iter(reads))


def ours_over_response(reads: list[bytes]) -> int:
    decoder = SSEDecoder()
    n = 0
    for read in _response(reads).iter_bytes():
        for event in decoder.decode(read):
            if event.data != "[DONE]":
                loads_strict(event.data)
                n += 1
    decoder.flush()
    return n


def httpx_sse_public(reads: list[bytes]) -> int:
    n = 0
    for event in httpx_sse.EventSource(_response(reads)).iter_sse():
        if event.data != "[DONE]":
            json.loads(event.data)
            n += 1
    return n


def interleaved(variants: dict[str, Callable[[], Any]], rounds: int) -> dict[str, float]:
    times: dict[str, list[float]] = {name: [] for name in variants}
    for _ in range(rounds):
        for name, fn in variants.items():
            gc.collect()
            t0 = time.perf_counter()
            fn()
            times[name].append(time.perf_counter() - t0)
    return {name: statistics.median(ts) for name, ts in times.items()}


def bench_decode(chunks: int, rounds: int) -> None:
    wire, _ = make_stream(chunks)
    data = b"".join(wire)
    print(f"\n1. SSE decode + JSON parse: {len(wire):,} events, {len(data) / 1e6:.2f} MB")
    assert ours(wire) == httpx_sse_decoders(wire) == chunks
    for label, reads in (
        ("one read per event", wire),
        ("4 KiB reads", [data[i : i + 4096] for i in range(0, len(data), 4096)]),
    ):
        medians = interleaved(
            {
                "turnledger": lambda r=reads: ours(r),  # type: ignore[misc]
                "httpx-sse decoders": lambda r=reads: httpx_sse_decoders(r),  # type: ignore[misc]
                "turnledger, httpx.Response": lambda r=reads: ours_over_response(r),  # type: ignore[misc]
                "httpx-sse iter_sse()": lambda r=reads: httpx_sse_public(r),  # type: ignore[misc]
            },
            rounds,
        )
        print(f"   {label} ({len(reads):,} reads), median of {rounds}:")
        for name, t in medians.items():
            print(
                f"     {name:28s} {t * 1e3:8.1f} ms  {chunks / t / 1e3:7.0f} k events/s"
                f"  {t / chunks * 1e6:5.2f} µs/event"
            )
        direct = medians["httpx-sse decoders"] / medians["turnledger"]
        public = medians["httpx-sse iter_sse()"] / medians["turnledger, httpx.Response"]
        print(
            f"     ratio (throughput, turnledger / httpx-sse): decoders {direct:.2f}x,"
            f" public API {public:.2f}x"
        )


# --- 2. the typed-event protocols against the vendors' SDKs ------------------------------


def typed_streams(n: int, seed: int = 2) -> tuple[list[bytes], list[bytes], str]:
    """A recorded Anthropic stream and a Responses stream of the same answer,
    each about ``n`` events (one text delta of 1-6 characters each)."""
    from turnledger.testing import anthropic_sse_events, responses_sse_events

    rng = random.Random(seed)
    alphabet = CJK * 2 + EMOJI + LATIN
    answer = "".join(rng.choice(alphabet) for _ in range(n * 3))
    return (
        anthropic_sse_events(answer, chunk_size=3),
        responses_sse_events(answer, chunk_size=3),
        answer,
    )


def _mock_client(reads: list[bytes]) -> Any:
    # The SDKs' own HTTP client over a transport that answers from memory.
    import httpx2

    def handler(request: Any) -> Any:
        headers = {"content-type": "text/event-stream"}
        return httpx2.Response(200, headers=headers, content=iter(reads))

    return httpx2.Client(transport=httpx2.MockTransport(handler))


def ours_typed(decoder_class: Any, reads: list[bytes]) -> str:
    decoder = decoder_class()
    for read in reads:
        decoder.feed(read)
    answer: str = decoder.finish().answer
    return answer


def ours_typed_response(decoder_class: Any, reads: list[bytes]) -> str:
    decoder = decoder_class()
    for read in _response(reads).iter_bytes():
        decoder.feed(read)
    answer: str = decoder.finish().answer
    return answer


def bench_sdks(events: int, rounds: int) -> None:
    try:
        import anthropic
        import openai
    except ImportError:
        print("\n2. (the anthropic and openai SDKs are not installed: pip install -e '.[bench]')")
        return
    from turnledger.adapters.providers import AnthropicStreamDecoder, ResponsesStreamDecoder

    wire_a, wire_r, answer = typed_streams(events)
    print(
        f"\n2. Typed-event streams against the vendors' SDKs (anthropic {anthropic.__version__}, "
        f"openai {openai.__version__}), one read per event:"
    )
    message = [{"role": "user", "content": "Stream, please."}]

    def claude(reads: list[bytes]) -> Any:
        return anthropic.Anthropic(
            api_key="sk-bench", base_url="http://bench", http_client=_mock_client(reads)
        )

    def gpt(reads: list[bytes]) -> Any:
        return openai.OpenAI(
            api_key="sk-bench", base_url="http://bench/v1", http_client=_mock_client(reads)
        )

    def sdk_anthropic_events(client: Any) -> str:
        out = []
        for ev in client.messages.create(model="m", max_tokens=8, messages=message, stream=True):
            if ev.type == "content_block_delta" and ev.delta.type == "text_delta":
                out.append(ev.delta.text)
        return "".join(out)

    def sdk_anthropic_stream(client: Any) -> str:
        with client.messages.stream(model="m", max_tokens=8, messages=message) as stream:
            text: str = stream.get_final_text()
        return text

    def sdk_responses_events(client: Any) -> str:
        out = []
        for ev in client.responses.create(model="m", input="Stream, please.", stream=True):
            if ev.type == "response.output_text.delta":
                out.append(ev.delta)
        return "".join(out)

    def sdk_responses_stream(client: Any) -> str:
        with client.responses.stream(model="m", input="Stream, please.") as stream:
            text: str = stream.get_final_response().output_text
        return text

    for label, wire, decoder, sdk, events_fn, stream_fn in (
        ("Anthropic Messages", wire_a, AnthropicStreamDecoder, claude,
         sdk_anthropic_events, sdk_anthropic_stream),
        ("OpenAI Responses", wire_r, ResponsesStreamDecoder, gpt,
         sdk_responses_events, sdk_responses_stream),
    ):  # fmt: skip
        client = sdk(wire)
        variants: dict[str, Callable[[], str]] = {
            "turnledger decoder": lambda w=wire, d=decoder: ours_typed(d, w),  # type: ignore[misc]
            "turnledger, httpx.Response": lambda w=wire, d=decoder: ours_typed_response(d, w),  # type: ignore[misc]
            "SDK, create(stream=True)": lambda c=client, f=events_fn: f(c),  # type: ignore[misc]
            "SDK, stream() accumulating": lambda c=client, f=stream_fn: f(c),  # type: ignore[misc]
        }
        for name, fn in variants.items():  # same answer from each, and warm
            assert fn() == answer, name
        medians = interleaved(variants, rounds)
        size = sum(map(len, wire))
        print(f"   {label}: {len(wire):,} events, {size / 1e6:.2f} MB, median of {rounds}:")
        for name, t in medians.items():
            print(
                f"     {name:28s} {t * 1e3:8.1f} ms  {len(wire) / t / 1e3:7.1f} k events/s"
                f"  {t / len(wire) * 1e6:6.2f} µs/event"
            )
        base = medians["turnledger, httpx.Response"]
        print(
            "     ratio (throughput, turnledger over httpx.Response / SDK):"
            f" create(stream=True) {medians['SDK, create(stream=True)'] / base:.2f}x,"
            f" stream() {medians['SDK, stream() accumulating'] / base:.2f}x"
        )


# --- 3. a streamed turn end to end ----------------------------------------------------


def _serve(conn: Any, chunks: int, gap: float) -> None:  # runs in the server process
    wire, _ = make_stream(chunks)
    body: list[Any] = []
    for event in wire:
        body.append(event)
        if gap:
            body.append(WritePause(gap))
    server = LoopbackServer(Reply(body=tuple(body)))
    with server.start_in_thread():
        conn.send(server.port)
        conn.recv()  # until told to stop


class _NoopSink:
    async def started(self) -> None:
        pass

    async def delta(self, text: str) -> None:
        pass


async def _e2e(port: int, chunks: int, rounds: int) -> None:
    from turnledger.adapters.stores.memory import MemoryStore

    try:
        from turnledger.sessions import open_hub
    except ImportError:
        open_hub = None  # type: ignore[assignment]

    _, answer = make_stream(chunks)
    base = f"http://127.0.0.1:{port}/v1"
    timeout = httpx.Timeout(30.0)
    client = httpx.AsyncClient(timeout=timeout, trust_env=False)
    provider = OpenAIChat(base_url=base, api_key="sk-bench", timeout=timeout, trust_env=False)
    request = ChatRequest(RequestId("bench"), "bench", (ChatMessage("user", "Stream, please."),))
    body = provider.encoder.encode(request.model, request.messages)

    async def bare() -> None:
        n = 0
        async with client.stream("POST", base + "/chat/completions", content=body) as r:
            async for chunk in r.aiter_bytes():
                n += len(chunk)

    async def complete() -> None:
        c = await provider.complete(request, _NoopSink())
        assert c.answer == answer

    variants: dict[str, Callable[[], Any]] = {
        "bare httpx aiter_bytes()": bare,
        "OpenAIChat.complete()": complete,
    }
    hub_cm = None
    if open_hub is not None:
        store = MemoryStore()
        hub_cm = open_hub(store, provider, model="bench", turn_deadline=None, idle_timeout=None)
        hub = await hub_cm.__aenter__()
        counter = iter(range(10**9))

        async def session() -> None:
            handle = await hub.submit(f"s{next(counter)}", "Stream, please.")
            result = await handle.outcome()
            assert result.kind == "committed", result
            assert result.answer == answer

        variants["turn through a session hub"] = session
    else:
        print("   (turnledger.sessions.open_hub is not available: no session figure)")

    wall: dict[str, list[float]] = {k: [] for k in variants}
    cpu: dict[str, list[float]] = {k: [] for k in variants}
    for fn in variants.values():  # warm up connections and caches
        await fn()
    for _ in range(rounds):
        for name, fn in variants.items():
            gc.collect()
            w0, c0 = time.perf_counter(), time.process_time()
            await fn()
            wall[name].append(time.perf_counter() - w0)
            cpu[name].append(time.process_time() - c0)
    if hub_cm is not None:
        await hub_cm.__aexit__(None, None, None)
    await provider.aclose()
    await client.aclose()

    print(f"   median of {rounds} interleaved runs, {chunks:,} chunks per turn:")
    base_w = statistics.median(wall["bare httpx aiter_bytes()"])
    base_c = statistics.median(cpu["bare httpx aiter_bytes()"])
    for name in variants:
        w, c = statistics.median(wall[name]), statistics.median(cpu[name])
        print(
            f"     {name:28s} wall {w * 1e3:7.1f} ms ({w / base_w:4.2f}x)"
            f"  client CPU {c * 1e3:7.1f} ms ({c / base_c:4.2f}x)"
            f"  {c / chunks * 1e6:5.1f} µs CPU/chunk"
        )


def bench_e2e(chunks: int, rounds: int, gap: float) -> None:
    how = f"a {gap * 1e3:g} ms pause after each chunk" if gap else "written back to back"
    print(f"\n3. A streamed turn end to end, loopback server in another process, {how}")
    ctx = multiprocessing.get_context("spawn")
    parent, child = ctx.Pipe()
    proc = ctx.Process(target=_serve, args=(child, chunks, gap), daemon=True)
    proc.start()
    try:
        port = parent.recv()
        trio.run(_e2e, port, chunks, rounds)
    finally:
        parent.send("stop")
        proc.join(10)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=9)
    parser.add_argument("--chunks", type=int, default=20_000)
    parser.add_argument(
        "--sdk-events", type=int, default=4_000, help="events per stream in the SDK comparison"
    )
    parser.add_argument("--quick", action="store_true", help="fewer rounds and chunks")
    parser.add_argument("--only-sdks", action="store_true", help="run the SDK comparison alone")
    args = parser.parse_args()
    if args.quick:
        args.rounds, args.chunks, args.sdk_events = 3, 2_000, 1_000
    # An application configures logging; keep the library's debug lines out.
    structlog.configure(wrapper_class=structlog.make_filtering_bound_logger(30))
    print(f"python {sys.version.split()[0]}, httpx {httpx.__version__}, trio {trio.__version__}")
    if args.only_sdks:
        bench_sdks(args.sdk_events, args.rounds)
        return
    bench_decode(args.chunks, args.rounds)
    bench_sdks(args.sdk_events, args.rounds)
    # Back to back: a read carries many chunks (a backlog, or a fast server).
    bench_e2e(args.chunks, args.rounds, 0.0)
    # Paced: each chunk arrives on its own, as from a model generating
    # tokens; the client does one socket read per chunk.
    bench_e2e(max(args.chunks // 20, 100), args.rounds, 0.0005)


if __name__ == "__main__":
    main()
