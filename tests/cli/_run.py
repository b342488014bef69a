"""Running the ``turnledger`` command as a user does: a real process."""

from __future__ import annotations

import contextlib
import os
import select
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

from _procs import within

#: Terminal controls a session id or an answer may carry: ESC (a title
#: change, a screen clear), BEL, CR, a C1 CSI and a bidi override.
NASTY = "\x1b]0;owned\x07\x1b[2J\r\x9b\u202e"


def tl(
    *args: str,
    cwd: Path,
    stdin: str | None = None,
    timeout: float = 60,
    env: dict[str, str] | None = None,
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "turnledger", *args],
        cwd=cwd,
        input=stdin,
        capture_output=True,
        text=True,
        timeout=timeout,
        env={
            **os.environ,
            "PYTHONUNBUFFERED": "1",
            "XDG_DATA_HOME": str(cwd / "xdg"),
            **(env or {}),
        },
    )


@contextlib.contextmanager
def server_process(tmp_path: Path, responder: str, setup: str = "") -> Iterator[str]:
    """A loopback server in a process of its own, answering with the
    responder that the Python expression ``responder`` builds (after the
    statements ``setup``; ``turnledger.testing``'s names and ``attrs`` in
    scope); yields its base URL."""
    script = tmp_path / "server.py"
    script.write_text(
        "import sys, attrs\n"
        "from turnledger.testing import *\n"
        f"{setup}"
        f"server = LoopbackServer({responder})\n"
        "with server.start_in_thread() as s:\n"
        "    print(s.base_url, flush=True)\n"
        "    sys.stdin.read()\n"
    )
    server = subprocess.Popen(
        [sys.executable, str(script)], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    )
    try:
        assert server.stdout is not None
        yield within(30, server.stdout.readline, "the server").strip()
    finally:
        try:
            server.communicate("", timeout=30)
        finally:
            if server.poll() is None:
                server.kill()
                server.wait(30)
            script.unlink()


@contextlib.contextmanager
def loopback_process(
    tmp_path: Path, answer: str, *, status: int = 200, delay: float = 0.0, **responder: float
) -> Iterator[str]:
    """A loopback server in a process of its own that answers every request
    with ``answer`` (streamed as ``chat_responder`` does, with
    ``responder`` options), after ``delay`` seconds; or, with a ``status``
    other than 200, with that status and ``answer`` as the error body.
    Yields its OpenAI base URL."""
    setup = (
        f"answer = lambda messages: {answer!r}\n"
        f"inner = chat_responder(answer, **{responder!r})\n"
        f"if {status!r} != 200:\n"
        f"    inner = lambda exchange: error_reply({status!r}, {answer!r})\n"
        f"respond = lambda exchange: attrs.evolve(inner(exchange), headers_delay={delay!r})\n"
    )
    with server_process(tmp_path, "respond", setup) as base_url:
        yield base_url + "/v1"


def read_terminal(main: int, timeout: float = 60) -> bytes:
    """Everything written to a pseudo-terminal until it closes (an
    AssertionError if it is still open after ``timeout`` s)."""
    seen = b""
    deadline = time.monotonic() + timeout
    while True:
        left = deadline - time.monotonic()
        if left <= 0 or not select.select([main], [], [], left)[0]:
            raise AssertionError(f"the terminal is still open after {timeout}s: {seen[-500:]!r}")
        try:
            chunk = os.read(main, 4096)
        except OSError:  # the terminal closed
            break
        if not chunk:
            break
        seen += chunk
    return seen
