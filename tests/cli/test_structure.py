"""The command line is a client of the library: it imports public names only."""

from __future__ import annotations

import ast
import os
import subprocess
import sys
from pathlib import Path

import turnledger.cli

CLI = Path(turnledger.cli.__file__).parent


def _private_imports(path: Path) -> list[str]:
    """``module.name`` for every name ``path`` imports from outside the
    command line through a private module or under a private name."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if not isinstance(node, ast.ImportFrom):
            continue
        if node.level == 1 or (node.level == 0 and not (node.module or "").startswith("turnl")):
            continue  # within the command line, or another library
        module = node.module or ""
        for alias in node.names:
            parts = [*module.split("."), alias.name]
            if any(p.startswith("_") and p != "__version__" for p in parts if p):
                found.append(f"{'.' * node.level}{module}.{alias.name}")
    return found


def test_the_command_line_imports_public_names_only() -> None:
    modules = sorted(CLI.glob("*.py"))
    assert {p.stem for p in modules} >= {"__init__", "_chat", "_demo", "_read"}
    for path in modules:
        assert _private_imports(path) == [], path.name


def test_the_checker_sees_a_private_import(tmp_path: Path) -> None:
    sample = tmp_path / "sample.py"
    sample.write_text(
        "from ..testing._loopback import Pause\nfrom ..sessions import _machine\n"
        "from .._errors import StoreError\nfrom .. import StoreError, __version__\n"
        "from ._display import visible\nfrom typing import Any\n"
    )
    assert _private_imports(sample) == [
        "..testing._loopback.Pause",
        "..sessions._machine",
        ".._errors.StoreError",
    ]


def test_the_script_and_python_m_reach_the_same_main() -> None:
    for command in (
        [sys.executable, "-m", "turnledger", "--version"],
        [sys.executable, "-c", "from turnledger.cli import main; main(['--version'])"],
    ):
        out = subprocess.run(command, capture_output=True, text=True, timeout=60)
        assert out.returncode == 0 and out.stdout.startswith("turnledger "), out.stderr


def test_every_command_and_option_has_help_and_an_example() -> None:
    import argparse

    from turnledger.cli import COMMANDS, _parser

    assert set(COMMANDS) >= {"demo", "chat", "replay", "log", "sessions", "export", "search"}
    for name in COMMANDS:
        # Each command's options are built when that command is named.
        parser = _parser([name])
        (sub,) = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
        assert {choice.dest for choice in sub._choices_actions} == set(COMMANDS)
        for p in [parser, sub.choices[name]]:
            assert p.epilog and "examples:" in p.epilog, p.prog
            for action in p._actions:
                assert action.help, f"{p.prog} {action.option_strings or action.dest}"
            p.format_help()  # every %(default)s and the like formats


def test_license_is_mit_with_the_authors() -> None:
    text = (CLI.parents[2] / "LICENSE").read_text(encoding="utf-8")
    assert text.startswith("MIT License") and "Copyright (c) 2026 the turnledger authors" in text


def test_the_command_line_works_without_the_serve_extra(tmp_path: Path) -> None:
    # The README's first command installs turnledger without extras: every
    # command but serve must work, and serve must say what to install.
    block = (
        "import sys\n"
        "for name in ('starlette', 'hypercorn'):\n"
        "    sys.modules[name] = None  # as if not installed\n"
        "from turnledger.cli import main\n"
        "sys.exit(main(sys.argv[1:]))\n"
    )

    def run(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-c", block, *args],
            cwd=tmp_path,
            capture_output=True,
            text=True,
            timeout=120,
            env={**os.environ, "XDG_DATA_HOME": str(tmp_path / "xdg")},
        )

    demo = run("demo", "--db", "d.db")
    assert demo.returncode == 0, demo.stderr
    assert "replayed history matches the live session" in demo.stdout
    serve = run("serve", "--db", "s.db")
    assert serve.returncode == 2
    assert "pip install 'turnledger[serve]'" in serve.stderr
    assert not (tmp_path / "s.db").exists()
