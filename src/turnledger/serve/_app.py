"""The ASGI application of ``turnledger serve`` (Starlette, run on trio).

Routes (JSON under ``/v1``; every error is ``{"error": {"code", "message"}}``
with a stable code, never a traceback):

- ``POST /v1/sessions/{id}/turns`` → ``text/event-stream``: ``turn``, then
  ``delta`` events (SSE ``id`` 1, 2, … numbers the deltas of that turn), then
  ``outcome``. A refused question gets an HTTP error instead (409 busy, 413
  over budget, 400 empty or invalid), since it never streams; those the edge
  can decide (see ``_Service._refusal``) are refused before the hub and
  write nothing, so no session is created by a refused first question.
- ``GET /v1/sessions/{id}/turns/{request_id}/stream`` with ``Last-Event-ID: k``
  → the deltas after ``k`` once, then the outcome; a turn that ended gets
  just the outcome. A client going away never cancels a turn.
- ``POST /v1/sessions/{id}/turns/{request_id}/cancel`` → the turn's result.
- ``GET /v1/sessions``, ``/v1/sessions/{id}``, ``/v1/sessions/{id}/events``,
  ``/v1/sessions/{id}/state``, ``/v1/sessions/{id}/timeline`` and its live
  ``/follow`` stream; ``GET /healthz``; ``GET /v1/nodes``; the timeline
  page at ``/``.

A node of a cluster (``serve --node-id``, :mod:`._cluster`) hands each
question, cancel, edit, regenerate, switch and erasure for a session another
live node owns to that node (``_Service._forward``), answers the calls of
other nodes (``_Service.answer_call``), and streams a turn run elsewhere:
its deltas through the previews in PostgreSQL, then its outcome from the
log (``_Service._followed``; ``_follow_elsewhere``, the outcome alone, when
an application was given a node but no previews).

Who may ask (``_guard``): with a token, whoever sends it; without one, only
this machine's pages and programs (a loopback ``Host``, and an ``Origin``
that is the service's own or one of ``ServeSettings.allowed_origins``).
Every POST is ``application/json``, parsed strictly (``wire.loads_object``).
Responses that leave a connection unusable (sent before the body was read,
or an event stream) close it (``_edge``).

An ``{id}`` is any id the library takes, written by :func:`quote_id`: routes
match the path as it was sent (``raw_path``), so an escaped ``/`` stays
inside its segment, and each handler decodes its ids with :func:`unquote_id`.

The hub's :class:`TurnHandle` already keeps every delta of a turn (each
``preview()`` starts from the first), so a reconnecting client is served
from the handle the app holds for each turn in flight it submitted (its
relay, dropped when the turn ends, however it ends). A finished turn's
result is kept for reconnects, the newest first, within
``ServeSettings.keep_results`` and ``keep_results_bytes``; beyond them, and
for turns this process did not run, the outcome comes from the store.

A turn whose store write failed ends with its outcome (``discarded``,
reason ``store_error``, the system's error in ``detail``); a turn whose
session another process took over gets the outcome that process recorded,
or the error ``owned_elsewhere``. ``shutting_down`` is only ever the
service stopping.
"""

from __future__ import annotations

import contextlib
import hmac
import math
import re
import time
import uuid
from collections import OrderedDict
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping, MutableMapping
from functools import partial
from typing import TYPE_CHECKING, Any
from urllib.parse import quote, quote_from_bytes, urlsplit

import attrs
import orjson
import structlog
import trio
from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import HTMLResponse, Response, StreamingResponse
from starlette.routing import Route

from .. import (
    ContentEncrypted,
    DecodeError,
    EncryptionError,
    InvalidCommand,
    ReplayError,
    SessionBusy,
    SessionClosed,
    SessionExists,
    SessionOwnedElsewhere,
    StoreError,
    SummaryFailed,
    UnknownBranch,
    UnknownPin,
    UnknownSession,
    UnknownTurn,
)
from .._errors import describe_store_error
from ..adapters.stores._pg_cluster import Call
from ..adapters.stores.postgres import PostgresStore
from ..events import DEFAULT_CODEC, EventStore, RequestId, StoredEvent
from ..runtime import PROMPTS, ModelSummarizer
from ..sessions import (
    BranchInfo,
    Budget,
    CommittedResult,
    DiscardedResult,
    Hub,
    RejectedResult,
    SessionState,
    Start,
    TurnHandle,
    TurnResult,
    ending_of,
    is_in_flight,
    plan,
    prompt_token_cap,
)
from ..sessions._forks import replay_resolved, seed_of
from ..wire import loads_object
from ._cluster import Node, NotTaken
from ._ids import unquote_id
from ._timeline import LIVE_PAGE_POLICY, phase_name, render_page, session_summary, timeline_model

if TYPE_CHECKING:
    from ..adapters.stores import Previews

__all__ = ["NewSessionBudget", "ServeSettings", "create_app"]

log = structlog.get_logger("turnledger.serve")

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]

_REJECT_STATUS = {
    "busy": 409,
    "over_budget": 413,
    "empty_question": 400,
    "invalid_question": 400,
    "store_error": 503,
    "limit": 507,
}
#: What a kept result costs besides its JSON: its key (two ids) and the
#: table's entry, as an estimate (see ServeSettings.keep_results_bytes).
_KEPT_ENTRY_BYTES = 256
_SSE_HEADERS = {"Cache-Control": "no-store", "X-Accel-Buffering": "no"}
#: How many times a call is handed to the owner the lease names (it may be
#: letting the session go, or be gone) before the client is told to retry.
_ROUTE_ATTEMPTS = 10
#: Seconds between looks at the owner of a turn followed from another node.
_POLL_OWNER = 1.0


@attrs.frozen(kw_only=True)
class NewSessionBudget:
    """What a question to a session that does not exist yet must fit on its
    own: the hub's caps (``max_request_bytes``, ``max_prompt_tokens``, with
    the provider's encoder) and the settings the hub creates sessions with.

    A question over it is refused before the hub (413 ``over_budget``) and
    creates nothing. A session that exists is measured by its own settings
    and window instead (see ``_Service._refusal``).
    """

    budget: Budget
    model: str
    system: str = ""


@attrs.frozen(kw_only=True)
class ServeSettings:
    """What the application needs besides the hub and the store."""

    #: Bearer token every route requires; ``None`` for none (loopback only:
    #: then only a loopback ``Host``, and an ``Origin`` that is the service's
    #: own or in ``allowed_origins``, are served).
    token: str | None = None
    #: Browser origins (``scheme://host[:port]``, lowercase, no path) whose
    #: pages may call the API: their requests pass the origin check, and
    #: their preflights and responses carry CORS headers.
    allowed_origins: frozenset[str] = frozenset()
    #: The budget questions to new sessions are measured by at the edge;
    #: ``None``: only empty and invalid questions are refused there.
    new_session_budget: NewSessionBudget | None = None
    #: Largest request body accepted, in bytes.
    max_body_bytes: int = 1_048_576
    #: Largest page of ``/v1/sessions`` and ``/events``.
    max_page: int = 1000
    #: Seconds between store checks of a followed session.
    follow_interval: float = 0.25
    #: Finished turns whose results are kept in memory for reconnects.
    keep_results: int = 4096
    #: The most memory those results may take, in bytes: their JSON (the
    #: answers, mostly) plus an estimated 256 bytes each. The oldest go
    #: first; a reconnect to a turn whose result went gets it from the store.
    keep_results_bytes: int = 64 * 1024 * 1024
    #: Turns that may be starting at once, from the POST until their first
    #: delta or end (0: no limit); more wait for a slot, in order of arrival.
    #: Starting a turn (its session, its first events, the model request) is
    #: the costliest part of a stream: a burst of a thousand at once makes
    #: every scheduler pass long, and a health check needs several passes.
    #: A turn holds its slot at most ``start_hold`` seconds: a slow model's
    #: long wait for its first token must not keep other turns from starting.
    max_starting: int = 32
    #: The longest a turn holds its starting slot (see ``max_starting``).
    start_hold: float = 0.5
    #: With previews through PostgreSQL (``--node-id``): the longest a
    #: stream of a turn running on another process waits between looks at
    #: the log for the turn's outcome (a notification is what wakes it
    #: sooner), and the longest it follows a turn at all before it ends with
    #: the error ``follow_timeout``.
    follow_poll: float = 1.0
    follow_deadline: float = 600.0


