"""``turnledger chat`` against model servers someone else wrote, installed
from PyPI (the test extra) and run on 127.0.0.1:

- ``llm-mock-api`` speaks Anthropic Messages and the OpenAI Responses API
  as their documentation describes: every turn commits.
- ``mockllm`` imitates the Anthropic API, but its stream is not the
  Messages protocol (``message_delta`` events carrying text deltas, no
  ``message_start`` or ``message_stop``, then OpenAI's ``[DONE]``): every
  turn is discarded with a reason that names what was wrong, and the chat
  goes on to the next question.
"""

from __future__ import annotations

import contextlib
import json
import os
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from ._run import tl

pytestmark = pytest.mark.slow

ANSWER = "Hello from a server we did not write."


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


@contextlib.contextmanager
def _running(command: list[str], port: int, **env: str) -> Iterator[str]:
    """Run a server command until the block ends; yields its base URL once
    it accepts connections (at most 60 s)."""
    log = open(os.devnull, "wb")  # noqa: SIM115 - closed below
    proc = subprocess.Popen(command, env={**os.environ, **env}, stdout=log, stderr=log)
    try:
        deadline = time.monotonic() + 60
        while True:
            assert proc.poll() is None, f"{command[0]} exited ({proc.returncode})"
            with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), 1):
                break
            assert time.monotonic() < deadline, f"{command[0]} did not start within 60 s"
            time.sleep(0.1)
        yield f"http://127.0.0.1:{port}"
    finally:
        proc.terminate()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(10)
        log.close()


def _events(db: Path, cwd: Path) -> list[str]:
    log = tl("log", str(db), "--json", cwd=cwd)
    assert log.returncode == 0, log.stderr
    return [json.loads(line)["tag"] for line in log.stdout.splitlines()]


@pytest.mark.parametrize(
    ("provider", "path"), [("anthropic", ""), ("openai-responses", "/v1")]
)  # fmt: skip
def test_a_conformant_server_commits(tmp_path: Path, provider: str, path: str) -> None:
    port = _free_port()
    script = Path(sys.executable).with_name("llm-mock-api")
    command = [str(script), "start", "-H", "127.0.0.1", "-p", str(port), "-f", ANSWER]
    with _running(command, port) as url:
        r = tl("chat", "--provider", provider, "--base-url", url + path, "--model", "claude-x",
               "--db", "x.db", "--api-key-env", "TL_KEY", cwd=tmp_path,
               stdin="Hi there?\nAnd again?\n", env={"TL_KEY": "sk-third-party"})  # fmt: skip
    assert r.returncode == 0, r.stderr
    assert r.stdout == f"{ANSWER}\n{ANSWER}\n"
    tags = _events(tmp_path / "x.db", tmp_path)
    assert tags.count("turn_committed") == 2
    assert "turn_discarded" not in tags


def test_a_non_conformant_server_is_discarded_with_the_reason(tmp_path: Path) -> None:
    port = _free_port()
    responses = tmp_path / "responses.yml"
    responses.write_text(f'responses:\n  "Hi there?": "{ANSWER}"\n')
    command = [sys.executable, "-m", "uvicorn", "mockllm.server:app",
               "--host", "127.0.0.1", "--port", str(port)]  # fmt: skip
    with _running(command, port, MOCKLLM_RESPONSES_FILE=str(responses)) as url:
        r = tl("chat", "--provider", "anthropic", "--base-url", url, "--model",
               "claude-3-haiku-20240307", "--db", "x.db", cwd=tmp_path,
               stdin="Hi there?\nStill there?\n")  # fmt: skip
    assert r.returncode == 1
    reason = "[not saved: discarded, reason=protocol: a message_delta before message_start]"
    assert r.stderr.count(reason) == 2, r.stderr  # both questions asked, both refused
    assert "Traceback" not in r.stderr and r.stdout == ""
    tags = _events(tmp_path / "x.db", tmp_path)
    assert tags.count("turn_discarded") == 2
    assert "turn_committed" not in tags
