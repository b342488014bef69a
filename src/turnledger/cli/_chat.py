"""``turnledger chat``: a prompt on a terminal, one question per line from
a pipe; against a model or the built-in loopback server."""

from __future__ import annotations

import argparse
import datetime as dt
import os
import signal
import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import attrs
import httpx
import trio

from .. import (
    InvalidCommand,
    ProviderSettingsError,
    SummaryFailed,
    UnknownSession,
    UnknownTurn,
    __version__,
)
from ..adapters.providers import PROVIDER_KINDS
from ..events import DEFAULT_CODEC, EventStore, Window
from ..sessions import (
    Budget,
    CommittedResult,
    DiscardedResult,
    Hub,
    SessionState,
    TurnHandle,
    TurnResult,
    open_hub,
    prompt_token_cap,
    replay_resolved,
    replay_stored,
)
from ..timeline import branch_line
from ._args import add_provider_arguments, open_configured_provider, provider_settings, text_arg
from ._display import ID_WIDTH, Out, describe, visible
from ._errors import EXIT_FAILED, EXIT_OK, EXIT_USAGE, Exit, display_db, scrub
from ._hints import ChatSettings, hint
from ._stores import open_to_write
from ._terminal import Look, PromptReader, Spinner, data_dir, shown_text

__all__ = ["add_chat_parser"]

_EXAMPLES = """examples:
  turnledger chat                                   the built-in loopback server, no key
  OPENAI_BASE_URL=https://api.openai.com/v1 OPENAI_API_KEY=sk-... turnledger chat --model gpt-4o
  turnledger chat --provider ollama --model llama3.2      (OLLAMA_HOST or 127.0.0.1:11434)
  ANTHROPIC_BASE_URL=https://api.anthropic.com ANTHROPIC_API_KEY=... \
    turnledger chat --provider anthropic --model claude-sonnet-4-5
  turnledger chat --provider openai-responses --base-url https://api.openai.com/v1 --model gpt-4.1
  turnledger chat --new --system 'Answer in French.'      a fresh session with its own settings
  printf 'q1\\nq2\\n' | turnledger chat --db x.db          one question per line

The endpoint is --base-url, else the provider's variable (OPENAI_BASE_URL, OLLAMA_HOST,
ANTHROPIC_BASE_URL), else the built-in loopback server. A bare chat continues the session 'chat' in
%(data)s; the banner says how many turns it resumed, and --new
(or /new at the prompt) starts a fresh one. A session's model, system prompt and
history policy are fixed when it starts: giving others for an existing session is
refused, with the choice spelled out.

At the prompt: Enter asks; Esc-Enter (or Alt-Enter) starts a new line, and a pasted
block of lines is one question; Up/Down walk the input history; /help lists the
commands (/exit /quit /new /history). Ctrl-C during an answer cancels that turn
(nothing is saved); Ctrl-C or Ctrl-D at the prompt ends the chat (exit 0)."""


