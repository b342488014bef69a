"""The ``keygen`` and ``rekey`` commands: keys of an encrypted store."""

from __future__ import annotations

import argparse
from typing import Any

from ._args import text_arg
from ._display import visible
from ._errors import EXIT_OK, EXIT_USAGE, Exit
from ._stores import command_keys, open_to_write

__all__ = ["add_keys_parsers"]


async def _cmd_keygen(args: argparse.Namespace) -> int:
    from ..adapters.encryption import new_key_line

    try:
        print(new_key_line(args.id))
    except ValueError as exc:
        raise Exit(EXIT_USAGE, str(exc)) from exc
    return EXIT_OK


async def _cmd_rekey(args: argparse.Namespace) -> int:
    from ..adapters.encryption import EncryptedStore, rotate_keys

    if command_keys() is None:
        raise Exit(
            EXIT_USAGE, "rekey needs the keys: --key-file (the new key first, the old after)"
        )
    store = await open_to_write(args.db)
    try:
        if not isinstance(store, EncryptedStore):
            raise Exit(EXIT_USAGE, f"{visible(args.db)} is not encrypted")
        count = await rotate_keys(store)
    finally:
        await store.aclose()
    print(f"rewrapped {count} data key(s) under key {store.keys.current_kek_id()!r}")  # type: ignore[union-attr]
    return EXIT_OK


def add_keys_parsers(sub: Any, common: argparse.ArgumentParser) -> None:
    """The ``keygen`` and ``rekey`` commands."""
    g = sub.add_parser(
        "keygen",
        help="print a new key-encryption key line",
        parents=[common],
        description="Print one ID:BASE64 line with 32 random bytes: a key file line "
        "(see docs/encryption.md).",
        epilog="examples:\n  umask 077 && turnledger keygen k1 > keys.txt\n"
        "  turnledger demo --key-file keys.txt                 an encrypted demo log",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    g.add_argument("id", metavar="ID", type=text_arg, help="the key's id")
    g.set_defaults(run=_cmd_keygen)
    r = sub.add_parser(
        "rekey",
        help="rewrap an encrypted store's data keys under the current key",
        parents=[common],
        description="Rewrap every session's data key under the first key of --key-file; "
        "no event is rewritten. Keep the old key in the file until this ends.",
        epilog="examples:\n  turnledger keygen k2 | cat - keys.txt > new.txt   the new key first\n"
        "  turnledger rekey chat.db --key-file new.txt",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    r.add_argument("db", metavar="DB", help="an encrypted store")
    r.set_defaults(run=_cmd_rekey)
