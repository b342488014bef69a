"""The ``erase`` and ``prune`` commands: removing sessions on purpose.

Both open the store to write, so a store another process writes (a running
``serve`` or ``chat`` on an SQLite file or a journal) refuses them with its
writer's pid (exit code 3); on PostgreSQL a session another process holds is
refused the same way. ``erase`` asks before it erases unless ``--yes``, and
without a terminal to ask on it refuses. ``prune --dry-run`` only reads.
"""

from __future__ import annotations

import argparse
import re
import sys
import time
from typing import Any

import trio

from .. import UnknownSession
from ..events import Erasure
from ..sessions import (
    RetentionPolicy,
    RetentionStep,
    erase_sessions,
    prune_store,
    sessions_of_subject,
    with_forks,
)
from ._args import at_least, text_arg
from ._display import print_json, visible
from ._errors import EXIT_NOT_FOUND, EXIT_OK, EXIT_USAGE, Exit
from ._stores import open_to_read, open_to_write

__all__ = ["add_lifecycle_parsers", "parse_age"]

_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 7 * 86400}
_AGE = re.compile(r"(\d+)([smhdw])")


def parse_age(text: str) -> int:
    """``30d``, ``12h``, ``90m``, ``45s``, ``2w`` as seconds (argparse type)."""
    m = _AGE.fullmatch(text.strip())
    if m is None or int(m[1]) < 1:
        raise argparse.ArgumentTypeError(f"{text!r} is not an age such as 30d, 12h, 90m, 45s or 2w")
    return int(m[1]) * _UNITS[m[2]]


async def _confirm(question: str) -> bool:
    print(question, end=" ", flush=True)
    answer = await trio.to_thread.run_sync(sys.stdin.readline)
    return answer.strip().lower() in ("y", "yes")


async def _cmd_erase(args: argparse.Namespace) -> int:
    if not args.yes and not sys.stdin.isatty():
        raise Exit(
            EXIT_USAGE,
            "refusing to erase without --yes: there is no terminal to ask for confirmation",
        )
    # Found, and confirmed, through a read-only store: until the erasure
    # itself nothing is locked, created or changed.
    reader = await open_to_read(args.db)
    try:
        if args.session is not None:
            found = bool(await reader.read(args.session))
            ids = [args.session] if found else []
        else:
            ids = await sessions_of_subject(reader, args.subject)
        # A fork shares its first turns with its source: it goes with it.
        ids = await with_forks(reader, ids)
    finally:
        await reader.aclose()
    if not ids:
        what = (
            f"session {visible(args.session)!r}"
            if args.session is not None
            else f"session of subject {visible(args.subject)!r}"
        )
        raise Exit(EXIT_NOT_FOUND, f"no {what}; nothing erased")
    if not args.yes:
        names = ", ".join(visible(sid) for sid in ids[:5]) + (" ..." if len(ids) > 5 else "")
        if not await _confirm(
            f"Erase {len(ids)} session(s) ({names}) and every byte of them? "
            "This cannot be undone. [y/N]"
        ):
            print("nothing erased")
            return EXIT_OK
    store = await open_to_write(args.db)
    try:
        records = await erase_sessions(store, ids)
    except UnknownSession as exc:
        raise Exit(EXIT_NOT_FOUND, f"{exc} (erased meanwhile?)") from exc
    finally:
        await store.aclose()
    for sid, record in zip(ids, records, strict=True):
        _print_erased(args, sid, record)
    return EXIT_OK


def _print_erased(args: argparse.Namespace, sid: str, record: Erasure) -> None:
    if args.json:
        print_json(
            {
                "session_id": sid,
                "session_hash": record.session_hash,
                "erased_at": record.erased_at,
                "events": record.events,
            }
        )
    else:
        print(f"erased {visible(sid)}: {record.events} events (sha256 {record.session_hash})")


