"""Pytest hooks that keep the suite honest (loaded by ``tests/conftest.py``;
an inner pytest run loads them with ``-p _pytest_guards``).

- A skipped trio test names its reason. pytest-trio turns a ``pytest.skip(why)``
  raised inside a trio run into a bare ``pytest.skip()`` (the reason and the
  place are lost, and the summary says ``python.py: Skipped``); the report is
  given back the original reason and the line that skipped.
"""

from __future__ import annotations

import os
from collections.abc import Generator
from types import TracebackType
from typing import Any

import _pytest
import pytest
from _pytest.outcomes import Skipped

__all__ = ["import_or_skip", "pytest_runtest_makereport"]

_PYTEST = os.path.dirname(pytest.__file__)
_PYTEST_PRIVATE = os.path.dirname(_pytest.__file__)


def _leaf_skip(exc: BaseException) -> Skipped | None:
    """The one Skipped inside the exception group pytest-trio caught."""
    group = exc.__context__
    if not isinstance(group, BaseExceptionGroup):
        return None
    leaves: list[BaseException] = []
    queue: list[BaseException] = [group]
    while queue:
        ex = queue.pop()
        if isinstance(ex, BaseExceptionGroup):
            queue.extend(ex.exceptions)
        else:
            leaves.append(ex)
    if len(leaves) == 1 and isinstance(leaves[0], Skipped):
        return leaves[0]
    return None


def _where(tb: TracebackType | None) -> tuple[str, int] | None:
    """The last frame of ``tb`` outside pytest itself: the line that skipped."""
    found = None
    while tb is not None:
        name = tb.tb_frame.f_code.co_filename
        if not name.startswith((_PYTEST, _PYTEST_PRIVATE)):
            found = (name, tb.tb_lineno)
        tb = tb.tb_next
    return found


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(
    item: pytest.Item, call: pytest.CallInfo[None]
) -> Generator[None, Any, None]:
    outcome = yield
    report: pytest.TestReport = outcome.get_result()
    if not report.skipped or call.excinfo is None:
        return
    bare = call.excinfo.value
    if not isinstance(bare, Skipped) or bare.msg:
        return
    leaf = _leaf_skip(bare)
    if leaf is None or not leaf.msg:
        return
    where = _where(leaf.__traceback__) or (str(item.path), (item.location[1] or 0))
    report.longrepr = (where[0], where[1], f"Skipped: {leaf.msg}")


def import_or_skip(module: str, *, required_by: str) -> Any:
    """``pytest.importorskip(module)``, except when the environment variable
    ``required_by`` is ``1`` (``.ci/run`` sets it): then a missing module
    fails the run instead of quietly skipping the tests that need it."""
    if os.environ.get(required_by) == "1":
        try:
            return __import__(module, fromlist=["_"])
        except ImportError as exc:
            pytest.fail(f"{required_by}=1 but {module} cannot be imported: {exc}", pytrace=False)
    return pytest.importorskip(module)
