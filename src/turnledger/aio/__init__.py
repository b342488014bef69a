"""The hub from asyncio: trio runs as a guest on the running asyncio loop.

``async with aio.open_hub(store, provider, model=...) as hub`` starts trio with
:func:`trio.lowlevel.start_guest_run` on the loop that is already running (one
process, one event-loop thread) and opens :func:`turnledger.sessions.open_hub`
inside it. The same hub, the same actors, the same stores and providers; only
the calls are asyncio's: ``await hub.submit(...)`` returns a
:class:`TurnHandle` whose :meth:`~TurnHandle.preview` is an asyncio async
iterator and whose :meth:`~TurnHandle.outcome` and :meth:`~TurnHandle.cancel`
are awaitables.

- Each call runs as one trio task; its result (or the same turnledger
  exception) comes back on an asyncio future.
- Cancelling the asyncio task that waits on ``outcome()`` or iterates
  ``preview()`` detaches that waiter and nothing else: the turn goes on (a web
  client that disconnects is not a Cancel). ``handle.cancel()`` is the only
  way to cancel a turn.
- Leaving the context shuts the hub down as the trio one does (turns in flight
  are written as ``interrupted``), also when the task holding the context is
  cancelled: the exit waits for the shutdown, then re-raises the cancellation.

Stores and providers that must be opened or closed under trio (the SQLite
and PostgreSQL stores, an HTTP provider) can be given as openers: a function
returning the object or an awaitable of it, called on the trio side; the hub
then closes what it opened (``aclose()``) after it has shut down.
"""

from ._hub import Hub, Opener, TurnHandle, open_hub

__all__ = ["Hub", "Opener", "TurnHandle", "open_hub"]
