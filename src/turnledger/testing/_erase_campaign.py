"""SIGKILL during an erasure: one trial, and the check that the store ends
with the session either fully erased or fully intact.

A trial writes sessions straight into a store (one of them holding a canary
in its system prompt, questions, answers and a tool result), starts a child
process that opens the store and erases that session, kills the child with
SIGKILL at a random moment after it announced the erasure, reopens the store
as the next writer would, and judges:

- ``erased``: the session reads as unknown, and (for the stores in files)
  no file in the store's folder holds the canary's bytes;
- ``intact``: the session reads back exactly as it was written;
- anything else is ``torn``: a failure.

Every other session must read back exactly as written, whatever the outcome.
``scripts/erase_campaign.py`` runs the trials by the hundred.

With ``encrypted=True`` the store is opened with a key (a key file beside
the store, ``keys.txt``; the key ring is the store's default one), so the
erasure destroys the session's data key first (crypto-shredding), then its
rows. ``erased`` then also requires that the key ring holds neither the
session's key nor a record of an erasure under way, once the store was
reopened as the next writer would (which finishes an erasure a kill cut
short); ``intact`` requires that the session still opens with its key.
"""

from __future__ import annotations

import functools
import os
import random
import select
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Literal

import attrs
import trio

from ..adapters.stores import open_store, store_kind
from ..adapters.stores._open import default_keyring
from ..events import (
    DEFAULT_CODEC,
    Event,
    EventStore,
    RequestId,
    SessionStarted,
    StoredEvent,
    StreamStarted,
    ToolCall,
    ToolCallsRequested,
    ToolResultRecorded,
    ToolRoundSubmitted,
    TurnCommitted,
    TurnSubmitted,
)

__all__ = ["CANARY", "EraseTrial", "calibrate", "key_file_for", "prepare", "run_erase_trial"]

#: The text the erased session holds and no byte of the store may keep.
CANARY = "CANARY-0b9e41-SIGKILL-ERASE"
TARGET = "target"

_CHILD = """
import sys, time, trio
from turnledger.adapters.stores import open_store

async def main():
    keys = None
    if len(sys.argv) > 3:
        from turnledger.adapters.encryption import keys_from_file
        keys = keys_from_file(sys.argv[3])
    store = await open_store(sys.argv[1], keys=keys)
    print("erasing", flush=True)
    t0 = time.perf_counter()
    await store.erase(sys.argv[2])
    print(f"erased {time.perf_counter() - t0:.6f}", flush=True)
    await store.aclose()

trio.run(main)
"""


@attrs.frozen
class EraseTrial:
    """How one trial ended."""

    outcome: Literal["erased", "intact", "torn"]
    #: Seconds from the child's announcement to the kill (None: not killed).
    delay: float | None
    #: What was wrong (empty unless ``torn`` or another session changed).
    problems: tuple[str, ...] = ()
    #: Encrypted stores: the kill fell after the key's destruction and
    #: before the rows went, and reopening the store finished the erasure.
    finished_on_reopen: bool = False


def _session(sid: str, secret: bool, turns: int, t0: float) -> list[StoredEvent]:
    mark = CANARY if secret else "plain"
    events: list[Event] = [SessionStarted(f"system {mark}", "m")]
    for n in range(turns):
        rid = RequestId(f"{sid}-r{n}")
        events += [
            TurnSubmitted(rid, f"question {n} {mark} " + "x" * 200, n, 0, 300),
            StreamStarted(rid),
        ]
        if n == 0:
            events += [
                ToolCallsRequested(rid, 0, (ToolCall("c1", "lookup", '{"q":"x"}'),)),
                ToolResultRecorded(rid, "c1", f"tool result {mark}"),
                ToolRoundSubmitted(rid, 1, 400),
                StreamStarted(rid),
            ]
        events.append(TurnCommitted(rid, f"answer {n} {mark} " + "y" * 300, "stop"))
    return [
        DEFAULT_CODEC.encode(ev, session_id=sid, seq=i, recorded_at=t0 + i)
        for i, ev in enumerate(events, 1)
    ]


def key_file_for(folder: Path) -> Path:
    """The key file of an encrypted trial's store, made on first use."""
    from ..adapters.encryption import new_key_line

    path = folder / "keys.txt"
    if not path.exists():
        path.write_text(new_key_line("k1") + "\n")
        path.chmod(0o600)
    return path


def _keys(key_file: Path | None) -> Any:
    if key_file is None:
        return None
    from ..adapters.encryption import keys_from_file

    return keys_from_file(key_file)


async def prepare(
    url: str, *, sessions: int = 20, turns: int = 4, key_file: Path | None = None
) -> dict[str, list[Any]]:
    """Write ``sessions`` sessions (the one in the middle is :data:`TARGET`,
    with the canary), sealed under keys from ``key_file`` if given; returns
    what each holds, to compare with later."""
    store = await open_store(url, keys=_keys(key_file))
    written: dict[str, list[Any]] = {}
    try:
        for i in range(sessions):
            sid = TARGET if i == sessions // 2 else f"s-{i}"
            batch = _session(sid, sid == TARGET, turns, 1.7e9 + i)
            await store.append(sid, batch, 0)
            written[sid] = _content(batch)
    finally:
        await store.aclose()
    return written


