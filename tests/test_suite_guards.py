"""The suite's own guards: a stuck test fails within the per-test timeout
instead of hanging CI, a skipped trio test names its reason, and the
Hypothesis profiles are what .ci/run and a nightly run expect.

The first two are checked on one inner pytest run, in a child process, of a
tiny test file, as CI would run it.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
from hypothesis import settings

TESTS = Path(__file__).parent

_INNER = """
import subprocess, sys

import pytest, trio

def _stuck_child():
    # A child that never writes: reading its stdout blocks forever.
    return subprocess.Popen(
        [sys.executable, "-c", "import time; time.sleep(600)"], stdout=subprocess.PIPE
    )

def test_a_stuck_child():
    child = _stuck_child()
    try:
        child.stdout.readline()
    finally:
        child.kill()
        child.wait(30)

async def test_a_stuck_child_under_trio():
    child = _stuck_child()
    try:
        child.stdout.readline()
    finally:
        child.kill()
        child.wait(30)

async def test_skips_inside_trio():
    async with trio.open_nursery() as nursery:
        nursery.start_soon(trio.sleep, 0)
        pytest.skip("the reason this trio test gives")

def test_fine():
    pass
"""


@pytest.fixture(scope="module")
def inner(tmp_path_factory: pytest.TempPathFactory) -> tuple[str, int, float]:
    """One inner pytest run (as CI runs it, with a 2 s timeout per test) on
    the tests above: its output, exit code and how long it took."""
    where = tmp_path_factory.mktemp("inner")
    (where / "test_inner.py").write_text(_INNER)
    path = os.pathsep.join([str(TESTS), os.environ.get("PYTHONPATH", "")])
    started = time.monotonic()
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-p", "_pytest_guards",
         "-o", "trio_mode=true", "-rfs", "-q", "--timeout=2", "test_inner.py"],
        cwd=where, capture_output=True, text=True, timeout=120,
        env={**os.environ, "PYTHONPATH": path},
    )  # fmt: skip
    return done.stdout + done.stderr, done.returncode, time.monotonic() - started


def test_a_stuck_child_process_fails_the_run_within_the_per_test_timeout(
    inner: tuple[str, int, float],
) -> None:
    out, code, took = inner
    assert code == 1, out  # tests failed (not: interrupted, not: hung)
    assert "2 failed, 1 passed, 1 skipped" in out, out
    failed = [line for line in out.splitlines() if line.startswith("FAILED ")]
    names = ("test_a_stuck_child ", "test_a_stuck_child_under_trio ")
    assert len(failed) == len(names), out
    for line, name in zip(failed, names, strict=True):
        assert f"test_inner.py::{name}" in line and "Timeout (>2.0s)" in line, line
    # Two stuck tests of 2 s each, and the interpreter's start: far below the
    # 120 s the outer run would wait for the inner one.
    assert took < 60, took


def test_a_trio_test_that_skips_names_its_reason(inner: tuple[str, int, float]) -> None:
    # pytest-trio alone reports "python.py:187: Skipped" (see tests/_pytest_guards.py).
    out, _, _ = inner
    assert "test_inner.py:31: the reason this trio test gives" in out, out


def test_the_ci_profile_is_derandomized_and_deep_goes_further() -> None:
    ci = settings.get_profile("ci")
    assert ci.derandomize and ci.database is None and ci.print_blob
    assert ci.max_examples == 2 * 100
    deep = settings.get_profile("deep")
    assert not deep.derandomize and deep.max_examples >= 10 * ci.max_examples
