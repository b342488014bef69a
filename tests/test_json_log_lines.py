"""The JSON lines ``configure_logging(json=True)`` writes: one object a line,
every field kept, whatever orjson can or cannot write itself."""

from __future__ import annotations

import io
import json
from collections.abc import Iterator
from typing import Any

import pytest
import structlog

from turnledger.adapters.logging import configure_logging


@pytest.fixture
def lines() -> Iterator[io.StringIO]:
    out = io.StringIO()
    configure_logging(json=True, verbosity=1, stream=out)
    try:
        yield out
    finally:
        structlog.reset_defaults()


class _Opaque:
    def __repr__(self) -> str:
        return "<opaque>"


def _read(out: io.StringIO) -> list[dict[str, Any]]:
    return [json.loads(line) for line in out.getvalue().splitlines()]


def test_every_field_is_kept_as_json(lines: io.StringIO) -> None:
    log = structlog.get_logger("turnledger.sessions").bind(session_id="s-1")
    log.info("transition", request_id="r-1", seq=3, **{"from": "Idle", "to": "Pending"})
    log.debug("message_received", msg_type="Submit", stale=False, in_flight=None)
    first, second = _read(lines)
    assert first["event"] == "transition" and first["level"] == "info"
    assert first["session_id"] == "s-1" and first["from"] == "Idle" and first["seq"] == 3
    assert "timestamp" in first
    assert second["stale"] is False and second["in_flight"] is None


def test_text_stays_utf8_and_odd_values_still_make_a_line(lines: io.StringIO) -> None:
    log = structlog.get_logger("turnledger.sessions")
    log.info("note", detail='你好 🌱 "quoted" \n line')
    log.info("big", n=2**70, obj=_Opaque())
    log.info("keys", counts={1: "one"})
    text = lines.getvalue()
    assert "你好 🌱" in text  # UTF-8 as is, not \\u escapes
    note, big, keys = _read(lines)
    assert note["detail"] == '你好 🌱 "quoted" \n line'
    assert big["n"] == 2**70 and big["obj"] == "<opaque>"
    assert keys["counts"] == {"1": "one"}
    assert len(text.splitlines()) == 3


def test_an_exception_is_rendered_into_the_line(lines: io.StringIO) -> None:
    log = structlog.get_logger("turnledger.sessions")
    try:
        raise ValueError("boom")
    except ValueError:
        log.error("actor_failed", exc_info=True)
    (line,) = _read(lines)
    assert "ValueError: boom" in line["exception"]
