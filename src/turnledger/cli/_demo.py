"""``turnledger demo``: a scripted conversation against a loopback server."""

from __future__ import annotations

import argparse
import ast
import datetime as dt
import operator
import os
import shlex
import sys
from typing import TYPE_CHECKING, Any

import trio

from ..adapters.providers import PROVIDER_KINDS, open_provider
from ..adapters.stores import store_kind
from ..events import DEFAULT_CODEC, EventStore, SummarySent, ToolCall, TurnSubmitted
from ..sessions import (
    ChatRequest,
    CommittedResult,
    Completion,
    DiscardedResult,
    Hub,
    Provider,
    StreamSink,
    Tool,
    ToolError,
    ToolInvocation,
    Turn,
    TurnHandle,
    TurnResult,
    open_hub,
    replay,
)
from ._args import add_provider_arguments
from ._display import Out, command_name, describe
from ._errors import EXIT_FAILED, EXIT_OK, display_db
from ._stores import open_to_write

if TYPE_CHECKING:
    from ..testing import LoopbackServer, Reply, WireProtocol

__all__ = ["add_demo_parser"]


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


async def _stream_turn(out: Out, turn: TurnHandle, *, stop_after: int | None = None) -> str:
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
    from ..testing import open_loopback_server

    out = Out(sys.stdout)
    kind = store_kind(args.db)
    db = args.db if kind == "postgres" else os.path.abspath(args.db)
    session = "demo-" + dt.datetime.now(dt.UTC).strftime("%Y%m%dT%H%M%S%f")[:-3]
    store = await open_to_write(db)
    out("turnledger demo: a scripted conversation against a loopback server on 127.0.0.1")
    out(f"  event log: {display_db(db)} ({_KINDS[kind]}), session {session}")
    try:
        async with open_loopback_server([]) as server:
            wire = PROVIDER_KINDS[args.provider]
            url = server.base_url + wire.loopback_path
            out(f"  provider:  {wire.summary} at {url}")
            async with _open(args.provider, url) as provider:
                demo = _Demo(out, server, store, provider, session, args.provider)
                ok = await demo.scenes()
                ok &= await demo.late_completion()
                ok &= await demo.tool_scenes()
                ok &= await demo.branch_scene()
                ok &= await demo.erase_scene()
            ok &= await demo.every_protocol()
            async with _open(args.provider, url) as provider:
                demo.provider, demo.protocol = provider, args.provider
                ok &= await demo.summary_scene()
    finally:
        await store.aclose()

    # Replay the file from disk, with a store opened anew.
    out()
    out("── Replaying the log from disk")
    again = await open_to_write(db)
    try:
        events = await again.read_decoded(session, DEFAULT_CODEC)
    finally:
        await again.aclose()
    state = replay(events)
    match = tuple(state.turns) == demo.live_history
    out(f"  {len(events)} events in {display_db(db)}")
    _print_turns(out, state.turns)
    verdict = "matches" if match else "DOES NOT match"
    out(f"  replayed history {verdict} the live session ({len(state.turns)} turns)")
    again = await open_to_write(db)
    try:
        tool_state = replay(await again.read_decoded(demo.tool_session, DEFAULT_CODEC))
    finally:
        await again.aclose()
    _print_turns(out, tool_state.turns)
    tools_match = tuple(tool_state.turns) == demo.tool_history
    verdict = "matches" if tools_match else "DOES NOT match"
    out(f"  replayed tool session {verdict} the live one ({len(tool_state.turns)} turn)")
    match &= tools_match
    out()
    log = f"{command_name()} log {shlex.quote(display_db(db))} --session {session}"
    out(f"The tool turns' story:  {log}-tools")
    out(f"See the whole story:  {log}")
    return EXIT_OK if ok and match else EXIT_FAILED


def _open(protocol: str, url: str) -> Any:
    # The loopback server is never sent a key.
    return open_provider(protocol, base_url=url, api_key="")


def _print_turns(out: Out, turns: Any) -> None:
    for i, t in enumerate(turns, 1):
        out(f"  [{i}] user: {t.question}")
        for r in t.rounds:
            for c in r.calls:
                out(f"      assistant calls {c.name}({c.arguments}) [{c.call_id}]")
            results = {res.call_id: res for res in r.results}
            for c in r.calls:
                out(f"      tool [{c.call_id}]: {results[c.call_id].content}")
        out(f"      assistant: {t.answer}")


_SYSTEM = "You are the turnledger demo assistant. Answer in one or two sentences."

