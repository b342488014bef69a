"""Every Python block of the README and of docs/ runs as written, and every
relative link between these pages (with its ``#anchor``) resolves.

A block is one of three kinds:

- a *program* (it calls ``trio.run`` or ``asyncio.run`` at the top level)
  runs in a fresh interpreter against the loopback model server, with the
  server's address in place of the model URLs the page names;
- an *excerpt* (preceded by ``<!-- excerpt: PATH -->``) must be PATH's own
  text (PATH from the top of the repository), piece by piece; PATH runs in
  a test of its own;
- any other block is a *fragment*. A page's fragments run in order in one
  namespace, like a doctest file, with ``await`` allowed at the top level:
  under trio, or under asyncio on a page whose fragments import
  ``turnledger.aio``. The pages say what the two names they lean on stand
  for: ``store`` (a SQLite file holding the session ``user-42``) and
  ``provider`` (an ``OpenAIChat`` on the loopback server); under asyncio
  they are openers, as docs/asyncio.md advises.
"""

from __future__ import annotations

import ast
import asyncio
import inspect
import linecache
import os
import re
import subprocess
import sys
import unicodedata
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import attrs
import pytest
import trio

from turnledger.adapters.providers import OpenAIChat
from turnledger.adapters.stores import SQLiteStore
from turnledger.events import BaseEventStore
from turnledger.sessions import CommittedResult, open_hub
from turnledger.testing import LoopbackServer, chat_responder

ROOT = Path(__file__).parents[1]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
ANSWER = "A turn is a question and its answer."
KEY = "sk-doc"
# What the pages write for a model server or a database, and what a test
# puts in its place.
OPENAI_URL = "http://127.0.0.1:8080/v1"
VENDOR_URLS = {"https://api.anthropic.com": "", "https://api.openai.com/v1": "/v1"}
PG_URL = "postgresql://app@db/turns"

_BLOCK = re.compile(r"(?:<!-- excerpt: (?P<excerpt>\S+) -->\n)?```python\n(?P<code>.*?)```", re.S)
_PROGRAM = re.compile(r"^(trio\.run|asyncio\.run)\(", re.M)


@attrs.frozen
class Block:
    page: Path
    number: int  # 1-based, among the page's Python blocks
    code: str
    excerpt: str | None

    @property
    def name(self) -> str:
        return f"{self.page.relative_to(ROOT)}, Python block {self.number}"

    @property
    def is_program(self) -> bool:
        return self.excerpt is None and _PROGRAM.search(self.code) is not None


def blocks_of(page: Path) -> list[Block]:
    text = page.read_text(encoding="utf-8")
    return [
        Block(page, n, m["code"], m["excerpt"])
        for n, m in enumerate(_BLOCK.finditer(text), start=1)
    ]


ALL_BLOCKS = [b for page in PAGES for b in blocks_of(page)]


def test_the_pages_hold_python_blocks_of_every_kind() -> None:
    # The parser finds what the pages hold: if this fails, a block went
    # unnoticed (a fence written differently) rather than unrun.
    fences = sum(p.read_text(encoding="utf-8").count("```python\n") for p in PAGES)
    assert len(ALL_BLOCKS) == fences
    assert {b.is_program for b in ALL_BLOCKS} == {True, False}
    assert any(b.excerpt for b in ALL_BLOCKS)


@pytest.fixture
def server() -> Iterator[LoopbackServer]:
    loopback = LoopbackServer(chat_responder(ANSWER))
    with loopback.start_in_thread():
        yield loopback


def _urls(code: str, server: LoopbackServer) -> str:
    code = code.replace(OPENAI_URL, server.openai_base_url)
    for url, path in VENDOR_URLS.items():
        code = code.replace(url, server.base_url + path)
    return code


def _env(server: LoopbackServer, tmp_path: Path) -> dict[str, str]:
    return {
        "ANTHROPIC_API_KEY": KEY,
        "OPENAI_API_KEY": KEY,
        "ANTHROPIC_BASE_URL": server.base_url,
        "OPENAI_BASE_URL": server.openai_base_url,
        "XDG_DATA_HOME": str(tmp_path / "xdg"),
    }


# --- programs ----------------------------------------------------------------


