"""Child processes running a snippet with this checkout's turnledger, and
reading their report lines with a deadline (shared by tests)."""

from __future__ import annotations

import os
import select
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

import turnledger

T = TypeVar("T")


def spawn(code: str, *args: str) -> subprocess.Popen[bytes]:
    """``python -c code args...`` with pipes for stdin and stdout."""
    src = str(Path(turnledger.__file__).parents[1])
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([src, os.environ.get("PYTHONPATH", "")])}
    return subprocess.Popen(
        [sys.executable, "-c", code, *args],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        env=env,
        bufsize=0,
    )


def readline_within(proc: subprocess.Popen[bytes], timeout: float = 30.0) -> str:
    """The child's next stdout line, or an AssertionError after ``timeout`` s."""
    assert proc.stdout is not None
    deadline = time.monotonic() + timeout
    line = b""
    while not line.endswith(b"\n"):
        left = deadline - time.monotonic()
        if left <= 0 or not select.select([proc.stdout], [], [], left)[0]:
            raise AssertionError(f"no line from the child within {timeout}s (got {line!r})")
        chunk = os.read(proc.stdout.fileno(), 1)
        if not chunk:
            raise AssertionError(f"the child exited (got {line!r}, code {proc.wait(timeout)})")
        line += chunk
    return line.decode().strip()


def within(timeout: float, read: Callable[[], T], what: str = "the child") -> T:
    """``read()`` (a blocking read of a child's pipe, of any kind), or an
    AssertionError after ``timeout`` s instead of a test that hangs.

    The read runs in a daemon thread; after a timeout it stays blocked until
    the caller kills the child (which closes the pipe), as every caller does
    in its ``finally``.
    """
    box: list[T] = []
    error: list[BaseException] = []

    def run() -> None:
        try:
            box.append(read())
        except BaseException as exc:  # handed to the caller below
            error.append(exc)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    thread.join(timeout)
    if thread.is_alive():
        raise AssertionError(f"nothing from {what} within {timeout}s")
    if error:
        raise error[0]
    return box[0]
