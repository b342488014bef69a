"""The trio runtime of sessions: the hub, the session actors and their log.

Everything that runs, waits or writes for a session lives here; the pure
core it drives (``decide``/``evolve``, the projection, the request encoder,
the ``Provider`` port) lives in :mod:`turnledger.sessions` and never imports
this package. ``turnledger.sessions`` re-exports :func:`open_hub` and the hub's
types lazily, so ``from turnledger.sessions import open_hub`` keeps working.

Modules:

- ``_hub``: :func:`open_hub`, :class:`Hub`, :class:`TurnHandle`; the only
  owner of which actors exist, which are starting and which are stopping.
- ``_actor``: one session's task: mailbox, batches, write-then-evolve, effects;
  its request task (kept between turns) and the tool tasks of a turn.
- ``_mailbox``: an actor's mailbox (a bounded deque handing over batches).
- ``_context``: :class:`Runtime`, the one immutable object an actor gets from
  its hub (store, provider, config, budget, counters, nursery, timers).
- ``_timers``: the deadline and idle timers of every turn in flight (one
  task and one heap per hub, instead of a cancel scope per wait).
- ``_window``: which context window a new session gets (asked of the
  provider once per model).
- ``_tickets``: what a caller holds for one Submit (preview and result).
- ``_lifecycle``: erasure and retention over a store (a subject's sessions,
  a policy's steps applied).
- ``_summaries``: who writes a summary (a function, or the session's model
  with a named prompt) and when the hub's :class:`SummaryPolicy` asks.
- ``_log``: the log vocabulary (event and field names) and the field builders.
"""

from ._hub import Hub, HubStatistics, TurnHandle, open_hub
from ._lifecycle import erase_sessions, forks_of, prune_store, sessions_of_subject, with_forks
from ._summaries import PROMPTS, ModelSummarizer, SummaryFunction, SummaryPolicy

__all__ = [
    "PROMPTS",
    "Hub",
    "HubStatistics",
    "ModelSummarizer",
    "SummaryFunction",
    "SummaryPolicy",
    "TurnHandle",
    "erase_sessions",
    "forks_of",
    "open_hub",
    "prune_store",
    "sessions_of_subject",
    "with_forks",
]
