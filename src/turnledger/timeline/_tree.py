"""A session's tree of branches as lines of text (see the package)."""

from __future__ import annotations

from typing import Final, Protocol

from ._rows import BranchEntry, Timeline

__all__ = ["branch_line", "branch_tree"]

#: Characters of a question a line of the tree shows.
_QUESTION_WIDTH: Final = 60
#: Spaces each level of the tree is indented by.
_INDENT: Final = "    "


class _Branch(Protocol):
    # A timeline's BranchEntry, or the BranchInfo hub.branches() lists.
    @property
    def branch_id(self) -> str: ...
    @property
    def parent(self) -> str | None: ...
    @property
    def at_turn(self) -> int: ...
    @property
    def kind(self) -> str | None: ...
    @property
    def length(self) -> int: ...
    @property
    def head(self) -> str | None: ...
    @property
    def active(self) -> bool: ...


def branch_line(branch: _Branch, *, id_width: int | None = None) -> str:
    """One branch in a line: ``* b2 from b1 after 1 turns (regenerate): 2
    turns, head g1`` (``*`` marks the active branch), as ``chat``'s
    ``/branches`` lists it; request ids cut to ``id_width`` characters.
    ``branch`` is a :class:`BranchEntry` or the
    :class:`~turnledger.sessions.BranchInfo` ``hub.branches()`` lists."""
    mark = "*" if branch.active else " "
    start = "" if branch.parent is None else f" from {branch.parent} after {branch.at_turn} turns"
    kind = "" if branch.kind is None else f" ({branch.kind})"
    head = "" if branch.head is None else f", head {_cut(branch.head, id_width)}"
    return f"{mark} {branch.branch_id}{start}{kind}: {branch.length} turns{head}"


def branch_tree(tl: Timeline, *, id_width: int | None = None) -> tuple[str, ...]:
    """The session's tree, a line per branch and per committed turn.

    Each branch lists the turns it added itself, numbered along its path
    from 1 (as ``chat``'s ``/history`` numbers them), each with its request
    id and question; a branch that starts from it is listed, one level in,
    just before the turn it asked differently or again (it keeps the turns
    above it). ``*`` marks the active branch. Request ids are cut to
    ``id_width`` characters (``None``: whole). For example::

        * main: 2 turns, head r1
            1. [r0] one
              b1 from main after 1 turns (edit): 2 turns, head e1
                2. [e1] deux
            2. [r1] two
    """
    questions = {r.request_id: r.question for r in tl.rows}
    children: dict[str, list[BranchEntry]] = {}
    for b in tl.branches:
        if b.parent is not None:
            children.setdefault(b.parent, []).append(b)
    lines: list[str] = []

    def draw(branch: BranchEntry, depth: int) -> None:
        pad = _INDENT * depth
        lines.append(pad + branch_line(branch, id_width=id_width))
        waiting = sorted(children.get(branch.branch_id, ()), key=lambda b: b.at_turn)
        for number, rid in enumerate(branch.turns, branch.at_turn + 1):
            # (stable: branches that start at the same turn stay in log order)
            while waiting and waiting[0].at_turn < number:
                draw(waiting.pop(0), depth + 1)
            question = _cut(" ".join(questions.get(rid, "").split()), _QUESTION_WIDTH)
            lines.append(f"{pad}{_INDENT}{number}. [{_cut(rid, id_width)}] {question}")
        for child in waiting:
            draw(child, depth + 1)

    for root in tl.branches:
        if root.parent is None:
            draw(root, 0)
    return tuple(lines)


def _cut(text: str, width: int | None) -> str:
    return text if width is None or len(text) <= width else text[: width - 1] + "…"
