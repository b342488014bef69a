"""``turnledger demo`` and ``turnledger chat``: the commands that run sessions."""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import shlex
import signal
import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any, TextIO

import httpx
import trio

from ._cli_errors import Exit, at_least, check_db_path, display_db, http_url, text_arg, visible
from ._errors import StoreError
from .events import DEFAULT_CODEC, EventStore, TurnSubmitted
from .sessions import (
    ChatRequest,
    CommittedResult,
    Completion,
    DiscardedResult,
    Hub,
    Provider,
    StreamSink,
    Turn,
    TurnHandle,
    TurnResult,
    open_hub,
    replay,
)

__all__ = ["add_chat_parser", "add_demo_parser"]

EXIT_OK, EXIT_FAILED, EXIT_USAGE, EXIT_STORE = 0, 1, 2, 3


class _Out:
    """Transcript printing: flushed at once, so a pipe shows it as it happens."""

    def __init__(self, stream: TextIO) -> None:
        self.stream = stream
        # A terminal acts on control characters: show them as escapes
        # there; a pipe or a file gets the text exactly as it was written.
        self.terminal = stream.isatty()

    def __call__(self, text: str = "", end: str = "\n") -> None:
        if self.terminal:
            text = visible(text, lines=True)
        self.stream.write(text + end)
        self.stream.flush()


def _describe(result: TurnResult) -> str:
    if isinstance(result, CommittedResult):
        return f"committed (finish_reason={result.finish_reason})"
    if isinstance(result, DiscardedResult):
        detail = f": {result.detail}" if result.detail else ""
        return f"discarded, reason={result.reason}{detail}"
    return f"rejected, reason={result.reason}: {result.detail}"


async def _open_store(db: str) -> EventStore:
    from .adapters.stores import open_store, store_kind

    check_db_path(db, store_kind(db))
    try:
        return await open_store(db)
    except StoreError as exc:
        raise Exit(EXIT_STORE, f"cannot open {display_db(db)}: {exc}") from exc


# --- demo -------------------------------------------------------------------


class _Uninterruptible:
    """A provider whose calls cannot be interrupted, like an SDK that blocks a
    worker thread: cancelling the turn does not stop the call, so its answer
    arrives after the session has moved on (a *late completion*)."""

    def __init__(self, inner: Provider) -> None:
        self._inner = inner

    @property
    def encoder(self) -> Any:
        return self._inner.encoder

    async def complete(self, request: ChatRequest, sink: StreamSink) -> Completion:
        with trio.CancelScope(shield=True):
            completion = await self._inner.complete(request, sink)
        return completion


async def _stream_turn(out: _Out, turn: TurnHandle, *, stop_after: int | None = None) -> str:
    shown = ""
    out("  assistant (preview): ", end="")
    async for delta in turn.preview():
        out(delta, end="")
        shown += delta
        if stop_after is not None and len(shown) >= stop_after:
            out(" ✂", end="")
            await turn.cancel()
            break
    out()
    return shown


_KINDS = {"sqlite": "SQLite", "journal": "journal", "postgres": "PostgreSQL"}


async def _run_demo(args: argparse.Namespace) -> int:
    from .adapters.providers import OpenAIChat
    from .adapters.stores import store_kind
    from .testing._loopback import open_loopback_server

    out = _Out(sys.stdout)
    kind = store_kind(args.db)
    db = args.db if kind == "postgres" else os.path.abspath(args.db)
    session = "demo-" + dt.datetime.now(dt.UTC).strftime("%Y%m%dT%H%M%S%f")[:-3]
    store = await _open_store(db)
    out("turnledger demo: a scripted conversation against a loopback server on 127.0.0.1")
    out(f"  event log: {display_db(db)} ({_KINDS[kind]}), session {session}")
    try:
        async with open_loopback_server([]) as server:
            out(f"  provider:  OpenAI-compatible SSE at {server.openai_base_url}")
            async with OpenAIChat(base_url=server.openai_base_url, api_key="") as provider:
                demo = _Demo(out, server, store, provider, session)
                ok = await demo.scenes()
                ok &= await demo.late_completion()
    finally:
        await store.aclose()

    # Replay the file from disk, with a store opened anew.
    out()
    out("── Replaying the log from disk")
    again = await _open_store(db)
    try:
        events = await again.read_decoded(session, DEFAULT_CODEC)
    finally:
        await again.aclose()
    state = replay(events)
    match = tuple(state.turns) == demo.live_history
    out(f"  {len(events)} events in {display_db(db)}")
    for i, t in enumerate(state.turns, 1):
        out(f"  [{i}] user: {t.question}")
        out(f"      assistant: {t.answer}")
    verdict = "matches" if match else "DOES NOT match"
    out(f"  replayed history {verdict} the live session ({len(state.turns)} turns)")
    out()
    out(f"See the whole story:  turnledger log {shlex.quote(display_db(db))} --session {session}")
    return EXIT_OK if ok and match else EXIT_FAILED


