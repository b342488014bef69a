"""The session runtime's log vocabulary: event names and field names.

These names are a stable interface (``grep``/``jq`` scripts depend on them);
docs/logging.md documents each one. Adding a field is compatible; renaming or
removing one is not. The library never configures structlog: it asks for a
logger and binds ``session_id`` (per actor) and ``request_id`` (per turn).
"""

from __future__ import annotations

from typing import Any, Final

import structlog

__all__ = ["EVENTS", "FIELDS", "LOGGER_NAME", "get_logger"]

#: The name passed to :func:`structlog.get_logger`.
LOGGER_NAME: Final = "turnledger.sessions"

#: Every log event name the session runtime emits, with its level.
EVENTS: Final[dict[str, str]] = {
    "actor_started": "debug",
    "actor_stopped": "debug",
    "actor_failed": "error",
    "message_received": "debug",
    "transition": "info",
    "late_completion": "info",
    "append_conflict": "warning",
    "request_error": "error",
}

#: Every key that may appear in those lines (besides structlog's own
#: ``event`` and whatever the application's processors add).
FIELDS: Final[frozenset[str]] = frozenset(
    {
        "session_id",
        "request_id",
        "msg_type",
        "stale",
        "in_flight",
        "question_chars",
        "answer_chars",
        "finish_reason",
        "detail",
        "from",
        "to",
        "tag",
        "seq",
        "reason",
        "preview_chars",
        "turns_sent",
        "turns_dropped",
        "request_bytes",
        "outcome",
        "delay_s",
        "version",
        "phase",
        "why",
        "error",
        "expected_version",
        "actual_version",
        "attempt",
    }
)


def get_logger() -> Any:
    """The runtime's logger (whatever the application configured)."""
    return structlog.get_logger(LOGGER_NAME)
