"""The ``turnledger`` command line.

Exit codes (stable, for scripts):

====  =====================================================================
0     success
1     the command ran but failed (a demo check did not hold, a chat error)
2     usage error (bad arguments)
3     store error (cannot open, locked, corrupt, owned by another process)
4     not found (no such file, session or request)
130   interrupted by Ctrl-C (in ``chat``, Ctrl-C at the prompt is a normal end: 0)
====  =====================================================================
"""

from __future__ import annotations

import argparse
import datetime as dt
import io
import json
import os
import sys
from collections.abc import Iterable, Sequence
from typing import Any, NoReturn

import trio

from . import __version__
from ._cli_errors import (
    Exit,
    at_least,
    check_db_path,
    display_db,
    scrub,
    secrets_of,
    text_arg,
    visible,
    visible_json,
)
from ._errors import CodecError, ReplayError, StoreError, TurnLedgerError
from ._inspect import phase_name, session_summary, timeline
from .events import DEFAULT_CODEC, Event, EventStore, StoredEvent
from .sessions._machine import SessionState, replay

__all__ = ["EXIT_FAILED", "EXIT_NOT_FOUND", "EXIT_OK", "EXIT_STORE", "EXIT_USAGE", "main"]

EXIT_OK = 0
EXIT_FAILED = 1
EXIT_USAGE = 2
EXIT_STORE = 3
EXIT_NOT_FOUND = 4
EXIT_INTERRUPTED = 130


