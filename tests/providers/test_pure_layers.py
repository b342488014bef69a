"""The streaming layers are pure: no trio, httpx, h11, sockets or structlog,
directly or through another turnledger module (the AST walk of
tests/test_architecture.py, repeated for the provider modules)."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

import turnledger

SRC = Path(turnledger.__file__).parent
FORBIDDEN = {"trio", "httpx", "h11", "sqlite3", "structlog", "psycopg", "socket", "asyncio"}

PURE_PROVIDER_MODULES = [
    "turnledger.adapters.providers._utf8",
    "turnledger.adapters.providers._sse",
    "turnledger.adapters.providers._json",
    "turnledger.adapters.providers._ndjson",
    "turnledger.adapters.providers._limits",
    "turnledger.adapters.providers._stream",
    "turnledger.adapters.providers._openai_chunks",
    "turnledger.adapters.providers._ollama_chunks",
    "turnledger.adapters.providers._retry",
    "turnledger.sse",
]


def _path(module: str) -> Path:
    rel = Path(*module.split(".")[1:])
    pkg = SRC / rel / "__init__.py"
    return pkg if pkg.exists() else SRC / rel.with_suffix(".py")


def _imports(module: str) -> set[str]:
    path = _path(module)
    tree = ast.parse(path.read_text(encoding="utf-8"))
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    out: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - node.level + 1]
                target = ".".join([*base, node.module] if node.module else base)
            else:
                target = node.module or ""
            out.add(target)
            out.update(f"{target}.{alias.name}" for alias in node.names)
    return out


def _closure(module: str) -> dict[str, set[str]]:
    seen: dict[str, set[str]] = {}
    todo = [module]
    while todo:
        m = todo.pop()
        if m in seen:
            continue
        seen[m] = _imports(m)
        todo += [i for i in seen[m] if i.startswith("turnledger") and _path(i).exists()]
    return seen


@pytest.mark.parametrize("module", PURE_PROVIDER_MODULES)
def test_pure(module: str) -> None:
    for m, imports in _closure(module).items():
        bad = {i for i in imports if i.split(".")[0] in FORBIDDEN}
        assert not bad, f"{module} reaches {m}, which imports {sorted(bad)}"


def test_the_checker_sees_the_shell() -> None:
    imports = _closure("turnledger.adapters.providers.openai")
    assert any(i.split(".")[0] == "httpx" for found in imports.values() for i in found)