@pytest.mark.loopback
@pytest.mark.parametrize("block", [b for b in ALL_BLOCKS if b.is_program], ids=lambda b: b.name)
def test_each_program_runs(block: Block, server: LoopbackServer, tmp_path: Path) -> None:
    done = subprocess.run(
        [sys.executable, "-c", _urls(block.code, server)],
        cwd=tmp_path,
        capture_output=True,
        timeout=60,
        env={**os.environ, **_env(server, tmp_path)},
    )
    assert done.returncode == 0, done.stderr.decode()[-2000:]
    out = done.stdout.decode()
    assert ANSWER in out and "not kept" not in out, out
    if block.page.name == "README.md":
        # The preview first, then the history: the question is in it
        # because the answer committed.
        assert out.startswith(ANSWER)
        assert "Turn(request_id=" in out and "question='What is a turn?'" in out
    assert server.exchanges, "the program never reached the model server"
    for exchange in server.exchanges:
        key = exchange.header("x-api-key") or exchange.header("authorization")
        assert key is None or key.endswith(KEY)
    for name in re.findall(r'(?:Store\.open|open_store)\("([^"]+)"\)', block.code):
        assert (tmp_path / name).exists()


def test_the_readme_has_one_trio_and_one_asyncio_program() -> None:
    readme = [b for b in blocks_of(ROOT / "README.md") if b.is_program]
    assert [re.findall(_PROGRAM, b.code) for b in readme] == [["trio.run"], ["asyncio.run"]]
    assert all(OPENAI_URL in b.code for b in readme)
    # The front door: the everyday names come from turnledger itself.
    for b in readme:
        assert re.findall(r"^(?:from|import) turnledger\S*", b.code, re.M) == ["from turnledger"]


# --- excerpts ----------------------------------------------------------------


@pytest.mark.parametrize("block", [b for b in ALL_BLOCKS if b.excerpt], ids=lambda b: b.name)
def test_each_excerpt_is_its_files_text(block: Block) -> None:
    assert block.excerpt is not None
    source = (ROOT / block.excerpt).read_text(encoding="utf-8")
    pieces = [p for p in re.split(r"\n\s*\n", block.code) if p.strip()]
    missing = [p for p in pieces if p.strip("\n") not in source]
    assert not missing, f"not in {block.excerpt}: {missing[0]!r}"


# --- fragments ---------------------------------------------------------------


def _fragment_pages() -> list[Path]:
    return [p for p in PAGES if any(not b.is_program and not b.excerpt for b in blocks_of(p))]


async def _run(block: Block, namespace: dict[str, Any]) -> None:
    code = compile(block.code, block.name, "exec", flags=ast.PyCF_ALLOW_TOP_LEVEL_AWAIT)
    # A traceback then shows the block's lines.
    linecache.cache[block.name] = (len(block.code), None, block.code.splitlines(True), block.name)
    try:
        result = eval(code, namespace)
        if inspect.isawaitable(result):
            await result
    except BaseException as exc:
        exc.add_note(f"in {block.name}")
        raise


async def _under_trio(blocks: list[Block], namespace: dict[str, Any], url: str) -> None:
    store = await SQLiteStore.open("chats.db")
    try:
        async with OpenAIChat(base_url=url) as provider:
            async with open_hub(store, provider, model="llama3") as hub:
                result = await (await hub.submit("user-42", "What is a turn?")).outcome()
                assert isinstance(result, CommittedResult)
            namespace.update(store=store, provider=provider)
            for block in blocks:
                await _run(block, namespace)
    finally:
        # Stores a page opened for itself (PostgreSQL, a reader) are closed
        # too; closing is idempotent.
        for value in [store, *namespace.values()]:
            if isinstance(value, BaseEventStore):
                await value.aclose()


async def _under_asyncio(blocks: list[Block], namespace: dict[str, Any], url: str) -> None:
    namespace.update(
        store=lambda: SQLiteStore.open("chats.db"),
        provider=lambda: OpenAIChat(base_url=url),
    )
    for block in blocks:
        await _run(block, namespace)