def _fmt_time(ts: float) -> str:
    return dt.datetime.fromtimestamp(ts, dt.UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")[:-4] + "Z"


async def _open(db: str) -> EventStore:
    """Open ``db`` only to read it: it must exist, and nothing in it changes
    (a journal is read without taking its writer's lock, since a chat may be
    writing to it)."""
    from .adapters.stores import open_store, store_kind

    check_db_path(db, store_kind(db))
    if store_kind(db) != "postgres" and not os.path.exists(db):
        raise Exit(EXIT_NOT_FOUND, f"no such file: {display_db(db)}")
    try:
        return await open_store(db, read_only=True)
    except StoreError as exc:
        raise Exit(EXIT_STORE, f"cannot open {display_db(db)}: {exc}") from exc


async def _load(store: EventStore, session: str | None) -> dict[str, list[StoredEvent]]:
    ids = [session] if session else await store.session_ids()
    out: dict[str, list[StoredEvent]] = {}
    for sid in ids:
        events = await store.read(sid)
        if events:
            out[sid] = events
    if not out:
        what = f"session {session!r}" if session else "any session"
        raise Exit(EXIT_NOT_FOUND, f"no events for {what}")
    return out


def _print_json(obj: Any) -> None:
    print(visible_json(json.dumps(obj, ensure_ascii=False)))


# --- replay / log / sessions ------------------------------------------------


#: Sessions per bulk read in ``replay`` (bounds what one read holds).
_REPLAY_SLICE = 256


def _fold_found(session_id: str, events: list[Event]) -> SessionState | None:
    return replay(events) if events else None


class _UpTo:
    """The codec for ``replay --at SEQ``: it decodes no event after SEQ, and
    does not even parse one, so damage or an event this release cannot read
    later in the log does not spoil the view at SEQ. Each later event is
    ``None``: it still shows that the session exists."""

    def __init__(self, at: int) -> None:
        self.at = at

    def decode(self, stored: StoredEvent) -> Event | None:
        return DEFAULT_CODEC.decode(stored) if stored.seq <= self.at else None

    def decode_rows(
        self, session_id: str, rows: Iterable[tuple[int, str, int, str | bytes]]
    ) -> list[Event | None]:
        rows = list(rows)
        wanted = [row for row in rows if row[0] <= self.at]
        later: list[Event | None] = [None] * (len(rows) - len(wanted))
        return [*DEFAULT_CODEC.decode_rows(session_id, wanted), *later]


def _fold_up_to(session_id: str, events: list[Event | None]) -> SessionState | None:
    return replay(e for e in events if e is not None) if events else None


async def _replay_states(store: EventStore, args: argparse.Namespace) -> dict[str, SessionState]:
    # Typed events straight from the store's bulk replay path, a slice of
    # sessions at a time; with --at, as they stood after that event.
    ids = [args.session] if args.session else await store.session_ids()
    states: dict[str, SessionState | None] = {}
    for i in range(0, len(ids), _REPLAY_SLICE):
        chunk = ids[i : i + _REPLAY_SLICE]
        if args.at is None:
            states.update(await store.read_decoded_many(chunk, DEFAULT_CODEC, _fold_found))
        else:
            states.update(await store.read_decoded_many(chunk, _UpTo(args.at), _fold_up_to))
    found = {sid: state for sid, state in states.items() if state is not None}
    if not found:
        what = f"session {args.session!r}" if args.session else "any session"
        raise Exit(EXIT_NOT_FOUND, f"no events for {what}")
    return found


async def _cmd_replay(args: argparse.Namespace) -> int:
    at: int | None = args.at
    store = await _open(args.db)
    try:
        found = await _replay_states(store, args)
    finally:
        await store.aclose()
    for sid, state in found.items():
        turns = [
            {"request_id": t.request_id, "question": t.question, "answer": t.answer}
            for t in state.turns
        ]
        if args.json:
            _print_json(
                {
                    "session_id": sid,
                    "version": state.version,
                    "phase": phase_name(state),
                    "context_start": state.context_start,
                    "turns": turns,
                }
            )
            continue
        where = f" at seq {state.version}" if at is not None else ""
        phase = phase_name(state)
        print(
            f"session {visible(sid)}{where}: {len(turns)} turns, {phase}, version {state.version}"
        )
        for i, t in enumerate(turns, 1):
            print(f"  [{i}] user: {visible(t['question'], lines=True)}")
            print(f"      assistant: {visible(t['answer'], lines=True)}")
    return EXIT_OK


async def _cmd_log(args: argparse.Namespace) -> int:
    store = await _open(args.db)
    try:
        streams = await _load(store, args.session)
    finally:
        await store.aclose()
    shown = 0
    for sid, events in streams.items():
        rows = timeline(events)
        if args.request:
            rows = [r for r in rows if r.request_id and r.request_id.startswith(args.request)]
        if not rows:
            continue
        if not args.json:
            print(f"session {visible(sid)}")
            print(f"  {'seq':>4}  {'time':<24} {'request':<13} {'event':<19} {'phase':<22} reason")
        for r in rows:
            shown += 1
            if args.json:
                _print_json(r.as_json())
                continue
            phase = r.phase_to if r.phase_from == r.phase_to else f"{r.phase_from}→{r.phase_to}"
            reason = f"{r.reason} ({r.detail})" if r.reason and r.detail else r.reason or r.detail
            if r.late_by is not None:
                reason += f" — {r.late_by:.3f}s after the turn ended"
            rid = visible(r.request_id or "-")
            rid = rid if len(rid) <= 12 else rid[:11] + "…"
            print(
                f"  {r.seq:>4}  {_fmt_time(r.recorded_at):<24} {rid:<13} {r.event:<19} "
                f"{phase:<22} {visible(reason)}".rstrip()
            )
    if shown == 0:
        raise Exit(EXIT_NOT_FOUND, f"no events for request {args.request!r}")
    return EXIT_OK


async def _cmd_sessions(args: argparse.Namespace) -> int:
    store = await _open(args.db)
    try:
        streams = await _load(store, None)
    finally:
        await store.aclose()
    if not args.json:
        print(f"{'session':<24} {'turns':>5} {'events':>6}  {'phase':<10} last outcome")
    for sid, events in streams.items():
        summary = session_summary(sid, events)
        if args.json:
            _print_json(summary)
        else:
            print(
                f"{visible(sid):<24} {summary['turns']:>5} {summary['events']:>6}  "
                f"{summary['phase']:<10} {visible(summary['last_outcome'] or '-')}"
            )
    return EXIT_OK


# --- the parser ---------------------------------------------------------------


def _logging_options(p: argparse.ArgumentParser, *, suppress: bool = False) -> None:
    p.add_argument(
        "-v",
        "--verbose",
        action="count",
        default=argparse.SUPPRESS if suppress else 0,
        help="more log lines on stderr: JSON logs carry the transitions and -v adds one line "
        "per message; a terminal shows warnings, -v the transitions, -vv every message",
    )
    p.add_argument(
        "--log-json",
        action="store_true",
        default=argparse.SUPPRESS if suppress else False,
        help="JSON log lines on stderr",
    )


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="turnledger",
        description="LLM chat sessions whose history can be trusted.",
        epilog="DB is a SQLite file, a .jsonl journal, or PostgreSQL: a postgresql:// URL "
        "or a libpq string such as 'host=127.0.0.1 dbname=app'.",
    )
    p.add_argument("--version", action="version", version=f"turnledger {__version__}")
    _logging_options(p)
    # The same options after the command name too (``turnledger chat -v``);
    # there they default to "not given", so they never undo the ones before.
    common = argparse.ArgumentParser(add_help=False)
    _logging_options(common, suppress=True)
    sub = p.add_subparsers(dest="command", required=True, metavar="COMMAND")

    from ._cli_run import add_chat_parser, add_demo_parser

    add_demo_parser(sub, common)
    add_chat_parser(sub, common)

    r = sub.add_parser("replay", help="rebuild history from a log", parents=[common])
    r.add_argument("db", metavar="DB")
    r.add_argument("--session", "-s", type=text_arg, help="only this session")
    r.add_argument("--at", type=at_least(0), metavar="SEQ", help="as it stood after event SEQ")
    r.add_argument("--json", action="store_true", help="one JSON object per session")
    r.set_defaults(run=_cmd_replay)

    lg = sub.add_parser("log", help="the event timeline of a log", parents=[common])
    lg.add_argument("db", metavar="DB")
    lg.add_argument("--session", "-s", type=text_arg, help="only this session")
    lg.add_argument("--request", "-r", type=text_arg,
                    help="only this request id (or a prefix of it)")  # fmt: skip
    lg.add_argument("--json", action="store_true", help="one JSON object per event")
    lg.set_defaults(run=_cmd_log)

    ss = sub.add_parser(
        "sessions", help="sessions with turn counts and last outcome", parents=[common]
    )
    ss.add_argument("db", metavar="DB")
    ss.add_argument("--json", action="store_true", help="one JSON object per session")
    ss.set_defaults(run=_cmd_sessions)
    return p


