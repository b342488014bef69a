"""Reading a child process's report lines with a deadline (shared by tests)."""

from __future__ import annotations

import os
import select
import subprocess
import time


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
            raise AssertionError(f"the child exited (got {line!r}, code {proc.wait()})")
        line += chunk
    return line.decode().strip()