class ApiError(Exception):
    """An error the API answers with: HTTP status, stable code, message."""

    def __init__(self, status: int, code: str, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.code = code
        self.message = message


def _json(body: Any, status: int = 200) -> Response:
    return Response(orjson.dumps(body), status_code=status, media_type="application/json")


def _error(status: int, code: str, message: str) -> Response:
    return _json({"error": {"code": code, "message": message}}, status)


def _sse(event: str, data: Any, id: int | None = None) -> bytes:
    return _frame(event, orjson.dumps(data), id)


def _frame(event: str, data: bytes, id: int | None = None) -> bytes:
    head = f"id: {id}\n" if id is not None else ""
    return f"{head}event: {event}\n".encode() + b"data: " + data + b"\n\n"


def _raw_json(body: bytes, status: int = 200) -> Response:
    return Response(body, status_code=status, media_type="application/json")


def result_json(result: TurnResult) -> dict[str, Any]:
    """A turn result as the API shows it."""
    body: dict[str, Any] = {"kind": result.kind, "request_id": result.request_id}
    if isinstance(result, CommittedResult):
        usage = None if result.usage is None else attrs.asdict(result.usage)
        body.update(answer=result.answer, finish_reason=result.finish_reason, usage=usage)
    elif isinstance(result, DiscardedResult):
        body.update(reason=result.reason, detail=result.detail, preview_chars=result.preview_chars)
    else:
        body.update(reason=result.reason, detail=result.detail)
    body["repeated"] = result.repeated
    return body


def _stored_outcome(stored: list[StoredEvent], request_id: str) -> dict[str, Any] | None:
    # The recorded end of a request from the log: what a reconnect after the
    # turn (or the process that ran it) is gone gets.
    for env in reversed(stored):
        if env.payload.get("request_id") != request_id:
            continue
        p = env.payload
        if env.tag == "turn_committed":
            return {
                "kind": "committed",
                "request_id": request_id,
                "answer": p["answer"],
                "finish_reason": p.get("finish_reason", "stop"),
                "usage": p.get("usage"),
                "repeated": True,
            }
        if env.tag in ("turn_discarded", "turn_rejected"):
            body = {"kind": "discarded" if env.tag == "turn_discarded" else "rejected"}
            body.update(request_id=request_id, reason=p["reason"], detail=p.get("detail", ""))
            if env.tag == "turn_discarded":
                body["preview_chars"] = p.get("preview_chars", 0)
            return body | {"repeated": True}
    return None


def _check_id(what: str, value: Any) -> str:
    # The library's rule (orjson has already refused text that is not Unicode).
    if not isinstance(value, str) or not value:
        raise ApiError(400, f"bad_{what}", f"a {what.replace('_', ' ')} is a non-empty string")
    return value


def _require_json(request: Request) -> None:
    # A browser sends a cross-site POST without asking first only if its
    # type is a "simple" one (text/plain, a form): requiring JSON makes every
    # other origin's write a preflighted one, which this service never grants
    # but to the origins it was told to trust.
    kind = request.headers.get("content-type", "").split(";", 1)[0].strip().lower()
    if kind != "application/json":
        raise ApiError(415, "unsupported_media_type", "POST bodies must be application/json")


def _path_id(request: Request, what: str) -> str:
    try:
        return unquote_id(request.path_params[what])
    except ValueError as exc:
        raise ApiError(400, f"bad_{what}", f"{exc} (see turnledger.serve.quote_id)") from None


def _int_param(request: Request, name: str, default: int, *, low: int, high: int) -> int:
    raw = request.query_params.get(name)
    if raw is None:
        return default
    # Digits only (no sign, space or "_"), and no more than the largest
    # bound (10**18) has, before int() is asked to read them.
    if not re.fullmatch(r"[0-9]{1,19}", raw) or not low <= int(raw) <= high:
        raise ApiError(400, "bad_parameter", f"{name} must be an integer in {low}..{high}")
    return int(raw)


class _Relay:
    """One turn in flight, as the streams of all its clients read it.

    A task per turn reads the handle's preview once and keeps each delta as
    its encoded SSE frame; every stream of the turn (the first, and any
    reattached with Last-Event-ID) sends what it has not sent yet in one
    write, so a burst of deltas costs one write per client, not one each.
    """

    __slots__ = ("frames", "handle", "lot", "outcome", "started")

    def __init__(self, handle: TurnHandle, started: Callable[[], None]) -> None:
        self.handle = handle
        #: Called once, when the turn's first delta or its end arrives.
        self.started: Callable[[], None] | None = started
        #: ``frames[i]`` is the SSE frame of delta ``i + 1``.
        self.frames: list[bytes] = []
        #: The final frame (``outcome``, or ``error`` if there is none).
        self.outcome: bytes | None = None
        self.lot = trio.lowlevel.ParkingLot()

    def _started(self) -> None:
        if self.started is not None:
            started, self.started = self.started, None
            started()

    async def run(self, service: _Service, key: tuple[str, str]) -> None:
        """Read the turn's deltas and its end; the relay leaves the service's
        table when the turn ends, however it ends.

        Cancellation: the service is stopping; the streams get
        ``shutting_down``.
        """
        n = 0
        previews = service.previews
        try:
            async for delta in self.handle.preview():
                if not n:
                    self._started()
                n += 1
                self.frames.append(_sse("delta", {"text": delta}, id=n))
                if previews is not None:
                    previews.publish(key[0], key[1], n, delta)
                self.lot.unpark_all()
            try:
                result = await self.handle.outcome()
            except SessionClosed as exc:
                # The session's actor stopped before the turn was decided.
                ended = await service._closed(key, exc)
                if isinstance(ended, ApiError):
                    self.outcome = _sse("error", {"code": ended.code, "message": ended.message})
                else:
                    self.outcome = _frame("outcome", ended)
            else:
                self.outcome = _frame("outcome", service._keep(key, result_json(result)))
        finally:
            if previews is not None:
                # After the outcome is in the log (or known not to be):
                # followers elsewhere read it from there.
                previews.end(key[0], key[1], n + 1)
            if self.outcome is None:
                self.outcome = _sse("error", _STOPPING)
            if service.live.get(key) is self:
                del service.live[key]
            self.lot.unpark_all()
            self._started()

    async def hold_at_most(self, seconds: float) -> None:
        """Give the starting slot back after ``seconds`` if the turn has not.

        Cancellation: cancelling this only leaves the slot to the turn's first
        delta or end, which give it back anyway.
        """
        await trio.sleep(seconds)
        self._started()

    async def stream(self, after: int, head: bytes) -> AsyncIterator[bytes]:
        if head:
            yield head
        sent = after
        while True:
            if sent < len(self.frames):
                batch = self.frames[sent:]
                sent += len(batch)
                yield b"".join(batch)
            elif self.outcome is not None:
                yield self.outcome
                return
            else:
                await self.lot.park()


_STOPPING = {"code": "shutting_down", "message": "the service stopped before the turn ended"}


class _Service:
    def __init__(
        self,
        hub: Hub,
        store: EventStore,
        settings: ServeSettings,
        stopping: trio.Event,
        nursery: trio.Nursery,
        previews: Previews | None = None,
    ) -> None:
        #: Previews through PostgreSQL (``--node-id``): turns this process
        #: runs are published, turns others run are followed.
        self.previews = previews
        self.stopping = stopping
        self.nursery = nursery
        self.hub = hub
        self.store = store
        self.settings = settings
        #: Turns in flight this process submitted, by (session, request id).
        self.live: dict[tuple[str, str], _Relay] = {}
        #: Results of recently finished turns (for reconnects) as their
        #: JSON, oldest first, and what they cost (see _keep).
        self.done: OrderedDict[tuple[str, str], bytes] = OrderedDict()
        self.kept_bytes = 0
        #: One question of a session at a time, from its check to its admission.
        self.gates = _Gates()
        #: Turns between their POST and their first delta (or end).
        self.starting = trio.CapacityLimiter(settings.max_starting or math.inf)
        #: This process as a node of a cluster (``serve --node-id``), else ``None``.
        self.node: Node | None = None

    # -- helpers ---------------------------------------------------------

    async def _body(self, request: Request, *, empty: bool = False) -> dict[str, Any]:
        """The request's JSON object body, read within ``max_body_bytes``
        (declared or not: a chunked body is counted as it arrives) and parsed
        by the same strict rules as provider chunks (duplicate keys refused).
        ``empty``: no body at all reads as ``{}``.

        Cancellation: the body is not read further; nothing was changed.
        """
        _require_json(request)
        limit = self.settings.max_body_bytes
        too_large = ApiError(413, "body_too_large", f"request bodies are limited to {limit} bytes")
        declared = request.headers.get("content-length")
        if declared is not None and declared.isdigit() and int(declared) > limit:
            raise too_large
        chunks = bytearray()
        async for chunk in request.stream():
            chunks += chunk
            if len(chunks) > limit:
                raise too_large
        if empty and not chunks:
            return {}
        try:
            return loads_object(bytes(chunks).decode("utf-8"))
        except UnicodeDecodeError:
            raise ApiError(400, "bad_json", "the body is not UTF-8") from None
        except DecodeError as exc:
            raise ApiError(
                400, "bad_json", f"the body is not one strict JSON object: {exc}"
            ) from None

    async def _stored(self, session_id: str) -> list[StoredEvent]:
        stored = await self.store.read(session_id)
        if not stored:
            raise ApiError(404, "unknown_session", f"no session {session_id!r}")
        return stored

    def _keep(self, key: tuple[str, str], result: dict[str, Any]) -> bytes:
        """Keep a finished turn's result (its JSON, returned) for reconnects,
        within ``keep_results`` and ``keep_results_bytes``, dropping the
        oldest first."""
        body = orjson.dumps(result)
        done = self.done
        old = done.pop(key, None)
        if old is not None:
            self.kept_bytes -= len(old) + _KEPT_ENTRY_BYTES
        cost = len(body) + _KEPT_ENTRY_BYTES
        limit = self.settings.keep_results_bytes
        if cost > limit or self.settings.keep_results < 1:
            return body  # larger than all the room there is: the store has it
        done[key] = body
        self.kept_bytes += cost
        while len(done) > self.settings.keep_results or self.kept_bytes > limit:
            _, dropped = done.popitem(last=False)
            self.kept_bytes -= len(dropped) + _KEPT_ENTRY_BYTES
        return body

    async def _closed(self, key: tuple[str, str], exc: SessionClosed) -> bytes | ApiError:
        """How a turn whose session stopped before it was decided ended: the
        outcome the log holds (recorded by the process that took the session
        over), else the error that says why (``owned_elsewhere``,
        ``store_error``; ``shutting_down`` only when the hub is closing)."""
        error = self._hub_error(exc)
        if error.code != "shutting_down":
            with contextlib.suppress(StoreError):
                found = _stored_outcome(await self.store.read(key[0]), key[1])
                if found is not None:
                    return self._keep(key, found)
        return error

    async def _admitted(self, handle: TurnHandle) -> None:
        # Wait until the session took the question in (it is in flight or
        # already ended) or refused it: a refusal is an HTTP error, not a
        # stream. The hub has no signal for admission, so look at the state.
        pause = 0.001
        while not handle.done:
            state = await self.hub.state(handle.session_id)
            if is_in_flight(state) and state.request.request_id == handle.request_id:  # type: ignore[union-attr]
                return
            await trio.sleep(pause)
            pause = min(pause * 2, 0.05)

    def _refusal(
        self, session_id: str, state: SessionState, question: str, first: Start | None = None
    ) -> ApiError | None:
        """Why the session would refuse ``question`` now, decided without it
        (so the refusal writes nothing): busy, or over the budget with the
        system prompt alone. ``None``: the session decides.

        The rules are the session's own (``sessions._machine._submit``): a
        session that exists is measured with its settings and its window
        (``prompt_token_cap``); a new one with the hub's caps
        (:class:`NewSessionBudget`) and the window it would get (``first``:
        :meth:`Hub.new_session_start`).
        """
        config = state.config
        if (
            config is not None
            and is_in_flight(state)
            and config.on_busy == "reject"
            # A turn that ended here although its end is not in the log yet
            # (the store refused it): the session says what happens next.
            and (session_id, state.request.request_id) not in self.done  # type: ignore[union-attr]
        ):
            return ApiError(409, "busy", "another turn of this session is in flight")
        limits = self.settings.new_session_budget
        if limits is None:
            return None
        budget = limits.budget
        if config is None:
            cap = budget.max_prompt_tokens
            if first is not None and first.context_window is not None:
                # A new session's calibration is 1:1 (see prompt_token_cap).
                room = first.context_window - (first.output_reserve or 0)
                cap = room if cap is None else min(cap, room)
            p = plan(limits.model, limits.system, state.turns, 0, question, budget, token_cap=cap)
        else:
            cap = prompt_token_cap(state, budget)
            p = plan(
                config.model,
                config.system,
                state.turns,
                state.context_start,
                question,
                budget,
                config.tools,
                config.tool_choice,
                token_cap=cap,
            )
        if p.fits:
            return None
        limit = budget.max_request_bytes
        if limit is not None and p.mandatory_bytes > limit:
            need = f"{p.mandatory_bytes} bytes; the budget is {limit}"
        else:
            need = f"about {p.mandatory_tokens} tokens; the budget is {cap}"
        return ApiError(413, "over_budget", f"system prompt and question need {need}")

    @staticmethod
    def _hub_error(exc: Exception) -> ApiError:
        # A session whose actor stopped says why in its cause.
        cause = exc.__cause__ if isinstance(exc, SessionClosed) else exc
        if isinstance(cause, SessionOwnedElsewhere):
            return ApiError(409, "owned_elsewhere", "another process owns this session")
        if isinstance(cause, StoreError):
            return ApiError(
                503, "store_error", f"the event store failed: {describe_store_error(cause)}"
            )
        if isinstance(exc, SessionClosed):
            if cause is None:
                return ApiError(503, "shutting_down", "the service is shutting down")
            # A log that does not fold (its message may quote the log).
            return ApiError(
                503, "store_error", f"the session stopped: {type(cause).__name__} in its log"
            )
        if isinstance(exc, UnknownSession):
            return ApiError(404, "unknown_session", str(exc))
        if isinstance(exc, UnknownTurn):
            return ApiError(404, "unknown_turn", str(exc))
        if isinstance(exc, UnknownBranch):
            return ApiError(404, "unknown_branch", str(exc))
        if isinstance(exc, UnknownPin):
            return ApiError(404, "unknown_pin", str(exc))
        if isinstance(exc, SummaryFailed):
            return ApiError(502, "summary_failed", str(exc))
        if isinstance(exc, SessionBusy):
            return ApiError(409, "busy", str(exc))
        if isinstance(exc, SessionExists):
            return ApiError(400, "session_exists", str(exc))
        if isinstance(exc, InvalidCommand):
            return ApiError(400, "bad_request", str(exc))
        return ApiError(503, "store_error", "the event store failed")

    # -- routes ------------------------------------------------------------

    async def submit(self, request: Request) -> Response:
        session_id = _path_id(request, "session_id")
        body = await self._body(request)
        _only(body, "question", "request_id")
        question, rid = _question(body), self._rid(_request_id(body))
        start = partial(self.hub.submit, session_id, question, request_id=rid)
        call = ("turns", {"question": question, "request_id": rid})
        return await self._ask(session_id, question, rid, start, call=call)

    async def edit(self, request: Request) -> Response:
        """POST .../edit ``{"turn_index", "question", "request_id"?}``: the
        question instead of the active branch's turn ``turn_index``, on a
        new branch; answered as ``POST .../turns`` is (an SSE stream)."""
        session_id = _path_id(request, "session_id")
        body = await self._body(request)
        _only(body, "turn_index", "question", "request_id")
        index = body.get("turn_index")
        if type(index) is not int:
            raise ApiError(400, "bad_field", "turn_index must be an integer")
        question, rid = _question(body), self._rid(_request_id(body))
        start = partial(self.hub.edit, session_id, index, question, request_id=rid)
        call = ("edit", {"turn_index": index, "question": question, "request_id": rid})
        return await self._ask(session_id, question, rid, start, branch=True, call=call)

    async def regenerate(self, request: Request) -> Response:
        """POST .../regenerate ``{"request_id"?}``: the last question asked
        again on a new branch; answered as ``POST .../turns`` is."""
        session_id = _path_id(request, "session_id")
        body = await self._body(request, empty=True)
        _only(body, "request_id")
        rid = self._rid(_request_id(body))
        start = partial(self.hub.regenerate, session_id, request_id=rid)
        call = ("regenerate", {"request_id": rid})
        return await self._ask(session_id, None, rid, start, branch=True, call=call)

    async def switch(self, request: Request) -> Response:
        """POST .../switch ``{"branch"}``: make a branch the active one."""
        session_id = _path_id(request, "session_id")
        body = await self._body(request)
        _only(body, "branch")
        branch = body.get("branch")
        if not isinstance(branch, str):
            raise ApiError(400, "bad_field", "branch must be a string")
        for _ in range(2):
            reply = await self._forward(session_id, "switch", {"branch": branch})
            if reply is not None:
                return _json(reply["body"], reply["status"])
            self._local_work()
            try:
                return await self._switch_here(session_id, branch)
            except ApiError as exc:
                if self.node is None or exc.code != "owned_elsewhere":
                    raise
        raise ApiError(503, "owner_unavailable", "the session changed hands; try again")

    async def _switch_here(self, session_id: str, branch: str) -> Response:
        try:
            async with self.gates.hold(session_id):
                await self.hub.switch(session_id, branch)
                return _json(_branches_json(session_id, await self.hub.branches(session_id)))
        except (StoreError, SessionClosed, InvalidCommand, UnknownSession) as exc:
            raise self._hub_error(exc) from None

    async def fork(self, request: Request) -> Response:
        """POST .../fork ``{"session_id", "at_turn"?}``: a new session that
        shares this one's first ``at_turn`` turns (all: absent or null) of
        its active branch, by reference. 201 with the fork's point."""
        source = _path_id(request, "session_id")
        body = await self._body(request)
        _only(body, "session_id", "at_turn")
        new_id = body.get("session_id")
        if not isinstance(new_id, str):
            raise ApiError(400, "bad_field", "session_id must be a string")
        at_turn = body.get("at_turn")
        if at_turn is not None and type(at_turn) is not int:
            raise ApiError(400, "bad_field", "at_turn must be an integer or null")
        try:
            async with self.gates.hold(new_id):
                forked = await self.hub.fork(source, new_id, at_turn)
        except ReplayError:
            # a source whose own log does not fold (a fork whose source is gone)
            raise ApiError(503, "store_error", "the source's log does not fold") from None
        except (StoreError, SessionClosed, InvalidCommand, UnknownSession) as exc:
            raise self._hub_error(exc) from None
        return _json(
            {
                "session_id": new_id,
                "source": forked.source,
                "source_seq": forked.source_seq,
                "branch": forked.branch,
                "at_turn": forked.at_turn,
            },
            status=201,
        )

    async def branches(self, request: Request) -> Response:
        """GET .../branches: every branch, ``main`` first, and the active one."""
        session_id = _path_id(request, "session_id")
        try:
            listed = await self.hub.branches(session_id)
        except (StoreError, SessionClosed, InvalidCommand, UnknownSession) as exc:
            raise self._hub_error(exc) from None
        return _json(_branches_json(session_id, listed))

    async def summarize(self, request: Request) -> Response:
        """POST .../summarize ``{"start"?, "end"?, "branch"?, "prompt"?}``:
        the session's model summarizes turns ``start`` to ``end`` (from 0,
        ``end`` excluded; default every turn) of a branch (default the
        active one) with the named prompt (default ``concise``); 201 with
        the recorded summary. Nothing is written on an error."""
        session_id = _path_id(request, "session_id")
        body = await self._body(request, empty=True)
        _only(body, "start", "end", "branch", "prompt")
        start, end = body.get("start", 0), body.get("end")
        if type(start) is not int or not (end is None or type(end) is int):
            raise ApiError(400, "bad_field", "start and end must be integers")
        branch = body.get("branch")
        if branch is not None and not isinstance(branch, str):
            raise ApiError(400, "bad_field", "branch must be a string")
        prompt = body.get("prompt", "concise")
        if prompt not in PROMPTS:
            known = ", ".join(sorted(PROMPTS))
            raise ApiError(400, "bad_field", f"prompt must be one of {known}")
        try:
            ev = await self.hub.summarize(
                session_id,
                start=start,
                end=end,
                branch=branch,
                summarizer=ModelSummarizer(prompt),
            )
        except (StoreError, SessionClosed, InvalidCommand, UnknownSession, SummaryFailed) as exc:
            raise self._hub_error(exc) from None
        return _json({"session_id": session_id, "summary": attrs.asdict(ev)}, 201)

    async def summaries(self, request: Request) -> Response:
        """GET .../summaries: every summary of the session, oldest first."""
        session_id = _path_id(request, "session_id")
        try:
            listed = await self.hub.summaries(session_id)
        except (StoreError, SessionClosed, InvalidCommand, UnknownSession) as exc:
            raise self._hub_error(exc) from None
        return _json({"session_id": session_id, "summaries": [attrs.asdict(x) for x in listed]})

    async def pin(self, request: Request) -> Response:
        """POST .../pins ``{"text", "origin", "pin_id"?}``: pin an item to
        the session's context; 201 with the pinned items."""
        session_id = _path_id(request, "session_id")
        body = await self._body(request)
        _only(body, "text", "origin", "pin_id")
        text, origin, pin_id = body.get("text"), body.get("origin"), body.get("pin_id")
        if not isinstance(text, str) or not isinstance(origin, str):
            raise ApiError(400, "bad_field", "text and origin must be strings")
        if pin_id is not None and not isinstance(pin_id, str):
            raise ApiError(400, "bad_field", "pin_id must be a string")
        try:
            async with self.gates.hold(session_id):
                await self.hub.pin(session_id, text, origin=origin, pin_id=pin_id)
                listed = await self.hub.pins(session_id)
        except (StoreError, SessionClosed, InvalidCommand, UnknownSession) as exc:
            raise self._hub_error(exc) from None
        return _json(_pins_json(session_id, listed), 201)

    async def pins(self, request: Request) -> Response:
        """GET .../pins: the items pinned now, in the order they are sent."""
        session_id = _path_id(request, "session_id")
        try:
            listed = await self.hub.pins(session_id)
        except (StoreError, SessionClosed, InvalidCommand, UnknownSession) as exc:
            raise self._hub_error(exc) from None
        return _json(_pins_json(session_id, listed))

    async def unpin(self, request: Request) -> Response:
        """DELETE .../pins/{pin_id}: stop sending a pinned item."""
        session_id = _path_id(request, "session_id")
        pin_id = _path_id(request, "pin_id")
        try:
            async with self.gates.hold(session_id):
                await self.hub.unpin(session_id, pin_id)
                listed = await self.hub.pins(session_id)
        except (StoreError, SessionClosed, InvalidCommand, UnknownSession) as exc:
            raise self._hub_error(exc) from None
        return _json(_pins_json(session_id, listed))

    async def _ask(
        self,
        session_id: str,
        question: str | None,
        rid: str | None,
        start: Callable[[], Awaitable[TurnHandle]],
        *,
        branch: bool = False,
        call: tuple[str, dict[str, Any]] | None = None,
    ) -> Response:
        """A question (``start`` asks it) answered as an SSE stream.
        ``branch``: an edit or a regenerate (``question`` ``None``: the last
        one again), which needs a session that exists. ``call``: the same
        question as a call to the node that owns the session, in a cluster."""
        for _ in range(2):
            reply = None if call is None else await self._forward(session_id, *call)
            if reply is not None:
                if "status" in reply:
                    return _json(reply["body"], reply["status"])
                assert rid is not None  # (a node draws an id for every question)
                head = _sse("turn", {"session_id": session_id, "request_id": rid})
                repeated = bool(reply.get("repeated", False))
                if self.previews is not None:
                    # Its deltas from the first, through the previews.
                    follow = self._followed((session_id, rid), 0, head, repeated)
                else:
                    follow = self._follow_elsewhere(session_id, rid, head, repeated)
                return StreamingResponse(
                    follow, media_type="text/event-stream", headers=_SSE_HEADERS
                )
            self._local_work()
            began = None
            try:
                began = await self._begin(session_id, question, rid, start, branch=branch)
            except ApiError as exc:
                # Taken by another node between the look at its owner and
                # the acquire: handed to that node.
                if self.node is None or exc.code != "owned_elsewhere":
                    raise
            if isinstance(began, Response):
                return began
            if began is not None:
                key, relay = began
                head = _sse("turn", {"session_id": key[0], "request_id": key[1]})
                return StreamingResponse(
                    relay.stream(0, head), media_type="text/event-stream", headers=_SSE_HEADERS
                )
        raise ApiError(503, "owner_unavailable", "the session changed hands; try again")

    async def _begin(
        self,
        session_id: str,
        question: str | None,
        rid: str | None,
        start: Callable[[], Awaitable[TurnHandle]],
        *,
        branch: bool = False,
    ) -> tuple[tuple[str, str], _Relay] | Response:
        """Ask here: the turn's key and relay once the session took the
        question in, or the response that refuses it."""
        # A slot among the turns starting (see ServeSettings.max_starting),
        # held until the turn's first delta or its end: the relay gives it back.
        slot = object()
        await self.starting.acquire_on_behalf_of(slot)
        held = True
        try:
            try:
                # One question of a session at a time from the look at its
                # state to its admission: a refusal decided here (busy, over
                # budget) cannot be overtaken by another POST of this process.
                async with self.gates.hold(session_id):
                    state = await self.hub.state(session_id)
                    if self.node is not None and await self._left_in_flight(session_id, state):
                        state = await self.hub.state(session_id)
                    if branch and state.config is None:
                        raise ApiError(404, "unknown_session", f"no session {session_id!r}")
                    if question is None:
                        # (no turn: the hub says so, unknown_turn)
                        question = state.turns[-1].question if len(state.turns) else "?"
                    ending = None if rid is None else ending_of(state, RequestId(rid))
                    if (
                        self.previews is not None
                        and rid is not None
                        and ending is not None
                        and ending.kind == "in_flight"
                        and (session_id, rid) not in self.live
                        and (session_id, rid) not in self.done
                    ):
                        # A retry of a turn another process runs: joined
                        # through PostgreSQL, never asked again.
                        key = (session_id, rid)
                        head = _sse("turn", {"session_id": session_id, "request_id": rid})
                        return StreamingResponse(
                            self._followed(key, 0, head),
                            media_type="text/event-stream",
                            headers=_SSE_HEADERS,
                        )
                    if ending is None:
                        first = None
                        if state.config is None and self.settings.new_session_budget:
                            first = await self.hub.new_session_start()
                        refused = self._refusal(session_id, state, question, first)
                        if refused is not None:
                            raise refused
                    handle = await start()
                    key = (session_id, handle.request_id)
                    await self._admitted(handle)
                if handle.done:
                    result = await handle.outcome()
                    if isinstance(result, RejectedResult):
                        # Refused by the session itself (a question the edge
                        # could not measure, or a repeat of a refused id).
                        self._keep(key, result_json(result))
                        status = _REJECT_STATUS.get(result.reason, 400)
                        code = "busy" if result.reason == "busy" else result.reason
                        return _error(status, code, _describe_rejection(result))
            except (StoreError, SessionClosed, InvalidCommand) as exc:
                raise self._hub_error(exc) from None
            relay = self.live.get(key)
            if relay is None:
                # The first handle of the turn (a repeat joins the same relay).
                relay = self.relay(handle, partial(self.starting.release_on_behalf_of, slot))
                held = False
                if self.settings.max_starting:
                    self.nursery.start_soon(relay.hold_at_most, self.settings.start_hold)
        finally:
            if held:
                self.starting.release_on_behalf_of(slot)
        return key, relay

    def relay(self, handle: TurnHandle, started: Callable[[], None] = lambda: None) -> _Relay:
        """The relay of a turn this process runs (started now if it has none):
        its streams here read it, and with previews it publishes the turn's
        deltas for the other nodes. A turn started here on another node's
        behalf (a hand-over) gets one too, so that it is followed from there.
        ``started`` is called at the turn's first delta or its end."""
        key = (handle.session_id, handle.request_id)
        relay = self.live.get(key)
        if relay is None:
            relay = self.live[key] = _Relay(handle, started)
            self.nursery.start_soon(relay.run, self, key)
        return relay

    async def reattach(self, request: Request) -> Response:
        session_id = _path_id(request, "session_id")
        rid = _path_id(request, "request_id")
        raw = request.headers.get("last-event-id", "0").strip() or "0"
        if not re.fullmatch(r"[0-9]{1,9}", raw):
            raise ApiError(400, "bad_last_event_id", "Last-Event-ID must be a delta number")
        after = int(raw)
        key = (session_id, rid)
        relay = self.live.get(key)
        if relay is not None:
            return StreamingResponse(
                relay.stream(after, b""), media_type="text/event-stream", headers=_SSE_HEADERS
            )
        # In flight in the log and not here: followed through the previews
        # while its owner lives (a dead owner's turn is closed here at once,
        # below).
        if (
            self.previews is not None
            and await self._runs_elsewhere(key)
            and (self.node is None or await self.node.owner_elsewhere(session_id) is not None)
        ):
            return StreamingResponse(
                self._followed(key, after, b""),
                media_type="text/event-stream",
                headers=_SSE_HEADERS,
            )
        outcome = await self._outcome(key)
        return StreamingResponse(
            _one(_frame("outcome", outcome)), media_type="text/event-stream", headers=_SSE_HEADERS
        )

    async def _runs_elsewhere(self, key: tuple[str, str]) -> bool:
        """Whether the log has the turn in flight with no outcome yet (its
        relay is not here: another process runs it, or ran it and died)."""
        if key in self.done:
            return False
        stored = await self._stored(key[0])
        if _stored_outcome(stored, key[1]) is not None:
            return False
        if not any(e.payload.get("request_id") == key[1] for e in stored):
            raise ApiError(404, "unknown_request", f"no request {key[1]!r} in this session")
        return True

    async def _logged(self, key: tuple[str, str]) -> bytes | None:
        """The JSON of the turn's outcome kept here or in the log; ``None``
        while there is none."""
        kept = self.done.get(key)
        if kept is not None:
            return kept
        found = _stored_outcome(await self.store.read(key[0]), key[1])
        return None if found is None else orjson.dumps(found)

    async def _ended_elsewhere(self, key: tuple[str, str]) -> bool:
        """Whether a turn another process ran has its outcome in the log. If
        no live process owns its session any more (its owner died, or was
        paused past its lease), this one takes the session over, which
        closes the turn as ``interrupted``; a process that took it first
        (``owned_elsewhere``) writes that outcome itself."""
        assert self.previews is not None
        if await self._logged(key) is not None:
            return True
        if self.node is not None:
            if await self.node.owner_elsewhere(key[0]) is not None:
                return False
        elif await self.previews.owner_live(key[0]):
            return False
        try:
            handle = await self.hub.submit(key[0], "", request_id=key[1])
            self._keep(key, result_json(await handle.outcome()))
        except (StoreError, SessionClosed, InvalidCommand, SessionOwnedElsewhere) as exc:
            log.info("follow_takeover_refused", error=type(exc).__name__)
            return False
        return True

    async def _followed(
        self, key: tuple[str, str], after: int, head: bytes, repeated: bool | None = None
    ) -> AsyncIterator[bytes]:
        """The stream of a turn another process runs, followed through
        PostgreSQL: the deltas after ``after`` (numbered as the owner
        numbers them), then the outcome from the log (``repeated`` as
        given, else as the log tells). A client going away stops only the
        following."""
        assert self.previews is not None
        if head:
            yield head
        settings = self.settings
        deadline = trio.current_time() + settings.follow_deadline
        timed_out = False

        async def ended() -> bool:
            nonlocal timed_out
            if self.stopping.is_set():
                return True  # this service stops: the stream ends (shutting_down)
            if trio.current_time() >= deadline:
                timed_out = True
                return True
            return await self._ended_elsewhere(key)

        try:
            async for batch in self.previews.follow(
                key[0], key[1], after, ended=ended, poll_interval=settings.follow_poll
            ):
                yield b"".join(_sse("delta", {"text": d.text}, id=d.seq) for d in batch)
            # The owner's end row comes once its outcome is decided; an
            # outcome its store refused is written later (or by a takeover).
            while not timed_out:
                found = await self._logged(key)
                if found is not None:
                    if repeated is not None:
                        found = orjson.dumps(orjson.loads(found) | {"repeated": repeated})
                    yield _frame("outcome", found)
                    return
                if self.stopping.is_set():
                    yield _sse("error", _STOPPING)
                    return
                if await ended():
                    continue
                with trio.move_on_after(settings.follow_poll):
                    await self.stopping.wait()
        except StoreError as exc:
            if self.stopping.is_set():  # (the previews close with the service)
                yield _sse("error", _STOPPING)
                return
            message = f"the event store failed: {describe_store_error(exc)}"
            yield _sse("error", {"code": "store_error", "message": message})
            return
        message = "the turn did not end within the follow deadline"
        yield _sse("error", {"code": "follow_timeout", "message": message})

    async def _outcome(self, key: tuple[str, str]) -> bytes:
        """The JSON of a turn's outcome when no relay has it: kept, else
        from the store."""
        kept = self.done.get(key)
        if kept is not None:
            return kept
        stored = await self._stored(key[0])
        found = _stored_outcome(stored, key[1])
        if found is not None:
            return orjson.dumps(found)
        if not any(e.payload.get("request_id") == key[1] for e in stored):
            raise ApiError(404, "unknown_request", f"no request {key[1]!r} in this session")
        # In flight in the log, yet no relay here: the process that ran it
        # stopped, or this one's store refused its end (``store_error``,
        # written once the store takes writes again). The request id,
        # repeated, asks the session's actor, which records nothing new for
        # an id it has seen: starting it closes a turn left by a stopped
        # process as ``interrupted``; a refused end is the ``store_error``
        # its callers got; another process that owns the session is
        # ``owned_elsewhere``.
        try:
            handle = await self.hub.submit(key[0], "", request_id=key[1])
            result = await handle.outcome()
        except (StoreError, SessionClosed, InvalidCommand) as exc:
            raise self._hub_error(exc) from None
        return orjson.dumps(result_json(result))

    async def cancel(self, request: Request) -> Response:
        session_id = _path_id(request, "session_id")
        rid = _path_id(request, "request_id")
        # A POST like any other: JSON, here an empty object (or no body).
        if await self._body(request, empty=True):
            raise ApiError(400, "bad_field", "a cancel takes no fields")
        if self.live.get((session_id, rid)) is None:
            reply = await self._forward(session_id, "cancel", {"request_id": rid})
            if reply is not None:
                return _json(reply["body"], reply["status"])
        return await self._cancel_here(session_id, rid)

    async def _cancel_here(self, session_id: str, rid: str) -> Response:
        key = (session_id, rid)
        relay = self.live.get(key)
        if relay is not None:
            try:
                result = await relay.handle.cancel()
            except SessionClosed as exc:
                ended = await self._closed(key, exc)
                if isinstance(ended, ApiError):
                    raise ended from None
                return _raw_json(ended)
            return _json(result_json(result))
        return _raw_json(await self._outcome(key))

    # -- a node of a cluster -------------------------------------------------

    def _rid(self, rid: str | None) -> str | None:
        # A node names every question: a call to another node, and a client
        # following the turn from here, need its id.
        return uuid.uuid4().hex if rid is None and self.node is not None else rid

    def _local_work(self) -> None:
        if self.node is not None and self.node.stopping:
            raise ApiError(503, "shutting_down", "this node is shutting down")

    async def _forward(
        self, session_id: str, kind: str, body: dict[str, Any]
    ) -> dict[str, Any] | None:
        """``kind`` handed to the live node that owns the session, and its
        reply (``{"status", "body"}``, or ``{"stream"}`` for an admitted
        question); ``None``: no other live node owns it, do it here."""
        node = self.node
        if node is None:
            return None
        for _ in range(_ROUTE_ATTEMPTS):
            target = await node.owner_elsewhere(session_id)
            if target is None:
                return None
            try:
                reply = await node.call(target, session_id, kind, body)
            except NotTaken:
                continue  # gone or stuck: its lease says so soon
            except TimeoutError:
                raise ApiError(
                    504, "owner_timeout", f"node {target!r} did not answer in time"
                ) from None
            if not reply.get("retry"):
                return reply
            await trio.sleep(0.2)  # its owner is letting it go
        raise ApiError(503, "owner_unavailable", "the session's owner did not take the call")

    async def answer_call(self, call: Call) -> dict[str, Any]:
        """Run a call another node handed over for a session this node owns
        (never handed on: a session found owned elsewhere is ``retry``)."""
        kind, sid, body = call.kind, call.session_id, call.body
        try:
            if kind == "cancel":
                return _reply(await self._cancel_here(sid, body["request_id"]))
            if kind == "erase":
                return _reply(await self._erase_here(sid))
            if kind not in ("switch", "turns", "edit", "regenerate"):
                raise ApiError(400, "bad_call", f"no call {kind!r} (another release?)")
            if self.node is not None and self.node.stopping:
                return {"retry": True}
            if kind == "switch":
                return _reply(await self._switch_here(sid, body["branch"]))
            rid = str(body["request_id"])
            question = body.get("question")
            start: Callable[[], Awaitable[TurnHandle]]
            if kind == "edit":
                index = int(body["turn_index"])
                start = partial(self.hub.edit, sid, index, str(question), request_id=rid)
            elif kind == "turns":
                start = partial(self.hub.submit, sid, str(question), request_id=rid)
            else:
                start = partial(self.hub.regenerate, sid, request_id=rid)
            began = await self._begin(sid, question, rid, start, branch=kind != "turns")
        except ApiError as exc:
            if exc.code == "owned_elsewhere":
                return {"retry": True}
            return {
                "status": exc.status,
                "body": {"error": {"code": exc.code, "message": exc.message}},
            }
        if isinstance(began, Response):
            return _reply(began)
        # Whether the question repeats a turn that had ended (its recorded
        # outcome), as the handle's result says (a quick turn may be done
        # already without being a repeat).
        handle, repeated = began[1].handle, False
        if handle.done:
            with contextlib.suppress(SessionClosed, StoreError):
                repeated = (await handle.outcome()).repeated
        return {"stream": True, "repeated": repeated}

    async def _left_in_flight(self, session_id: str, state: SessionState) -> bool:
        """Whether the log shows a turn in flight that no relay here runs (a
        dead node's: the session has no live owner, or it would have been
        handed over) and it was closed now: the session is taken over, and
        the turn ends as ``interrupted``, before the new question is judged
        (it would be refused as busy)."""
        if not is_in_flight(state):
            return False
        key = (session_id, str(state.request.request_id))  # type: ignore[union-attr]
        if key in self.live or key in self.done:
            return False
        await self._outcome(key)
        return True

    async def _follow_elsewhere(
        self, session_id: str, rid: str, head: bytes, repeated: bool
    ) -> AsyncIterator[bytes]:
        """A turn run by another node, followed to its outcome through the
        log (the turn's deltas are the previews' business). Should its owner
        die, the outcome is decided here: the session is taken over, and a
        turn it left in flight ends as ``interrupted``."""
        if head:
            yield head
        node = self.node
        assert node is not None
        after, pause, looked = 0, 0.02, trio.current_time()
        while True:
            stored = await self.store.read(session_id, after)
            found = _stored_outcome(stored, rid)
            if found is not None:
                yield _frame("outcome", orjson.dumps(found | {"repeated": repeated}))
                return
            after = stored[-1].seq if stored else after
            if trio.current_time() - looked >= _POLL_OWNER:
                looked = trio.current_time()
                if await node.owner_elsewhere(session_id) is None:
                    try:
                        yield _frame("outcome", await self._outcome((session_id, rid)))
                    except ApiError as exc:
                        yield _sse("error", {"code": exc.code, "message": exc.message})
                    return
            await trio.sleep(pause)
            pause = min(pause * 2, 0.2)

    async def sessions(self, request: Request) -> Response:
        limit = _int_param(request, "limit", 100, low=1, high=self.settings.max_page)
        after = _int_param(request, "after", 0, low=0, high=10**18)
        ids = await self.store.session_ids()
        page = ids[after : after + limit]
        items = []
        for sid in page:
            stored = await self.store.read(sid)
            items.append(session_summary(sid, stored, seed=await seed_of(self.store, stored)))
        nxt = after + len(page) if after + len(page) < len(ids) else None
        return _json({"sessions": items, "total": len(ids), "next": nxt})

    async def session(self, request: Request) -> Response:
        session_id = _path_id(request, "session_id")
        state = await self.hub.state(session_id)
        if state.version == 0:
            raise ApiError(404, "unknown_session", f"no session {session_id!r}")
        return _json(_state_json(session_id, state))

    async def erase(self, request: Request) -> Response:
        """``DELETE /v1/sessions/{id}``: erase the session (its turn in
        flight ends as ``erased``); 404 if there is none, nothing changed."""
        session_id = _path_id(request, "session_id")
        reply = await self._forward(session_id, "erase", {})
        if reply is not None:
            return _json(reply["body"], reply["status"])
        return await self._erase_here(session_id)

    async def _erase_here(self, session_id: str) -> Response:
        try:
            record = await self.hub.erase(session_id)
        except UnknownSession:
            raise ApiError(404, "unknown_session", f"no session {session_id!r}") from None
        except StoreError as exc:
            detail = describe_store_error(exc)
            raise ApiError(503, "store_error", f"nothing erased: {detail}") from None
        # Results kept for reconnects hold its answers: they go too.
        for key in [k for k in self.done if k[0] == session_id]:
            self.kept_bytes -= len(self.done.pop(key)) + _KEPT_ENTRY_BYTES
        return _json(
            {
                "erased": True,
                "session_hash": record.session_hash,
                "erased_at": record.erased_at,
                "events": record.events,
            }
        )

    async def events(self, request: Request) -> Response:
        session_id = _path_id(request, "session_id")
        after = _int_param(request, "after", 0, low=0, high=10**18)
        limit = _int_param(request, "limit", 100, low=1, high=self.settings.max_page)
        stored = await self.store.read(session_id, after)
        if not stored and after == 0:
            raise ApiError(404, "unknown_session", f"no session {session_id!r}")
        page = stored[:limit]
        items = [
            {
                "seq": e.seq,
                "tag": e.tag,
                "schema_version": e.schema_version,
                "recorded_at": e.recorded_at,
                "payload": dict(e.payload),
            }
            for e in page
        ]
        nxt = page[-1].seq if len(stored) > limit else None
        return _json({"session_id": session_id, "events": items, "next": nxt})

    async def state_at(self, request: Request) -> Response:
        session_id = _path_id(request, "session_id")
        events = await self.store.read_decoded(session_id, DEFAULT_CODEC)
        if not events:
            raise ApiError(404, "unknown_session", f"no session {session_id!r}")
        at = _int_param(request, "at", len(events), low=1, high=10**18)
        if at > len(events):
            raise ApiError(404, "unknown_seq", f"the session has {len(events)} events")
        try:
            state = await replay_resolved(self.store, events[:at])
        except ReplayError as exc:
            raise ApiError(503, "store_error", f"the log does not fold: {exc}") from None
        return _json(_state_json(session_id, state))

    async def timeline(self, request: Request) -> Response:
        session_id = _path_id(request, "session_id")
        stored = await self._stored(session_id)
        seed = await seed_of(self.store, stored)
        return _json(timeline_model(session_id, stored, seed=seed))

    async def follow(self, request: Request) -> Response:
        session_id = _path_id(request, "session_id")
        stored = await self._stored(session_id)
        seed = await seed_of(self.store, stored)

        async def events() -> AsyncIterator[bytes]:
            seen = list(stored)
            yield _sse("timeline", timeline_model(session_id, seen, seed=seed))
            while not self.stopping.is_set():
                with trio.move_on_after(self.settings.follow_interval):
                    await self.stopping.wait()
                more = await self.store.read(session_id, seen[-1].seq)
                if more:
                    seen.extend(more)
                    yield _sse("timeline", timeline_model(session_id, seen, seed=seed))

        return StreamingResponse(events(), media_type="text/event-stream", headers=_SSE_HEADERS)

    async def nodes(self, request: Request) -> Response:
        """GET /v1/nodes: the live nodes (``?dead=1``: and those whose
        heartbeat ran out), each with its sessions, heartbeats and lag."""
        limit = _int_param(request, "sessions", 1000, low=0, high=self.settings.max_page * 100)
        dead = _int_param(request, "dead", 0, low=0, high=1)
        listed = getattr(self.store, "nodes", None)
        if listed is None:
            raise ApiError(404, "no_cluster", "nodes need a PostgreSQL store")
        found = await listed(dead=bool(dead), sessions=limit)
        return _json(
            {
                "node_id": None if self.node is None else self.node.node_id,
                "nodes": [_node_json(n) for n in found],
            }
        )

    async def healthz(self, request: Request) -> Response:
        stats = self.hub.statistics()
        body: dict[str, Any] = {
            "ok": True,
            "node_id": None if self.node is None else self.node.node_id,
            "stopping": self.node is not None and self.node.stopping,
            "actors": stats.actors,
            "in_flight": stats.in_flight,
            "relays": len(self.live),
            "kept_results": len(self.done),
            "kept_results_bytes": self.kept_bytes,
            "store_errors": stats.store_errors,
        }
        p = self.previews
        if p is not None:
            body["previews"] = {
                "batches": p.batches,
                "rows": p.rows_published,
                "publish_errors": p.publish_errors,
                "notifications": p.notifications,
                "following": p.following,
            }
        return _json(body)

    async def page(self, request: Request) -> Response:
        policy = f"{LIVE_PAGE_POLICY}; frame-ancestors 'none'"
        headers = {"Cache-Control": "no-store", "Content-Security-Policy": policy}
        return HTMLResponse(render_page(None), headers=headers)


def _reply(response: Response) -> dict[str, Any]:
    # A response as a call's reply (the JSON routes' bodies are JSON).
    return {"status": response.status_code, "body": orjson.loads(bytes(response.body))}


def _node_json(node: Any) -> dict[str, Any]:
    return {
        "node_id": node.node_id,
        "live": node.live,
        "stopping": node.stopping,
        "address": node.address,
        "host": node.host,
        "pid": node.pid,
        "started_at": node.started_at.timestamp(),
        "heartbeat_at": node.heartbeat_at.timestamp(),
        "expires_at": node.expires_at.timestamp(),
        "heartbeat_age_ms": round(node.age_ms, 1),
        "renewals": node.renewals,
        "lag_ms": round(node.lag_ms, 1),
        "session_count": node.session_count,
        "sessions": list(node.sessions),
    }


def _only(body: Mapping[str, Any], *fields: str) -> None:
    """Refuse a body with a field the route does not take (400 ``bad_field``)."""
    unknown = set(body) - set(fields)
    if unknown:
        raise ApiError(400, "bad_field", f"unknown fields: {', '.join(sorted(unknown))}")


def _request_id(body: Mapping[str, Any]) -> str | None:
    """The body's ``request_id``, checked as ids are; ``None``: not given."""
    rid = body.get("request_id")
    return None if rid is None else _check_id("request_id", rid)


def _question(body: Mapping[str, Any]) -> str:
    """The body's ``question``: a string, not refused for its shape (empty,
    not valid text), so a refusal decided here writes nothing."""
    question = body.get("question")
    if not isinstance(question, str):
        raise ApiError(400, "bad_field", "question must be a string")
    shape = _shape_refusal(question)
    if shape is not None:
        raise shape
    return question


def _shape_refusal(question: str) -> ApiError | None:
    # The session's own first two rules (sessions._machine._submit), applied
    # before the hub so that such a question writes nothing.
    if not question.strip():
        return ApiError(400, "empty_question", "the question is empty")
    try:
        question.encode("utf-8")
    except UnicodeEncodeError:
        return ApiError(400, "invalid_question", "the question has a lone surrogate")
    return None


class _Gates:
    """A lock per session, kept only while someone holds or waits for it."""

    def __init__(self) -> None:
        self._locks: dict[str, tuple[trio.Lock, int]] = {}

    @contextlib.asynccontextmanager
    async def hold(self, key: str) -> AsyncIterator[None]:
        """Hold ``key``'s lock for the body.

        Cancellation: while waiting, the lock is not taken; inside, it is
        given back as the body unwinds.
        """
        lock, users = self._locks.get(key, (trio.Lock(), 0))
        self._locks[key] = (lock, users + 1)
        try:
            async with lock:
                yield
        finally:
            lock, users = self._locks[key]
            if users == 1:
                del self._locks[key]
            else:
                self._locks[key] = (lock, users - 1)


async def _one(chunk: bytes) -> AsyncIterator[bytes]:
    yield chunk


def _describe_rejection(result: RejectedResult) -> str:
    return {
        "busy": "another turn of this session is in flight",
        "over_budget": "the question does not fit the request budget",
        "empty_question": "the question is empty",
        "invalid_question": "the question is not valid Unicode text",
        "store_error": f"the event store failed: {result.detail}",
        "limit": f"the event store is full: {result.detail}",
    }.get(result.reason, result.reason)


def _pins_json(session_id: str, listed: tuple[Any, ...]) -> dict[str, Any]:
    return {"session_id": session_id, "pins": [attrs.asdict(p) for p in listed]}


def _branches_json(session_id: str, listed: tuple[BranchInfo, ...]) -> dict[str, Any]:
    active = next((b.branch_id for b in listed if b.active), "main")
    return {
        "session_id": session_id,
        "active_branch": active,
        "branches": [attrs.asdict(b) for b in listed],
    }


def _state_json(session_id: str, state: Any) -> dict[str, Any]:
    return {
        "session_id": session_id,
        "version": state.version,
        "phase": phase_name(state),
        "in_flight": state.request.request_id if is_in_flight(state) else None,
        "turns": [
            {"request_id": t.request_id, "question": t.question, "answer": t.answer}
            for t in state.turns
        ],
    }


#: Host names that can only mean this machine (a rebound DNS name cannot
#: pose as one of them: the browser sends the name it resolved).
_LOOPBACK_HOSTS = frozenset({"127.0.0.1", "localhost", "[::1]"})
#: A preflight's answer to an allowed origin.
_PREFLIGHT_HEADERS = {
    "Access-Control-Allow-Methods": "GET, POST",
    "Access-Control-Allow-Headers": "Content-Type, Last-Event-ID, Authorization",
    "Access-Control-Max-Age": "600",
}


def _headers(scope: Scope, name: bytes) -> list[bytes]:
    return [v for k, v in scope["headers"] if k.lower() == name]


def _host_name(host: bytes) -> str:
    # "127.0.0.1:8421" -> "127.0.0.1", "[::1]:80" -> "[::1]", "LocalHost" -> "localhost"
    text = host.decode("latin-1").strip().lower()
    if text.startswith("["):
        return text.partition("]")[0] + "]"
    return text.partition(":")[0]


def _origin_refusal(scope: Scope, allowed: frozenset[str]) -> str | None:
    """Why a request without a token comes from somewhere it must not
    (``None``: it does not). The ``Host`` must name this machine (a DNS
    rebinding page sends its own name), and an ``Origin``, when the browser
    sends one, must be the service's own (the ``Host`` it was sent to) or
    one the operator allowed: another page, even on another loopback port,
    may neither write nor read."""
    hosts = _headers(scope, b"host")
    if len(hosts) != 1 or _host_name(hosts[0]) not in _LOOPBACK_HOSTS:
        return "the Host header must name a loopback address"
    origins = _headers(scope, b"origin")
    if not origins:
        return None  # not sent by a browser's cross-origin machinery
    if len(origins) > 1:
        return "one Origin header at most"
    origin = origins[0].decode("latin-1").strip().lower()
    if origin in allowed or origin == "http://" + hosts[0].decode("latin-1").strip().lower():
        return None
    return "requests from this origin are not allowed (see --allow-origin)"


def _bearer(scope: Scope, token: bytes) -> Response | None:
    """The refusal of a request whose credentials are not the token
    (``None``: they are). The scheme is case-insensitive (RFC 7235); the
    token is compared in constant time."""
    given = _headers(scope, b"authorization")
    if len(given) > 1:
        return _error(400, "bad_authorization", "one Authorization header at most")
    scheme, _, credentials = (given[0] if given else b"").strip().partition(b" ")
    if scheme.lower() != b"bearer" or not hmac.compare_digest(credentials.strip(), token):
        refused = _error(401, "unauthorized", "a bearer token is required")
        refused.headers["WWW-Authenticate"] = "Bearer"
        return refused
    return None


def check_origin(origin: str) -> str:
    """An ``--allow-origin`` value as the browser sends it (``scheme://host[:port]``,
    lowercase), or ValueError if it is not one."""
    parts = urlsplit(origin.strip())
    if (
        parts.scheme not in ("http", "https")
        or not parts.hostname
        or parts.path not in ("", "/")
        or parts.query
        or parts.fragment
        or parts.username is not None
        or parts.password is not None
    ):
        raise ValueError(
            f"{origin!r} is not an origin (scheme://host[:port], e.g. http://localhost:3000)"
        )
    netloc = parts.netloc.lower()
    if parts.port == {"http": 80, "https": 443}[parts.scheme]:
        netloc = netloc.rpartition(":")[0]  # a browser leaves the default port out
    return f"{parts.scheme}://{netloc}"


def _guard(app: ASGIApp, settings: ServeSettings) -> ASGIApp:
    """Access log for every request; then who may ask: the bearer token when
    one is set, else only this machine's pages (see :func:`_origin_refusal`).
    Preflights from an allowed origin are answered here (they carry no token)."""
    token = None if settings.token is None else settings.token.encode()
    allowed = settings.allowed_origins

    async def guarded(scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await app(scope, receive, send)
            return
        started = time.perf_counter()
        status = 0
        origin = b"".join(_headers(scope, b"origin")[:1]).decode("latin-1").strip().lower()
        cors = [(b"access-control-allow-origin", origin.encode()), (b"vary", b"Origin")]
        trusted = origin in allowed

        async def sending(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
                if trusted:
                    message = {**message, "headers": [*message.get("headers", ()), *cors]}
            await send(message)

        try:
            # Answered here, not by the app: a preflight's grant, or a refusal.
            early: Response | None
            if trusted and scope["method"] == "OPTIONS":
                early = Response(status_code=204, headers=_PREFLIGHT_HEADERS)
            elif token is not None:
                early = _bearer(scope, token)
            else:
                why = _origin_refusal(scope, allowed)
                early = None if why is None else _error(403, "forbidden_origin", why)
            if early is not None:
                await early(scope, receive, sending)
                return
            await app(scope, receive, sending)
        finally:
            log.info(
                "http_request",
                method=scope["method"],
                path=scope["path"],
                status=status,
                duration_ms=round((time.perf_counter() - started) * 1000, 3),
            )

    return guarded


#: Sent with every response; a response without a policy of its own (all but
#: the page) gets ``default-src 'none'``: a browser runs nothing it serves.
_SECURITY_HEADERS = [
    (b"x-content-type-options", b"nosniff"),
    (b"x-frame-options", b"DENY"),
    (b"referrer-policy", b"no-referrer"),
]
_NO_CONTENT_POLICY = (b"content-security-policy", b"default-src 'none'; frame-ancestors 'none'")
#: Sent with a response that leaves the connection unusable for another
#: request: one sent before the request's body was read (an early 413, 401,
#: 415...: the rest of the body would be read as the next request), and an
#: event stream (a client that keeps its connection after the stream would
#: otherwise hold a shutdown for the whole graceful timeout).
_CLOSE = (b"connection", b"close")
#: What stays as it is when a path is read as sent (``raw_path``).
_PATH_SAFE = "/%!$&'()*+,;=:@~-._"


def _is_stream(headers: list[tuple[bytes, bytes]]) -> bool:
    return any(
        k.lower() == b"content-type" and v.lower().startswith(b"text/event-stream")
        for k, v in headers
    )


def _edge(app: ASGIApp) -> ASGIApp:
    """Routes see the path as it was sent, and responses get the security
    headers, and ``Connection: close`` when the connection cannot carry
    another request (see ``_CLOSE``)."""

    async def edged(scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await app(scope, receive, send)
            return
        # Still percent-encoded: an id's escaped "/" stays in its segment.
        # (A server that gives no raw_path: the path encoded again, so that
        # an id's "%" is not read twice; only an id's "/" is then lost.)
        raw = scope.get("raw_path")
        if raw is not None:
            path = quote_from_bytes(raw, safe=_PATH_SAFE)
        else:
            path = quote(scope["path"], safe=_PATH_SAFE.replace("%", ""))
        scope = {**scope, "path": path}
        # Whether the request's body is still (partly) unread.
        unread = any(
            (k == b"content-length" and v.strip() not in (b"", b"0")) or k == b"transfer-encoding"
            for k, v in ((k.lower(), v) for k, v in scope.get("headers", ()))
        )

        async def receiving() -> Message:
            nonlocal unread
            message = await receive()
            if message["type"] != "http.request" or not message.get("more_body", False):
                unread = False
            return message

        async def sending(message: Message) -> None:
            if message["type"] == "http.response.start":
                headers = [*message.get("headers", ()), *_SECURITY_HEADERS]
                if not any(k.lower() == b"content-security-policy" for k, _ in headers):
                    headers.append(_NO_CONTENT_POLICY)
                if unread or _is_stream(headers):
                    headers.append(_CLOSE)
                message = {**message, "headers": headers}
            elif message["type"] == "http.response.body" and not message.get("more_body", False):
                # The last write ends the response, and after Connection:
                # close the server closes the socket within this call. A
                # streaming response's disconnect watcher is told of the end
                # at that moment and cancels its sender: unshielded, the
                # close was cancelled and the connection stayed open until
                # the client left (holding a shutdown for its whole backstop).
                with trio.CancelScope(shield=True):
                    await send(message)
                return
            await send(message)

        await app(scope, receiving, sending)

    return edged


def create_app(
    hub: Hub,
    store: EventStore,
    settings: ServeSettings | None = None,
    *,
    nursery: trio.Nursery,
    stopping: trio.Event | None = None,
    node: Node | None = None,
    previews: Previews | None = None,
) -> ASGIApp:
    """The ASGI application over a running hub and its store.

    ``nursery`` runs one small task per turn in flight (it reads the turn's
    preview for all its streams; it ends with the turn, or when the hub
    closes). ``stopping``, once set, ends the live-follow streams (so a
    graceful shutdown need not wait for browsers to go away). ``node``:
    this process as a node of a cluster (made here if ``store`` is a
    :class:`~turnledger.adapters.stores.PostgresStore` opened with a
    ``node_id``); it answers the calls of other nodes in ``nursery``.
    ``previews`` (a node's, see docs/cluster.md): the turns this process
    runs publish their deltas there, and a stream of a turn that runs on
    another node follows it from there.
    """
    settings = settings or ServeSettings()
    stop = trio.Event() if stopping is None else stopping
    svc = _Service(hub, store, settings, stop, nursery, previews)
    if node is None and isinstance(store, PostgresStore) and store.inbox is not None:
        node = Node(store, hub)
    if node is not None:
        svc.node = node
        nursery.start_soon(node.run, svc.answer_call)

    async def api_error(request: Request, exc: Exception) -> Response:
        assert isinstance(exc, ApiError)
        return _error(exc.status, exc.code, exc.message)

    async def http_error(request: Request, exc: Exception) -> Response:
        assert isinstance(exc, HTTPException)
        code = {404: "not_found", 405: "method_not_allowed"}.get(exc.status_code, "http_error")
        return _error(exc.status_code, code, str(exc.detail))

    async def encrypted(request: Request, exc: Exception) -> Response:
        # Never the ciphertext, never the content: what is wrong, in a word.
        log.error("http_error", error=type(exc).__name__, path=request.url.path)
        if isinstance(exc, ContentEncrypted):
            return _error(
                503,
                "content_encrypted",
                "the content is encrypted: serve has not been given its key",
            )
        return _error(500, "encryption", f"the content cannot be opened ({type(exc).__name__})")

    async def internal(request: Request, exc: Exception) -> Response:
        log.error("http_error", error=type(exc).__name__, path=request.url.path)
        return _error(500, "internal", "internal error")

    sid = "{session_id}"
    turn = f"/v1/sessions/{sid}/turns/{{request_id}}"
    app = Starlette(
        routes=[
            Route("/", svc.page),
            Route("/healthz", svc.healthz),
            Route("/v1/nodes", svc.nodes),
            Route("/v1/sessions", svc.sessions),
            Route(f"/v1/sessions/{sid}", svc.session),
            Route(f"/v1/sessions/{sid}", svc.erase, methods=["DELETE"]),
            Route(f"/v1/sessions/{sid}/events", svc.events),
            Route(f"/v1/sessions/{sid}/state", svc.state_at),
            Route(f"/v1/sessions/{sid}/timeline", svc.timeline),
            Route(f"/v1/sessions/{sid}/follow", svc.follow),
            Route(f"/v1/sessions/{sid}/turns", svc.submit, methods=["POST"]),
            Route(f"/v1/sessions/{sid}/edit", svc.edit, methods=["POST"]),
            Route(f"/v1/sessions/{sid}/regenerate", svc.regenerate, methods=["POST"]),
            Route(f"/v1/sessions/{sid}/switch", svc.switch, methods=["POST"]),
            Route(f"/v1/sessions/{sid}/branches", svc.branches),
            Route(f"/v1/sessions/{sid}/fork", svc.fork, methods=["POST"]),
            Route(f"/v1/sessions/{sid}/summarize", svc.summarize, methods=["POST"]),
            Route(f"/v1/sessions/{sid}/summaries", svc.summaries),
            Route(f"/v1/sessions/{sid}/pins", svc.pins),
            Route(f"/v1/sessions/{sid}/pins", svc.pin, methods=["POST"]),
            Route(f"/v1/sessions/{sid}/pins/{{pin_id}}", svc.unpin, methods=["DELETE"]),
            Route(f"{turn}/stream", svc.reattach),
            Route(f"{turn}/cancel", svc.cancel, methods=["POST"]),
        ],
        exception_handlers={
            ApiError: api_error,
            HTTPException: http_error,
            ContentEncrypted: encrypted,
            EncryptionError: encrypted,
            Exception: internal,
        },
    )
    return _edge(_guard(app, settings))
