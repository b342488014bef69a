"""The page that draws one session's timeline.

The rows come from :mod:`turnledger.timeline` (the same rows ``turnledger
log`` prints); this module turns them into JSON and HTML text (no trio, no
HTTP). The browser page served at ``/`` and the static file written by
``turnledger log DB --session S --html FILE`` draw the same model with the
same script, so a bug report shows exactly what the live page showed.

No stored text can break the page: the model is embedded as JSON with every
character that could end or re-enter a script element escaped, the page
runs only its own script and style (a Content-Security-Policy with their
hashes, computed from the assets when this module loads), and the script
adds stored text only as text, showing control and bidirectional
characters as escapes (the command line's set, from :mod:`turnledger.text`).
"""

from __future__ import annotations

import base64
import hashlib
import json
import re
from collections.abc import Sequence
from importlib import resources
from typing import Any

from ..events import EventStore, StoredEvent
from ..sessions import SessionState
from ..sessions._forks import seed_of
from ..text import INVISIBLE_RANGES, visible
from ..timeline import explain, phase_name, session_summary, timeline

__all__ = [
    "LIVE_PAGE_POLICY",
    "STATIC_PAGE_POLICY",
    "explain",
    "phase_name",
    "render_page",
    "session_page",
    "session_summary",
    "timeline_model",
]


def timeline_model(
    session_id: str, stored: Sequence[StoredEvent], *, seed: SessionState | None = None
) -> dict[str, Any]:
    """The session's timeline (:func:`turnledger.timeline.timeline`) as the
    JSON the page draws and ``GET /v1/sessions/{id}/timeline`` returns: one
    row per request id (:meth:`turnledger.timeline.Row.as_json`) and the
    history (``seed``: a fork's shared turns, see ``timeline``)."""
    return timeline(session_id, stored, seed=seed).as_json()


async def session_page(store: EventStore, session_id: str) -> str | None:
    """The static timeline page of one session (``None`` if it has no events):
    what ``turnledger log DB --session S --html FILE`` writes.

    Cancellation: only the store read waits; cancelled, it has read nothing
    and no page is built.
    """
    stored = await store.read(session_id)
    if not stored:
        return None
    seed = await seed_of(store, stored)
    return render_page(
        timeline_model(session_id, stored, seed=seed), title=f"turnledger: {session_id}"
    )


def _asset(name: str) -> str:
    return resources.files(__package__).joinpath("static", name).read_text("utf-8")


_TEMPLATE, _CSS, _JS = _asset("page.html"), _asset("timeline.css"), _asset("timeline.js")


def _hash_source(text: str) -> str:
    # CSP hash source: base64 of the SHA-256 of the element's text, exactly
    # as it stands between the tags (the template adds nothing around it).
    digest = hashlib.sha256(text.encode("utf-8")).digest()
    return f"'sha256-{base64.b64encode(digest).decode()}'"


#: The static page's Content-Security-Policy: its own script and style,
#: nothing else (no other script, style, image, font, frame or form).
STATIC_PAGE_POLICY = (
    f"default-src 'none'; script-src {_hash_source(_JS)}; style-src {_hash_source(_CSS)}; "
    "base-uri 'none'; form-action 'none'; require-trusted-types-for 'script'"
)
#: The live page's: the same, and requests to the service that served it.
LIVE_PAGE_POLICY = STATIC_PAGE_POLICY + "; connect-src 'self'"

#: What could end the script element or re-enter markup from inside it
#: (``</script``, ``<!--``), and the separators old parsers end lines at.
#: JSON writes them only inside strings, where an escape means the same.
_SCRIPT_SAFE = str.maketrans(
    {"<": "\\u003c", ">": "\\u003e", "&": "\\u0026", "\u2028": "\\u2028", "\u2029": "\\u2029"}
)


def _script_json(value: Any) -> str:
    """``value`` as JSON text safe inside an HTML ``<script>`` element."""
    return json.dumps(value, ensure_ascii=False).translate(_SCRIPT_SAFE)


def render_page(model: dict[str, Any] | None, *, title: str = "turnledger") -> str:
    """The timeline page as one self-contained HTML document.

    With ``model`` (from :func:`timeline_model`) the page is static: it
    draws that session and needs nothing else. Without it, the page is the
    live one served at ``/``: it lists sessions from ``/v1/sessions`` and
    follows the chosen one over SSE. Either carries its policy
    (:data:`STATIC_PAGE_POLICY` or :data:`LIVE_PAGE_POLICY`) in a ``meta``
    element.
    """
    parts = {
        "policy": _escape(STATIC_PAGE_POLICY if model is not None else LIVE_PAGE_POLICY),
        "title": _escape(visible(title)),
        "css": _CSS,
        "data": _script_json({"model": model, "invisible": INVISIBLE_RANGES}),
        "js": _JS,
    }
    # One pass over the template: text inside the data is never substituted.
    return re.sub(r"\{\{(\w+)\}\}", lambda m: parts[m.group(1)], _TEMPLATE)


def _escape(text: str) -> str:
    return (
        text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;").replace('"', "&quot;")
    )
