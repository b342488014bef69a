"""The ``turnledger`` command line: the parser and :func:`main`.

One module per command family: :mod:`._demo`, :mod:`._chat` and
:mod:`._read` (``replay``, ``log``, ``sessions``, over :mod:`turnledger.timeline`),
:mod:`._browse` (``export``, ``search``), :mod:`._lifecycle` (``erase``,
``prune``), :mod:`._serve` (``serve``, from
:mod:`turnledger.serve`); :mod:`._terminal` and :mod:`._hints` serve ``chat``
on a terminal;
:mod:`._stores` opens the store a command names, :mod:`._errors` holds the
exit codes and keeps passwords out of messages, :mod:`._display` keeps
terminal controls out of what is printed, :mod:`._logs` says where and when
log lines are shown, :mod:`._args` checks arguments.
The command line uses only public names of the library.

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
import importlib
import io
import os
import sys
from collections.abc import Sequence
from typing import NoReturn

from .. import (
    CodecError,
    ContentEncrypted,
    ReplayError,
    StoreError,
    TurnLedgerError,
    __version__,
)
from ._errors import (
    EXIT_FAILED,
    EXIT_INTERRUPTED,
    EXIT_NOT_FOUND,
    EXIT_OK,
    EXIT_STORE,
    EXIT_USAGE,
    Exit,
    scrub,
    secrets_of,
)

__all__ = ["EXIT_FAILED", "EXIT_NOT_FOUND", "EXIT_OK", "EXIT_STORE", "EXIT_USAGE", "main"]


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
    p.add_argument(
        "--key-file",
        metavar="PATH",
        default=argparse.SUPPRESS if suppress else None,
        help="keys of an encrypted store (ID:BASE64 lines, the current one first; "
        "or set TURNLEDGER_KEY_FILE or TURNLEDGER_KEYS); see docs/encryption.md",
    )


#: Every command: its module, the function there that adds its parser (and
#: those of the commands listed with it), and its line in ``turnledger --help``.
#: Only the command being run has its module imported (``turnledger --help``
#: imports none: trio, httpx, the stores and the chat stay unloaded); the
#: others get a parser with just their help line, which is all the top-level
#: help shows. tests/cli/test_startup.py checks that each line here is the one
#: the module's parser gives.
COMMANDS: dict[str, tuple[str, str, str]] = {
    "demo": ("_demo", "add_demo_parser",
             "run a scripted conversation against a built-in loopback server"),
    "chat": ("_chat", "add_chat_parser",
             "chat with a model (a prompt on a terminal, one question per line from a pipe)"),
    "replay": ("_read", "add_read_parsers", "rebuild history from a log"),
    "log": ("_read", "add_read_parsers", "the event timeline of a log"),
    "sessions": ("_read", "add_read_parsers",
                 "sessions with turn counts and last outcome (and owners, on PostgreSQL)"),
    "export": ("_browse", "add_browse_parsers", "one session as Markdown or JSON"),
    "search": ("_browse", "add_browse_parsers",
               "committed turns whose question or answer holds TEXT"),
    "serve": ("_serve", "add_serve_parser", "HTTP API and browser timeline over a store"),
    "erase": ("_lifecycle", "add_lifecycle_parsers",
              "erase a session, or every session of a subject, byte for byte"),
    "prune": ("_lifecycle", "add_lifecycle_parsers",
              "erase sessions idle for too long, trim old turns"),
    "keygen": ("_keys", "add_keys_parsers", "print a new key-encryption key line"),
    "rekey": ("_keys", "add_keys_parsers",
              "rewrap an encrypted store's data keys under the current key"),
}  # fmt: skip


def _command_of(argv: Sequence[str]) -> str | None:
    """The command ``argv`` names: its first word that is not an option (no
    option before the command takes a value), or None."""
    for word in argv:
        if word == "--":
            return None
        if not word.startswith("-"):
            return word if word in COMMANDS else None
    return None


def _parser(argv: Sequence[str] = ()) -> argparse.ArgumentParser:
    """The parser, with the full options of the command ``argv`` names (if
    any) and a help line for every other command."""
    p = argparse.ArgumentParser(
        prog="turnledger",
        description="LLM chat sessions whose history can be trusted.",
        epilog="DB is a SQLite file, a .jsonl journal, or PostgreSQL: a postgresql:// URL "
        "or a libpq string such as 'host=127.0.0.1 dbname=app'.\n\n"
        "examples:\n"
        "  turnledger demo                                   no network, no key\n"
        "  turnledger chat                                   the built-in loopback server\n"
        "  turnledger chat --model gpt-4o                    with OPENAI_BASE_URL and "
        "OPENAI_API_KEY set\n"
        "  turnledger log chat.db --text                     what happened, turn by turn\n"
        "  turnledger export chat.db --session chat > chat.md\n"
        "  turnledger search chat.db 'append-only'\n\n"
        "'turnledger COMMAND --help' lists a command's options with examples.",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--version", action="version", version=f"turnledger {__version__}")
    _logging_options(p)
    # The same options after the command name too (``turnledger chat -v``);
    # there they default to "not given", so they never undo the ones before.
    common = argparse.ArgumentParser(add_help=False)
    _logging_options(common, suppress=True)
    sub = p.add_subparsers(
        dest="command", required=True, metavar="COMMAND", help="one of the commands below"
    )
    chosen = _command_of(argv)
    family = None if chosen is None else COMMANDS[chosen][:2]
    for name, (module, adder, help_line) in COMMANDS.items():
        if (module, adder) == family:
            # The module adds this command and the others it holds, once.
            add = getattr(importlib.import_module(f"{__name__}.{module}"), adder)
            add(sub, common)
            family = None
        elif chosen is None or COMMANDS[name][:2] != COMMANDS[chosen][:2]:
            sub.add_parser(name, help=help_line, parents=[common])
    return p


def _exit_code(raised: BaseException, secrets: set[str]) -> int:
    # A lone error from inside a nursery arrives wrapped in a group.
    exc = raised
    while isinstance(exc, BaseExceptionGroup) and len(exc.exceptions) == 1:
        exc = exc.exceptions[0]

    from ._display import visible

    def say(message: str) -> None:
        print(scrub(f"turnledger: {visible(message, lines=True)}", secrets), file=sys.stderr)

    if isinstance(exc, Exit):
        if exc.message:
            say(exc.message)
        return exc.code
    if isinstance(exc, StoreError):
        say(f"store error: {exc}")
        return EXIT_STORE
    if isinstance(exc, ContentEncrypted):
        say(str(exc))
        return EXIT_STORE
    if isinstance(exc, CodecError | ReplayError):
        say(f"the log is corrupt: {exc}")
        return EXIT_STORE
    if isinstance(exc, TurnLedgerError):
        say(str(exc))
        return EXIT_FAILED
    if isinstance(exc, KeyboardInterrupt):
        return EXIT_INTERRUPTED
    if isinstance(exc, BrokenPipeError):
        # The reader of stdout had enough (``turnledger log DB | head``):
        # a normal end, without a traceback or a second error at exit.
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        return EXIT_OK
    raise raised


def main(argv: Sequence[str] | None = None) -> NoReturn:
    """Entry point of the ``turnledger`` script."""
    # Text that cannot be encoded (an answer's lone surrogate, a terminal
    # that is not UTF-8) is shown escaped rather than ending the command.
    for stream in (sys.stdout, sys.stderr):
        if isinstance(stream, io.TextIOWrapper):
            stream.reconfigure(errors="backslashreplace")
    words = sys.argv[1:] if argv is None else list(argv)
    args = _parser(words).parse_args(words)
    # Imported only now: ``turnledger --help`` has ended above without them.
    import trio

    from ._logs import CommandLog
    from ._stores import use_key_file

    use_key_file(args.key_file)

    # demo and chat tell a story on a terminal: their log lines wait until
    # it is told (._logs); chat's window line tells the window's facts.
    args.command_log = CommandLog(
        sys.stderr,
        json=True if args.log_json else None,
        verbosity=args.verbose,
        hold=getattr(args, "hold_logs", False),
        told=getattr(args, "told", ()),
    )
    args.command_log.configure()
    try:
        code = trio.run(args.run, args)
    except BaseException as raised:
        args.command_log.release(args.command)
        code = _exit_code(raised, secrets_of(getattr(args, "db", None)))
    args.command_log.release(args.command)
    sys.exit(code)