_SYSTEM = "You are the turnledger demo assistant. Answer in one or two sentences."


class _Demo:
    def __init__(
        self, out: _Out, server: Any, store: EventStore, provider: Provider, session: str
    ) -> None:
        self.out = out
        self.server = server
        self.store = store
        self.provider = provider
        self.session = session
        self.live_history: tuple[Turn, ...] = ()

    @staticmethod
    def slow(text: str, *, pause: float = 0.03, finish: str | None = "stop") -> Any:
        from .testing._loopback import Pause, Reply, openai_sse_chunks

        parts: list[Any] = []
        for chunk in openai_sse_chunks(text, finish_reason=finish, chunk_size=6):
            parts += [chunk, Pause(pause)]
        return Reply(body=tuple(parts))

    async def turn(
        self, hub: Hub, title: str, question: str, reply: Any, *, stop_after: int | None = None
    ) -> TurnResult:
        out = self.out
        self.server.enqueue(reply)
        out()
        out(f"── {title}")
        out(f"  user: {question}")
        handle = await hub.submit(self.session, question)
        await _stream_turn(out, handle, stop_after=stop_after)
        result = await handle.outcome()
        out(f"  outcome: {_describe(result)}")
        out(f"  history: {len(await hub.history(self.session))} turn(s)")
        return result

    async def scenes(self) -> bool:
        from .testing._loopback import Hang, Reply, error_reply, openai_sse_chunks

        out = self.out
        async with open_hub(
            self.store,
            self.provider,
            model="demo-model",
            system=_SYSTEM,
            max_request_bytes=560,
            turn_deadline=2.0,
            idle_timeout=1.0,
        ) as hub:
            first = await self.turn(
                hub,
                "1. A complete answer commits",
                "What does turnledger keep?",
                self.slow(
                    "Only turns whose answer arrived complete and accepted: "
                    "finish_reason stop, then [DONE]."
                ),
            )
            second = await self.turn(
                hub,
                "2. A longer answer commits too",
                "And everything else?",
                self.slow(
                    "Everything else goes to the event log as typed events with request ids, "
                    "so a replay rebuilds history and every race can be read afterwards.",
                    pause=0.01,
                ),
            )
            ok = isinstance(first, CommittedResult) and isinstance(second, CommittedResult)

            before = await hub.history(self.session)
            third = await self.turn(
                hub,
                "3. The request is trimmed to 560 bytes (whole turns), then times out",
                "Summarise our conversation so far, please.",
                Reply(body=(openai_sse_chunks("", finish_reason=None, done=False)[0], Hang())),
            )
            submitted = [
                DEFAULT_CODEC.decode(e)
                for e in await self.store.read(self.session)
                if e.tag == "turn_submitted"
            ][-1]
            assert isinstance(submitted, TurnSubmitted)
            out(
                f"  request: {submitted.request_bytes} bytes, {submitted.turns_sent} turn(s) "
                f"sent, {submitted.turns_dropped} dropped to fit"
            )
            same = await hub.history(self.session) == before
            out(f"  history unchanged by the trim and the timeout: {'yes' if same else 'NO'}")
            ok &= isinstance(third, DiscardedResult) and third.reason == "timeout"
            ok &= same and submitted.turns_dropped >= 1

            fourth = await self.turn(
                hub,
                "4. Cancelled mid-stream: the preview was shown, nothing is committed",
                "Tell me a long story about event logs.",
                self.slow("Once upon a time there was an append-only log that never forgot. " * 4),
                stop_after=40,
            )
            ok &= isinstance(fourth, DiscardedResult) and fourth.reason == "cancelled"

            fifth = await self.turn(
                hub,
                "5. HTTP 429 (its error body never reaches a log line or an event)",
                "Are you there?",
                error_reply(
                    429,
                    '{"error":{"message":"rate limited by /srv/app/limits.py"}}',
                    headers=[("Retry-After", "1")],
                ),
            )
            ok &= isinstance(fifth, DiscardedResult) and fifth.reason == "http_status"

            sixth = await self.turn(
                hub,
                "6. finish_reason=length: the text looks complete, but it is not",
                "Write one short sentence about trio.",
                self.slow("Trio makes structured concurrency feel natural.", finish="length"),
            )
            ok &= isinstance(sixth, DiscardedResult) and sixth.reason == "incomplete_finish"
            self.live_history = await hub.history(self.session)
        return ok

    async def late_completion(self) -> bool:
        # A provider whose calls cannot be interrupted: its answer comes back
        # after the deadline discarded the turn.
        from .testing._loopback import Reply, openai_sse_chunks

        out = self.out
        out()
        out("── 7. A late completion: the answer arrives after the turn timed out")
        body = tuple(openai_sse_chunks("This answer is too late.", chunk_size=40))
        self.server.enqueue(Reply(body=body, headers_delay=1.6))
        async with open_hub(
            self.store,
            _Uninterruptible(self.provider),
            model="demo-model",
            system=_SYSTEM,
            turn_deadline=1.0,
            idle_timeout=None,
        ) as hub:
            question = "Is this answer on time?"
            out(f"  user: {question}")
            handle = await hub.submit(self.session, question)
            result = await handle.outcome()
            out(f"  outcome: {_describe(result)}")
            late = await self._wait_ignored(handle.request_id)
            same = await hub.history(self.session) == self.live_history
        if late is None:
            out("  the late completion was not recorded")
            return False
        out(
            f"  its answer arrived {late:.2f}s after the turn ended: recorded as "
            f"completion_ignored; history unchanged: {'yes' if same else 'NO'}"
        )
        return isinstance(result, DiscardedResult) and result.reason == "timeout" and same

    async def _wait_ignored(self, request_id: str) -> float | None:
        with trio.move_on_after(5):
            while True:
                events = await self.store.read(self.session)
                ended = {
                    e.payload.get("request_id"): e.recorded_at
                    for e in events
                    if e.tag == "turn_discarded"
                }
                for e in events:
                    if e.tag == "completion_ignored" and e.payload["request_id"] == request_id:
                        return e.recorded_at - ended[request_id]
                await trio.sleep(0.05)
        return None


