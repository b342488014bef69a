"""``turnledger --help`` stays quick: the command line loads a command's
module (and trio, httpx, the stores, the chat) only when that command runs.
How quick is measured by benchmarks/cli_startup.py, never asserted here."""

from __future__ import annotations

import argparse
import json
import subprocess
import sys

import pytest

from turnledger.cli import COMMANDS, _command_of, _parser

#: What neither ``import turnledger`` nor ``import turnledger.cli`` may load.
HEAVY = ("trio", "httpx", "structlog", "turnledger.adapters", "turnledger.sessions",
         "turnledger.cli._chat", "turnledger.cli._demo", "turnledger.cli._read",
         "turnledger.cli._browse", "turnledger.cli._serve", "turnledger.serve")  # fmt: skip


def _loaded_after(code: str) -> set[str]:
    probe = f"import sys\n{code}\nimport json\nprint(json.dumps(sorted(sys.modules)))"
    done = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, timeout=60, check=True
    )
    return set(json.loads(done.stdout))


def _heavy(modules: set[str]) -> list[str]:
    return sorted(m for m in modules if any(m == h or m.startswith(h + ".") for h in HEAVY))


@pytest.mark.parametrize(
    "code",
    [
        "import turnledger",
        "import turnledger.cli",
        "from turnledger.cli import _parser; _parser([]).format_help()",
    ],
)
def test_importing_the_package_and_the_command_line_loads_no_runtime(code: str) -> None:
    assert _heavy(_loaded_after(code)) == []


def test_the_probe_sees_what_a_command_loads() -> None:
    # The same probe, on a parser with chat's options: it sees trio and httpx.
    loaded = _loaded_after("from turnledger.cli import _parser; _parser(['chat'])")
    assert {"trio", "httpx", "turnledger.cli._chat"} <= set(_heavy(loaded))


def test_turnledger_help_runs_without_loading_a_command() -> None:
    probe = (
        "import sys, json, runpy\n"
        "sys.argv = ['turnledger', '--help']\n"
        "try:\n"
        "    runpy.run_module('turnledger', run_name='__main__')\n"
        "except SystemExit:\n"
        "    pass\n"
        "print(json.dumps(sorted(sys.modules)))\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, timeout=60, check=True
    )
    help_text, _, modules = done.stdout.rpartition("\n[")
    assert "turnledger COMMAND --help" in help_text
    for name, (_, _, line) in COMMANDS.items():
        assert name in help_text and line[:40] in help_text.replace("\n", " "), name
    assert _heavy(set(json.loads("[" + modules))) == []


@pytest.mark.parametrize("name", list(COMMANDS))
def test_each_help_line_is_the_one_its_module_gives(name: str) -> None:
    # The table's line (shown by turnledger --help) and the parser the
    # module builds (shown when the command is named) say the same.
    parser = _parser([name])
    (sub,) = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    given = {choice.dest: choice.help for choice in sub._choices_actions}
    assert given[name] == COMMANDS[name][2]
    assert sub.choices[name].epilog  # the full parser, not the help line alone


@pytest.mark.parametrize(
    ("argv", "command"),
    [
        ([], None),
        (["--help"], None),
        (["-v", "--log-json", "chat", "--db", "x"], "chat"),
        (["-vv", "log", "serve"], "log"),
        (["nope", "chat"], None),
        (["--", "chat"], None),
    ],
)
def test_the_command_is_the_first_word_that_is_not_an_option(
    argv: list[str], command: str | None
) -> None:
    assert _command_of(argv) == command


def test_a_command_parses_as_before_after_logging_options() -> None:
    args = _parser(["-v", "log", "x.db", "--json"]).parse_args(["-v", "log", "x.db", "--json"])
    assert (args.command, args.db, args.verbose) == ("log", "x.db", 1)
    with pytest.raises(SystemExit) as raised:
        _parser(["nope"]).parse_args(["nope"])
    assert raised.value.code == 2