def add_chat_parser(sub: Any, common: argparse.ArgumentParser) -> None:
    c = sub.add_parser(
        "chat",
        parents=[common],
        help="chat with a model (a prompt on a terminal, one question per line from a pipe)",
        description="Chat with a model. Exit code 1 if any turn did not commit (other "
        "than one cancelled with Ctrl-C).",
        epilog=_EXAMPLES % {"data": data_dir() / "chat.db"},
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    c.add_argument("--db", default=None, metavar="DB",
                   help="event log: a SQLite file, a .jsonl journal or a PostgreSQL URL "
                   f"(default: {data_dir() / 'chat.db'})")  # fmt: skip
    c.add_argument("--session", type=text_arg, default="chat",
                   help="session id, e.g. work (default: %(default)s)")  # fmt: skip
    c.add_argument("--new", action="store_true",
                   help="start a fresh session (id: the --session id plus the time) "
                   "instead of continuing one")  # fmt: skip
    c.add_argument("--system", type=text_arg, default=None,
                   help="system prompt, e.g. 'Be brief.' (fixed when a session starts)"
                   )  # fmt: skip
    add_provider_arguments(c)
    # On a terminal the log lines wait until the chat ends, and the window
    # line tells the context window (so its log lines are not shown there).
    c.set_defaults(run=_run_chat, hold_logs=True, told=_WINDOW_EVENTS)


@attrs.frozen
class _Endpoint:
    #: The base URL the provider is given.
    base_url: str
    #: ``--base-url``, the provider's variable (``OPENAI_BASE_URL``...) or ``loopback``.
    source: str


def _configured_endpoint(args: argparse.Namespace) -> _Endpoint | None:
    """The endpoint the user configured, as the library reads it: the
    option, else the provider's environment variable; None if neither."""
    try:
        configured = provider_settings(args).endpoint()
    except ProviderSettingsError as exc:  # (the variable's value is not repeated)
        raise Exit(EXIT_USAGE, str(exc)) from None
    if configured is None:
        return None
    source = "--base-url" if configured.source == "base_url" else configured.source
    return _Endpoint(configured.url, source)


def _key_var(args: argparse.Namespace) -> str:
    if args.api_key_env:
        return str(args.api_key_env)
    return PROVIDER_KINDS[args.provider].key_env


def _make_provider(args: argparse.Namespace, endpoint: _Endpoint) -> Any:
    # The same provider serve builds from the same options; each protocol
    # says what its API calls them (and refuses what it lacks: the
    # Responses API has no stop sequences).
    return open_configured_provider(
        provider_settings(args), endpoint.base_url, loopback=endpoint.source == "loopback"
    )


@asynccontextmanager
async def _endpoint(args: argparse.Namespace) -> AsyncIterator[_Endpoint]:
    configured = _configured_endpoint(args)
    if configured is not None:
        yield configured
        return
    from ..testing import chat_responder, open_loopback_server

    def answer(messages: list[dict[str, Any]]) -> str:
        question = messages[-1]["content"] if messages else ""
        turns = sum(1 for m in messages if m.get("role") == "user")
        return f"(loopback) You said: {question!r}. The request held {turns - 1} earlier turn(s)."

    async with open_loopback_server(chat_responder(answer, chunk_size=6, pause=0.01)) as server:
        yield _Endpoint(server.base_url + PROVIDER_KINDS[args.provider].loopback_path, "loopback")


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


@attrs.frozen
class _Existing:
    """What the store says about a session before the chat starts."""

    model: str
    system: str
    turns: int


async def _existing(store: EventStore, session_id: str) -> _Existing | None:
    events = await store.read_decoded(session_id, DEFAULT_CODEC)
    if not events:
        return None
    started = events[0]
    return _Existing(
        model=getattr(started, "model", ""),
        system=getattr(started, "system", ""),
        turns=len((await replay_resolved(store, events)).turns),
    )


async def _fresh_id(store: EventStore, base: str) -> str:
    """A session id nobody has used: ``base`` and the time, then a counter."""
    stamp = dt.datetime.now(dt.UTC).strftime("%Y%m%d-%H%M%S")
    candidate = f"{base}-{stamp}"
    n = 1
    while await store.read(candidate):
        n += 1
        candidate = f"{base}-{stamp}-{n}"
    return candidate


def _check_settings(args: argparse.Namespace, existing: _Existing) -> None:
    """Refuse settings the existing session does not have: they would be
    silently ignored, since a session's settings are fixed when it starts."""
    clashes = []
    if args.model is not None and args.model != existing.model:
        clashes.append(f"model {existing.model!r} (not {args.model!r})")
    if args.system is not None and args.system != existing.system:
        clashes.append(f"system prompt {existing.system!r}")
    if clashes:
        sid = visible(args.session)
        raise Exit(
            EXIT_USAGE,
            f"session {sid!r} was started with {visible(' and '.join(clashes))}, and a "
            "session's settings stay fixed. Either add --new to start a fresh session with "
            f"the new settings, or leave them out to continue {sid!r} as it is.",
        )


def _default_db() -> str:
    folder = data_dir()
    try:
        folder.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise Exit(EXIT_USAGE, f"cannot create {folder}: {exc.strerror}; give --db") from None
    return str(folder / "chat.db")


async def _run_chat(args: argparse.Namespace) -> int:
    configured = _configured_endpoint(args)
    if configured is not None and not args.model:
        raise Exit(EXIT_USAGE, f"--model is required with an endpoint (from {configured.source})")
    model = args.model or "loopback"
    db = args.db if args.db is not None else _default_db()
    async with _endpoint(args) as endpoint:
        # Everything the arguments can get wrong fails here, before the
        # store is opened or any task started: a usage error, exit 2.
        try:
            provider = _make_provider(args, endpoint)
            provider.encoder.encode(model, [])
        except (ValueError, TypeError, httpx.InvalidURL) as exc:
            raise Exit(EXIT_USAGE, f"bad request settings: {exc}") from None
        key_var = None if endpoint.source == "loopback" else _key_var(args)
        timeout = type(provider).default_timeout
        settings = ChatSettings(
            url=provider.url,
            source=endpoint.source,
            model=model,
            key_var=key_var,
            key_set=bool(key_var and os.environ.get(key_var)),
            connect_timeout=timeout.connect,
            read_timeout=timeout.read,
            turn_deadline=args.timeout,
            provider=args.provider,
        )
        window, reserve = args.context_window, args.output_reserve
        if window is not None and reserve is not None and reserve >= window:
            raise Exit(EXIT_USAGE, "--output-reserve must be below --context-window")
        store = await open_to_write(db)
        try:
            session_id = await _fresh_id(store, args.session) if args.new else args.session
            existing = None if args.new else await _existing(store, session_id)
            if existing is not None:
                _check_settings(args, existing)
            chat = _Conversation(Out(sys.stdout), session_id, store, settings)
            chat.base_id = args.session
            if chat.interactive:
                chat.banner(db, existing)
            async with provider, trio.open_nursery() as nursery:
                nursery.start_soon(chat.on_sigint)
                async with open_hub(
                    store,
                    provider,
                    model=model,
                    system=args.system or "",
                    max_request_bytes=args.max_request_bytes,
                    max_prompt_tokens=args.max_prompt_tokens,
                    context_window=window,
                    output_reserve=reserve,
                    policy=None if args.window is None else Window(args.window),
                    turn_deadline=args.timeout,
                ) as hub:
                    state = await hub.open_session(session_id)
                    fallback = args.command_log.noted("context_window_fallback")
                    window_line = _window_line(
                        state,
                        args.max_prompt_tokens,
                        None if fallback is None else str(fallback.get("detail", "")),
                    )
                    if chat.interactive:
                        chat.say(f"  window    {window_line}")
                    elif not args.command_log.json:
                        # (JSON logs carry it as their context_window line.)
                        print(f"[{window_line}]", file=sys.stderr, flush=True)
                    with chat.scope:
                        if chat.interactive:
                            history = data_dir() / "input-history"
                            await chat.prompt_loop(hub, PromptReader(history, chat.look))
                        else:
                            await chat.read_loop(hub, _Lines(0))
                nursery.cancel_scope.cancel()
        finally:
            await store.aclose()
    return EXIT_FAILED if chat.failures else EXIT_OK


_HELP = """commands:
  /help          this list
  /history       the turns of this session that were saved (the active branch's)
  /edit N TEXT   ask TEXT instead of question N of /history, on a new branch
  /retry         ask the last question again, on a new branch
  /branches      the branches of this session; * marks the active one
  /switch B      go on from branch B (main, b1, ...)
  /fork NEW [N]  a new session NEW that shares the first N questions (all) of /history
                 by reference; the chat goes on in it
  /summarize [N] the model summarizes questions 1 to N (default: all but the last
                 two); a request that must drop them then sends the summary instead
  /pin TEXT      send TEXT with every question, right after the system prompt
  /pins          the pinned items; /unpin ID stops sending one
  /new           start a fresh session (this one stays in the store)
  /exit, /quit   end the chat (so do exit, quit, Ctrl-D and Ctrl-C at the prompt)
Enter asks; Esc-Enter (or Alt-Enter) starts a new line; a pasted block is one question.
Up/Down recall earlier input. Ctrl-C during an answer cancels it: nothing is saved.
A question that starts with / is written //..."""


#: The log events the window line tells in its own words (._logs).
_WINDOW_EVENTS = ("context_window", "context_window_fallback")


def _window_line(
    state: SessionState, max_prompt_tokens: int | None, why_fallback: str | None = None
) -> str:
    """The window and reserve that apply, where they came from, and the
    budget; ``why_fallback``: why the server could not tell the window (the
    ``context_window_fallback`` warning's detail), said after ``fallback``."""
    config = state.config
    assert config is not None
    cap = prompt_token_cap(state, Budget(max_prompt_tokens=max_prompt_tokens))
    source: str = config.window_source
    if source == "fallback" and why_fallback:
        source = f"fallback: {visible(why_fallback)}"
    if config.context_window is None:
        line = "no context window recorded for this session"
    else:
        line = (
            f"context window {config.context_window} tokens ({source}), "
            f"{config.output_reserve} kept for the answer"
        )
    budget = "no prompt token budget" if cap is None else f"prompt budget ~{cap} tokens"
    return f"{line}; {budget}"


class _Conversation:
    """One chat: questions from the input, answers streamed to ``out``, and
    Ctrl-C cancelling the turn in flight or, at the prompt, ending the chat."""

    def __init__(
        self, out: Out, session_id: str, store: EventStore, settings: ChatSettings
    ) -> None:
        self.out = out
        self.session_id = session_id
        #: What /new adds the time to.
        self.base_id = session_id
        self.store = store
        self.settings = settings
        self.interactive = sys.stdin is not None and sys.stdin.isatty() and sys.stdout.isatty()
        self.look = Look(sys.stdout)
        self.err = Look(sys.stderr)
        #: Turns that did not commit, and lines refused.
        self.failures = 0
        #: Cancelled to end the chat (Ctrl-C at the prompt).
        self.scope = trio.CancelScope()
        self.current: TurnHandle | None = None

    def say(self, text: str, *codes: str) -> None:
        """A line for the person at the terminal (stderr)."""
        sys.stdout.flush()
        print(self.err.paint(text, *codes), file=sys.stderr, flush=True)

    def banner(self, db: str, existing: _Existing | None) -> None:
        s = self.settings
        if s.source == "loopback":
            name = PROVIDER_KINDS[s.provider].url_env
            where = f"built-in loopback server (no --base-url or {name} set)"
        else:
            where = f"{s.url} (from {s.source})"
        if existing is None:
            state = "a new session"
        else:
            state = f"resumed {existing.turns} turns (--new or /new starts a fresh session)"
        self.say(f"turnledger {__version__} chat", Look.BOLD)
        self.say(f"  model     {visible(s.model)}")
        self.say(f"  endpoint  {visible(where)}")
        self.say(f"  store     {visible(display_db(db))}")
        self.say(f"  session   {visible(self.session_id)}: {state}")
        self.say("  /help lists the commands; Esc-Enter starts a new line; Ctrl-D ends", Look.DIM)

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
            # A person typing while the answers go to a file or a pipe:
            # a plain prompt on stderr.
            typing = sys.stdin is not None and sys.stdin.isatty()
            line = await _read_line(lines, "you> " if typing else None)
            if line is None:
                return
            if isinstance(line, _Refused):
                self.fail(str(line))
            elif line.strip():
                await self.ask(hub, line)

    async def prompt_loop(self, hub: Hub, reader: PromptReader) -> None:
        """Questions and commands from the prompt, until /exit, ^D or ^C."""
        while True:
            text = await reader.read()
            if text is None:
                return
            command = text.strip()
            # A bare "exit" or "quit" typed at the prompt ends the chat, as in
            # the shells and REPLs people know.
            if command.lower() in ("exit", "quit"):
                return
            if command.startswith("/") and not command.startswith("//"):
                if not await self.command(command, hub):
                    return
            elif "\0" in text:
                self.fail("refused: the question holds a NUL character")
            elif command:
                await self.ask(hub, text[1:] if command.startswith("//") else text)

    async def command(self, command: str, hub: Hub) -> bool:
        """Run a /command; False to end the chat."""
        name = command.split()[0].lower()
        if name in ("/edit", "/retry", "/branches", "/switch", "/fork"):
            try:
                await self.branch_command(name, command, hub)
            except InvalidCommand as exc:  # an unknown turn or branch, busy
                self.fail(f"refused: {exc}")
            return True
        if name in ("/summarize", "/pin", "/pins", "/unpin"):
            try:
                await self.context_command(name, command, hub)
            except (InvalidCommand, UnknownSession) as exc:  # no such turns or pin, busy
                self.fail(f"refused: {exc}")
            except SummaryFailed as exc:
                self.fail(f"no summary: {exc}")
            return True
        if name in ("/exit", "/quit"):
            return False
        if name == "/help":
            self.say(_HELP)
        elif name == "/new":
            self.session_id = await _fresh_id(self.store, self.base_id)
            self.say(f"a new session: {visible(self.session_id)}", Look.DIM)
        elif name == "/history":
            await self.history()
        else:
            self.say(f"unknown command {visible(name)}: /help lists them", Look.RED)
        return True

    async def branch_command(self, name: str, command: str, hub: Hub) -> None:
        """/edit N TEXT, /retry, /branches, /switch B and /fork NEW [N]."""
        parts = command.split(maxsplit=2)
        if name == "/fork":
            await self.fork(parts, hub)
        elif name == "/retry":
            await self.run_turn(await hub.regenerate(self.session_id))
        elif name == "/edit":
            if len(parts) < 3 or not parts[1].isdigit() or int(parts[1]) < 1:
                self.fail("usage: /edit N TEXT (N: the question's number in /history)")
                return
            try:
                turn = await hub.edit(self.session_id, int(parts[1]) - 1, parts[2])
            except UnknownTurn:
                self.fail(f"refused: no question {parts[1]} on this branch (see /history)")
                return
            await self.run_turn(turn)
        elif name == "/switch":
            if len(parts) != 2:
                self.fail("usage: /switch B (a branch /branches lists)")
                return
            await hub.switch(self.session_id, parts[1])
            turns = len(await hub.history(self.session_id))
            self.say(f"on branch {visible(parts[1])}: {turns} turns", Look.DIM)
        else:
            for b in await hub.branches(self.session_id):
                # (the line of `turnledger log`'s tree)
                self.say(visible(branch_line(b, id_width=ID_WIDTH)))

    async def fork(self, parts: list[str], hub: Hub) -> None:
        """/fork NEW [N]: NEW shares the first N turns (all) of this
        session's active branch; the chat goes on in NEW."""
        if len(parts) not in (2, 3) or (len(parts) == 3 and not parts[2].isdigit()):
            self.fail("usage: /fork NEW [N] (N: how many questions of /history it keeps)")
            return
        keep = int(parts[2]) if len(parts) == 3 else None
        try:
            forked = await hub.fork(self.session_id, parts[1], keep)
        except UnknownSession:
            self.fail("refused: this session has nothing to fork yet")
            return
        self.session_id = parts[1]
        self.say(
            f"a fork: {visible(parts[1])}, sharing {forked.at_turn} turns of "
            f"{visible(forked.source)} (branch {forked.branch}); the chat goes on in it",
            Look.DIM,
        )

    async def context_command(self, name: str, command: str, hub: Hub) -> None:
        """/summarize [N], /pin TEXT, /pins and /unpin ID."""
        parts = command.split(maxsplit=1)
        arg = parts[1].strip() if len(parts) > 1 else ""
        if name == "/summarize":
            if arg and not (arg.isdigit() and int(arg) >= 1):
                self.fail("usage: /summarize [N] (N: questions from the first, see /history)")
                return
            n = len(await hub.history(self.session_id))
            end = int(arg) if arg else n - 2
            if end < 1:
                self.fail("nothing to summarize yet: the last two questions are kept as they are")
                return
            s = await hub.summarize(self.session_id, end=end)
            self.say(
                f"summary {s.summary_id} of questions {s.start + 1}-{s.end} "
                f"({s.origin}, {s.origin_name}, ~{s.estimated_tokens} tokens):",
                Look.DIM,
            )
            self.say(visible(s.text, lines=True))
        elif name == "/pin":
            if not arg:
                self.fail("usage: /pin TEXT")
                return
            pin_id = await hub.pin(self.session_id, arg, origin="chat")
            self.say(f"pinned as {pin_id}", Look.DIM)
        elif name == "/unpin":
            if not arg:
                self.fail("usage: /unpin ID (an id /pins lists)")
                return
            await hub.unpin(self.session_id, arg)
            self.say(f"unpinned {visible(arg)}", Look.DIM)
        else:
            pins = await hub.pins(self.session_id)
            if not pins:
                self.say("nothing pinned", Look.DIM)
            for p in pins:
                self.say(f"{p.pin_id} ({visible(p.origin)}): {visible(p.text, lines=True)}")

    async def history(self) -> None:
        turns = (await replay_stored(self.store, self.session_id)).turns
        if not turns:
            self.say("no saved turns in this session yet", Look.DIM)
        for i, t in enumerate(turns, 1):
            self.say(f"[{i}] you: {visible(t.question, lines=True)}", Look.BOLD)
            self.say(f"    {visible(t.answer, lines=True)}")

    async def ask(self, hub: Hub, question: str) -> None:
        """One turn: the answer streams as it arrives (after a spinner on a
        terminal); an outcome other than committed is reported on stderr."""
        await self.run_turn(await hub.submit(self.session_id, question))

    async def run_turn(self, turn: TurnHandle) -> None:
        """Stream one turn's answer and report an outcome other than committed."""
        self.current = turn
        shown = ""
        spinner = Spinner(self.look)
        async with trio.open_nursery() as nursery:
            if self.interactive:
                nursery.start_soon(spinner.run)
            async for delta in turn.preview():
                spinner.stop()
                self.out(delta, end="")
                shown += delta
            spinner.stop()
        result = await turn.outcome()
        self.current = None
        if not isinstance(result, CommittedResult) and shown and self.interactive:
            self.look.redraw_dim(shown_text(shown))
        if shown or isinstance(result, CommittedResult):
            self.out()
        if not isinstance(result, CommittedResult):
            self.fail(describe(result), result)

    def fail(self, message: str, result: TurnResult | None = None) -> None:
        # A turn cancelled with Ctrl-C is the user's choice, not a failure.
        if not (isinstance(result, DiscardedResult) and result.reason == "cancelled"):
            self.failures += 1
        saved = "not saved: " if result is not None else ""
        self.say(f"[{saved}{visible(message)}]", Look.DIM)
        fix = hint(result, self.settings) if result is not None else None
        if fix is not None:
            key = os.environ.get(self.settings.key_var or "", "")
            self.say(scrub(f"  {visible(fix)}", {key} if key else set()), Look.RED)