@pytest.mark.loopback
@pytest.mark.parametrize("page", _fragment_pages(), ids=lambda p: str(p.relative_to(ROOT)))
def test_the_fragments_of_each_page_run(
    page: Path,
    server: LoopbackServer,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    request: pytest.FixtureRequest,
) -> None:
    monkeypatch.chdir(tmp_path)
    for name, value in _env(server, tmp_path).items():
        monkeypatch.setenv(name, value)
    blocks = [b for b in blocks_of(page) if not b.is_program and not b.excerpt]
    left_out = [b for b in blocks if PG_URL in b.code]
    if left_out and (
        os.environ.get("TURNLEDGER_TEST_PG_DSN") or os.environ.get("TURNLEDGER_REQUIRE_PG") == "1"
    ):
        dsn = request.getfixturevalue("pg_dsn")
        blocks = [attrs.evolve(b, code=b.code.replace(PG_URL, dsn)) for b in blocks]
        left_out = []
    run = [b for b in blocks if b not in left_out]
    namespace: dict[str, Any] = {"__name__": "__doc_example__"}
    if any(re.search(r"^from turnledger import .*\baio\b", b.code, re.M) for b in run):
        asyncio.run(_under_asyncio(run, namespace, server.openai_base_url))
    else:
        trio.run(_under_trio, run, namespace, server.openai_base_url)
    if left_out:
        pytest.skip(
            f"ran {len(run)} blocks; not run without TURNLEDGER_TEST_PG_DSN: "
            + ", ".join(b.name for b in left_out)
        )


# --- links -------------------------------------------------------------------

_FENCE = re.compile(r"^```.*?^```", re.S | re.M)
_CODE_SPAN = re.compile(r"`[^`\n]*`")
_LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")
_HEADING = re.compile(r"^#{1,6}\s+(.+?)\s*#*\s*$", re.M)


def _prose(page: Path) -> str:
    return _CODE_SPAN.sub("", _FENCE.sub("", page.read_text(encoding="utf-8")))


def slug(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation dropped
    (letters, digits, ``-`` and ``_`` stay), spaces as ``-``."""
    text = heading.replace("`", "").strip().lower()
    kept = "".join(c for c in text if c in " -_" or unicodedata.category(c)[0] in "LN")
    return kept.replace(" ", "-")


def anchors(page: Path) -> set[str]:
    seen: dict[str, int] = {}
    out = set()
    text = _FENCE.sub("", page.read_text(encoding="utf-8"))
    for heading in _HEADING.findall(text):
        base = slug(heading)
        n = seen.get(base, 0)
        seen[base] = n + 1
        out.add(base if n == 0 else f"{base}-{n}")
    return out


def links(page: Path) -> list[str]:
    return [t for t in _LINK.findall(_prose(page)) if not re.match(r"[a-z]+:", t)]


def test_the_slugs_follow_github() -> None:
    assert slug("What it costs") == "what-it-costs"
    assert slug("`turnledger.aio`") == "turnledgeraio"
    assert slug("History, request budgets and context windows") == (
        "history-request-budgets-and-context-windows"
    )
    assert slug("FastAPI: streaming a turn as Server-Sent Events") == (
        "fastapi-streaming-a-turn-as-server-sent-events"
    )


def test_the_link_check_finds_a_broken_link(tmp_path: Path) -> None:
    page = tmp_path / "page.md"
    page.write_text("# Top\n\n[a](#top) [b](#nowhere) `[c](#code)` [d](https://x.org)\n")
    assert _broken(page) == ["#nowhere"]


def _broken(page: Path) -> list[str]:
    def resolves(target: str) -> bool:
        path, _, anchor = target.partition("#")
        resolved = (page.parent / path).resolve() if path else page
        if not resolved.exists():
            return False
        return not anchor or (resolved.suffix == ".md" and anchor in anchors(resolved))

    return [t for t in links(page) if not resolves(t)]


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_relative_link_resolves(page: Path) -> None:
    assert _broken(page) == []


def test_the_readme_is_a_front_page() -> None:
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    assert len(readme.splitlines()) < 250
    # Its map names every page of docs/.
    mapped = {(ROOT / t).resolve() for t in links(ROOT / "README.md")}
    assert set(p.resolve() for p in PAGES[1:]) <= mapped