def add_demo_parser(sub: Any, common: argparse.ArgumentParser) -> None:
    d = sub.add_parser(
        "demo",
        parents=[common],
        help="run a scripted conversation against a built-in loopback server",
        description="No network and no API key: a loopback server on 127.0.0.1 plays "
        "a committed turn, a trim then a timeout, a cancel mid-stream, an HTTP 429, "
        "a length finish and a late completion; then the log is replayed from disk.",
    )
    d.add_argument("--db", default="turnledger-demo.db", help="event log (default: %(default)s)")
    d.set_defaults(run=_run_demo)


# --- chat -------------------------------------------------------------------


def _positive(kind: type[int] | type[float]) -> Any:
    def parse(text: str) -> int | float:
        try:
            value = kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"not a number: {text!r}") from None
        if not value > 0 or value != value or value == float("inf"):
            raise argparse.ArgumentTypeError(f"must be a positive number, not {text}")
        return value

    return parse


def _param(text: str) -> tuple[str, Any]:
    key, sep, value = text.partition("=")
    if not sep or not key:
        raise argparse.ArgumentTypeError(f"expected KEY=JSON, got {text!r}")
    try:
        return key, json.loads(value)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(f"{key}: not JSON: {exc}") from exc


def add_chat_parser(sub: Any, common: argparse.ArgumentParser) -> None:
    c = sub.add_parser(
        "chat",
        parents=[common],
        help="chat with a model (reads one question per line when stdin is not a terminal)",
        description="Without --base-url it talks to a built-in loopback server, so it works "
        "on a fresh machine. Ctrl-C during an answer cancels that turn; Ctrl-C at the prompt "
        "or the end of input exits. Exit code 1 if any turn did not commit.",
    )
    c.add_argument("--provider", choices=["openai", "ollama"], default="openai")
    c.add_argument("--base-url", type=http_url, help="e.g. http://127.0.0.1:8080/v1 (OpenAI) or "
                   "http://127.0.0.1:11434 (Ollama)")  # fmt: skip
    c.add_argument("--model", type=text_arg, default=None, help="model name (default: loopback)")
    c.add_argument("--api-key-env", default=None, metavar="NAME",
                   help="environment variable holding the API key "
                   "(default: OPENAI_API_KEY / OLLAMA_API_KEY)")  # fmt: skip
    c.add_argument("--db", default="turnledger-chat.db", help="event log (default: %(default)s)")
    c.add_argument(
        "--session", type=text_arg, default="chat", help="session id (default: %(default)s)"
    )
    c.add_argument(
        "--system",
        type=text_arg,
        default=None,
        help="system prompt (fixed when the session starts)",
    )
    c.add_argument("--max-request-bytes", type=_positive(int), default=None, metavar="N",
                   help="cap on the request body, in bytes")  # fmt: skip
    c.add_argument("--max-prompt-tokens", type=_positive(int), default=None, metavar="N",
                   help="cap on the estimated prompt tokens (~4 characters a token)")  # fmt: skip
    c.add_argument("--timeout", type=_positive(float), default=120.0, metavar="SECONDS",
                   help="overall deadline per turn (default: %(default)s)")  # fmt: skip
    c.add_argument("--max-tokens", type=at_least(1), default=None, metavar="N")
    c.add_argument("--temperature", type=float, default=None)
    c.add_argument("--stop", action="append", default=None, help="stop sequence (repeatable)")
    c.add_argument("--param", action="append", type=_param, default=[], metavar="KEY=JSON",
                   help="any other request field (repeatable)")  # fmt: skip
    c.set_defaults(run=_run_chat)


