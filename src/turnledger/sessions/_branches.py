"""A session's tree of turns, as branches (pure).

Every session has the branch ``main``. An edit or a regenerate starts a new
branch from the active one: it keeps the active branch's first ``at_turn``
turns (by reference: a :meth:`History.upto` view, O(1)) and becomes the
active branch. A switch makes another branch active. History, everywhere
else in the core, is the active branch's path: ``state.turns``.

The state keeps a record of every branch (``state.branches``), but the
active branch's record is refreshed only when it stops being active: a
commit touches ``state.turns`` alone and stays O(1), however many branches
there are. :func:`branch_records` gives the records with the active one up
to date. A session that never branched has no records at all (``()``), so
an old log replays to exactly the state it always did.
"""

from __future__ import annotations

import attrs

from .._errors import UnknownBranch
from ..events import MAIN_BRANCH, BranchId, BranchKind, RequestId
from ._history import History

__all__ = ["Branch", "BranchInfo", "branch_records", "find_branch", "infos", "next_branch_id"]


@attrs.frozen
class Branch:
    """One branch's record: where it starts and, when it was last saved,
    its turns and the first turn a request may draw from."""

    branch_id: BranchId
    #: The branch it started from (``None``: ``main``).
    parent: BranchId | None
    #: Turns of ``parent`` it keeps (``0`` for ``main``).
    at_turn: int
    #: ``edit`` or ``regenerate`` (``None``: ``main``).
    kind: BranchKind | None
    turns: History
    context_start: int = 0


@attrs.frozen
class BranchInfo:
    """What ``branches()`` lists for one branch."""

    branch_id: BranchId
    parent: BranchId | None
    at_turn: int
    kind: BranchKind | None
    #: Committed turns on the branch's path (the shared prefix included).
    length: int
    #: Request id of the branch's newest turn (``None``: it has none).
    head: RequestId | None
    active: bool


def branch_records(
    branches: tuple[Branch, ...], active: BranchId, turns: History, context_start: int
) -> tuple[Branch, ...]:
    """Every branch's record, the active one's saved from ``turns``.

    ``branches`` empty: a session that never branched, whose only branch is
    ``main``."""
    if not branches:
        return (Branch(MAIN_BRANCH, None, 0, None, turns, context_start),)
    return tuple(
        attrs.evolve(b, turns=turns, context_start=context_start) if b.branch_id == active else b
        for b in branches
    )


def find_branch(branches: tuple[Branch, ...], branch_id: str) -> Branch:
    """The record of ``branch_id``.

    Raises:
        UnknownBranch: the session has no such branch.
    """
    for b in branches:
        if b.branch_id == branch_id:
            return b
    known = ", ".join(b.branch_id for b in branches)
    raise UnknownBranch(f"no branch {branch_id!r}; the session has {known}")


def next_branch_id(branches: tuple[Branch, ...]) -> BranchId:
    """The id the next branch gets: ``b1``, ``b2``... (``main`` is the first)."""
    return BranchId(f"b{max(len(branches), 1)}")


def infos(branches: tuple[Branch, ...], active: BranchId) -> tuple[BranchInfo, ...]:
    """The listing of ``branches`` (records from :func:`branch_records`)."""
    return tuple(
        BranchInfo(
            b.branch_id,
            b.parent,
            b.at_turn,
            b.kind,
            len(b.turns),
            b.turns[-1].request_id if len(b.turns) else None,
            b.branch_id == active,
        )
        for b in branches
    )
