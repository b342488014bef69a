"""Branches against a naive reference model (a plain tree of lists).

Random sequences of submits, edits, regenerates, switches, summaries,
completions, failures, cancels, timeouts and late completions drive the pure
machine (under a byte budget that drops old turns) and,
independently, a model written without the projection or the machine's
code: a dict of branch name -> list of (request id, question, answer), the
active branch's name, and the turn in flight. After every step:

- each branch's history equals the model's;
- the request in flight carries exactly the active branch's turns (never a
  turn of another branch) and its question;
- bad input (an unknown turn or branch, a switch while busy, a summary of
  turns a branch does not have) raised its typed error and changed nothing;
- a request that sends a summary sends it once, right after the system
  prompt; it is a summary of the active branch's turns from the first one,
  it covers exactly the turns the request drops, and no turn it sends;

and at the end a replay of the log equals the live state, and a replay that
ignores every summary event gives exactly the same turns on every branch.

Forks join in (:func:`test_forks_match_the_model_and_leave_their_source_alone`):
several sessions, each a log of its own; a fork starts a new one from the
active branch of the current one, and later steps may go on in any of them.
Each fork's history equals the model's (the source's turns up to the fork
point, then its own), a fork never changes a byte of its source's log, and
each session replays, through the real fork resolution over a store of
encoded rows, to its live state.
"""

from __future__ import annotations

from typing import Literal

import attrs
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from turnledger import SessionBusy, UnknownBranch, UnknownSession, UnknownTurn
from turnledger.events import (
    DEFAULT_CODEC,
    BranchId,
    Event,
    RequestId,
    StoredEvent,
    SummaryRecorded,
    SummarySent,
)
from turnledger.sessions import (
    Budget,
    Cancel,
    Completed,
    Edit,
    Failed,
    Failure,
    Message,
    Pending,
    RecordSummary,
    Regenerate,
    SessionState,
    Start,
    Submit,
    Switch,
    Timeout,
    branch_turns,
    branches_of,
    decide,
    evolve,
    fork_events,
    fork_seed,
    initial_state,
    replay,
    request_messages,
)
from turnledger.sessions._forks import replay_resolved
from turnledger.sessions._replay import StateDecoder, fold_items

Pair = tuple[str, str, str]  # request id, question, answer


@attrs.define
class Model:
    """What should happen, as a user would explain it."""

    on_busy: str
    branches: dict[str, list[Pair]] = attrs.Factory(lambda: {"main": []})
    active: str = "main"
    #: (request id, question) of the turn in flight, on the active branch.
    flight: tuple[str, str] | None = None
    ended: list[str] = attrs.Factory(list)
    #: summary text -> (branch, start, end, request ids of the turns covered)
    summaries: dict[str, tuple[str, int, int, list[str]]] = attrs.Factory(dict)

    def end_flight(self) -> None:
        assert self.flight is not None
        self.ended.append(self.flight[0])
        self.flight = None

    def ask(self, rid: str, question: str) -> bool:
        """A question; False if refused as busy."""
        if self.flight is not None:
            if self.on_busy == "reject":
                self.ended.append(rid)  # rejected: its id is used up
                return False
            self.end_flight()
        self.flight = (rid, question)
        return True

    def branch(self, rid: str, keep: int, question: str) -> None:
        if self.flight is not None and self.on_busy == "reject":
            self.ended.append(rid)
            return
        name = f"b{len(self.branches)}"
        self.branches[name] = list(self.branches[self.active][:keep])
        self.active = name
        self.ask(rid, question)


Op = tuple[str, int]
#: (what, a number): turns and branches are picked by the number modulo
#: one more than there are, so that most picks exist and some do not.
OPS = st.tuples(
    st.sampled_from(
        [
            *("submit", "submit", "edit", "edit", "regen", "switch", "switch"),
            *("complete", "complete", "complete", "fail", "cancel", "timeout", "late"),
            *("summarize", "summarize"),
        ]
    ),
    st.integers(-1, 50),
)


