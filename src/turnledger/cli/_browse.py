"""``turnledger export`` and ``search``: a session as Markdown or JSON, and
the committed turns that hold some text."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Iterable, Sequence
from typing import Any

from .. import ReplayError, UnknownBranch
from ..events import (
    DEFAULT_CODEC,
    BranchStarted,
    Event,
    EventStore,
    RequestId,
    SessionForked,
    SessionStarted,
    StoredEvent,
    TurnCommitted,
    TurnDiscarded,
    TurnRejected,
    TurnSubmitted,
)
from ..sessions import History, Idle, Turn, branch_turns, replay
from ._args import at_least, text_arg
from ._display import Out, fmt_time, print_json, visible
from ._errors import EXIT_NOT_FOUND, EXIT_OK, Exit
from ._stores import open_to_read

__all__ = ["add_browse_parsers", "export_record", "export_session", "find_turns", "markdown"]


def _usage(event: TurnCommitted) -> dict[str, int | None] | None:
    if event.usage is None:
        return None
    u = event.usage
    return {
        "prompt_tokens": u.prompt_tokens,
        "completion_tokens": u.completion_tokens,
        "total_tokens": u.total_tokens,
    }


def export_record(
    session_id: str,
    stored: Sequence[StoredEvent],
    branch: str | None = None,
    shared: Sequence[dict[str, Any]] = (),
) -> dict[str, Any]:
    """One session as ``export --format json`` writes it: its settings, the
    committed turns in order (the ``replay --json`` fields plus times,
    finish reason and usage), and, apart, the turns that were not saved.

    A session that has branched exports one branch's path (``branch``, by
    default the active one), named in ``branch``. A fork's record starts
    with ``shared``: the turns it shares with its source, as the source's
    record has them (:func:`export_session` reads them), and names the
    source in ``forked_from``.

    Raises:
        UnknownBranch: the session has no branch ``branch``.
    """
    record: dict[str, Any] = {
        "session_id": session_id,
        "model": None,
        "system": None,
        "started_at": None,
        "turns": list(shared),
        "not_saved": [],
    }
    asked: dict[str, tuple[str, float]] = {}
    events: list[Event] = []
    for env in stored:
        event = DEFAULT_CODEC.decode(env)
        events.append(event)
        at = fmt_time(env.recorded_at)
        if isinstance(event, SessionStarted):
            record.update(model=event.model, system=event.system, started_at=at)
        elif isinstance(event, SessionForked):
            record["forked_from"] = {
                "session_id": event.source,
                "source_seq": event.source_seq,
                "branch": event.branch,
                "at_turn": event.at_turn,
            }
        elif isinstance(event, TurnSubmitted):
            asked[event.request_id] = (event.question, env.recorded_at)
        elif isinstance(event, TurnCommitted):
            question, submitted = asked.get(event.request_id, ("", env.recorded_at))
            record["turns"].append(
                {
                    "request_id": event.request_id,
                    "question": question,
                    "answer": event.answer,
                    "asked_at": fmt_time(submitted),
                    "committed_at": at,
                    "finish_reason": event.finish_reason,
                    "usage": _usage(event),
                }
            )
        elif isinstance(event, TurnDiscarded | TurnRejected):
            question_at = asked.get(event.request_id)
            record["not_saved"].append(
                {
                    "request_id": event.request_id,
                    "question": question_at[0] if question_at else None,
                    "outcome": "discarded" if isinstance(event, TurnDiscarded) else "rejected",
                    "reason": event.reason,
                    "detail": event.detail,
                    "at": at,
                    # the place in the conversation: after this many turns
                    "after_turn": len(record["turns"]),
                }
            )
    if branch is not None or any(isinstance(e, BranchStarted) for e in events):
        state = replay(events, _shared_seed(shared))
        name = state.active_branch if branch is None else branch
        committed = {t["request_id"]: t for t in record["turns"]}
        record["turns"] = [committed[t.request_id] for t in branch_turns(state, name)]
        record["branch"] = name
    return record


def _quote(text: str) -> str:
    return "\n".join(f"> {line}" if line else ">" for line in text.split("\n"))


def markdown(record: dict[str, Any]) -> str:
    """``export --format md``: every committed turn under its own numbered
    heading, in order; a turn that was not saved as a quoted note between
    them, never numbered as a turn."""
    lines = [f"# Session {record['session_id']}", ""]
    lines.append(f"- model: {record['model']}")
    lines.append(f"- started: {record['started_at']}")
    if record["system"]:
        lines.append(f"- system prompt: {record['system']}")
    lines.append(f"- turns: {len(record['turns'])} saved, {len(record['not_saved'])} not saved")
    lines.append("")
    not_saved = list(record["not_saved"])

    def notes_before(n: int) -> None:
        while not_saved and not_saved[0]["after_turn"] < n:
            item = not_saved.pop(0)
            why = f"{item['outcome']}: {item['reason']}"
            if item["detail"]:
                why += f" ({item['detail']})"
            lines.append(f"> **Not saved** — {why}, {item['at']}. The question was:")
            lines.append(">")
            lines.append(_quote(item["question"] or "(not recorded)"))
            lines.append("")

    for n, turn in enumerate(record["turns"], 1):
        notes_before(n)
        meta = [turn["committed_at"], f"finish: {turn['finish_reason']}"]
        usage = turn["usage"]
        if usage:
            meta.append(f"tokens: {usage['prompt_tokens']} in, {usage['completion_tokens']} out")
        lines += [f"## Turn {n}", "", f"*{' · '.join(meta)}*", ""]
        lines += ["**You**", "", turn["question"], "", "**Assistant**", "", turn["answer"], ""]
    notes_before(len(record["turns"]) + 1)
    return "\n".join(lines)


async def _cmd_export(args: argparse.Namespace) -> int:
    store = await open_to_read(args.db)
    try:
        stored = await store.read(args.session)
        if not stored:
            raise Exit(EXIT_NOT_FOUND, f"no events for session {args.session!r}")
        try:
            record = await export_session(store, args.session, stored, args.branch)
        except UnknownBranch as exc:
            raise Exit(EXIT_NOT_FOUND, str(exc)) from None
    finally:
        await store.aclose()
    if args.format == "json":
        print_json(record)
    else:
        Out(sys.stdout)(markdown(record), end="")
    return EXIT_OK


def _shared_seed(shared: Sequence[dict[str, Any]]) -> Idle | None:
    # The state a fork's events fold from, as far as an export needs it:
    # the shared turns' ids, questions and answers.
    if not shared:
        return None
    turns = [Turn(RequestId(t["request_id"]), t["question"], t["answer"]) for t in shared]
    return Idle(turns=History(turns))


async def export_session(
    store: EventStore, session_id: str, stored: Sequence[StoredEvent], branch: str | None = None
) -> dict[str, Any]:
    """:func:`export_record` of a session read from ``store``: a fork's
    shared turns are read from its source (and its source's, for a fork of
    a fork), as the source's record had them when it was forked.

    Raises:
        UnknownBranch: the session has no branch ``branch``.
        ReplayError: a fork whose source is gone.

    Cancellation: reads only; a cancelled call changed nothing.
    """
    shared: list[dict[str, Any]] = []
    if len(stored) > 1 and stored[1].tag == "session_forked":
        forked = DEFAULT_CODEC.decode(stored[1])
        assert isinstance(forked, SessionForked)
        source = await store.read(forked.source)
        if len(source) < forked.source_seq:
            raise ReplayError(f"the source {forked.source!r} of this fork was erased")
        whole = await export_session(
            store, forked.source, source[: forked.source_seq], forked.branch
        )
        shared = whole["turns"][: forked.at_turn]
    return export_record(session_id, stored, branch, shared)


Hit = tuple[int, str, str, str]  # (turn number, request id, question, answer)


def _matches(needle: str) -> Any:
    def fold(session_id: str, events: list[Event]) -> list[Hit]:
        if not events:
            return []
        found: list[Hit] = []
        # A fork's shared turns are found in its source, where they are
        # stored: here they stand as empty turns, which match no needle.
        forked = events[1] if len(events) > 1 else None
        seed = None
        if isinstance(forked, SessionForked):
            blank = [Turn(RequestId(f"shared-{i}"), "", "") for i in range(forked.at_turn)]
            seed = Idle(turns=History(blank))
        for n, t in enumerate(replay(events, seed).turns, 1):
            if needle in t.question.casefold() or needle in t.answer.casefold():
                found.append((n, t.request_id, t.question, t.answer))
        return found

    return fold


class _Prefilter:
    """The decoder of ``search``: a session none of whose stored payload
    texts holds the needle is not parsed at all (it folds as no events).

    Exact, not a guess, for a needle without ``"``, ``\\`` or control
    characters: stores write payloads as JSON with text as it is
    (``ensure_ascii=False``), escaping only those characters, so a match in
    a question or an answer is a match in the payload text, case folded
    alike. A payload holding ``\\u`` escapes (text with a lone surrogate)
    is always parsed. Other needles parse every session."""

    def __init__(self, needle: str) -> None:
        self.needle = needle
        self.exact = not any(c in '"\\' or c < " " for c in needle)

    def decode(self, stored: StoredEvent) -> Event:
        return DEFAULT_CODEC.decode(stored)

    def decode_rows(
        self, session_id: str, rows: Iterable[tuple[int, str, int, str | bytes]]
    ) -> list[Event]:
        rows = list(rows)
        if self.exact and not any(self._may_hold(row[3]) for row in rows):
            return []
        return DEFAULT_CODEC.decode_rows(session_id, rows)

    def _may_hold(self, payload: str | bytes) -> bool:
        text = payload if isinstance(payload, str) else payload.decode("utf-8", "replace")
        return "\\u" in text or self.needle in text.casefold()


async def find_turns(
    store: EventStore, text: str, session: str | None = None
) -> dict[str, list[Hit]]:
    """The committed turns of ``store`` (of ``session`` only, if given)
    whose question or answer holds ``text``, case ignored; by session."""
    needle = text.casefold()
    ids = [session] if session else await store.session_ids()
    hits: dict[str, list[Hit]] = {}
    for i in range(0, len(ids), 256):
        found = await store.read_decoded_many(
            ids[i : i + 256], _Prefilter(needle), _matches(needle)
        )
        hits.update({sid: rows for sid, rows in found.items() if rows})
    return hits


def _snippet(text: str, needle: str, width: int = 80) -> str:
    """One line around the first match of ``needle``, escapes visible."""
    at = text.casefold().find(needle)
    if at < 0:
        at = 0
    start = max(0, at - width // 3)
    part = text[start : start + width]
    shown = visible(part)
    return ("…" if start else "") + shown + ("…" if start + width < len(text) else "")


async def _cmd_search(args: argparse.Namespace) -> int:
    needle = args.text.casefold()
    store = await open_to_read(args.db)
    try:
        hits = await find_turns(store, args.text, args.session)
    finally:
        await store.aclose()
    shown = 0
    for sid, rows in hits.items():
        for n, rid, question, answer in rows:
            if args.limit is not None and shown >= args.limit:
                break
            shown += 1
            if args.json:
                print_json(
                    {"session_id": sid, "turn": n, "request_id": rid,
                     "question": question, "answer": answer}
                )  # fmt: skip
                continue
            where = answer if needle not in question.casefold() else question
            print(f"{visible(sid)} #{n}  {_snippet(where, needle)}")
    if shown == 0:
        raise Exit(EXIT_NOT_FOUND, f"no committed turn holds {visible(args.text)!r}")
    return EXIT_OK


def add_browse_parsers(sub: Any, common: argparse.ArgumentParser) -> None:
    """The ``export`` and ``search`` commands."""
    e = sub.add_parser(
        "export",
        parents=[common],
        help="one session as Markdown or JSON",
        description="Write one session to stdout: its settings, every committed turn in "
        "order with times, finish reason and usage, and, marked apart, the turns that "
        "were not saved (discarded or rejected; never mixed into the history).",
        epilog="examples:\n  turnledger export chat.db --session chat > chat.md\n"
        "  turnledger export chat.db -s chat --format json | jq '.turns[].question'",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    e.add_argument("db", metavar="DB", help="the event log, e.g. chat.db")
    e.add_argument("--session", "-s", type=text_arg, required=True,
                   help="the session to export, e.g. chat")  # fmt: skip
    e.add_argument("--format", choices=["md", "json"], default="md",
                   help="Markdown, or one JSON document (default: %(default)s)")  # fmt: skip
    e.add_argument("--branch", type=text_arg, metavar="B",
                   help="the turns of branch B (main, b1, ...); default: the active")  # fmt: skip
    e.set_defaults(run=_cmd_export)

    s = sub.add_parser(
        "search",
        parents=[common],
        help="committed turns whose question or answer holds TEXT",
        description="Search the committed turns (what history holds; discarded text is "
        "never searched) for TEXT, ignoring case. Prints the session, the turn number "
        "and a line around the match. Exit code 4 when nothing matches.",
        epilog="examples:\n  turnledger search chat.db 'append-only'\n"
        "  turnledger search chat.db invoice --session work --json",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    s.add_argument("db", metavar="DB", help="the event log, e.g. chat.db")
    s.add_argument("text", metavar="TEXT", type=text_arg, help="the text to find")
    s.add_argument("--session", "-s", type=text_arg, help="only this session")
    s.add_argument("--limit", type=at_least(1), metavar="N", help="at most N matches")
    s.add_argument("--json", action="store_true", help="one JSON object per matching turn")
    s.set_defaults(run=_cmd_search)
