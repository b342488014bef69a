"""turnledger.aio.open_hub takes the keywords of turnledger.sessions.open_hub,
typed alike, so a type checker catches a misspelt option in either."""

from __future__ import annotations

import inspect
import subprocess
import sys
from pathlib import Path

import pytest

from turnledger import aio, sessions


def _keywords(fn: object) -> list[tuple[str, object, object, object]]:
    params = inspect.signature(fn).parameters.values()  # type: ignore[arg-type]
    return [
        (p.name, p.kind, p.default, p.annotation)
        for p in params
        if p.kind is inspect.Parameter.KEYWORD_ONLY
    ]


def test_the_asyncio_hub_has_the_trio_hubs_keywords() -> None:
    trio_side = _keywords(sessions.open_hub)
    asyncio_side = _keywords(aio.open_hub)
    assert [k[0] for k in trio_side][:3] == ["model", "system", "policy"]
    # What opens under trio is given to the asyncio hub as an opener, as the
    # store and the provider are: the one annotation that differs.
    opener = {"snapshots": "Opener[SnapshotStore] | None"}
    assert asyncio_side == [(n, k, d, opener.get(n, a)) for n, k, d, a in trio_side]
    kinds = {p.kind for p in inspect.signature(aio.open_hub).parameters.values()}
    assert inspect.Parameter.VAR_KEYWORD not in kinds  # no **options left


@pytest.mark.slow
def test_mypy_refuses_a_misspelt_option(tmp_path: Path) -> None:
    snippet = tmp_path / "snippet.py"
    snippet.write_text(
        "from turnledger import MemoryStore, aio\n"
        "from turnledger.testing import ScriptedProvider\n\n"
        "async def main() -> None:\n"
        "    async with aio.open_hub(MemoryStore(), ScriptedProvider(), model='m',\n"
        "                            turn_dedline=5.0) as hub:\n"
        "        await hub.submit('s', 'q')\n"
    )
    done = subprocess.run(
        [sys.executable, "-m", "mypy", "--strict", "--no-incremental", str(snippet)],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 1, done.stdout
    assert 'Unexpected keyword argument "turn_dedline"' in done.stdout
    assert done.stdout.count("error:") == 1, done.stdout
