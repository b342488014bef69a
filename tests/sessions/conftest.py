from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
import structlog

from ._helpers import HookedStore


def _drop(_logger: Any, _method: str, _event: Any) -> Any:
    raise structlog.DropEvent


@pytest.fixture(autouse=True)
def quiet_logs() -> Iterator[None]:
    # Tests that look at log lines use capture_logs(), which swaps these
    # processors out in place; the rest should not pay for rendering.
    structlog.configure(processors=[_drop])
    yield
    structlog.reset_defaults()


@pytest.fixture
def store() -> HookedStore:
    return HookedStore()
