"""``turnledger serve``: the HTTP service and the browser timeline.

- :func:`create_app`: the ASGI application over a running hub and its store
  (Starlette; served by Hypercorn's trio worker in ``turnledger serve``),
  with its :class:`ServeSettings` (and :class:`NewSessionBudget`, what a
  question to a new session must fit before it reaches the hub).
- :func:`run_serve`: the whole service (store, provider, hub, server,
  signals) from one typed :class:`ServeOptions`, which ``turnledger serve``
  builds from its options.
- :func:`timeline_model` / :func:`render_page`: one session's timeline as
  data (the rows of :mod:`turnledger.timeline`, as JSON), and the
  self-contained HTML page that draws it (the page at ``/``, and the static
  file of ``turnledger log DB --session S --html FILE``).
- :func:`quote_id` / :func:`unquote_id`: a session or request id as one
  path segment of the API, and back (any id the library takes).

Needs the ``serve`` extra (``pip install 'turnledger[serve]'``) for the
application and the server; the timeline model and page need nothing more.
"""

from typing import TYPE_CHECKING as _TYPE_CHECKING
from typing import Any as _Any

from ._ids import quote_id, unquote_id
from ._timeline import explain, render_page, session_page, session_summary, timeline_model

if _TYPE_CHECKING:
    from ._app import NewSessionBudget, ServeSettings, create_app
    from ._server import ServeOptions, ServeOptionsError, add_serve_arguments, run_serve

__all__ = [
    "NewSessionBudget",
    "ServeOptions",
    "ServeOptionsError",
    "ServeSettings",
    "add_serve_arguments",
    "create_app",
    "explain",
    "quote_id",
    "render_page",
    "run_serve",
    "session_page",
    "session_summary",
    "timeline_model",
    "unquote_id",
]

_LAZY = {
    "NewSessionBudget": "_app",
    "ServeSettings": "_app",
    "create_app": "_app",
    "ServeOptions": "_server",
    "ServeOptionsError": "_server",
    "add_serve_arguments": "_server",
    "run_serve": "_server",
}


def __getattr__(name: str) -> _Any:
    # The server stack (starlette, hypercorn) loads only when asked for, so
    # writing a static timeline needs no extra.
    where = _LAZY.get(name)
    if where is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    import importlib

    value = getattr(importlib.import_module(f"{__name__}.{where}"), name)
    globals()[name] = value
    return value