_OPS: dict[type, Any] = {
    ast.Add: operator.add,
    ast.Sub: operator.sub,
    ast.Mult: operator.mul,
    ast.Div: operator.truediv,
    ast.USub: operator.neg,
}


def _arith(node: ast.AST) -> float:
    if isinstance(node, ast.Expression):
        return _arith(node.body)
    if isinstance(node, ast.Constant) and isinstance(node.value, int | float):
        if isinstance(node.value, bool):
            raise ToolError("only numbers and + - * / are allowed")
        return float(node.value)
    if isinstance(node, ast.BinOp) and type(node.op) in _OPS:
        return float(_OPS[type(node.op)](_arith(node.left), _arith(node.right)))
    if isinstance(node, ast.UnaryOp) and type(node.op) in _OPS:
        return float(_OPS[type(node.op)](_arith(node.operand)))
    raise ToolError("only numbers and + - * / are allowed")


async def calculator(call: ToolInvocation) -> dict[str, float]:
    """The demo's built-in calculator: ``{"expression": "6*7"}``."""
    expression = str(call.arguments.get("expression", ""))
    if len(expression) > 200:
        raise ToolError("the expression is too long")
    try:
        tree = ast.parse(expression, mode="eval")
        return {"value": _arith(tree)}
    except (SyntaxError, ZeroDivisionError) as exc:
        raise ToolError(f"cannot evaluate: {type(exc).__name__}") from None


async def clock(call: ToolInvocation) -> str:
    """The demo's built-in clock: the UTC time now."""
    return dt.datetime.now(dt.UTC).strftime("%H:%M UTC")


_CALC = Tool(
    "calculator",
    calculator,
    "Evaluate an arithmetic expression (numbers and + - * /).",
    {"type": "object", "properties": {"expression": {"type": "string"}}},
)
_CLOCK = Tool("clock", clock, "The current time (UTC).")


