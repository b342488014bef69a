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


def _modules(folder: str, *, recursive: bool = False) -> list[str]:
    """Every module of ``folder`` (a dotted package name), package files included."""
    root = SRC / Path(*folder.split(".")[1:])
    out = []
    for path in sorted(root.rglob("*.py") if recursive else root.glob("*.py")):
        parts = path.relative_to(SRC).with_suffix("").parts
        if parts[-1] == "__init__":
            parts = parts[:-1]
        out.append(".".join(("turnledger", *parts)))
    return out


#: The folders of the pure core: every module in them, by glob.
PURE_FOLDERS = [
    "turnledger.events",
    "turnledger.sessions",
    "turnledger.wire",
    "turnledger.timeline",
]
#: Where the trio runtime of sessions lives (allowed trio and structlog).
RUNTIME = "turnledger.runtime"
#: The package files that load the runtime lazily, on first use (checked by
#: what an import really loads, below, rather than by their import lines).
LAZY = {"turnledger.sessions"}
#: Pure modules outside those folders: the error types, the public SSE
#: decoder, the text escapes, the retry arithmetic the provider adapters use
#: and their table.
PURE_ELSEWHERE = [
    "turnledger._errors",
    "turnledger.sse",
    "turnledger.text",
    "turnledger.adapters.providers._retry",
    "turnledger.adapters.providers._kinds",
]
PURE = [
    m
    for folder in PURE_FOLDERS
    for m in _modules(folder)
    if m not in LAZY and not m.startswith(RUNTIME)
] + PURE_ELSEWHERE
#: What adapters must never import: the testing kit and the command line
#: (a package ``turnledger.cli`` or the modules it grew from), by name prefix.
NOT_FOR_ADAPTERS = (
    "turnledger.testing",
    "turnledger.cli",
    "turnledger._cli",
    "turnledger._inspect",
)


def test_the_folders_hold_what_the_tree_says() -> None:
    # The globs found the modules (a typo in a folder name cannot pass), and
    # the runtime really is a subpackage of its own.
    assert "turnledger.sessions._machine" in PURE
    assert "turnledger.events.codec" in PURE
    assert "turnledger.timeline._rows" in PURE
    assert "turnledger.wire._sse" in PURE and "turnledger.wire._openai_chunks" in PURE
    runtime = _modules(RUNTIME)
    assert f"{RUNTIME}._hub" in runtime and f"{RUNTIME}._actor" in runtime
    assert not set(runtime) & set(PURE)


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
    for module in _modules("turnledger.sessions", recursive=True):
        assert not any(i.startswith("turnledger.adapters") for i in _imports(module)), module
    for module in _modules("turnledger.wire", recursive=True):
        assert not any(
            i.startswith(("turnledger.adapters", "turnledger.runtime")) for i in _imports(module)
        ), module
    for module in _modules("turnledger.events", recursive=True):
        assert not any(
            i.startswith(("turnledger.adapters", "turnledger.sessions")) for i in _imports(module)
        ), module


def _is_under(name: str, prefixes: tuple[str, ...]) -> bool:
    return any(name == p or name.startswith((p + ".", p + "_")) for p in prefixes)


def test_adapters_import_neither_the_testing_kit_nor_the_command_line() -> None:
    adapters = _modules("turnledger.adapters", recursive=True)
    assert "turnledger.adapters.stores.memory" in adapters
    for module in adapters:
        bad = {i for i in _imports(module) if _is_under(i, NOT_FOR_ADAPTERS)}
        assert not bad, f"{module} imports {sorted(bad)}"


def test_the_adapter_check_knows_both_shapes_of_the_command_line() -> None:
    # The command line is a package (turnledger.cli.*) or the flat modules
    # it grew from; either name is caught, a module that merely starts with
    # the same letters is not.
    for name in ("turnledger.cli", "turnledger.cli.chat", "turnledger._cli_run"):
        assert _is_under(name, NOT_FOR_ADAPTERS), name
    assert _is_under("turnledger.testing._loopback", NOT_FOR_ADAPTERS)
    assert not _is_under("turnledger.client", NOT_FOR_ADAPTERS)
    assert not _is_under("turnledger.sessions", NOT_FOR_ADAPTERS)


def test_importing_the_pure_modules_loads_no_io_library() -> None:
    # The AST walk above sees import statements; this sees what Python really
    # loads, package __init__ files included, in a fresh interpreter.
    code = (
        "import sys\n"
        + "".join(f"import {m}\n" for m in [*PURE, *sorted(LAZY)])
        + f"print(sorted(m for m in {sorted(LOADED_FORBIDDEN)!r} if m in sys.modules))"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=60
    )
    assert out.stdout.strip() == "[]"
    # and the check can fail: the runtime does load trio
    code = "import sys, turnledger.sessions as s; s.open_hub; print('trio' in sys.modules)"
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=60
    )
    assert out.stdout.strip() == "True"


# --- import circles -------------------------------------------------------------
# A circle of imports, even one that exists only for type hints, ties the
# modules on it into one unit that cannot be read, loaded or moved alone.
# The graph has an edge for every import statement of a module (top level,
# under TYPE_CHECKING and inside functions); ``from pkg import name`` points at
# ``pkg.name`` when that is a module, else at ``pkg``. Importing ``a.b.c``
# runs ``a/__init__`` first, but that is the package's own business, not an
# edge of the importing module.


def _module_graph() -> dict[str, set[str]]:
    modules = {
        ".".join(("turnledger", *p.relative_to(SRC).with_suffix("").parts)).removesuffix(
            ".__init__"
        ): p
        for p in SRC.rglob("*.py")
    }
    graph: dict[str, set[str]] = {}
    for module, path in modules.items():
        package = module if path.name == "__init__.py" else module.rpartition(".")[0]
        edges: set[str] = set()
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), str(path))):
            if isinstance(node, ast.Import):
                edges.update(a.name for a in node.names if a.name in modules)
            elif isinstance(node, ast.ImportFrom):
                if node.level:
                    base = package.split(".")[: len(package.split(".")) - node.level + 1]
                    target = ".".join(base) + (f".{node.module}" if node.module else "")
                else:
                    target = node.module or ""
                for alias in node.names:
                    if f"{target}.{alias.name}" in modules:
                        edges.add(f"{target}.{alias.name}")
                    elif target in modules:
                        edges.add(target)
        edges.discard(module)
        graph[module] = edges
    return graph


def _circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components with more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def test_no_import_circles() -> None:
    graph = _module_graph()
    assert "turnledger.runtime._actor" in graph and "turnledger.wire._sse" in graph
    assert "turnledger.runtime._context" in graph["turnledger.runtime._actor"]
    assert _circles(graph) == []


def test_the_circle_check_can_fail() -> None:
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}
    assert _circles(graph) == [["a", "b", "c"]]
    # and it sees a circle that runs through a type-only import
    graph = _module_graph()
    graph["turnledger.runtime._context"].add("turnledger.runtime._actor")
    assert ["turnledger.runtime._actor", "turnledger.runtime._context"] in _circles(graph)
