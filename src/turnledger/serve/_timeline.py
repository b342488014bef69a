"""The timeline of one session, as data a page draws, and the page itself.

Pure: stored envelopes in, JSON-able dicts and HTML text out (no trio, no
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

from ..events import (
    DEFAULT_CODEC,
    CompletionIgnored,
    EventStore,
    SessionStarted,
    StoredEvent,
    StreamStarted,
    TurnCommitted,
    TurnDiscarded,
    TurnRejected,
    TurnSubmitted,
)
from ..sessions import SessionState, evolve, initial_state, is_in_flight
from ..text import INVISIBLE_RANGES, visible

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

_DISCARD_WHY = {
    "cancelled": "the turn was cancelled by an explicit Stop",
    "superseded": "a newer question replaced it before its answer was complete",
    "interrupted": "the service stopped or crashed while it was in flight",
    "http_status": "the model server answered with an HTTP error",
    "transport": "the connection to the model server failed",
    "protocol": "the model server broke the chat protocol",
    "malformed": "the model server sent malformed data",
    "empty": "the answer was empty",
    "incomplete_finish": "the answer did not finish with 'stop' (cut off)",
    "incomplete_stream": "the stream ended before it was complete",
    "provider_error": "the model server reported an error mid-stream",
    "limit": "the stream crossed a safety limit",
    "conflict": "the log moved under the session",
}
_TIMEOUT_WHY = {
    "deadline": "no complete answer arrived within the turn deadline",
    "idle": "the stream went silent for longer than the idle timeout",
}
_REJECT_WHY = {
    "busy": "another turn of this session was still in flight",
    "over_budget": "the system prompt and question alone exceed the request budget",
    "empty_question": "the question was empty",
    "invalid_question": "the question was not valid Unicode text",
}


def phase_name(state: SessionState) -> str:
    """``idle``, ``pending``, ``streaming``, ``committed`` or ``discarded``."""
    return type(state).__name__.lower()


def explain(row: dict[str, Any]) -> str:
    """One sentence telling why a turn is (or is not) in history."""
    end, reason, detail = row["end"], row["reason"], row["detail"]
    if end == "committed":
        return "In history: a complete answer was accepted."
    if end == "in_flight":
        return "In flight: not in history unless a complete answer arrives."
    if end == "rejected":
        why = _REJECT_WHY.get(reason, reason)
        return f"Refused before any request was sent: {why}."
    if reason == "timeout":
        why = _TIMEOUT_WHY.get(detail, "it timed out")
    else:
        why = _DISCARD_WHY.get(reason, reason)
    if reason == "superseded" and row.get("superseded_by"):
        why = f"a newer question ({row['superseded_by']}) replaced it"
    text = f"Not in history: {why}."
    if row["preview_chars"]:
        text += f" The {row['preview_chars']} characters shown were only a preview."
    return text


def _row(request_id: str, seq: int, at: float, question: str) -> dict[str, Any]:
    return {
        "request_id": request_id,
        "question": question,
        "seq": seq,
        "submitted_at": at,
        "stream_started_at": None,
        "ended_at": None,
        "end": "in_flight",
        "reason": "",
        "detail": "",
        "preview_chars": 0,
        "answer_chars": 0,
        "usage": None,
        "turns_sent": 0,
        "request_bytes": 0,
        "late": [],
        "superseded_by": None,
        "explanation": "",
    }


def timeline_model(session_id: str, stored: Sequence[StoredEvent]) -> dict[str, Any]:
    """One row per request id (in order of first appearance), plus history.

    Each row has the times of ``submitted``, ``stream_started`` and the end,
    how it ended (``committed``/``discarded``/``rejected``/``in_flight``) with
    reason and detail, preview and answer lengths, token usage, late
    completions with their delay after the turn ended, the request id that
    superseded it, and a sentence saying why it is or is not in history.
    """
    rows: dict[str, dict[str, Any]] = {}
    state: SessionState = initial_state()
    just_superseded: dict[str, Any] | None = None
    for env in stored:
        event = DEFAULT_CODEC.decode(env)
        state = evolve(state, event)
        at = env.recorded_at
        if isinstance(event, SessionStarted):
            continue
        rid = str(event.request_id)
        row = rows.get(rid)
        if isinstance(event, TurnSubmitted):
            row = rows[rid] = _row(rid, env.seq, at, event.question)
            row["turns_sent"] = event.turns_sent
            row["request_bytes"] = event.request_bytes
            if just_superseded is not None:
                just_superseded["superseded_by"] = rid
        elif isinstance(event, TurnRejected):
            if row is None:
                row = rows[rid] = _row(rid, env.seq, at, "")
            row.update(end="rejected", ended_at=at, reason=event.reason, detail=event.detail)
        elif row is None:
            continue  # an event for a request this log never saw submitted
        elif isinstance(event, StreamStarted):
            row["stream_started_at"] = at
        elif isinstance(event, TurnCommitted):
            row.update(end="committed", ended_at=at, reason=event.finish_reason)
            row["answer_chars"] = len(event.answer)
            if event.usage is not None:
                row["usage"] = {
                    "prompt_tokens": event.usage.prompt_tokens,
                    "completion_tokens": event.usage.completion_tokens,
                    "total_tokens": event.usage.total_tokens,
                }
        elif isinstance(event, TurnDiscarded):
            row.update(end="discarded", ended_at=at, reason=event.reason, detail=event.detail)
            row["preview_chars"] = event.preview_chars
        elif isinstance(event, CompletionIgnored):
            ended = row["ended_at"]
            delay = None if ended is None else max(0.0, at - ended)
            row["late"].append({"outcome": event.outcome, "at": at, "delay_s": delay})
        just_superseded = (
            row if isinstance(event, TurnDiscarded) and event.reason == "superseded" else None
        )
    for row in rows.values():
        row["explanation"] = explain(row)
    times = [e.recorded_at for e in stored]
    return {
        "session_id": session_id,
        "version": state.version,
        "phase": phase_name(state),
        "in_flight": str(state.request.request_id) if is_in_flight(state) else None,  # type: ignore[union-attr]
        "t0": min(times) if times else None,
        "t1": max(times) if times else None,
        "turns": list(rows.values()),
        "history": [
            {"request_id": t.request_id, "question": t.question, "answer": t.answer}
            for t in state.turns
        ],
    }


def session_summary(session_id: str, stored: Sequence[StoredEvent]) -> dict[str, Any]:
    """A line of the sessions list: turns in history, phase, last outcome."""
    model = timeline_model(session_id, stored)
    last = None
    for row in reversed(model["turns"]):
        if row["end"] != "in_flight":
            last = row["end"] if row["end"] == "committed" else f"{row['end']} ({row['reason']})"
            break
    return {
        "session_id": session_id,
        "events": len(stored),
        "turns": len(model["history"]),
        "requests": len(model["turns"]),
        "phase": model["phase"],
        "last_outcome": last,
        "last_recorded_at": model["t1"],
    }


async def session_page(store: EventStore, session_id: str) -> str | None:
    """The static timeline page of one session (``None`` if it has no events):
    what ``turnledger log DB --session S --html FILE`` writes."""
    stored = await store.read(session_id)
    if not stored:
        return None
    return render_page(timeline_model(session_id, stored), title=f"turnledger: {session_id}")


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
