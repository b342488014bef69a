"""One session's timeline: the rows every view of a log draws.

Pure: stored envelopes in, frozen rows out (no trio, no HTTP, no files).
``turnledger log`` (text and ``--json``), ``turnledger log --html``, the
``serve`` page and its JSON routes all render what :func:`timeline` builds,
so no view can show a fact another one misses.

A :class:`Timeline` holds one :class:`Row` per request id, in order of first
appearance. A row carries:

- its phases: every event of the request as a :class:`Step` (the phase the
  session moved from and to, why, and the token figures), the times it was
  submitted, started streaming and ended;
- its outcome (``committed``, ``discarded``, ``rejected`` or
  ``in_flight``) with reason and detail, and a sentence saying why the turn
  is or is not in history (:func:`explain`);
- its retries (:class:`RetryEntry`: a request sent again, smaller, after a
  context overflow) and tool rounds (:class:`ToolRoundEntry`: tool names,
  call ids, argument and result sizes, durations; never the arguments or
  results themselves);
- its late completions (:class:`LateCompletion`, with their delay after the
  turn ended);
- its links: the request that superseded it and the ones it superseded,
  and for a ``busy`` rejection the request that was in flight;
- its usage and budgets: tokens reported, the estimate of the request, and
  the session's prompt token budget when it was projected.
- its branch: the branch it was asked on, and the branch it started
  (:class:`BranchStart`: an edit or a regenerate) if it did.

The timeline also holds the session's tree: every branch
(:class:`BranchEntry`: where it starts, its length, its newest turn and
the turns it added itself), the active one (whose path ``history`` is) and
every switch (:class:`BranchSwitch`). :func:`branch_tree` draws the tree as
lines of text (``turnledger log`` prints them); the page draws the same.

:func:`session_summary` is the one line a list of sessions shows, with the
same keys in ``turnledger sessions --json`` and ``GET /v1/sessions``.
"""

from ._rows import (
    BranchEntry,
    BranchStart,
    BranchSwitch,
    End,
    LateCompletion,
    RetryEntry,
    Row,
    Step,
    Timeline,
    ToolCallEntry,
    ToolRoundEntry,
    explain,
    iso_time,
    phase_name,
    session_summary,
    timeline,
)
from ._tree import branch_line, branch_tree

__all__ = [
    "BranchEntry",
    "BranchStart",
    "BranchSwitch",
    "End",
    "LateCompletion",
    "RetryEntry",
    "Row",
    "Step",
    "Timeline",
    "ToolCallEntry",
    "ToolRoundEntry",
    "branch_line",
    "branch_tree",
    "explain",
    "iso_time",
    "phase_name",
    "session_summary",
    "timeline",
]