class _Demo:
    def __init__(
        self,
        out: Out,
        server: LoopbackServer,
        store: EventStore,
        provider: Provider,
        session: str,
        protocol: WireProtocol,
    ) -> None:
        self.out = out
        self.protocol = protocol
        self.server = server
        self.store = store
        self.provider = provider
        self.session = session
        self.live_history: tuple[Turn, ...] = ()
        self.tool_session = session + "-tools"
        self.tool_history: tuple[Turn, ...] = ()

    def slow(
        self, text: str, *, pause: float = 0.03, truncated: bool = False, chunk_size: int = 6
    ) -> Reply:
        """An answer in the demo's protocol, a pause after each frame."""
        from ..testing import Reply, WritePause, answer_parts, media_type_of

        parts: list[Any] = []
        for chunk in answer_parts(self.protocol, text, chunk_size=chunk_size, truncated=truncated):
            parts += [chunk, WritePause(pause)]
        return Reply(media_type=media_type_of(self.protocol), body=tuple(parts))

    async def turn(
        self, hub: Hub, title: str, question: str, reply: Reply, *, stop_after: int | None = None
    ) -> TurnResult:
        out = self.out
        self.server.enqueue(reply)
        out()
        out(f"── {title}")
        out(f"  user: {question}")
        handle = await hub.submit(self.session, question)
        await _stream_turn(out, handle, stop_after=stop_after)
        result = await handle.outcome()
        out(f"  outcome: {describe(result)}")
        out(f"  history: {len(await hub.history(self.session))} turn(s)")
        return result

    async def scenes(self) -> bool:
        from ..testing import Reply, Stall, answer_parts, error_reply, media_type_of

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
                    "Only turns whose answer arrived complete and accepted, "
                    "ended the way its protocol ends a good answer."
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
                # (the stream opens, then nothing: Ollama's has no opening line)
                Reply(
                    media_type=media_type_of(self.protocol),
                    body=(*answer_parts(self.protocol, "x")[: self.protocol != "ollama"], Stall()),
                ),
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
                "6. Stopped at the token cap: the text looks complete, but it is not",
                "Write one short sentence about trio.",
                self.slow("Trio makes structured concurrency feel natural.", truncated=True),
            )
            ok &= isinstance(sixth, DiscardedResult) and sixth.reason == "incomplete_finish"
            self.live_history = await hub.history(self.session)
        return ok

    async def late_completion(self) -> bool:
        # A provider whose calls cannot be interrupted: its answer comes back
        # after the deadline discarded the turn.
        import attrs

        out = self.out
        out()
        out("── 7. A late completion: the answer arrives after the turn timed out")
        reply = self.slow("This answer is too late.", pause=0, chunk_size=40)
        self.server.enqueue(attrs.evolve(reply, headers_delay=1.6))
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
            out(f"  outcome: {describe(result)}")
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

    async def tool_scenes(self) -> bool:
        from ..testing import tool_call_reply

        out = self.out
        looking = trio.Event()

        async def lookup(call: ToolInvocation) -> str:
            looking.set()
            await trio.sleep(30)  # a slow lookup: cancelled long before
            return "found"

        tools = [_CALC, _CLOCK, Tool("lookup", lookup, "Look an order up (slow).")]
        async with open_hub(
            self.store, self.provider, model="demo-model", system=_SYSTEM, tools=tools
        ) as hub:
            session = self.tool_session
            question = "What is 6*7, and what time is it?"
            calls = (
                ToolCall("call_1", "calculator", '{"expression":"6*7"}'),
                ToolCall("call_2", "clock", "{}"),
            )
            self.server.enqueue(tool_call_reply(calls, protocol=self.protocol, chunk_size=2))
            self.server.enqueue(self.slow("6*7 is 42, and the clock tool says it is now."))
            out()
            out("── 8. A tool turn: two calls run in parallel, then the answer; all commit at once")
            out(f"  user: {question}")
            handle = await hub.submit(session, question)
            await _stream_turn(out, handle)
            result = await handle.outcome()
            turn = (await hub.history(session))[-1]
            for c in turn.rounds[0].calls:
                res = next(r for r in turn.rounds[0].results if r.call_id == c.call_id)
                out(f"  tool {c.name}({c.arguments}) → {res.content}")
            out(f"  outcome: {describe(result)}")
            out("  history: 1 turn = question, 1 call message, 2 results, answer")
            ok = isinstance(result, CommittedResult) and len(turn.rounds) == 1

            before = await hub.history(session)
            call = ToolCall("call_3", "lookup", "{}")
            self.server.enqueue(tool_call_reply((call,), protocol=self.protocol))
            out()
            out("── 9. Cancelled while a tool runs: the call and its turn are dropped whole")
            question = "Where is my order 1042?"
            out(f"  user: {question}")
            handle = await hub.submit(session, question)
            with trio.fail_after(5):
                await looking.wait()
            out("  tool lookup running… cancel ✂")
            await handle.cancel()
            result = await handle.outcome()
            out(f"  outcome: {describe(result)}")
            same = await hub.history(session) == before
            out(f"  history unchanged, no call without its result: {'yes' if same else 'NO'}")
            ok &= isinstance(result, DiscardedResult) and result.reason == "cancelled" and same
            self.tool_history = await hub.history(session)
        return ok

    async def branch_scene(self) -> bool:
        """Edit and regenerate: branches in the ledger, nothing rewritten."""
        out = self.out
        session = self.session + "-branches"
        out()
        out("── 11. Edit an earlier question, ask again, go back: branches, nothing rewritten")
        async with open_hub(self.store, self.provider, model="demo-model", system=_SYSTEM) as hub:
            for q, a in (("Name a colour.", "Blue."), ("And a fruit?", "A pear.")):
                self.server.enqueue(self.slow(a, pause=0.01))
                await (await hub.submit(session, q)).outcome()
            self.server.enqueue(self.slow("Red.", pause=0.01))
            edited = await (await hub.edit(session, 0, "Name a warm colour.")).outcome()
            out("  /edit 1 'Name a warm colour.' → " + describe(edited))
            self.server.enqueue(self.slow("Orange.", pause=0.01))
            again = await (await hub.regenerate(session)).outcome()
            out("  /retry → " + describe(again))
            for b in await hub.branches(session):
                mark = "*" if b.active else " "
                start = "" if b.parent is None else f" ({b.kind} of turn {b.at_turn + 1})"
                out(f"  {mark} {b.branch_id:8s} {b.length} turn(s){start}")
            now = [t.answer for t in await hub.history(session)]
            await hub.switch(session, "main")
            back = [t.answer for t in await hub.history(session)]
            out(f"  history now {now}; after /switch main {back}")
        ok = now == ["Orange."] and back == ["Blue.", "A pear."]
        return ok and isinstance(edited, CommittedResult) and isinstance(again, CommittedResult)

    async def erase_scene(self) -> bool:
        """Erasure: the session's events leave the store; a tombstone stays."""
        out = self.out
        session = self.session + "-erased"
        out()
        out("── 12. Erased on request: the session's events leave the store")
        async with open_hub(self.store, self.provider, model="demo-model", system=_SYSTEM) as hub:
            self.server.enqueue(self.slow("Noted.", pause=0.01))
            await (await hub.submit(session, "My card number is 4111 1111 1111 1111.")).outcome()
            before = len(await self.store.read(session))
            record = await hub.erase(session)
            left = len(await self.store.read(session))
        at = dt.datetime.fromtimestamp(record.erased_at, dt.UTC)
        out(f"  hub.erase: {before} events before, {left} after")
        out(f"  the store keeps a tombstone: {record.events} events erased at {at:%H:%M:%S} UTC,")
        out(f"  under the id's hash {record.session_hash[:16]}… (never the id, never its text)")
        return left == 0 and record.events == before > 0

    async def every_protocol(self) -> bool:
        """One turn through each wire protocol, each in a session of its own."""
        out = self.out
        out()
        out("── 13. One turn through each wire protocol, the same rules for all")
        ok = True
        for name, wire in PROVIDER_KINDS.items():
            self.protocol = name  # type: ignore[assignment]
            self.server.enqueue(self.slow(f"Committed over {wire.summary}.", pause=0.01))
            async with (
                _open(name, self.server.base_url + wire.loopback_path) as provider,
                open_hub(self.store, provider, model="demo-model", system=_SYSTEM) as hub,
            ):
                result = await (await hub.submit(f"{self.session}-{name}", "Hello?")).outcome()
            out(f"  {name:17s} {describe(result)}")
            ok &= isinstance(result, CommittedResult)
        return ok

    async def summary_scene(self) -> bool:
        """A pinned item and a summary: what a long conversation keeps in its
        requests, each an event, while history keeps every turn."""
        out = self.out
        session = self.session + "-summary"
        out()
        out("── 14. A pinned item goes with every request; a summary stands for dropped turns")
        async with open_hub(
            self.store, self.provider, model="demo-model", system=_SYSTEM, max_request_bytes=540
        ) as hub:
            pairs = (
                ("My name is Ada and I keep bees.", "Noted: Ada, a beekeeper."),
                ("How many hives should I start with?", "Two, so you can compare them."),
                ("When do I harvest honey?", "Late summer, once the frames are capped."),
            )
            for q, a in pairs:
                self.server.enqueue(self.slow(a, pause=0.01))
                await (await hub.submit(session, q)).outcome()
            pin = await hub.pin(session, "Answer in one sentence.", origin="policy")
            out(f"  pinned {pin} (policy): sent after the system prompt, with every request")
            self.server.enqueue(self.slow("Ada keeps bees and starts with two hives.", pause=0))
            s = await hub.summarize(session, end=2)
            out(
                f"  summary {s.summary_id} of turns 1-{s.end} ({s.origin}, {s.origin_name} prompt, "
                f"~{s.estimated_tokens} tokens): {s.text}"
            )
            self.server.enqueue(self.slow("Two hives, Ada; harvest in late summer.", pause=0.01))
            result = await (await hub.submit(session, "Remind me of my plan?")).outcome()
            body = self.server.exchanges[-1].body
            events = [DEFAULT_CODEC.decode(e) for e in await self.store.read(session)]
            (sub,) = [e for e in events if isinstance(e, TurnSubmitted)][-1:]
            sent = [e.summary_id for e in events if isinstance(e, SummarySent)]
            out(
                f"  the next request dropped {sub.turns_dropped} turns and sent "
                f"{', '.join(sent) or 'no summary'} in their place, "
                f"the pin {'with it' if b'Answer in one sentence.' in body else 'NOT'}"
            )
            history = await hub.history(session)
            out(f"  history keeps every turn: {len(history)} turn(s); replay ignores summaries")
        return (
            isinstance(result, CommittedResult)
            and sent == [s.summary_id]
            and b"Answer in one sentence." in body
            and len(history) == 4
        )

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
        "an answer cut at the token cap, a late completion, a tool turn, a turn cancelled "
        "mid-tool and one turn through each wire protocol; then the log is replayed from disk.",
        epilog="examples:\n  turnledger demo\n  turnledger demo --db demo.jsonl   "
        "(a JSON-lines journal you can read with jq)\n  turnledger demo --provider anthropic",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    d.add_argument("--db", default="turnledger-demo.db",
                   help="event log, e.g. demo.db or demo.jsonl (default: %(default)s)")  # fmt: skip
    add_provider_arguments(d, scripted=True)
    # On a terminal the story is told first and the log lines after it.
    d.set_defaults(run=_run_demo, hold_logs=True)
