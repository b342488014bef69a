"""The README's embedding examples run as written: the trio one under
``trio.run`` and the asyncio one under ``asyncio.run``, each in a fresh
interpreter against the loopback provider server."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from turnledger.testing import LoopbackServer, chat_responder

README = Path(__file__).parents[1] / "README.md"
URL = "http://127.0.0.1:8080/v1"


def example(ending: str) -> str:
    blocks: list[str] = re.findall(r"```python\n(.*?)```", README.read_text(), re.S)
    [code] = [b for b in blocks if b.rstrip().endswith(ending)]
    assert URL in code
    # The front door: the everyday names come from turnledger itself.
    assert re.findall(r"^(?:from|import) turnledger\S*", code, re.M) == ["from turnledger"]
    return code


@pytest.mark.loopback
@pytest.mark.parametrize("ending", ["trio.run(main)", "asyncio.run(main())"])
def test_the_readme_example_runs(ending: str, tmp_path: Path) -> None:
    server = LoopbackServer(chat_responder("A turn is a question and its answer."))
    with server.start_in_thread():
        code = example(ending).replace(URL, server.openai_base_url)
        done = subprocess.run(
            [sys.executable, "-c", code], cwd=tmp_path, capture_output=True, timeout=60
        )
    assert done.returncode == 0, done.stderr.decode()[-2000:]
    out = done.stdout.decode()
    assert out.startswith("A turn is a question and its answer.")
    assert "Turn(request_id=" in out and "question='What is a turn?'" in out
    assert (tmp_path / "chats.db").exists()


PROVIDERS_DOC = Path(__file__).parents[1] / "docs" / "providers.md"


@pytest.mark.loopback
@pytest.mark.parametrize(
    ("url", "path"),
    [("https://api.anthropic.com", ""), ("https://api.openai.com/v1", "/v1")],
    ids=["anthropic", "openai-responses"],
)
def test_the_provider_examples_run(url: str, path: str, tmp_path: Path) -> None:
    blocks = re.findall(r"```python\n(.*?)```", PROVIDERS_DOC.read_text(), re.S)
    [code] = [b for b in blocks if f'base_url="{url}"' in b]
    server = LoopbackServer(chat_responder("A turn is a question and its answer."))
    with server.start_in_thread():
        code = code.replace(url, server.base_url + path)
        done = subprocess.run(
            [sys.executable, "-c", code], cwd=tmp_path, capture_output=True, timeout=60,
            env={**os.environ, "ANTHROPIC_API_KEY": "sk-doc", "OPENAI_API_KEY": "sk-doc"},
        )  # fmt: skip
        (exchange,) = server.exchanges
    assert done.returncode == 0, done.stderr.decode()[-2000:]
    assert "CommittedResult(" in done.stdout.decode()
    assert "answer='A turn is a question and its answer.'" in done.stdout.decode()
    key = exchange.header("x-api-key") or exchange.header("authorization")
    assert key is not None and key.endswith("sk-doc")
