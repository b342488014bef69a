"""Logging setup for applications (the command line uses it).

The library itself never configures logging: its loggers use the
application's structlog configuration if there is one, and standard
``logging`` otherwise (docs/logging.md). An application that wants
turnledger's lines the way the command line shows them calls
:func:`configure_logging` once; it configures structlog for the process.
"""

from __future__ import annotations

import logging
import os
import sys
from collections.abc import Sequence
from typing import TextIO

import structlog

__all__ = ["configure_logging"]


def configure_logging(
    *,
    json: bool | None = None,
    verbosity: int = 0,
    stream: TextIO | None = None,
    processors: Sequence[structlog.types.Processor] = (),
) -> None:
    """Send structlog output to ``stream`` (stderr by default).

    Args:
        json: JSON lines (for ``jq``) or console lines; ``None`` picks console
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
        structlog.processors.JSONRenderer(ensure_ascii=False)
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
