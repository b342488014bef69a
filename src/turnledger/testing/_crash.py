"""Crash trials: run sessions in a child process, SIGKILL it, check the store.

Each trial starts ``python -m turnledger.testing._crash`` as a child that runs
several sessions against a store, printing ``committed <session> <request>``
to its stdout (a pipe) right after each ``outcome()`` reported a commit. The
parent kills it with SIGKILL at a random moment, reopens the store and checks:

- every turn the child reported as committed is in the log;
- every session's events decode, with ``seq`` running 1, 2, 3 ... (no torn
  or duplicated event) and fold with ``replay``;
- a session left in flight is closed as ``interrupted`` when a hub next
  starts it, and then is at rest.

Used by ``tests/test_crash.py`` (a few dozen trials) and
``scripts/crash_campaign.py`` (thousands).
"""

from __future__ import annotations

import os
import random
import select
import signal
import subprocess
import sys
import time
from collections.abc import Sequence

import attrs
import trio

from ..events import DEFAULT_CODEC, TurnCommitted, TurnDiscarded, TurnSubmitted
from ..sessions import is_in_flight, open_hub, replay

__all__ = ["TrialResult", "check_store", "run_trial"]

SESSIONS = 6


@attrs.frozen
class TrialResult:
    """What one trial saw."""

    reported: int
    events: int
    committed: int
    recovered_in_flight: int
    killed_after: float
    #: ``(session id, request id)`` of every commit the child reported.
    reported_ids: tuple[tuple[str, str], ...] = ()


def _script(request: object) -> list[object]:
    from . import _scripted as s

    # A few chunks with short real pauses, so kills land in every phase.
    return [s.Begin(), s.Chunk("lo", 0.002), s.Chunk("rem", 0.003), s.Finish("lorem")]


async def _child(url: str) -> None:
    from ..adapters.stores import open_store
    from ._scripted import ScriptedProvider

    store = await open_store(url)
    provider = ScriptedProvider(_script)  # type: ignore[arg-type]
    out = sys.stdout

    async def session(hub: object, sid: str) -> None:
        n = 0
        while True:
            n += 1
            turn = await hub.submit(sid, f"question {n}")  # type: ignore[attr-defined]
            result = await turn.outcome()
            if result.kind == "committed":
                out.write(f"committed {sid} {turn.request_id}\n")
                out.flush()

    async with (
        open_hub(store, provider, model="crash-model", turn_deadline=5.0) as hub,
        trio.open_nursery() as nursery,
    ):
        for i in range(SESSIONS):
            nursery.start_soon(session, hub, f"s{i}")


def _first_line(child: subprocess.Popen[bytes], timeout: float) -> bytes:
    """The child's first stdout line; ``b""`` if it exits or says nothing
    within ``timeout`` s (a stuck child must not hang the trial)."""
    assert child.stdout is not None
    fd = child.stdout.fileno()
    deadline = time.monotonic() + timeout
    line = b""
    while not line.endswith(b"\n"):
        left = deadline - time.monotonic()
        if left <= 0 or not select.select([fd], [], [], left)[0]:
            return b""
        chunk = os.read(fd, 1)
        if not chunk:
            return b""
        line += chunk
    return line


def run_trial(
    url: str, *, rng: random.Random, max_delay: float = 0.5, first_commit_within: float = 60.0
) -> TrialResult:
    """One trial: start the child, wait for its first commit (at most
    ``first_commit_within`` seconds), SIGKILL it after a random further delay
    (up to ``max_delay`` seconds), then check the store."""
    child = subprocess.Popen(
        [sys.executable, "-m", "turnledger.testing._crash", url],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )
    # Wait until the child has committed at least once, then a random while.
    first = _first_line(child, first_commit_within)
    delay = rng.uniform(0.0, max_delay)
    time.sleep(delay)
    child.send_signal(signal.SIGKILL)
    rest, err = child.communicate(timeout=30)
    if not first:
        raise AssertionError(f"the child never committed: {err.decode(errors='replace')[-2000:]}")
    lines = [first.decode(), *rest.decode().splitlines()]
    reported = [tuple(line.split()[1:3]) for line in lines if line.startswith("committed ")]
    # A line cut by the kill is not a report.
    reported = [r for r in reported if len(r) == 2]
    events, committed, recovered = trio.run(check_store, url, reported)
    ids = tuple((sid, rid) for sid, rid in reported)
    return TrialResult(len(reported), events, committed, recovered, delay, ids)


async def check_store(url: str, reported: Sequence[tuple[str, ...]]) -> tuple[int, int, int]:
    """Check a store after a crash; returns (events, committed turns, recovered)."""
    from ..adapters.stores import open_store
    from ._scripted import ScriptedProvider

    store = await open_store(url)
    try:
        total = committed = 0
        in_flight: list[tuple[str, str]] = []
        logs = {}
        for sid in await store.session_ids():
            stored = await store.read(sid)
            assert [e.seq for e in stored] == list(range(1, len(stored) + 1)), sid
            events = [DEFAULT_CODEC.decode(e) for e in stored]
            state = replay(events)  # raises ReplayError on an impossible log
            logs[sid] = events
            total += len(events)
            committed += len(state.turns)
            if is_in_flight(state):
                in_flight.append((sid, state.request.request_id))  # type: ignore[union-attr]
        for sid, rid in reported:
            assert any(
                isinstance(e, TurnCommitted) and e.request_id == rid for e in logs.get(sid, [])
            ), f"{sid}/{rid} was reported committed but is not in the log"
        for events in logs.values():
            submitted = [e.request_id for e in events if isinstance(e, TurnSubmitted)]
            assert len(submitted) == len(set(submitted)), "a question was recorded twice"
        # The next start closes what was left in flight.
        async with open_hub(store, ScriptedProvider(), model="crash-model") as hub:
            for sid, rid in in_flight:
                state = await hub.open_session(sid)
                assert not is_in_flight(state)
                last = DEFAULT_CODEC.decode((await store.read(sid))[-1])
                assert isinstance(last, TurnDiscarded), last
                assert (last.request_id, last.reason) == (rid, "interrupted"), last
        return total, committed, len(in_flight)
    finally:
        await store.aclose()


if __name__ == "__main__":
    import logging

    import structlog

    # stdout is the report pipe: keep log lines out of it.
    structlog.configure(wrapper_class=structlog.make_filtering_bound_logger(logging.CRITICAL))
    trio.run(_child, sys.argv[1])
