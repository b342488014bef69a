"""Fault injection for simulations: a store wrapper and a provider.

:class:`FaultyStore` wraps any :class:`~turnledger.events.EventStore` and,
drawing from a seeded random source, makes appends meet what disks and
servers do to them:

- ``latency``: the append takes long (a spike of up to a minute);
- ``enospc_append`` / ``eio_append``: the write fails before anything is
  written (``StoreFull`` / ``StoreError`` carrying the ``OSError``);
- ``enospc_commit`` / ``eio_commit``: the same at commit, after the write's
  time was spent; nothing is written;
- ``fsync``: the batch reached the file but syncing it failed: whether it
  survives is unknown (the seed decides), and the store refuses everything
  after it until it is reopened, as a database that cannot trust its own
  file must (:attr:`FaultyStore.poisoned`);
- ``connection_lost``: the connection dropped mid-transaction (PostgreSQL):
  the commit happened or not (the seed decides), the caller cannot tell.

Processes. Each wrapper stands for one process on the shared inner store.
:meth:`FaultyStore.kill` is the crash point: from then on the wrapper
refuses every call, so a process considered dead writes nothing more, and
what the inner store holds is what was durable. :meth:`FaultyStore.freeze`
stalls the process instead (a partition, a long pause): its calls wait
until :meth:`FaultyStore.thaw`, while another process may take its sessions
over. Ownership is fenced as the PostgreSQL store fences it: ``acquire``
takes the session's lease at the next epoch (:class:`Leases`, shared by the
processes), and an append under an epoch that is no longer the session's is
refused with ``LeaseLost``. :attr:`FaultyStore.writes` logs the epoch of
every batch that reached the inner store.

:class:`FaultyProvider` plays, per request, a normal stream or a fault:
resets before and after the first byte, stalls, duplicated, reordered or
split chunks, completions that come late (after the turn ended), failures,
unusable answers and tool calls. Every answer it returns names the request
and round it answers (``"<request id>/<round>/<n>"``), so a check can tell
where any text in history came from.
"""

from __future__ import annotations

import errno
import itertools
import os
import random
from collections.abc import Callable, Sequence
from typing import Final, TypeVar

import trio

from .._errors import (
    LeaseLost,
    ProviderError,
    SessionOwnedElsewhere,
    StoreError,
    StoreFull,
    StoreUnavailable,
)
from ..events import DiscardReason, Erasure, EventDecoder, EventStore, StoredEvent, ToolCall
from ..sessions import ChatRequest, Completion, JsonChatEncoder, RequestEncoder, StreamSink

__all__ = [
    "PROVIDER_FAULTS",
    "STORE_FAULTS",
    "FaultyProvider",
    "FaultyStore",
    "Leases",
    "dangling_calls",
]

_T = TypeVar("_T")
_R = TypeVar("_R")

#: What an append may meet (besides going through).
STORE_FAULTS: Final = (
    "latency",
    "enospc_append",
    "eio_append",
    "enospc_commit",
    "eio_commit",
    "fsync",
    "connection_lost",
)

#: What a request may meet, with its weight (``ok`` included).
PROVIDER_FAULTS: Final = {
    "ok": 10,
    "split": 3,
    "duplicated": 2,
    "reordered": 2,
    "reset_before": 2,
    "reset_after": 2,
    "stall": 1,
    "late": 5,
    "failed": 1,
    "unusable": 1,
    "tools": 4,
}


def _os_error(code: int, what: str) -> StoreError:
    exc = OSError(code, os.strerror(code))
    error = (StoreFull if code == errno.ENOSPC else StoreError)(f"{what}: {exc}")
    error.__cause__ = exc
    return error


class Leases:
    """Who owns each session, and at which epoch: shared by the processes
    (:class:`FaultyStore` wrappers) of one inner store."""

    def __init__(self) -> None:
        #: session id -> (epoch, the owning process, or None once released)
        self.owners: dict[str, tuple[int, FaultyStore | None]] = {}

    def take(self, session_id: str, store: FaultyStore) -> int:
        """Take the session at the next epoch; returns the epoch.

        Raises:
            SessionOwnedElsewhere: another live process owns it (a stalled
                or dead owner's lease has run out: it is taken over).
        """
        epoch, owner = self.owners.get(session_id, (0, None))
        if owner is not None and owner is not store and owner.alive:
            raise SessionOwnedElsewhere(session_id, "its lease is live")
        self.owners[session_id] = (epoch + 1, store)
        return epoch + 1