def _exit_code(raised: BaseException, secrets: set[str]) -> int:
    # A lone error from inside a nursery arrives wrapped in a group.
    exc = raised
    while isinstance(exc, BaseExceptionGroup) and len(exc.exceptions) == 1:
        exc = exc.exceptions[0]

    def say(message: str) -> None:
        print(scrub(f"turnledger: {message}", secrets), file=sys.stderr)

    if isinstance(exc, Exit):
        if exc.message:
            say(exc.message)
        return exc.code
    if isinstance(exc, StoreError):
        say(f"store error: {exc}")
        return EXIT_STORE
    if isinstance(exc, CodecError | ReplayError):
        say(f"the log is corrupt: {exc}")
        return EXIT_STORE
    if isinstance(exc, TurnLedgerError):
        say(str(exc))
        return EXIT_FAILED
    if isinstance(exc, KeyboardInterrupt):
        return EXIT_INTERRUPTED
    raise raised


def main(argv: Sequence[str] | None = None) -> NoReturn:
    """Entry point of the ``turnledger`` script."""
    # Text that cannot be encoded (an answer's lone surrogate, a terminal
    # that is not UTF-8) is shown escaped rather than ending the command.
    for stream in (sys.stdout, sys.stderr):
        if isinstance(stream, io.TextIOWrapper):
            stream.reconfigure(errors="backslashreplace")
    args = _parser().parse_args(argv)
    from .adapters.logging import configure_logging

    configure_logging(json=True if args.log_json else None, verbosity=args.verbose)
    try:
        code = trio.run(args.run, args)
    except BaseException as raised:
        code = _exit_code(raised, secrets_of(getattr(args, "db", None)))
    sys.exit(code)