async def _cmd_prune(args: argparse.Namespace) -> int:
    if args.older_than is None and args.max_turns is None:
        raise Exit(EXIT_USAGE, "say what to prune: --older-than AGE and/or --max-turns N")
    policy = RetentionPolicy(args.older_than, args.max_turns)
    # A dry run only reads: nothing is locked, created or changed.
    store = await (open_to_read(args.db) if args.dry_run else open_to_write(args.db))
    now = time.time()

    def show(step: RetentionStep, record: Erasure | None) -> None:
        _print_step(args, step, now)

    try:
        steps = await prune_store(store, policy, now=now, dry_run=args.dry_run, on_step=show)
    finally:
        await store.aclose()
    if not args.json:
        verb = "would prune" if args.dry_run else "pruned"
        erased = sum(1 for s in steps if s.action == "erase")
        print(f"{verb} {len(steps)} session(s): {erased} erased, {len(steps) - erased} trimmed")
    return EXIT_OK


def _print_step(args: argparse.Namespace, step: RetentionStep, now: float) -> None:
    if args.json:
        out: dict[str, Any] = {
            "session_id": step.session_id,
            "action": step.action,
            "events": step.events,
            "kept": len(step.keep),
            "turns": step.turns,
            "dry_run": args.dry_run,
        }
        print_json(out)
        return
    sid = visible(step.session_id)
    would = "would be " if args.dry_run else ""
    if step.action == "erase":
        print(f"{sid}: {would}erased ({step.events} events)")
    else:
        print(
            f"{sid}: {would}trimmed, {step.turns} oldest turn(s) cut "
            f"({step.events} -> {len(step.keep)} events)"
        )


_DB_HELP = "the event log: a SQLite file, a .jsonl journal or a PostgreSQL URL, e.g. chat.db"


def add_lifecycle_parsers(sub: Any, common: argparse.ArgumentParser) -> None:
    """The ``erase`` and ``prune`` commands."""
    e = sub.add_parser(
        "erase",
        parents=[common],
        help="erase a session, or every session of a subject, byte for byte",
        description="Remove every event of the session(s) from the store so that no byte "
        "of them is left in its files (SQLite: secure delete and a truncated WAL; a journal "
        "is rewritten); only a content-free erasure record stays. Asks first unless --yes. "
        "A store another process is writing refuses it (exit code 3).",
        epilog="examples:\n  turnledger erase chat.db --session chat\n"
        "  turnledger erase chat.db --subject user-42 --yes",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    e.add_argument("db", metavar="DB", help=_DB_HELP)
    which = e.add_mutually_exclusive_group(required=True)
    which.add_argument("--session", "-s", type=text_arg, help="the session to erase")
    which.add_argument("--subject", type=text_arg, help="erase every session of this subject")
    e.add_argument("--yes", "-y", action="store_true", help="do not ask for confirmation")
    e.add_argument("--json", action="store_true", help="one JSON object per erasure")
    e.set_defaults(run=_cmd_erase)

    p = sub.add_parser(
        "prune",
        parents=[common],
        help="erase sessions idle for too long, trim old turns",
        description="Apply a retention policy: erase every session whose last event is older "
        "than AGE, and/or cut each session to its newest N committed turns (whole turns; "
        "a turn's tool rounds stay with it). A session's own retention, recorded when it "
        "was created, applies too. Pruning is an erasure, with the same guarantees.",
        epilog="examples:\n  turnledger prune chat.db --older-than 30d --dry-run\n"
        "  turnledger prune chat.db --older-than 90d --max-turns 200",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("db", metavar="DB", help=_DB_HELP)
    p.add_argument("--older-than", type=parse_age, metavar="AGE",
                   help="erase sessions idle for longer (30d, 12h, 90m, 45s, 2w)")  # fmt: skip
    p.add_argument("--max-turns", type=at_least(1), metavar="N",
                   help="keep each session's newest N committed turns")  # fmt: skip
    p.add_argument("--dry-run", action="store_true", help="only say what would be done")
    p.add_argument("--json", action="store_true", help="one JSON object per session pruned")
    p.set_defaults(run=_cmd_prune)
