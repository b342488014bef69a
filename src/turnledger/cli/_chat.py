"""``turnledger chat``: one question per line, against a model or the
built-in loopback server."""

from __future__ import annotations

import argparse
import os
import signal
import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import httpx
import trio

from ..adapters.providers import OllamaChat, OpenAIChat
from ..sessions import CommittedResult, Hub, TurnHandle, open_hub
from ._args import at_least, http_url, key_json, positive, text_arg
from ._display import Out, describe, visible
from ._errors import EXIT_FAILED, EXIT_OK, EXIT_USAGE, Exit
from ._stores import open_to_write

__all__ = ["add_chat_parser"]


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
    c.add_argument("--max-request-bytes", type=positive(int), default=None, metavar="N",
                   help="cap on the request body, in bytes")  # fmt: skip
    c.add_argument("--max-prompt-tokens", type=positive(int), default=None, metavar="N",
                   help="cap on the estimated prompt tokens (~4 characters a token)")  # fmt: skip
    c.add_argument("--timeout", type=positive(float), default=120.0, metavar="SECONDS",
                   help="overall deadline per turn (default: %(default)s)")  # fmt: skip
    c.add_argument("--max-tokens", type=at_least(1), default=None, metavar="N")
    c.add_argument("--temperature", type=float, default=None)
    c.add_argument("--stop", action="append", default=None, help="stop sequence (repeatable)")
    c.add_argument("--param", action="append", type=key_json, default=[], metavar="KEY=JSON",
                   help="any other request field (repeatable)")  # fmt: skip
    c.set_defaults(run=_run_chat)


def _make_provider(args: argparse.Namespace, base_url: str) -> OpenAIChat | OllamaChat:
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
    from ..testing import chat_responder, open_loopback_server

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
    if args.base_url and not args.model:
        raise Exit(EXIT_USAGE, "--model is required with --base-url")
    model = args.model or "loopback"
    async with _endpoint(args) as base_url:
        # Everything the arguments can get wrong fails here, before the
        # store is opened or any task started: a usage error, exit 2.
        try:
            provider = _make_provider(args, base_url)
            provider.encoder.encode(model, [])
        except (ValueError, TypeError, httpx.InvalidURL) as exc:
            raise Exit(EXIT_USAGE, f"bad request settings: {exc}") from None
        store = await open_to_write(args.db)
        chat = _Conversation(Out(sys.stdout), args.session)
        try:
            async with provider, trio.open_nursery() as nursery:
                nursery.start_soon(chat.on_sigint)
                async with open_hub(
                    store,
                    provider,
                    model=model,
                    system=args.system or "",
                    max_request_bytes=args.max_request_bytes,
                    max_prompt_tokens=args.max_prompt_tokens,
                    turn_deadline=args.timeout,
                ) as hub:
                    with chat.scope:
                        await chat.read_loop(hub, _Lines(0))
                nursery.cancel_scope.cancel()
        finally:
            await store.aclose()
    return EXIT_FAILED if chat.failures else EXIT_OK


class _Conversation:
    """One chat: questions from the input, answers streamed to ``out``, and
    Ctrl-C cancelling the turn in flight or, at the prompt, ending the chat."""

    def __init__(self, out: Out, session_id: str) -> None:
        self.out = out
        self.session_id = session_id
        self.interactive = sys.stdin is not None and sys.stdin.isatty()
        #: Turns that did not commit, and lines refused.
        self.failures = 0
        #: Cancelled to end the chat (Ctrl-C at the prompt).
        self.scope = trio.CancelScope()
        self.current: TurnHandle | None = None

    async def on_sigint(self) -> None:
        with trio.open_signal_receiver(signal.SIGINT) as signals:
            async for _ in signals:
                if self.current is not None and not self.current.done:
                    await self.current.cancel()
                else:
                    self.scope.cancel()

    async def read_loop(self, hub: Hub, lines: _Lines) -> None:
        """Ask each line of input, until the end of input."""
        while True:
            line = await _read_line(lines, "you> " if self.interactive else None)
            if line is None:
                return
            if isinstance(line, _Refused):
                self.fail(str(line))
            elif line.strip():
                await self.ask(hub, line)

    async def ask(self, hub: Hub, question: str) -> None:
        """One turn: the answer streams as it arrives; an outcome other than
        committed is reported on stderr."""
        turn = await hub.submit(self.session_id, question)
        self.current = turn
        async for delta in turn.preview():
            self.out(delta, end="")
        result = await turn.outcome()
        self.current = None
        self.out()
        if not isinstance(result, CommittedResult):
            self.fail(describe(result))

    def fail(self, message: str) -> None:
        self.failures += 1
        print(f"[{visible(message)}]", file=sys.stderr, flush=True)
