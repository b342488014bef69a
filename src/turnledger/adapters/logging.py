"""Logging setup for applications (the command line uses it).

The library itself never configures structlog: it only logs through
``structlog.get_logger()``. An application that wants turnledger's lines the
way the command line shows them calls :func:`configure_logging` once.
"""

from __future__ import annotations

import logging
import sys
from typing import TextIO

import structlog

__all__ = ["configure_logging"]


def configure_logging(
    *, json: bool | None = None, verbose: bool = False, stream: TextIO | None = None
) -> None:
    """Send structlog output to ``stream`` (stderr by default).

    Args:
        json: JSON lines (for ``jq``) or console lines; ``None`` picks console
            when the stream is a terminal and JSON otherwise.
        verbose: include debug lines (one per mailbox message).
    """
    out = stream or sys.stderr
    if json is None:
        json = not out.isatty()
    renderer: structlog.types.Processor = (
        structlog.processors.JSONRenderer(ensure_ascii=False)
        if json
        else structlog.dev.ConsoleRenderer(colors=out.isatty())
    )
    structlog.configure(
        processors=[
            structlog.contextvars.merge_contextvars,
            structlog.processors.add_log_level,
            structlog.processors.TimeStamper(fmt="iso", utc=True),
            structlog.processors.format_exc_info,
            renderer,
        ],
        wrapper_class=structlog.make_filtering_bound_logger(
            logging.DEBUG if verbose else logging.INFO
        ),
        logger_factory=structlog.PrintLoggerFactory(out),
        cache_logger_on_first_use=False,
    )
