"""A small tmpfs of a test's own, to fill up and free again: the full disk of
the disk-full tests (shared by tests).

Mounting one needs root, as the CI runs. Elsewhere those tests skip, unless
``TURNLEDGER_REQUIRE_TMPFS=1`` (set by ``.ci/run``): then they fail, so a CI
that cannot mount never passes them by.
"""

from __future__ import annotations

import errno
import os
import subprocess
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import NoReturn

import pytest

_FILLER = ".filler"


class Disk:
    """A mounted tmpfs at ``path``."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def fill(self) -> None:
        """Take every free block: the next write that needs one fails with
        ENOSPC (a write into the unused end of a file's last block still
        fits, as on any full disk)."""
        fd = os.open(self.path / _FILLER, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
        try:
            for size in (1 << 20, 1 << 12, 1):
                block = b"\0" * size
                try:
                    while True:
                        os.write(fd, block)
                except OSError as exc:
                    if exc.errno != errno.ENOSPC:
                        raise
        finally:
            os.close(fd)
        assert self.free_bytes() == 0

    def free(self) -> None:
        """Give the space back."""
        (self.path / _FILLER).unlink()

    def free_bytes(self) -> int:
        st = os.statvfs(self.path)
        return st.f_bavail * st.f_frsize


def _unavailable(why: str) -> NoReturn:
    if os.environ.get("TURNLEDGER_REQUIRE_TMPFS") == "1":
        pytest.fail(f"TURNLEDGER_REQUIRE_TMPFS=1 but {why}")
    pytest.skip(f"a disk-full test mounts a tmpfs: {why}")


@contextmanager
def small_tmpfs(where: Path, size: str = "4m") -> Iterator[Disk]:
    """Mount a tmpfs of ``size`` at ``where`` (created), unmounted after."""
    if os.geteuid() != 0:
        _unavailable("this test does not run as root")
    where.mkdir(parents=True, exist_ok=True)
    mount = ["mount", "-t", "tmpfs", "-o", f"size={size},mode=0700", "tmpfs", str(where)]
    try:
        done = subprocess.run(mount, capture_output=True, timeout=10, check=False)
    except (OSError, subprocess.TimeoutExpired) as exc:
        _unavailable(f"mount failed: {exc}")
    if done.returncode != 0:
        _unavailable(f"mount failed: {done.stderr.decode(errors='replace').strip()}")
    try:
        yield Disk(where)
    finally:
        # Lazy: a child process or a thread may still hold a file there.
        subprocess.run(["umount", "-l", str(where)], capture_output=True, timeout=10, check=False)
