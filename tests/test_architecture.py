"""The pure core imports no I/O library, directly or through another module."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

import turnledger

SRC = Path(turnledger.__file__).parent
FORBIDDEN = {"trio", "httpx", "h11", "sqlite3", "structlog", "psycopg", "psycopg_pool", "socket"}

# What must not even be loaded. (socket is in FORBIDDEN for direct imports
# only: the standard library's email.utils, used to parse Retry-After dates,
# loads it without doing any I/O.)
LOADED_FORBIDDEN = FORBIDDEN - {"socket"}

PURE = [
    "turnledger._errors",
    "turnledger.events",
    "turnledger.events._events",
    "turnledger.events._envelope",
    "turnledger.events._exact_json",
    "turnledger.events._store",
    "turnledger.events.codec",
    "turnledger.sessions._machine",
    "turnledger.sessions._messages",
    "turnledger.sessions._history",
    "turnledger.sessions._projection",
    "turnledger.sessions._request",
    "turnledger.sessions._ports",
    "turnledger.sessions._diagram",
    "turnledger.sessions._results",
    "turnledger.sessions._replay",
    "turnledger.sse",
    "turnledger.adapters.providers._utf8",
    "turnledger.adapters.providers._lines",
    "turnledger.adapters.providers._sse",
    "turnledger.adapters.providers._strict_json",
    "turnledger.adapters.providers._ndjson",
    "turnledger.adapters.providers._limits",
    "turnledger.adapters.providers._stream",
    "turnledger.adapters.providers._openai_chunks",
    "turnledger.adapters.providers._ollama_chunks",
    "turnledger.adapters.providers._retry",
]


def _path(module: str) -> Path:
    rel = Path(*module.split(".")[1:])
    pkg = SRC / rel / "__init__.py"
    return pkg if pkg.exists() else SRC / rel.with_suffix(".py")


def _imports(module: str) -> set[str]:
    path = _path(module)
    tree = ast.parse(path.read_text(encoding="utf-8"), str(path))
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    out: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                base = base[: len(base) - node.level + 1]
                prefix = ".".join(base)
                target = f"{prefix}.{node.module}" if node.module else prefix
            else:
                target = node.module or ""
            out.add(target)
            for alias in node.names:
                out.add(f"{target}.{alias.name}")
    return out


def _closure(module: str) -> dict[str, set[str]]:
    seen: dict[str, set[str]] = {}
    todo = [module]
    while todo:
        m = todo.pop()
        if m in seen:
            continue
        seen[m] = _imports(m)
        for imp in seen[m]:
            if imp.startswith("turnledger") and (_path(imp).exists()) and imp not in seen:
                todo.append(imp)
    return seen


@pytest.mark.parametrize("module", PURE)
def test_pure_modules_import_no_io(module: str) -> None:
    for m, imports in _closure(module).items():
        bad = {i for i in imports if i.split(".")[0] in FORBIDDEN}
        assert not bad, f"{module} reaches {m}, which imports {sorted(bad)}"


def test_the_checker_catches_an_io_import() -> None:
    # the actor is allowed trio; the checker must notice it
    assert any(
        i.split(".")[0] == "trio"
        for i in _closure("turnledger.adapters.stores.memory")["turnledger.adapters.stores.memory"]
    )


def test_sessions_never_import_adapters() -> None:
    for path in (SRC / "sessions").glob("*.py"):
        module = f"turnledger.sessions.{path.stem}"
        assert not any(i.startswith("turnledger.adapters") for i in _imports(module)), module
    for path in (SRC / "events").glob("*.py"):
        module = f"turnledger.events.{path.stem}"
        assert not any(
            i.startswith(("turnledger.adapters", "turnledger.sessions")) for i in _imports(module)
        ), module


def test_importing_the_pure_modules_loads_no_io_library() -> None:
    # The AST walk above sees import statements; this sees what Python really
    # loads, package __init__ files included, in a fresh interpreter.
    code = (
        "import sys\n"
        + "".join(f"import {m}\n" for m in PURE)
        + f"print(sorted(m for m in {sorted(LOADED_FORBIDDEN)!r} if m in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"
    # and the check can fail: the runtime does load trio
    code = "import sys, turnledger.sessions as s; s.open_hub; print('trio' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "True"
