"""Committed history as a persistent, append-only sequence.

States are immutable, but copying the whole history on every commit would make
replay quadratic. ``History`` views share one underlying list: a view sees its
first ``n`` items, and appending to the newest view extends the shared list in
place. Appending to an older view (a branch) copies. Views therefore behave as
immutable values at O(1) amortized cost per commit.

The same trick keeps, per request encoder, the running sizes the projection
needs, so a projection is a binary search rather than a re-serialization.

A history (and the endings) reopened from a snapshot may hold only its
newest items at first: the older ones stay behind a loader (an
:class:`Older`, shared by every view of that storage), called the first
time something needs an older item, and then put in place for every view.
Reading the length, the newest items, appending and recording need no
older item.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Hashable, Iterator, Sequence
from typing import Any, Generic, TypeVar, overload

import attrs

from ..events import RequestId, ToolCall

__all__ = ["Ending", "Endings", "History", "Older", "ToolResult", "ToolRound", "Turn"]

T = TypeVar("T")
V = TypeVar("V")


@attrs.frozen
class ToolResult:
    """The result of one tool call, as the model sees it."""

    call_id: str
    content: str
    is_error: bool = False


@attrs.frozen
class ToolRound:
    """One round of a tool turn: the assistant's calls and their results
    (complete once every call has its result)."""

    calls: tuple[ToolCall, ...]
    content: str = ""
    results: tuple[ToolResult, ...] = ()

    @property
    def complete(self) -> bool:
        return len(self.results) == len(self.calls)

    def pending(self) -> tuple[str, ...]:
        """Call ids still waiting for a result."""
        done = {r.call_id for r in self.results}
        return tuple(c.call_id for c in self.calls if c.call_id not in done)


@attrs.frozen
class Turn:
    """One committed turn: the question, its tool rounds (if any, every call
    with its result) and its accepted answer."""

    request_id: RequestId
    question: str
    answer: str
    rounds: tuple[ToolRound, ...] = ()


class Older(Generic[T]):
    """The ``count`` oldest items of a shared list, not loaded yet: ``load``
    returns them (oldest first) the first time one is needed. A loader that
    fails raises (a snapshot's older part found damaged, see
    :mod:`turnledger.sessions._snapshot`); it is called again on the next
    need. Safe to fill from any thread (a snapshot is taken on a worker
    thread)."""

    __slots__ = ("_load", "_lock", "count")

    def __init__(self, count: int, load: Callable[[], Sequence[T]]) -> None:
        self.count = count
        self._load: Callable[[], Sequence[T]] | None = load
        self._lock = threading.Lock()

    @property
    def pending(self) -> bool:
        """True until the older items are in place."""
        return self._load is not None

    def fill(self, items: list[T]) -> None:
        """Put the older items in front of ``items`` (once)."""
        with self._lock:
            load = self._load
            if load is None:
                return
            older = load()
            if len(older) != self.count:
                raise ValueError(f"{len(older)} older items, {self.count} expected")
            items[0:0] = older
            self._load = None


class _Shared(Generic[T]):
    __slots__ = ("_items", "_n", "_older")

    def __init__(self, items: list[T], n: int) -> None:
        self._items = items
        self._n = n
        self._older: Older[T] | None = None

    def _off(self) -> int:
        """How many of the first items are not in ``_items`` yet."""
        older = self._older
        if older is None:
            return 0
        if older.pending:
            return older.count
        self._older = None
        return 0

    def _ready(self) -> None:
        """Put every older item in place."""
        older = self._older
        if older is not None:
            older.fill(self._items)
            self._older = None

    def _extended(self, item: T) -> list[T]:
        items = self._items
        if len(items) + self._off() != self._n:
            self._ready()
            items = items[: self._n]  # a branch: stop sharing
        items.append(item)
        return items

    def __len__(self) -> int:
        return self._n

    def __iter__(self) -> Iterator[T]:
        self._ready()
        items = self._items
        for i in range(self._n):
            yield items[i]

    def __eq__(self, other: object) -> bool:
        if type(other) is not type(self):
            return NotImplemented
        assert isinstance(other, _Shared)
        if self._n != other._n:
            return False
        if self._items is other._items and self._off() == other._off():
            return True
        self._ready()
        other._ready()
        return self._items[: self._n] == other._items[: other._n]

    def __hash__(self) -> int:
        self._ready()
        return hash(tuple(self._items[: self._n]))


class History(_Shared[Turn], Sequence[Turn]):
    """The committed turns of a session, oldest first. Immutable."""

    __slots__ = ("_prefix",)

    def __init__(self, turns: Sequence[Turn] = ()) -> None:
        super().__init__(list(turns), len(turns))
        # key -> a list aligned with the turns plus one: running sizes
        # (_prefix[k][i] is the cost of the first i turns, see prefix()), or
        # values per turn after a placeholder (see per_turn()). A branch
        # keeps the first n + 1 items of each.
        self._prefix: dict[Hashable, list[Any]] = {}

    @classmethod
    def _view(
        cls,
        items: list[Turn],
        n: int,
        prefix: dict[Hashable, list[Any]],
        older: Older[Turn] | None = None,
    ) -> History:
        h = cls.__new__(cls)
        h._items = items
        h._n = n
        h._prefix = prefix
        h._older = older
        return h

    @classmethod
    def lazy(cls, newest: list[Turn], older: Older[Turn]) -> History:
        """The history of ``older.count`` turns not loaded yet followed by
        ``newest``: what a snapshot reopens (see :class:`Older`)."""
        return cls._view(newest, older.count + len(newest), {}, older)

    def append(self, turn: Turn) -> History:
        """A new history with ``turn`` at the end; ``self`` is unchanged."""
        shared = len(self._items) + self._off() == self._n
        items = self._extended(turn)
        prefix = self._prefix if shared else {k: v[: self._n + 1] for k, v in self._prefix.items()}
        return History._view(items, self._n + 1, prefix, self._older if shared else None)

    def upto(self, n: int) -> History:
        """The first ``n`` turns, as a view that shares this one's storage
        (O(1)): where a branch starts. Appending to it copies, as for any
        older view; ``self`` is unchanged."""
        if not 0 <= n <= self._n:
            raise IndexError("history length out of range")
        if n < self._off():
            self._ready()
        return History._view(self._items, n, self._prefix, self._older)

    def extend(self, turns: Sequence[Turn]) -> History:
        """A new history with ``turns`` at the end: what appending each in
        turn gives, with one view built instead of one per turn (the
        replay fold's form)."""
        if not turns:
            return self
        shared = len(self._items) + self._off() == self._n
        if not shared:
            self._ready()
        items = self._items if shared else self._items[: self._n]
        items.extend(turns)
        prefix = self._prefix if shared else {k: v[: self._n + 1] for k, v in self._prefix.items()}
        return History._view(items, self._n + len(turns), prefix, self._older if shared else None)

    @overload
    def __getitem__(self, index: int) -> Turn: ...
    @overload
    def __getitem__(self, index: slice) -> Sequence[Turn]: ...
    def __getitem__(self, index: int | slice) -> Turn | Sequence[Turn]:
        if isinstance(index, slice):
            self._ready()
            return tuple(self._items[: self._n][index])
        if index < 0:
            index += self._n
        if not 0 <= index < self._n:
            raise IndexError("history index out of range")
        off = self._off()
        if index < off:
            self._ready()
            off = 0
        return self._items[index - off]

    def __repr__(self) -> str:
        return f"History({list(self)!r})"

    def prefix(self, key: Hashable, values: Sequence[V], cost: Callable[[V], int]) -> list[int]:
        """Running sums ``P`` with ``P[i] = sum(cost(values[j]) for j in 1..i)``,
        over ``values`` aligned as :meth:`per_turn` returns them (the cost of
        the first ``i`` turns).

        Computed once per turn and key, then shared by every later view.
        The returned list may be longer than ``len(self) + 1``; read only
        ``P[: len(self) + 1]``.
        """
        self._ready()
        sums: list[int] | None = self._prefix.get(key)
        if sums is None:
            sums = self._prefix[key] = [0]
        while len(sums) <= self._n:
            sums.append(sums[-1] + cost(values[len(sums)]))
        return sums

    def per_turn(self, key: Hashable, fn: Callable[[Turn], V]) -> list[V]:
        """``V`` with ``V[i + 1] = fn(self[i])`` (``V[0]`` is a placeholder).

        Computed once per turn and key, then shared by every later view, as
        for :meth:`prefix`: ``fn`` must be pure. Read only ``V[1 : len(self) + 1]``.
        """
        self._ready()
        values: list[V] | None = self._prefix.get(key)
        if values is None:
            values = self._prefix[key] = [None]
        items = self._items
        while len(values) <= self._n:
            values.append(fn(items[len(values) - 1]))
        return values


@attrs.frozen
class Ending:
    """How a request ended, as far as the session recorded it.

    The session's own record (``kind`` is ``"in_flight"`` while it runs).
    Callers get a :data:`~turnledger.sessions.TurnResult` from
    ``TurnHandle.outcome()`` instead.
    """

    kind: str  # "committed" | "discarded" | "rejected"
    reason: str = ""
    detail: str = ""
    answer: str | None = None


class Endings(_Shared[tuple[RequestId, Ending]]):
    """How every request id the session has seen ended. Immutable.

    Each request id is recorded at most once (a seen id is never submitted
    again), so a shared list plus a shared index is enough.
    """

    __slots__ = ("_index",)

    def __init__(self) -> None:
        super().__init__([], 0)
        self._index: dict[RequestId, int] = {}

    @classmethod
    def lazy(
        cls,
        newest: list[tuple[RequestId, Ending]],
        older: Older[tuple[RequestId, Ending]],
        index: dict[RequestId, int],
    ) -> Endings:
        """The endings of ``older.count`` requests not loaded yet followed
        by ``newest``; ``index`` holds every request id's position (so that
        a request id is known without loading, see :class:`Older`)."""
        new = cls.__new__(cls)
        new._items = newest
        new._n = older.count + len(newest)
        new._index = index
        new._older = older
        return new

    def get(self, request_id: RequestId) -> Ending | None:
        i = self._index.get(request_id)
        if i is None or i >= self._n:
            return None
        off = self._off()
        if i < off:
            self._ready()
            off = 0
        return self._items[i - off][1]

    def record(self, request_id: RequestId, ending: Ending) -> Endings:
        if self._index.get(request_id, self._n) < self._n:
            raise ValueError(f"request {request_id!r} already ended")
        shared = len(self._items) + self._off() == self._n
        items = self._extended((request_id, ending))
        index = self._index if shared else {rid: i for i, (rid, _) in enumerate(items[:-1])}
        index[request_id] = self._n
        new = Endings.__new__(Endings)
        new._items = items
        new._n = self._n + 1
        new._index = index
        new._older = self._older if shared else None
        return new

    def record_all(self, endings: Sequence[tuple[RequestId, Ending]]) -> Endings:
        """What :meth:`record` of each pair in turn gives, with one object
        built instead of one per pair (the replay fold's form).

        Raises:
            ValueError: a request id already ended (or repeats in ``endings``).
        """
        if not endings:
            return self
        for request_id, _ in endings:
            if self._index.get(request_id, self._n) < self._n:
                raise ValueError(f"request {request_id!r} already ended")
        if len({rid for rid, _ in endings}) != len(endings):
            raise ValueError("a request id repeats")
        shared = len(self._items) + self._off() == self._n
        if not shared:
            self._ready()
        items = self._items if shared else self._items[: self._n]
        index = self._index if shared else {rid: i for i, (rid, _) in enumerate(items)}
        for i, pair in enumerate(endings, self._n):
            index[pair[0]] = i
        items.extend(endings)
        new = Endings.__new__(Endings)
        new._items = items
        new._n = self._n + len(endings)
        new._index = index
        new._older = self._older if shared else None
        return new

    def __repr__(self) -> str:
        return f"Endings({dict(self)!r})"

    def __contains__(self, request_id: Any) -> bool:
        return self.get(request_id) is not None
