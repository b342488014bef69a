"""How the library gets its loggers: a library's manners.

turnledger never configures logging. Its loggers resolve, each time one is
bound (an actor starting, a request being sent), to:

- the application's structlog configuration, once the application (or the
  command line, through :func:`turnledger.adapters.logging.configure_logging`)
  called :func:`structlog.configure`: the lines go through its processors,
  with the event names and fields of docs/logging.md;
- otherwise, the standard :mod:`logging` logger of the same name (under
  ``turnledger``): below WARNING nothing is printed unless the application
  asks (``logging.basicConfig(level=logging.INFO)``, a handler, a level), and
  warnings and errors reach its handlers, or stderr through Python's
  last-resort handler when it has none. The fields go on the record as
  ``record.turnledger`` (a dict) and, rendered ``key=value``, in the message.

structlog's own default (every line, debug included, printed to stdout) is
never used.
"""

from __future__ import annotations

import logging
from collections.abc import MutableMapping
from typing import Any

import structlog

__all__ = ["library_logger"]


def _render(_: Any, __: str, event_dict: MutableMapping[str, Any]) -> Any:
    event = event_dict.pop("event", "")
    fields = " ".join(f"{key}={value!r}" for key, value in event_dict.items())
    message = f"{event} {fields}" if fields else str(event)
    return (message,), {"extra": {"turnledger": {"event": event, **event_dict}}}


_PROCESSORS: list[Any] = [
    structlog.stdlib.filter_by_level,
    structlog.contextvars.merge_contextvars,
    structlog.processors.format_exc_info,
    _render,
]


class _StdlibBoundLogger(structlog.stdlib.BoundLogger):
    """structlog's stdlib logger, answering ``is_enabled_for`` like its
    filtering loggers do, so callers can skip building a line nobody sees."""

    def is_enabled_for(self, level: int) -> bool:
        return bool(self._logger.isEnabledFor(level))


class _LibraryLogger:
    """A logger that picks its destination when it is bound or used."""

    __slots__ = ("_name", "_stdlib")

    def __init__(self, name: str) -> None:
        self._name = name
        self._stdlib: Any = None

    def _resolve(self) -> Any:
        if structlog.is_configured():
            return structlog.get_logger(self._name)
        if self._stdlib is None:
            self._stdlib = structlog.wrap_logger(
                logging.getLogger(self._name),
                processors=_PROCESSORS,
                wrapper_class=_StdlibBoundLogger,
                cache_logger_on_first_use=True,
            )
        return self._stdlib

    def bind(self, **values: Any) -> Any:
        return self._resolve().bind(**values)

    def __getattr__(self, name: str) -> Any:
        # debug, info, warning, error, ...: resolved at each use.
        return getattr(self._resolve(), name)

    def __repr__(self) -> str:
        return f"<turnledger logger {self._name!r}>"


def library_logger(name: str) -> Any:
    """The logger the library logs ``name``'s lines with (see the module docstring)."""
    return _LibraryLogger(name)