def _content(events: list[StoredEvent]) -> list[Any]:
    return [(e.seq, e.tag, e.schema_version, dict(e.payload)) for e in events]


def _child(url: str, key_file: Path | None) -> subprocess.Popen[str]:
    extra = [] if key_file is None else [str(key_file)]
    return subprocess.Popen(
        [sys.executable, "-c", _CHILD, url, TARGET, *extra],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def _announced(proc: subprocess.Popen[str], timeout: float) -> None:
    """Wait, at most ``timeout`` seconds, for the child's ``erasing`` line.

    Reads the pipe's bytes as they come (never a blocking ``readline``: a
    child stuck after half a line cannot hold the trial past its deadline).
    """
    assert proc.stdout is not None
    fd = proc.stdout.fileno()
    deadline = time.monotonic() + timeout
    seen = b""
    while (left := deadline - time.monotonic()) > 0:
        ready, _, _ = select.select([fd], [], [], min(left, 0.1))
        if not ready:
            continue
        chunk = os.read(fd, 4096)
        if not chunk:
            break
        seen += chunk
        if any(line.startswith(b"erasing") for line in seen.split(b"\n")[:-1]):
            return
    proc.kill()
    try:
        _, err = proc.communicate(timeout=10)
    except subprocess.TimeoutExpired:
        err = ""
    raise RuntimeError(f"the erasing child never started: {err}")


def calibrate(url: str, timeout: float = 60.0, *, key_file: Path | None = None) -> float:
    """Seconds one erasure takes in a child (on a store :func:`prepare` wrote)."""
    proc = _child(url, key_file)
    out, err = proc.communicate(timeout=timeout)
    for line in out.splitlines():
        if line.startswith("erased "):
            return float(line.split()[1])
    raise RuntimeError(f"the erasing child failed: {err}")


def _files_with_canary(folder: Path) -> list[str]:
    needle = CANARY.encode()
    return [p.name for p in sorted(folder.iterdir()) if p.is_file() and needle in p.read_bytes()]


async def _judge(
    url: str, written: dict[str, list[Any]], folder: Path | None, key_file: Path | None
) -> EraseTrial:
    left_pending: list[str] = []
    if key_file is not None:  # what the kill left in the key ring
        from ..adapters.encryption import PostgresKeyRing, SQLiteKeyRing

        at = default_keyring(url)
        ring: Any = await (
            PostgresKeyRing.open(at) if store_kind(at) == "postgres" else SQLiteKeyRing.open(at)
        )
        try:
            left_pending = await ring.pending_erasures()
        finally:
            await ring.aclose()
    # The next writer, as after a crash (with a key, it finishes an erasure
    # the kill cut short).
    store: EventStore = await open_store(url, keys=_keys(key_file))
    keyed: set[str] = set()
    pending: list[str] = []
    try:
        found = {sid: _content(await store.read(sid)) for sid in written}
        ids = await store.session_ids()
        opened_ring = getattr(store, "ring", None)
        if key_file is not None and opened_ring is not None:
            keyed = set(await opened_ring.get_many(list(written)))
            pending = await opened_ring.pending_erasures()
    finally:
        await store.aclose()
    problems = [
        f"{sid} changed"
        for sid, content in written.items()
        if sid != TARGET and found[sid] != content
    ]
    target = found[TARGET]
    outcome: Literal["erased", "intact", "torn"]
    if target == written[TARGET] and TARGET in ids:
        outcome = "intact"
    elif not target and TARGET not in ids:
        outcome = "erased"
        left = _files_with_canary(folder) if folder is not None else []
        if left:
            outcome = "torn"
            problems.append(f"erased, but the canary is still in {left}")
        if key_file is not None and (TARGET in keyed or pending):
            outcome = "torn"
            problems.append(f"erased, but the key ring keeps {TARGET}'s key or {pending}")
    else:
        outcome = "torn"
        problems.append(f"{TARGET} holds {len(target)} of its {len(written[TARGET])} events")
    return EraseTrial(outcome, None, tuple(problems), TARGET in left_pending)


def run_erase_trial(
    url: str,
    rng: random.Random,
    max_delay: float,
    *,
    timeout: float = 60.0,
    key_file: Path | None = None,
) -> EraseTrial:
    """One trial on a store :func:`prepare` has not written yet: prepare,
    erase in a child, SIGKILL it after ``U(0, max_delay)`` seconds, judge.
    With ``key_file`` the store is encrypted under its keys."""
    written = trio.run(functools.partial(prepare, url, key_file=key_file))
    folder = None if store_kind(url) == "postgres" else Path(url).parent
    proc = _child(url, key_file)
    try:
        _announced(proc, timeout)
        delay = rng.uniform(0, max_delay)
        time.sleep(delay)
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(timeout)
        for stream in (proc.stdout, proc.stderr):
            if stream is not None:
                stream.close()
    trial = trio.run(_judge, url, written, folder, key_file)
    return attrs.evolve(trial, delay=delay)