class FaultyStore:
    """An :class:`~turnledger.events.EventStore` that injects faults into
    ``inner``'s appends (see the module docstring). A session must be
    acquired (as the hub's actors do) before it is appended to.

    Args:
        inner: the store that keeps what was durable; never closed here.
        rng: the random source of faults.
        rate: the chance that an append meets a fault.
        faults: the faults to choose from (default: all of :data:`STORE_FAULTS`).
        leases: the owners of sessions, shared by the wrappers of ``inner``.
        writes: the log of ``(epoch, session_id, first seq, count)`` of every
            batch that reached ``inner``, shared by the wrappers of ``inner``.
    """

    def __init__(
        self,
        inner: EventStore,
        rng: random.Random,
        *,
        rate: float = 0.05,
        faults: Sequence[str] = STORE_FAULTS,
        leases: Leases | None = None,
        writes: list[tuple[int, str, int, int]] | None = None,
    ) -> None:
        self.inner = inner
        self._rng = rng
        self._rate = rate
        self._faults = tuple(faults)
        unknown = set(self._faults) - set(STORE_FAULTS)
        if unknown:
            raise ValueError(f"unknown store faults: {sorted(unknown)}")
        self.leases = Leases() if leases is None else leases
        #: The epoch of each session this process acquired.
        self.held: dict[str, int] = {}
        self.writes: list[tuple[int, str, int, int]] = [] if writes is None else writes
        self._thawed: trio.Event | None = None
        #: Faults injected so far, by session.
        self.injected: dict[str, list[str]] = {}
        #: Set by an ``fsync`` fault: every later call is refused.
        self.poisoned = False
        self.dead = False

    def kill(self) -> None:
        """The crash point: the process is dead; nothing it does reaches the store."""
        self.dead = True

    @property
    def alive(self) -> bool:
        """Neither dead nor stalled."""
        return not self.dead and self._thawed is None

    def freeze(self) -> None:
        """Stall the process: its calls wait until :meth:`thaw`."""
        self._thawed = trio.Event()

    def thaw(self) -> None:
        """Let a stalled process go on."""
        if self._thawed is not None:
            self._thawed.set()
            self._thawed = None

    async def _check(self) -> None:
        while self._thawed is not None:
            await self._thawed.wait()
        self._check_now()

    def _check_now(self) -> None:
        if self.dead:
            raise StoreUnavailable("the process is dead")
        if self.poisoned:
            raise StoreError("an earlier fsync failed: reopen the store")

    async def _write(self, session_id: str, events: Sequence[StoredEvent], version: int) -> int:
        await self._check()
        epoch = self.held.get(session_id, 0)
        current = self.leases.owners.get(session_id, (0, None))
        if current != (epoch, self):
            raise LeaseLost(session_id, epoch, current[0])
        new = await self.inner.append(session_id, events, version)
        if events:
            self.writes.append((epoch, session_id, events[0].seq, len(events)))
        return new

    async def append(
        self, session_id: str, events: Sequence[StoredEvent], expected_version: int
    ) -> int:
        await self._check()
        rng = self._rng
        fault = rng.choice(self._faults) if events and rng.random() < self._rate else None
        if fault is None:
            return await self._write(session_id, events, expected_version)
        self.injected.setdefault(session_id, []).append(fault)
        if fault == "latency":
            await trio.sleep(rng.uniform(1.0, 60.0))
            return await self._write(session_id, events, expected_version)
        if fault.endswith("_append"):
            raise _os_error(errno.ENOSPC if fault.startswith("enospc") else errno.EIO, "append")
        await trio.sleep(rng.uniform(0.0, 2.0))  # the write's time, then the end
        await self._check()
        if fault.endswith("_commit"):
            raise _os_error(errno.ENOSPC if fault.startswith("enospc") else errno.EIO, "commit")
        if rng.random() < 0.5:
            # fsync / connection_lost: the batch may have made it after all.
            await self._write(session_id, events, expected_version)
        if fault == "fsync":
            self.poisoned = True
            raise _os_error(errno.EIO, "fsync")
        raise StoreUnavailable("the connection was lost in the middle of the transaction")

    async def read(self, session_id: str, after: int = 0) -> list[StoredEvent]:
        await self._check()
        return await self.inner.read(session_id, after)

    async def read_decoded(
        self, session_id: str, decoder: EventDecoder[_T], after: int = 0
    ) -> list[_T]:
        await self._check()
        return await self.inner.read_decoded(session_id, decoder, after)

    async def read_decoded_many(
        self,
        session_ids: Sequence[str],
        decoder: EventDecoder[_T],
        fold: Callable[[str, list[_T]], _R],
    ) -> dict[str, _R]:
        await self._check()
        return await self.inner.read_decoded_many(session_ids, decoder, fold)

    async def read_all(self, after: int = 0, limit: int | None = None) -> list[StoredEvent]:
        await self._check()
        return await self.inner.read_all(after, limit)

    async def session_ids(self) -> list[str]:
        await self._check()
        return await self.inner.session_ids()

    async def erase(self, session_id: str, keep: Sequence[StoredEvent] = ()) -> Erasure:
        """``inner``'s erasure (no fault is injected into it).

        Cancellation: as ``inner``'s.
        """
        await self._check()
        return await self.inner.erase(session_id, keep)

    async def erasures(self) -> list[Erasure]:
        return await self.inner.erasures()

    async def acquire(self, session_id: str) -> None:
        await self._check()
        await self.inner.acquire(session_id)
        self.held[session_id] = self.leases.take(session_id, self)

    async def release(self, session_id: str) -> None:
        await self._check()
        epoch = self.held.pop(session_id, None)
        if epoch is not None and self.leases.owners.get(session_id) == (epoch, self):
            self.leases.owners[session_id] = (epoch, None)
        await self.inner.release(session_id)

    async def aclose(self) -> None:
        """Nothing: ``inner`` outlives its incarnations."""
        await trio.lowlevel.checkpoint()


