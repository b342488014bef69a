"""Retention, decided: which sessions a policy erases, and where a trim to
the newest turns cuts. Pure functions of stored events and a clock reading;
the runtime (``turnledger.runtime._lifecycle``) applies what they decide.

A session's log is kept whole or cut at a turn's first event: a trim keeps
the ``SessionStarted`` and every event from the ``TurnSubmitted`` of the
oldest kept turn on, so a turn's tool rounds, retries and results always go
(or stay) together, and replaying the kept events gives the newest turns,
exactly as they were.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Literal

import attrs

from ..events import StoredEvent

__all__ = ["RetentionPolicy", "RetentionStep", "plan_retention", "subject_of"]


def _positive_or_none(kind: type[Any] | tuple[type[Any], ...]) -> Any:
    def check(_inst: object, attr: attrs.Attribute[Any], value: object) -> None:
        if value is None:
            return
        if isinstance(value, bool) or not isinstance(value, kind) or value <= 0:
            raise ValueError(f"{attr.name} must be positive or None, not {value!r}")

    return check


@attrs.frozen
class RetentionPolicy:
    """How long sessions are kept, and how much of each.

    ``max_idle``: seconds since a session's last event after which it is
    erased whole. ``max_turns``: committed turns a session keeps; older
    turns are cut off (whole turns, tool rounds included). Either may be
    ``None`` (no limit). A session's own retention (recorded when it was
    created) applies too: the stricter of the two wins.
    """

    max_idle: float | None = attrs.field(default=None, validator=_positive_or_none((int, float)))
    max_turns: int | None = attrs.field(default=None, validator=_positive_or_none(int))

    def with_session(self, started: StoredEvent | None) -> RetentionPolicy:
        """This policy made stricter by the session's own (from its
        ``session_started`` envelope)."""
        if started is None or started.tag != "session_started":
            return self
        idle, turns = self.max_idle, self.max_turns
        own_idle = started.payload.get("retain_seconds")
        own_turns = started.payload.get("retain_turns")
        if type(own_idle) is int and own_idle > 0:
            idle = own_idle if idle is None else min(idle, own_idle)
        if type(own_turns) is int and own_turns > 0:
            turns = own_turns if turns is None else min(turns, own_turns)
        return RetentionPolicy(idle, turns)


@attrs.frozen
class RetentionStep:
    """What a policy does to one session."""

    session_id: str
    #: ``erase``: the whole session; ``trim``: the oldest turns.
    action: Literal["erase", "trim"]
    #: Events the session holds now.
    events: int
    #: Events kept (``seq`` from 1): empty for ``erase``.
    keep: tuple[StoredEvent, ...] = ()
    #: Committed turns cut off (a trim) or erased.
    turns: int = 0


#: Tags whose session a trim keeps whole (never trimmed, only erased): a
#: branch (its point is a place on its parent's path), a fork (its turns are
#: counted from its source's), a summary (its turns by their place) and pins.
_BRANCH_TAGS = frozenset(
    {
        "branch_started",
        "branch_switched",
        "session_forked",
        "summary_recorded",
        "pin_added",
        "pin_removed",
    }
)


def subject_of(stored: Sequence[StoredEvent]) -> str | None:
    """The subject a session's first event names (``None``: none, or a
    session written before subjects were recorded)."""
    if not stored or stored[0].tag != "session_started":
        return None
    subject = stored[0].payload.get("subject")
    return subject if isinstance(subject, str) else None


def _committed(stored: Sequence[StoredEvent]) -> list[str]:
    return [ev.payload.get("request_id", "") for ev in stored if ev.tag == "turn_committed"]


def plan_retention(
    session_id: str, stored: Sequence[StoredEvent], policy: RetentionPolicy, now: float
) -> RetentionStep | None:
    """What ``policy`` (with the session's own) does to the session whose
    events are ``stored`` at time ``now``; ``None``: nothing."""
    if not stored:
        return None
    policy = policy.with_session(stored[0])
    committed = _committed(stored)
    if policy.max_idle is not None and now - stored[-1].recorded_at >= policy.max_idle:
        return RetentionStep(session_id, "erase", len(stored), turns=len(committed))
    limit = policy.max_turns
    if limit is None or len(committed) <= limit:
        return None
    oldest_kept = committed[len(committed) - limit]
    cut = next(
        (
            ev.seq
            for ev in stored
            if ev.tag == "turn_submitted" and ev.payload.get("request_id") == oldest_kept
        ),
        None,
    )
    if cut is None or stored[0].tag != "session_started":
        return None  # not a log this release can cut safely: kept whole
    if any(ev.tag in _BRANCH_TAGS for ev in stored):
        # A branch keeps turns by their place on its parent's path: cutting
        # the oldest turns would move every branch point (and a fork's own
        # turns follow the ones it shares), a summary's turns, and drop the
        # pins made before the cut. Kept whole.
        return None
    kept = [stored[0], *(ev for ev in stored if ev.seq >= cut)]
    keep = tuple(
        StoredEvent(session_id, i, ev.tag, ev.schema_version, ev.payload, ev.recorded_at)
        for i, ev in enumerate(kept, 1)
    )
    return RetentionStep(session_id, "trim", len(stored), keep, turns=len(committed) - limit)
