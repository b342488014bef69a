"""``turnledger replay``, ``log`` and ``sessions``: the commands that only
read a log."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import attrs

from .. import UnknownBranch
from ..adapters.stores import PostgresStore, SessionLease
from ..events import DEFAULT_CODEC, Event, EventStore, SessionForked, StoredEvent
from ..sessions import (
    SessionState,
    Turn,
    branch_turns,
    branches_of,
    replay,
    replay_resolved,
    replay_sessions,
    seed_of,
    subject_of,
)
from ..timeline import branch_tree, phase_name, session_summary, timeline
from ._args import at_least, text_arg
from ._display import ID_WIDTH, fmt_time, print_json, visible
from ._errors import EXIT_FAILED, EXIT_NOT_FOUND, EXIT_OK, EXIT_USAGE, Exit
from ._stores import open_to_read

__all__ = ["add_read_parsers"]


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


#: Sessions per bulk read in ``replay`` (bounds what one read holds).
_REPLAY_SLICE = 256


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


def _fold_up_to(session_id: str, events: list[Event | None]) -> SessionState | list[Event] | None:
    if not events:
        return None
    wanted = [e for e in events if e is not None]
    if len(wanted) > 1 and isinstance(wanted[1], SessionForked):
        return wanted  # a fork: folded once its shared turns are read
    return replay(wanted)


async def _replay_states(store: EventStore, args: argparse.Namespace) -> dict[str, SessionState]:
    # Typed events straight from the store's bulk replay path, a slice of
    # sessions at a time; with --at, as they stood after that event.
    ids = [args.session] if args.session else await store.session_ids()
    states: dict[str, SessionState | None] = {}
    for i in range(0, len(ids), _REPLAY_SLICE):
        chunk = ids[i : i + _REPLAY_SLICE]
        if args.at is None:
            # The bulk replay's fold (the state replay() gives, without
            # building the events of common turns); a session without
            # events has the initial state (version 0): not found.
            replayed = await replay_sessions(store, chunk)
            states.update({sid: s if s.version else None for sid, s in replayed.items()})
        else:
            got = await store.read_decoded_many(chunk, _UpTo(args.at), _fold_up_to)
            for sid, value in got.items():
                if isinstance(value, list):
                    value = await replay_resolved(store, value)
                states[sid] = value
    found = {sid: state for sid, state in states.items() if state is not None}
    if not found:
        what = f"session {args.session!r}" if args.session else "any session"
        raise Exit(EXIT_NOT_FOUND, f"no events for {what}")
    return found


async def _cmd_replay(args: argparse.Namespace) -> int:
    at: int | None = args.at
    branch: str | None = args.branch
    if branch is not None and args.session is None:
        raise Exit(EXIT_USAGE, "--branch needs --session: a branch belongs to one session")
    store = await open_to_read(args.db)
    try:
        found = await _replay_states(store, args)
    finally:
        await store.aclose()
    for sid, state in found.items():
        path = state.turns
        if branch is not None:
            try:
                path = branch_turns(state, branch)
            except UnknownBranch:
                names = ", ".join(b.branch_id for b in branches_of(state))
                raise Exit(
                    EXIT_NOT_FOUND,
                    f"no branch {visible(branch)} in session {visible(sid)} (it has {names})",
                ) from None
        turns = [_turn_json(t) for t in path]
        if args.json:
            out: dict[str, Any] = {
                "session_id": sid,
                "version": state.version,
                "phase": phase_name(state),
                "context_start": state.context_start,
                "turns": turns,
            }
            if branch is not None:
                out["branch"] = branch
            print_json(out)
            continue
        where = f" at seq {state.version}" if at is not None else ""
        if branch is not None:
            where += f", branch {visible(branch)}"
        phase = phase_name(state)
        print(
            f"session {visible(sid)}{where}: {len(turns)} turns, {phase}, version {state.version}"
        )
        for i, t in enumerate(turns, 1):
            print(f"  [{i}] user: {visible(t['question'], lines=True)}")
            for r in t.get("rounds", ()):
                for c in r["calls"]:
                    call = f"{c['name']}({c['arguments']}) [{c['call_id']}]"
                    print(f"      assistant calls: {visible(call, lines=True)}")
                for res in r["results"]:
                    tag = "tool error" if res["is_error"] else "tool"
                    text = visible(res["content"], lines=True)
                    print(f"      {tag} [{visible(res['call_id'])}]: {text}")
            print(f"      assistant: {visible(t['answer'], lines=True)}")
    return EXIT_OK


async def _write_html(args: argparse.Namespace) -> int:
    # The same page as the service's timeline, as one self-contained file.
    if not args.session:
        raise Exit(EXIT_USAGE, "--html draws one session: give --session S")
    if args.json or args.request or args.text:
        raise Exit(EXIT_USAGE, "--html draws a whole session: no --json, --text or --request")
    from ..serve import session_page

    store = await open_to_read(args.db)
    try:
        page = await session_page(store, args.session)
    finally:
        await store.aclose()
    if page is None:
        raise Exit(EXIT_NOT_FOUND, f"no events for session {args.session!r}")
    if args.html == "-":
        sys.stdout.write(page)
        return EXIT_OK
    try:
        Path(args.html).write_text(page, encoding="utf-8")
    except OSError as exc:
        raise Exit(EXIT_FAILED, f"cannot write {args.html}: {exc.strerror}") from None
    print(f"wrote {visible(args.html)}", file=sys.stderr)
    return EXIT_OK


def _turn_json(t: Turn) -> dict[str, Any]:
    out: dict[str, Any] = {"request_id": t.request_id, "question": t.question, "answer": t.answer}
    if t.rounds:
        out["rounds"] = [
            {
                "content": r.content,
                "calls": [attrs.asdict(c) for c in r.calls],
                # in the order of the calls, as the model gets them
                "results": [
                    attrs.asdict(res)
                    for c in r.calls
                    for res in r.results
                    if res.call_id == c.call_id
                ],
            }
            for r in t.rounds
        ]
    return out


async def _cmd_log(args: argparse.Namespace) -> int:
    if args.html is not None:
        return await _write_html(args)
    store = await open_to_read(args.db)
    try:
        streams = await _load(store, args.session)
        seeds = {sid: await seed_of(store, events) for sid, events in streams.items()}
    finally:
        await store.aclose()
    shown = 0
    for sid, events in streams.items():
        # The session's rows, each event of each a line (log order).
        session = timeline(sid, events, seed=seeds[sid])
        if args.request:
            wanted = [r for r in session.rows if r.request_id.startswith(args.request)]
            rows = sorted((s for r in wanted for s in r.steps), key=lambda s: s.seq)
        else:
            rows = session.steps()
        if not rows:
            continue
        if not args.json:
            print(f"session {visible(sid)}")
            print(f"  {'seq':>4}  {'time':<24} {'request':<13} {'event':<19} {'phase':<22} reason")
        for r in rows:
            shown += 1
            if args.json:
                print_json(r.as_json(text=args.text))
                continue
            phase = r.phase_to if r.phase_from == r.phase_to else f"{r.phase_from}→{r.phase_to}"
            reason = f"{r.reason} ({r.detail})" if r.reason and r.detail else r.reason or r.detail
            if r.late_by is not None:
                reason += f" — {r.late_by:.3f}s after the turn ended"
            rid = visible(r.request_id or "-")
            rid = rid if len(rid) <= ID_WIDTH else rid[: ID_WIDTH - 1] + "…"
            print(
                f"  {r.seq:>4}  {fmt_time(r.recorded_at):<24} {rid:<13} {r.event:<19} "
                f"{phase:<22} {visible(reason)}".rstrip()
            )
            if args.text and r.text:
                who = "you" if r.event == "turn_submitted" else "answer"
                print(f"        {who}: {_one_line(r.text)}")
        if not args.json and not args.request and len(session.branches) > 1:
            # The tree after the events: each branch, where it starts, its turns.
            print(f"  branches ({len(session.branches)}, * marks the active one):")
            for line in branch_tree(session, id_width=ID_WIDTH):
                print(f"    {visible(line)}")
    if shown == 0:
        raise Exit(EXIT_NOT_FOUND, f"no events for request {args.request!r}")
    return EXIT_OK


#: Characters of a question or an answer ``log --text`` shows.
_TEXT_WIDTH = 100


def _one_line(text: str) -> str:
    """``text`` on one line: every control character (newlines too) as an
    escape, cut to :data:`_TEXT_WIDTH` characters."""
    shown = visible(text)
    return shown if len(shown) <= _TEXT_WIDTH else shown[: _TEXT_WIDTH - 1] + "…"


async def _cmd_sessions(args: argparse.Namespace) -> int:
    store = await open_to_read(args.db)
    owners: dict[str, SessionLease] | None = None
    try:
        streams = await _load(store, None)
        if args.subject is not None:
            streams = {s: e for s, e in streams.items() if subject_of(e) == args.subject}
            if not streams:
                raise Exit(EXIT_NOT_FOUND, f"no session of subject {visible(args.subject)!r}")
        seeds = {sid: await seed_of(store, events) for sid, events in streams.items()}
        if isinstance(store, PostgresStore):  # the store that has owners
            owners = {lease.session_id: lease for lease in await store.owners()}
    finally:
        await store.aclose()
    if not args.json:
        print(
            f"{'session':<24} {'turns':>5} {'events':>6}  {'phase':<10} "
            f"{'prompt':>8} {'compl.':>7} {'dropped':>7}  {'last outcome':<24}"
            + ("  owner (node: host pid, lease epoch, expiry)" if owners is not None else "")
        )
    for sid, events in streams.items():
        summary = session_summary(sid, events, seed=seeds[sid])
        lease = owners.get(sid) if owners is not None else None
        if args.json:
            if owners is not None:
                summary["owner"] = _owner_json(lease)
            print_json(summary)
        else:
            line = (
                f"{visible(sid):<24} {summary['turns']:>5} {summary['events']:>6}  "
                f"{summary['phase']:<10} {summary['prompt_tokens']:>8} "
                f"{summary['completion_tokens']:>7} {summary['turns_dropped']:>7}  "
                f"{visible(summary['last_outcome'] or '-'):<24}"
            )
            if owners is not None:
                line += f"  {_owner_text(lease)}"
            print(line.rstrip())
    return EXIT_OK


def _owner_text(lease: SessionLease | None) -> str:
    if lease is None:
        return "-"
    until = fmt_time(lease.expires_at.timestamp())
    state = "until" if lease.live else "expired"
    node = "" if lease.node is None else f"node {visible(lease.node)}: "
    return f"{node}{visible(lease.host)} {lease.pid}, epoch {lease.epoch}, {state} {until}"


def _owner_json(lease: SessionLease | None) -> dict[str, Any] | None:
    if lease is None:
        return None
    return {
        "host": lease.host,
        "pid": lease.pid,
        "epoch": lease.epoch,
        "expires_at": lease.expires_at.timestamp(),
        "live": lease.live,
        "node": lease.node,
    }


_DB_HELP = "the event log: a SQLite file, a .jsonl journal or a PostgreSQL URL, e.g. chat.db"


def add_read_parsers(sub: Any, common: argparse.ArgumentParser) -> None:
    """The ``replay``, ``log`` and ``sessions`` commands."""
    r = sub.add_parser(
        "replay",
        help="rebuild history from a log",
        parents=[common],
        description="Rebuild each session's history (its committed turns) from the log, "
        "as the runtime does on restart; nothing in the log changes.",
        epilog="examples:\n  turnledger replay chat.db\n"
        "  turnledger replay chat.db --session chat --at 17     as it stood after event 17\n"
        "  turnledger replay chat.db --json | jq '.turns | length'",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    r.add_argument("db", metavar="DB", help=_DB_HELP)
    r.add_argument("--session", "-s", type=text_arg, help="only this session")
    r.add_argument("--at", type=at_least(0), metavar="SEQ", help="as it stood after event SEQ")
    r.add_argument("--json", action="store_true", help="one JSON object per session")
    r.add_argument(
        "--branch",
        type=text_arg,
        metavar="B",
        help="the turns of branch B (main, b1, ...) instead of the active one (needs --session)",
    )
    r.set_defaults(run=_cmd_replay)

    lg = sub.add_parser(
        "log",
        help="the event timeline of a log",
        parents=[common],
        description="Every event in order: its time, request, tag, the phase it moved "
        "the session through and why; with --text the question and answer too.",
        epilog="examples:\n  turnledger log chat.db --session chat --text\n"
        "  turnledger log chat.db --request 3f2a\n"
        "  turnledger log chat.db --json | jq -c 'select(.tag == \"turn_discarded\")'",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    lg.add_argument("db", metavar="DB", help=_DB_HELP)
    lg.add_argument("--session", "-s", type=text_arg, help="only this session")
    lg.add_argument("--request", "-r", type=text_arg,
                    help="only this request id (or a prefix of it)")  # fmt: skip
    lg.add_argument("--json", action="store_true", help="one JSON object per event, with "
                    "the keys of the structlog lines (tag, from, to, ISO timestamp)")  # fmt: skip
    lg.add_argument("--text", action="store_true", help="also the question and the answer, "
                    "a line each (cut, escapes visible); with --json a text field")  # fmt: skip
    lg.add_argument("--html", metavar="FILE", type=text_arg,
                    help="write the session's timeline page, self-contained, to FILE (- for "
                    "stdout); needs --session")  # fmt: skip
    lg.set_defaults(run=_cmd_log)

    ss = sub.add_parser(
        "sessions",
        help="sessions with turn counts and last outcome (and owners, on PostgreSQL)",
        parents=[common],
        description="One line per session: turns in history, events, phase and the "
        "outcome of its last turn; on PostgreSQL also the process that owns it.",
        epilog="examples:\n  turnledger sessions chat.db\n"
        "  turnledger sessions 'postgresql://app@127.0.0.1/app' --json",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    ss.add_argument("db", metavar="DB", help=_DB_HELP)
    ss.add_argument("--json", action="store_true", help="one JSON object per session")
    ss.add_argument("--subject", type=text_arg, help="only the sessions of this subject "
                    "(whom they belong to; see 'turnledger erase --subject')")  # fmt: skip
    ss.set_defaults(run=_cmd_sessions)