def dangling_calls(request: ChatRequest) -> list[str]:
    """Tool call ids in ``request`` that no later ``tool`` message answers."""
    answered = {m.tool_call_id for m in request.messages if m.role == "tool"}
    return [
        c.call_id
        for m in request.messages
        if m.role == "assistant"
        for c in m.tool_calls
        if c.call_id not in answered
    ]


class FaultyProvider:
    """A :class:`~turnledger.sessions.Provider` that plays a random stream or
    fault per request (see the module docstring).

    Args:
        rng: the random source.
        weights: the chance of each kind of reply (default :data:`PROVIDER_FAULTS`).
        tools: names of the tools it may call (when the request offers them).
    """

    def __init__(
        self,
        rng: random.Random,
        *,
        weights: dict[str, int] | None = None,
        tools: Sequence[str] = (),
    ) -> None:
        self._rng = rng
        w = PROVIDER_FAULTS if weights is None else weights
        self._kinds = list(w)
        self._weights = [w[k] for k in self._kinds]
        self._tools = tuple(tools)
        self._encoder: RequestEncoder = JsonChatEncoder()
        self._n = 0
        #: Every request received, in order.
        self.requests: list[ChatRequest] = []
        #: Every answer returned, by ``(request id, round)``.
        self.answers: dict[tuple[str, int], list[str]] = {}

    @property
    def encoder(self) -> RequestEncoder:
        return self._encoder

    async def complete(self, request: ChatRequest, sink: StreamSink) -> Completion:
        rng = self._rng
        self._n += 1
        self.requests.append(request)
        rid, rnd = request.request_id, request.round
        kind = rng.choices(self._kinds, self._weights)[0]
        if kind == "tools" and not (request.tools and self._tools and rnd < 2):
            kind = "ok"
        answer = f"{rid}/{rnd}/{self._n}"
        await trio.sleep(rng.expovariate(0.2))  # the time to the first byte, 5 s on average
        if kind == "reset_before":
            raise ProviderError("connection reset before the first byte", reason="transport")
        await sink.started()
        if kind == "tools":
            calls = tuple(
                ToolCall(f"c{self._n}-{i}", rng.choice(self._tools), "{}")
                for i in range(rng.randint(1, 3))
            )
            return self._done(rid, rnd, Completion("", "tool_calls", tool_calls=calls))
        chunks = _chunks(answer, kind, rng)
        cut = rng.randrange(len(chunks) + 1) if kind == "reset_after" else len(chunks)
        for chunk in chunks[:cut]:
            await sink.delta(chunk)
            await trio.sleep(rng.uniform(0.0, 0.2))
        if kind == "reset_after":
            raise ProviderError("connection reset in the middle of the stream", reason="transport")
        if kind == "stall":
            await trio.sleep(rng.uniform(10.0, 120.0))
        if kind == "failed":
            reason: DiscardReason = rng.choice(
                ["http_status", "protocol", "malformed", "provider_error"]
            )
            raise ProviderError("the server failed", reason=reason)
        if kind == "late":
            # The last part cannot be interrupted (a server or SDK that
            # finishes what it started): the answer comes however long it
            # takes, whether the turn still waits for it or not.
            with trio.CancelScope(shield=True):
                await trio.sleep(rng.uniform(0.0, 45.0))
                return self._done(rid, rnd, Completion(answer, "stop"))
        if kind == "unusable":
            text, finish = rng.choice([("", "stop"), (answer, "length"), (answer, None)])
            return self._done(rid, rnd, Completion(text, finish))
        return self._done(rid, rnd, Completion(answer, "stop"))

    def _done(self, rid: str, rnd: int, completion: Completion) -> Completion:
        self.answers.setdefault((rid, rnd), []).append(completion.answer)
        return completion


def _chunks(answer: str, kind: str, rng: random.Random) -> list[str]:
    """The deltas of ``answer``: split at random, and for the mangled kinds
    duplicated or reordered (so the preview is not the answer)."""
    cuts = sorted(rng.sample(range(1, len(answer)), min(len(answer) - 1, rng.randint(0, 4))))
    bounds = [0, *cuts, len(answer)]
    chunks = [answer[a:b] for a, b in itertools.pairwise(bounds)]
    if kind == "split":
        chunks = [c for chunk in chunks for c in chunk]  # one character each
    elif kind == "duplicated":
        i = rng.randrange(len(chunks))
        chunks.insert(i, chunks[i])
    elif kind == "reordered" and len(chunks) > 1:
        i = rng.randrange(len(chunks) - 1)
        chunks[i], chunks[i + 1] = chunks[i + 1], chunks[i]
    return chunks