#: About four turns of this walk fit with the question: older ones are dropped.
BUDGET = Budget(max_request_bytes=420)


@attrs.define
class Run:
    state: SessionState
    log: list[Event]
    budget: Budget = BUDGET

    def send(self, msg: Message) -> tuple[Event, ...]:
        events = decide(self.state, msg, budget=self.budget)
        for ev in events:
            self.state = evolve(self.state, ev)
        self.log.extend(events)
        return events


def _step(run: Run, model: Model, op: Op, n: int) -> None:
    kind, k = op
    rid = f"r{n}"
    if kind == "submit":
        run.send(Submit(RequestId(rid), f"q{n}"))
        model.ask(rid, f"q{n}")
    elif kind in ("edit", "regen"):
        turns = model.branches[model.active]
        index = (k if k < 0 else k % (len(turns) + 1)) if kind == "edit" else len(turns) - 1
        msg: Message = (
            Edit(RequestId(rid), index, f"q{n}") if kind == "edit" else Regenerate(RequestId(rid))
        )
        if not 0 <= index < len(turns):
            _refused(run, msg, UnknownTurn)
            return
        question = f"q{n}" if kind == "edit" else turns[index][1]
        run.send(msg)
        model.branch(rid, index, question)
    elif kind == "switch":
        names = [*model.branches, "b99"]
        name = names[max(k, 0) % len(names)]
        if name not in model.branches:
            _refused(run, Switch(BranchId(name)), UnknownBranch)
        elif name == model.active:
            assert run.send(Switch(BranchId(name))) == ()
        elif model.flight is not None and model.on_busy == "reject":
            _refused(run, Switch(BranchId(name)), SessionBusy)
        else:
            run.send(Switch(BranchId(name)))
            if model.flight is not None:
                model.end_flight()
            model.active = name
    elif kind in ("complete", "fail", "cancel", "timeout"):
        if model.flight is None:
            return
        current = RequestId(model.flight[0])
        if kind == "complete":
            run.send(Completed(current, f"a-{current}", "stop"))
            model.branches[model.active].append((current, model.flight[1], f"a-{current}"))
        elif kind == "fail":
            run.send(Failed(current, Failure("http_status", "HTTP 500")))
        elif kind == "cancel":
            run.send(Cancel(current))
        else:
            run.send(Timeout(current))
        model.end_flight()
    elif kind == "summarize":
        names = list(model.branches)
        name = names[abs(k) // 7 % len(names)] if k % 4 == 3 else model.active
        turns = model.branches[name]
        start = 1 if k % 5 == 4 else 0  # a summary that leaves a turn out: never sent
        end = abs(k) % (len(turns) + 2)
        text = f"S{n}"
        msg = RecordSummary(RequestId(f"sum{n}"), BranchId(name), start, end, text, "function", "f")
        if not start < end <= len(turns):
            _refused(run, msg, UnknownTurn)
            return
        (ev,) = run.send(msg)
        assert isinstance(ev, SummaryRecorded) and ev.text == text
        model.summaries[text] = (name, start, end, [t[0] for t in turns[start:end]])
    else:  # a late answer for a request that already ended: nothing changes
        if not model.ended:
            return
        late = RequestId(model.ended[k % len(model.ended)])
        before = run.state
        (ev,) = run.send(Completed(late, "a late answer", "stop"))
        assert type(ev).__name__ == "CompletionIgnored"
        assert attrs.evolve(run.state, version=before.version) == before


def _refused(run: Run, msg: Message, error: type[Exception]) -> None:
    before = run.state
    with pytest.raises(error):
        run.send(msg)
    assert run.state is before


def _check(run: Run, model: Model) -> None:
    state = run.state
    listed = {b.branch_id: b for b in branches_of(state)}
    assert list(listed) == list(model.branches)
    assert state.active_branch == model.active
    for name, pairs in model.branches.items():
        turns = [(t.request_id, t.question, t.answer) for t in branch_turns(state, name)]
        assert turns == pairs, name
        assert listed[name].length == len(pairs)
        assert listed[name].active == (name == model.active)
    flight = model.flight
    assert (state.request.request_id if isinstance(state, Pending) else None) == (
        flight[0] if flight is not None and isinstance(state, Pending) else None
    )
    if isinstance(state, Pending):
        assert flight is not None
        sent = [m.content for m in request_messages(state)]
        assert sent[0] == "sys" and sent[-1] == flight[1]
        body = sent[1:-1]
        summary = None
        if body and body[0] in model.summaries:
            summary, body = body[0], body[1:]
        # the sent turns: a contiguous run of the active branch's newest turns
        active = model.branches[model.active]
        pairs = [[q, a] for _, q, a in active]
        first_sent = len(active) - len(body) // 2
        assert body == [x for pair in pairs[first_sent:] for x in pair]
        assert not any(x in model.summaries for x in body)  # sent once, at most
        if summary is not None:
            name, start, end, rids = model.summaries[summary]
            # it stands for exactly the dropped turns: all of them, none sent
            assert start == 0 and end == first_sent
            assert rids == [t[0] for t in active[:end]]
            assert state.request.summary_id is not None


@pytest.mark.parametrize("on_busy", ["reject", "supersede"])
@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(ops=st.lists(OPS, max_size=40))
def test_branches_match_a_plain_tree_of_lists(
    on_busy: Literal["reject", "supersede"], ops: list[Op]
) -> None:
    run = Run(initial_state(), [])
    run.send(Start("sys", "m", on_busy=on_busy))
    model = Model(on_busy)
    for n, op in enumerate(ops):
        _step(run, model, op, n)
        _check(run, model)
    assert replay(run.log) == run.state
    # replay that ignores the summaries: the very same turns on every branch
    plain = replay([e for e in run.log if not isinstance(e, (SummaryRecorded, SummarySent))])
    for b in branches_of(run.state):
        assert list(branch_turns(plain, b.branch_id)) == list(branch_turns(run.state, b.branch_id))
    assert plain.summaries == () and plain.active_branch == run.state.active_branch
    # and the bulk replay's fold (plain tuples for the common turn) agrees
    decoder = StateDecoder()
    stored = [
        DEFAULT_CODEC.encode(e, session_id="s", seq=i, recorded_at=0.0)
        for i, e in enumerate(run.log, 1)
    ]
    assert fold_items([decoder.decode(e) for e in stored]) == run.state


def test_the_model_reaches_deep_trees() -> None:
    # (a fixed walk, so that the property above is known to reach a branch
    # of a branch, a switch back and a regenerate on an old branch)
    run = Run(initial_state(), [])
    run.send(Start("sys", "m"))
    model = Model("reject")
    script: list[Op] = [
        ("submit", 0), ("complete", 0), ("submit", 0), ("complete", 0),
        ("edit", 1), ("complete", 0), ("edit", 0), ("complete", 0),
        ("switch", 1), ("regen", 0), ("complete", 0), ("switch", 0), ("late", 0),
    ]  # fmt: skip
    for n, op in enumerate(script):
        _step(run, model, op, n)
        _check(run, model)
    assert list(model.branches) == ["main", "b1", "b2", "b3"]
    assert model.active == "main" and len(model.branches["b3"]) == 2
    assert replay(run.log) == run.state


# --- forks ------------------------------------------------------------------


class RowStore:
    """The read side of an event store over rows encoded by the real codec
    (enough for the fork resolution, which only reads)."""

    def __init__(self, logs: dict[str, list[Event]]) -> None:
        self.rows = {
            sid: [
                DEFAULT_CODEC.encode(e, session_id=sid, seq=i, recorded_at=0.0)
                for i, e in enumerate(log, 1)
            ]
            for sid, log in logs.items()
        }

    async def read_decoded(self, session_id: str, decoder: object, after: int = 0) -> list[Event]:
        return [DEFAULT_CODEC.decode(r) for r in self.rows.get(session_id, []) if r.seq > after]


def _now(coro: object) -> object:
    # The resolution awaits only RowStore, which never suspends: run it to
    # its end without an event loop (the core's tests use none).
    try:
        coro.send(None)  # type: ignore[attr-defined]
    except StopIteration as done:
        return done.value
    raise AssertionError("the resolution suspended")


def _encoded(log: list[Event], sid: str) -> list[StoredEvent]:
    return [
        DEFAULT_CODEC.encode(e, session_id=sid, seq=i, recorded_at=0.0)
        for i, e in enumerate(log, 1)
    ]


FORK_OPS = st.one_of(
    OPS,
    st.tuples(st.sampled_from(["fork", "fork", "hop"]), st.integers(-1, 50)),
)


@attrs.define
class World:
    on_busy: str
    runs: dict[str, Run] = attrs.Factory(dict)
    models: dict[str, Model] = attrs.Factory(dict)
    current: str = "s0"
    #: (fork, source, source's encoded rows when it was forked)
    forks: list[tuple[str, str, list[StoredEvent]]] = attrs.Factory(list)


def _fork(world: World, k: int) -> None:
    src_id = world.current
    run, model = world.runs[src_id], world.models[src_id]
    turns = model.branches[model.active]
    at = k % (len(turns) + 2) if k >= 0 else k  # some picks past the end, -1 too
    before_rows = _encoded(run.log, src_id)
    before_state = run.state
    if not 0 <= at <= len(turns):
        with pytest.raises(UnknownTurn):
            fork_events(run.state, src_id, at)
        return
    started, forked = fork_events(run.state, src_id, at)
    assert (forked.source, forked.source_seq, forked.branch) == (
        src_id,
        len(run.log),
        model.active,
    )
    new_id = f"s{len(world.runs)}"
    store = RowStore({sid: r.log for sid, r in world.runs.items()})
    source_state = _now(replay_resolved(store, run.log))  # type: ignore[arg-type]
    assert source_state == run.state
    seed = fork_seed(source_state, forked)  # type: ignore[arg-type]
    fork_run = Run(seed, [started, forked])
    for ev in (started, forked):
        fork_run.state = evolve(fork_run.state, ev)
    world.runs[new_id] = fork_run
    fork_model = Model(world.on_busy)
    fork_model.branches["main"] = list(turns[:at])
    world.models[new_id] = fork_model
    world.forks.append((new_id, src_id, before_rows))
    # the source did not move
    assert run.state is before_state and _encoded(run.log, src_id) == before_rows
    world.current = new_id


@pytest.mark.parametrize("on_busy", ["reject", "supersede"])
@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(ops=st.lists(FORK_OPS, max_size=50))
def test_forks_match_the_model_and_leave_their_source_alone(
    on_busy: Literal["reject", "supersede"], ops: list[Op]
) -> None:
    world = World(on_busy)
    world.runs["s0"] = Run(initial_state(), [])
    world.runs["s0"].send(Start("sys", "m", on_busy=on_busy))
    world.models["s0"] = Model(on_busy)
    for n, op in enumerate(ops):
        kind, k = op
        if kind == "fork":
            _fork(world, k)
        elif kind == "hop":
            ids = list(world.runs)
            world.current = ids[max(k, 0) % len(ids)]
        else:
            # request ids stay unique across the sessions (a fork knows its
            # source's as committed)
            _step(world.runs[world.current], world.models[world.current], op, n)
        for sid in world.runs:
            _check(world.runs[sid], world.models[sid])
    store = RowStore({sid: run.log for sid, run in world.runs.items()})
    for run in world.runs.values():
        assert _now(replay_resolved(store, run.log)) == run.state  # type: ignore[arg-type]
    for fork, source, rows in world.forks:
        # every row the source had when it was forked is still byte-identical
        now = store.rows[source][: len(rows)]
        assert [(r.seq, r.tag, r.payload) for r in now] == [(r.seq, r.tag, r.payload) for r in rows]
        assert world.runs[fork].state.fork is not None


def test_the_fork_walk_reaches_forks_of_forks_and_bad_points() -> None:
    world = World("reject")
    world.runs["s0"] = Run(initial_state(), [])
    world.runs["s0"].send(Start("sys", "m"))
    world.models["s0"] = Model("reject")
    script: list[Op] = [
        ("submit", 0), ("complete", 0), ("submit", 0), ("complete", 0),
        ("edit", 1), ("complete", 0),  # s0 is on b1: two turns
        ("fork", 7),  # past the end: refused
        ("fork", 1),  # s1: s0's b1 up to turn 1
        ("submit", 0), ("complete", 0),
        ("fork", 2),  # s2: all of s1
        ("submit", 0), ("complete", 0), ("hop", 0), ("submit", 0), ("complete", 0),
    ]  # fmt: skip
    for n, op in enumerate(script):
        kind, k = op
        if kind == "fork":
            _fork(world, k)
        elif kind == "hop":
            world.current = list(world.runs)[k]
        else:
            _step(world.runs[world.current], world.models[world.current], op, n)
        for sid in world.runs:
            _check(world.runs[sid], world.models[sid])
    assert list(world.runs) == ["s0", "s1", "s2"]
    assert [q for _, q, _ in world.models["s2"].branches["main"]] == ["q0", "q8", "q11"]
    assert [q for _, q, _ in world.models["s0"].branches["b1"]] == ["q0", "q4", "q14"]
    assert [q for _, q, _ in world.models["s0"].branches["main"]] == ["q0", "q2"]
    store = RowStore({sid: run.log for sid, run in world.runs.items()})
    for run in world.runs.values():
        assert _now(replay_resolved(store, run.log)) == run.state  # type: ignore[arg-type]
    # a plain fold cannot see the shared turns: it says so
    from turnledger import ReplayError

    with pytest.raises(ReplayError, match="not resolved"):
        replay(world.runs["s2"].log)
    # and a fork whose source is gone does not replay
    del store.rows["s1"]
    with pytest.raises(ReplayError, match="erased"):
        _now(replay_resolved(store, world.runs["s2"].log))  # type: ignore[arg-type]
    with pytest.raises(UnknownSession):
        fork_events(initial_state(), "nobody")


def test_the_model_sends_summaries_on_branches() -> None:
    # (a fixed walk: a summary is sent in place of dropped turns on main, the
    # same summary stands for them on a branch that keeps them, and is not
    # sent on a branch that no longer has its last turn)
    run = Run(initial_state(), [])
    run.send(Start("sys", "m"))
    model = Model("reject")
    script: list[Op] = [("submit", 0), ("complete", 0)] * 6
    script += [("summarize", 12), ("submit", 0)]
    for n, op in enumerate(script):
        _step(run, model, op, n)
        _check(run, model)
    state = run.state
    assert isinstance(state, Pending) and state.request.summary_id == "s1"
    assert state.request.turns_sent == 2 and state.request.turns_dropped == 4
    sent = [m.content for m in request_messages(state)]
    assert sent.count("S12") == 1 and sent[1] == "S12"
    more: list[Op] = [("complete", 0), ("edit", 5), ("complete", 0), ("submit", 0)]
    for n, op in enumerate(more, len(script)):
        _step(run, model, op, n)
        _check(run, model)
    state = run.state
    assert isinstance(state, Pending) and state.active_branch == "b1"
    assert state.request.summary_id == "s1"  # b1 keeps turns 0-4: the same summary
    more = [("complete", 0), ("edit", 2), ("submit", 0)]
    for n, op in enumerate(more, len(script) + 4):
        _step(run, model, op, n)
        _check(run, model)
    assert replay(run.log) == run.state
