"""``turnledger chat`` against servers that answer badly: each failure says
what to fix, on stderr only; no key or error body is shown or stored."""

from __future__ import annotations

import socket
import subprocess
from pathlib import Path

import pytest

from ._run import loopback_process, server_process, tl

pytestmark = pytest.mark.slow

KEY = "sk-do-not-print-4242"
BODY = "BODY-FROM-THE-SERVER"


def no_secret_anywhere(tmp_path: Path, *texts: str) -> None:
    for text in texts:
        assert KEY not in text and BODY not in text
    for file in tmp_path.rglob("*.db*"):
        data = file.read_bytes()
        assert KEY.encode() not in data and BODY.encode() not in data


def test_openai_base_url_is_the_endpoint_when_no_option_is_given(tmp_path: Path) -> None:
    with loopback_process(tmp_path, "from the configured server") as url:
        r = tl("chat", "--db", "x.db", "--model", "m", cwd=tmp_path, stdin="q\n",
               env={"OPENAI_BASE_URL": url})  # fmt: skip
        assert r.returncode == 0, r.stderr
        assert r.stdout == "from the configured server\n"
        # an endpoint needs a model: the variable is named
        r = tl("chat", "--db", "x.db", cwd=tmp_path, stdin="q\n", env={"OPENAI_BASE_URL": url})
        assert r.returncode == 2
        assert "--model is required with an endpoint (from OPENAI_BASE_URL)" in r.stderr
    bad = tl("chat", "--model", "m", cwd=tmp_path, stdin="q\n", env={"OPENAI_BASE_URL": "ftp://x"})
    assert bad.returncode == 2 and "OPENAI_BASE_URL: not an http:// or https:// URL" in bad.stderr


def test_ollama_host_is_the_endpoint_for_ollama(tmp_path: Path) -> None:
    with loopback_process(tmp_path, "from ollama") as url:
        host = url.removeprefix("http://").removesuffix("/v1")  # host:port, as Ollama writes it
        r = tl("chat", "--provider", "ollama", "--db", "x.db", "--model", "m", cwd=tmp_path,
               stdin="q\n", env={"OLLAMA_HOST": host})  # fmt: skip
        assert r.returncode == 0, r.stderr
        assert r.stdout == "from ollama\n"


def test_401_says_which_variable_was_read(tmp_path: Path) -> None:
    with loopback_process(tmp_path, BODY, status=401) as url:
        missing = tl("chat", "--db", "x.db", "--model", "m", "--base-url", url, cwd=tmp_path,
                     stdin="q\n", env={"OPENAI_API_KEY": ""})  # fmt: skip
        rejected = tl("chat", "--db", "x.db", "--model", "m", "--base-url", url, cwd=tmp_path,
                      stdin="q\n", env={"OPENAI_API_KEY": KEY})  # fmt: skip
        named = tl("chat", "--db", "x.db", "--model", "m", "--base-url", url, "--api-key-env",
                   "MY_KEY", cwd=tmp_path, stdin="q\n", env={"MY_KEY": KEY})  # fmt: skip
    assert missing.returncode == rejected.returncode == named.returncode == 1
    assert "[not saved: discarded, reason=http_status: HTTP 401]" in missing.stderr
    assert "no API key was sent: OPENAI_API_KEY is not set" in missing.stderr
    assert "the API key read from OPENAI_API_KEY was rejected by 127.0.0.1:" in rejected.stderr
    assert "the API key read from MY_KEY was rejected" in named.stderr
    no_secret_anywhere(tmp_path, missing.stderr, rejected.stderr, named.stderr, rejected.stdout)


def test_404_names_the_model_and_the_url(tmp_path: Path) -> None:
    with loopback_process(tmp_path, BODY, status=404) as url:
        r = tl("chat", "--db", "x.db", "--model", "no-such-model", cwd=tmp_path, stdin="q\n",
               env={"OPENAI_BASE_URL": url, "OPENAI_API_KEY": KEY})  # fmt: skip
    assert r.returncode == 1
    assert f"HTTP 404: nothing at {url}/chat/completions for model 'no-such-model'" in r.stderr
    assert "the URL from OPENAI_BASE_URL (or --base-url)" in r.stderr
    no_secret_anywhere(tmp_path, r.stderr, r.stdout)


def test_a_connect_error_names_host_and_port(tmp_path: Path) -> None:
    with socket.socket() as s:  # a port nobody listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    r = tl("chat", "--db", "x.db", "--model", "m", "--base-url", f"http://127.0.0.1:{port}/v1",
           cwd=tmp_path, stdin="q\n", env={"OPENAI_API_KEY": KEY})  # fmt: skip
    assert r.returncode == 1
    assert "reason=transport: connect error" in r.stderr
    assert f"could not connect to 127.0.0.1:{port} (the URL from --base-url)" in r.stderr
    no_secret_anywhere(tmp_path, r.stderr)


def test_a_timeout_says_which_limit_fired(tmp_path: Path) -> None:
    with loopback_process(tmp_path, "too late", delay=5.0) as url:
        r = tl("chat", "--db", "x.db", "--model", "m", "--base-url", url, "--timeout", "0.5",
               cwd=tmp_path, stdin="q\n")  # fmt: skip
    assert r.returncode == 1
    assert "reason=timeout: deadline" in r.stderr
    assert "the turn deadline (--timeout 0.5 s) fired" in r.stderr


def test_anthropic_401_404_and_529_say_what_to_fix(tmp_path: Path) -> None:
    # One server: the model name says which status to answer with.
    setup = "respond = lambda exchange: error_reply(int(exchange.json()['model']), 'BODY')\n"
    with server_process(tmp_path, "respond", setup.replace("BODY", BODY)) as base:

        def chat(status: int, key: str) -> subprocess.CompletedProcess[str]:
            return tl("chat", "--provider", "anthropic", "--db", f"{status}.db", "--model",
                      str(status), cwd=tmp_path, stdin="q\n",
                      env={"ANTHROPIC_BASE_URL": base, "ANTHROPIC_API_KEY": key})  # fmt: skip

        missing, rejected, not_found, overloaded = (
            chat(401, ""),
            chat(401, KEY),
            chat(404, KEY),
            chat(529, KEY),
        )
    for r in (missing, rejected, not_found, overloaded):
        assert r.returncode == 1, r.stderr
    assert "no API key was sent: ANTHROPIC_API_KEY is not set" in missing.stderr
    assert "the API key read from ANTHROPIC_API_KEY was rejected by 127.0.0.1:" in rejected.stderr
    assert f"HTTP 404: nothing at {base}/v1/messages for model '404'" in not_found.stderr
    assert "the URL from ANTHROPIC_BASE_URL (or --base-url)" in not_found.stderr
    assert "an Anthropic URL is the host" in not_found.stderr
    assert "HTTP 529: 127.0.0.1:" in overloaded.stderr and "is overloaded" in overloaded.stderr
    no_secret_anywhere(tmp_path, *(r.stderr + r.stdout for r in (rejected, not_found, overloaded)))