def _make_provider(args: argparse.Namespace, base_url: str) -> Any:
    from .adapters.providers import OllamaChat, OpenAIChat

    if not args.base_url:
        key: str | None = ""  # the built-in loopback server: never send a key there
    elif args.api_key_env:
        key = os.environ.get(args.api_key_env)
        if key is None:
            raise Exit(EXIT_USAGE, f"--api-key-env: {args.api_key_env} is not set")
    else:
        key = None  # the provider's own default: OPENAI_API_KEY / OLLAMA_API_KEY
    extra = dict(args.param)
    if args.provider == "ollama":
        given = extra.pop("options", None) or {}
        if not isinstance(given, dict):
            raise Exit(EXIT_USAGE, "--param options=... must be a JSON object")
        options: dict[str, Any] = dict(given)
        if args.temperature is not None:
            options["temperature"] = args.temperature
        if args.max_tokens is not None:
            options["num_predict"] = args.max_tokens
        if args.stop:
            options["stop"] = args.stop
        return OllamaChat(
            base_url=base_url, api_key=key, options=options or None, extra=extra or None
        )
    return OpenAIChat(
        base_url=base_url,
        api_key=key,
        temperature=args.temperature,
        max_tokens=args.max_tokens,
        stop=args.stop,
        extra=extra or None,
    )


@asynccontextmanager
async def _endpoint(args: argparse.Namespace) -> AsyncIterator[str]:
    if args.base_url:
        yield args.base_url
        return
    from .testing._loopback import chat_responder, open_loopback_server

    def answer(messages: list[dict[str, Any]]) -> str:
        question = messages[-1]["content"] if messages else ""
        turns = sum(1 for m in messages if m.get("role") == "user")
        return f"(loopback) You said: {question!r}. The request held {turns - 1} earlier turn(s)."

    async with open_loopback_server(chat_responder(answer, chunk_size=6, pause=0.01)) as server:
        yield server.openai_base_url if args.provider == "openai" else server.base_url


class _Refused(str):
    """A line of input that is not submitted: the text says why."""


