"""Crash campaigns: thousands of SIGKILL trials, counting what a crash broke.

A trial runs the child of :mod:`turnledger.testing._crash` (several sessions
submitting turn after turn, writing ``committed <session> <request>`` to its
stdout after each ``outcome()`` reported a commit), kills it with SIGKILL at
a random moment after its first commit, reopens the store and surveys it.
Where :func:`~turnledger.testing._crash.check_store` stops at the first
failed check, :func:`survey` counts, so a campaign reports totals:

- ``lost``: turns the child reported committed that are not in the log;
- ``torn``: sessions whose events do not read back whole (a ``seq`` gap or
  repeat, an event that does not decode, a log ``replay`` refuses, a store
  that will not reopen), and questions recorded twice;
- ``unrecovered``: sessions left in flight that the next hub did not close
  as ``interrupted``.

Children are forked from a ``multiprocessing`` fork server that has already
imported turnledger, so a trial costs the run and the check, not an
interpreter start. The child is still a process of its own that opens the
store itself and dies by SIGKILL; only the imports are shared.

Used by ``scripts/crash_campaign.py``.
"""

from __future__ import annotations

import multiprocessing
import os
import random
import select
import sys
import time
from collections.abc import Sequence
from typing import Any

import attrs
import trio

from .._errors import StoreError
from ..events import DEFAULT_CODEC, TurnCommitted, TurnDiscarded, TurnSubmitted
from ..sessions import is_in_flight, open_hub, replay

__all__ = ["Survey", "Trial", "run_campaign_trial", "survey"]

#: Seconds a child may take to report its first commit.
FIRST_COMMIT_TIMEOUT = 60.0


@attrs.frozen
class Survey:
    """What the reopened store held after one kill."""

    events: int = 0
    committed: int = 0
    lost: int = 0
    torn: int = 0
    in_flight: int = 0
    unrecovered: int = 0
    problems: tuple[str, ...] = ()


@attrs.frozen
class Trial:
    """One trial: the commits the child reported, and the survey."""

    reported: int
    killed_after: float
    survey: Survey


async def survey(url: str, reported: Sequence[tuple[str, str]]) -> Survey:
    """Reopen ``url`` after a crash and count what was lost or torn (see the
    module docstring); never raises for what it finds."""
    from ..adapters.stores import open_store
    from ._scripted import ScriptedProvider

    problems: list[str] = []
    try:
        store = await open_store(url)
    except StoreError as exc:
        return Survey(torn=1, problems=(f"the store does not reopen: {exc!r}",))
    try:
        total = committed = torn = 0
        commits: dict[str, set[str]] = {}
        in_flight: list[tuple[str, str]] = []
        for sid in await store.session_ids():
            try:
                stored = await store.read(sid)
                if [e.seq for e in stored] != list(range(1, len(stored) + 1)):
                    raise ValueError(f"seq runs {[e.seq for e in stored]}")
                events = [DEFAULT_CODEC.decode(e) for e in stored]
                state = replay(events)
            except Exception as exc:  # anything that stops a log reading back
                torn += 1
                problems.append(f"{sid}: {exc!r}")
                continue
            total += len(events)
            committed += len(state.turns)
            commits[sid] = {e.request_id for e in events if isinstance(e, TurnCommitted)}
            submitted = [e.request_id for e in events if isinstance(e, TurnSubmitted)]
            if len(submitted) != len(set(submitted)):
                torn += 1
                problems.append(f"{sid}: a question recorded twice")
            if is_in_flight(state):
                in_flight.append((sid, state.request.request_id))  # type: ignore[union-attr]
        missing = [(sid, rid) for sid, rid in reported if rid not in commits.get(sid, set())]
        problems += [f"{sid}/{rid} reported committed, not in the log" for sid, rid in missing]
        unrecovered = 0
        if in_flight:  # the next start closes what was left in flight
            async with open_hub(store, ScriptedProvider(), model="crash-model") as hub:
                for sid, rid in in_flight:
                    state = await hub.open_session(sid)
                    last = DEFAULT_CODEC.decode((await store.read(sid))[-1])
                    closed = isinstance(last, TurnDiscarded) and (
                        last.request_id,
                        last.reason,
                    ) == (rid, "interrupted")
                    if is_in_flight(state) or not closed:
                        unrecovered += 1
                        problems.append(f"{sid}/{rid} not closed as interrupted: {last!r}")
        return Survey(
            total, committed, len(missing), torn, len(in_flight), unrecovered, tuple(problems)
        )
    finally:
        await store.aclose()


def _child(url: str, out: Any) -> None:
    """The forked child: the crash child of ``_crash`` with its stdout on the
    pipe end ``out`` (a ``multiprocessing`` connection, used as a plain fd)."""
    import logging

    import structlog

    from . import _crash

    os.dup2(out.fileno(), 1)
    sys.stdout = open(1, "w", buffering=1, closefd=False)  # noqa: SIM115
    structlog.configure(wrapper_class=structlog.make_filtering_bound_logger(logging.CRITICAL))
    trio.run(_crash._child, url)


_context: Any = None


def _forkserver() -> Any:
    global _context
    if _context is None:
        _context = multiprocessing.get_context("forkserver")
        _context.set_forkserver_preload(
            ["turnledger.testing._crash", "turnledger.adapters.stores", "psycopg", "psycopg_pool"]
        )
    return _context


def _read_until(fd: int, deadline: float, *, first_line: bool) -> bytes:
    """Bytes from ``fd``: up to the first newline, or until end of file."""
    data = b""
    while time.monotonic() < deadline:
        ready, _, _ = select.select([fd], [], [], max(0.0, deadline - time.monotonic()))
        if not ready:
            break
        chunk = os.read(fd, 65536)
        if not chunk:
            return data
        data += chunk
        if first_line and b"\n" in data:
            return data
    raise TimeoutError(f"no {'first commit' if first_line else 'end of output'} in time")


def run_campaign_trial(url: str, *, rng: random.Random, max_delay: float = 0.5) -> Trial:
    """Fork a crash child on ``url``, wait for its first commit, SIGKILL it a
    random while later (up to ``max_delay`` seconds), and survey the store.

    Raises:
        TimeoutError: the child reported no commit within
            :data:`FIRST_COMMIT_TIMEOUT` seconds (it is killed first).
    """
    ctx = _forkserver()
    reader, writer = ctx.Pipe(duplex=False)
    with reader:
        with writer:
            proc = ctx.Process(target=_child, args=(url, writer), daemon=True)
            proc.start()
        try:
            fd = reader.fileno()
            data = _read_until(fd, time.monotonic() + FIRST_COMMIT_TIMEOUT, first_line=True)
            delay = rng.uniform(0.0, max_delay)
            time.sleep(delay)
        finally:
            proc.kill()
            proc.join(30)
        data += _read_until(fd, time.monotonic() + 30, first_line=False)
    if proc.exitcode is None:
        raise TimeoutError("the killed child did not exit")
    lines = data.decode(errors="replace").split("\n")[:-1]  # a cut last line is no report
    reported = [
        (parts[1], parts[2])
        for parts in (line.split() for line in lines)
        if len(parts) == 3 and parts[0] == "committed"
    ]
    if not reported:
        raise AssertionError("the child never committed")
    return Trial(len(reported), delay, trio.run(survey, url, reported))
