"""Logging setup for applications (the command line uses it).

The library itself never configures logging: its loggers use the
application's structlog configuration if there is one, and standard
``logging`` otherwise (docs/logging.md). An application that wants
turnledger's lines the way the command line shows them calls
:func:`configure_logging` once; it configures structlog for the process.
"""

from __future__ import annotations

import json
import logging
import os
import sys
from collections.abc import Sequence
from typing import Any, TextIO

import orjson
import structlog

__all__ = ["configure_logging"]


def _json_line(event_dict: Any, **kw: Any) -> str:
    """One JSON line, written by orjson (UTF-8 as is, compact).

    structlog's JSONRenderer with ``json.dumps`` spends about 5 µs on a line
    of the session runtime, and a turn writes about three at INFO (six at
    DEBUG); orjson writes the same line in under 1 µs
    (``benchmarks/streams_logs_floor.py``). What orjson cannot write (an
    integer past 64 bits, a key that is not a string) goes to ``json.dumps``
    with the same fallback for other objects (their ``repr``).
    """
    default = kw.get("default")
    try:
        return orjson.dumps(event_dict, default=default).decode()
    except TypeError:
        return json.dumps(event_dict, ensure_ascii=False, default=default)


def configure_logging(
    *,
    json: bool | None = None,
    verbosity: int = 0,
    stream: TextIO | None = None,
    processors: Sequence[structlog.types.Processor] = (),
) -> None:
    """Send structlog output to ``stream`` (stderr by default).

    Args:
        json: JSON lines (for ``jq``; compact, UTF-8 as is) or console lines; ``None`` picks console
            when the stream is a terminal and JSON otherwise.
        verbosity: JSON lines carry the transitions (info) at 0 and add one
            line per mailbox message (debug) from 1. A console is meant for a
            person reading a transcript beside it: warnings only at 0, the
            transitions at 1, every message from 2.
        processors: run on every line that passes the level, once its
            context and ``level`` are in, before the time stamp and the
            rendering: to note a line or drop it (``structlog.DropEvent``);
            the command line keeps there what a command says in its own words.
    """
    out = stream or sys.stderr
    if json is None:
        json = not out.isatty()
    if json:
        level = logging.INFO if verbosity <= 0 else logging.DEBUG
    else:
        level = (logging.WARNING, logging.INFO)[verbosity] if verbosity < 2 else logging.DEBUG
    renderer: structlog.types.Processor = (
        structlog.processors.JSONRenderer(serializer=_json_line)
        if json
        else structlog.dev.ConsoleRenderer(colors=out.isatty() and not os.environ.get("NO_COLOR"))
    )
    structlog.configure(
        processors=[
            structlog.contextvars.merge_contextvars,
            structlog.processors.add_log_level,
            *processors,
            structlog.processors.TimeStamper(fmt="iso", utc=True),
            structlog.processors.format_exc_info,
            renderer,
        ],
        wrapper_class=structlog.make_filtering_bound_logger(level),
        logger_factory=structlog.PrintLoggerFactory(out),
        cache_logger_on_first_use=False,
    )