def _decode_line(raw: bytes, number: int) -> str:
    """One line of input as text, or a :class:`_Refused` saying why not
    (each line stands alone: a bad one spoils neither its neighbours nor the
    lines read before it)."""
    try:
        line = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        bad = raw[exc.start : exc.start + 1].hex()
        return _Refused(f"line {number} refused: not UTF-8 (byte 0x{bad} at offset {exc.start})")
    if "\0" in line:
        return _Refused(f"line {number} refused: it holds a NUL character")
    return line


class _Lines:
    """Lines of bytes from a file descriptor, read with ``os.read``: no
    decoding (each line is decoded on its own) and no lock held, so a
    reading thread abandoned at exit cannot block the interpreter's
    shutdown the way a buffered ``sys.stdin`` can."""

    def __init__(self, fd: int) -> None:
        self.fd = fd
        self.pending = b""
        self.ended = False
        self.number = 0

    def readline(self) -> bytes | None:
        """The next line without its line end, or None at the end."""
        while b"\n" not in self.pending and not self.ended:
            try:
                chunk = os.read(self.fd, 65536)
            except OSError:  # no standard input at all (a closed descriptor)
                chunk = b""
            self.ended = not chunk
            self.pending += chunk
        if not self.pending:
            return None
        line, _, self.pending = self.pending.partition(b"\n")
        self.number += 1
        return line.removesuffix(b"\r")


async def _read_line(lines: _Lines, prompt: str | None) -> str | None:
    """The next line of input as text, a :class:`_Refused`, or None at the
    end of input."""

    def read() -> str | None:
        if prompt is not None:
            sys.stderr.write(prompt)
            sys.stderr.flush()
        raw = lines.readline()
        return None if raw is None else _decode_line(raw, lines.number)

    return await trio.to_thread.run_sync(read, abandon_on_cancel=True)


async def _run_chat(args: argparse.Namespace) -> int:
    out = _Out(sys.stdout)
    interactive = sys.stdin is not None and sys.stdin.isatty()
    if args.base_url and not args.model:
        raise Exit(EXIT_USAGE, "--model is required with --base-url")
    model = args.model or "loopback"
    failures = 0
    current: list[TurnHandle] = []
    async with _endpoint(args) as base_url:
        # Everything the arguments can get wrong fails here, before the
        # store is opened or any task started: a usage error, exit 2.
        try:
            provider = _make_provider(args, base_url)
            provider.encoder.encode(model, [])
        except (ValueError, TypeError, httpx.InvalidURL) as exc:
            raise Exit(EXIT_USAGE, f"bad request settings: {exc}") from None
        store = await _open_store(args.db)
        try:
            async with provider, trio.open_nursery() as nursery:
                chat_scope = trio.CancelScope()

                async def on_sigint() -> None:
                    with trio.open_signal_receiver(signal.SIGINT) as signals:
                        async for _ in signals:
                            if current and not current[0].done:
                                await current[0].cancel()
                            else:
                                chat_scope.cancel()

                nursery.start_soon(on_sigint)
                async with open_hub(
                    store,
                    provider,
                    model=model,
                    system=args.system or "",
                    max_request_bytes=args.max_request_bytes,
                    max_prompt_tokens=args.max_prompt_tokens,
                    turn_deadline=args.timeout,
                ) as hub:
                    with chat_scope:
                        lines = _Lines(0)
                        while True:
                            line = await _read_line(lines, "you> " if interactive else None)
                            if line is None:
                                break
                            if isinstance(line, _Refused):
                                failures += 1
                                print(f"[{line}]", file=sys.stderr, flush=True)
                                continue
                            if not line.strip():
                                continue
                            turn = await hub.submit(args.session, line)
                            current[:] = [turn]
                            async for delta in turn.preview():
                                out(delta, end="")
                            result = await turn.outcome()
                            current.clear()
                            out()
                            if not isinstance(result, CommittedResult):
                                failures += 1
                                message = visible(_describe(result))
                                print(f"[{message}]", file=sys.stderr, flush=True)
                nursery.cancel_scope.cancel()
        finally:
            await store.aclose()
    return EXIT_FAILED if failures else EXIT_OK
