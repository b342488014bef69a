"""Given/when/then helpers for the pure state machine."""

from __future__ import annotations

from collections.abc import Sequence

import attrs

from turnledger.events import Event, RequestId
from turnledger.sessions import (
    Budget,
    Message,
    SessionState,
    Start,
    decide,
    evolve,
    initial_state,
    replay,
)

from ._reference import meaning, observed


def rid(s: str) -> RequestId:
    return RequestId(s)


@attrs.define
class Session:
    """A pure session driven message by message, keeping its log."""

    state: SessionState = attrs.field(factory=initial_state)
    log: list[Event] = attrs.field(factory=list)
    budget: Budget = attrs.field(factory=Budget)

    def when(self, message: Message, *, preview_chars: int = 0) -> tuple[Event, ...]:
        events = decide(self.state, message, budget=self.budget, preview_chars=preview_chars)
        for ev in events:
            self.state = evolve(self.state, ev)
        self.log.extend(events)
        return events

    def then_replay_matches(self) -> None:
        """Replaying the log gives the state built step by step, and that
        state says what the log means by the independent reference fold."""
        assert replay(self.log) == self.state
        assert observed(self.state) == meaning(self.log)


def given(*messages: Message, budget: Budget | None = None, start: Start | None = None) -> Session:
    s = Session(budget=budget or Budget())
    s.when(start or Start("be brief", "test-model"))
    for m in messages:
        s.when(m)
    return s


def given_events(events: Sequence[Event]) -> SessionState:
    return replay(events)
