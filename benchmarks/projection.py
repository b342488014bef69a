"""Projection cost: the linear, cached projection against the naive loop.

    python benchmarks/projection.py [--repeat N] [--naive-max TURNS]

For each history size it reports the median time of:
- ``plan`` with cold caches (every message encoded once: the first projection
  after replaying a log),
- ``plan`` with warm caches (what every later request costs: the per-message
  sizes were computed when each turn was first projected),
- the naive "drop the oldest whole turn and re-serialize" loop (only up to
  ``--naive-max`` turns: it is quadratic),
and the ratio naive / warm measured in the same run. The budget is chosen so
that about half of the history fits, which is the naive loop's bad case.

A second table does the same with tool turns in the history (every third
turn took one or two rounds of tool calls) and tool definitions in every
request, and reports its warm time against the plain history's, measured in
the same run.

Then, at 10,000 turns, a session's projection with its context window: the
byte cap as above plus the token budget (window minus output reserve, by the
estimate calibrated from reported usage, as ``decide`` computes it for every
Submit), warm, against the byte-only warm figure of the same run.

Last, branches: a session whose 10,000 committed turns are spread over 100
branches (each an edit of its parent's tenth turn from the end, then 100
turns), built by the pure machine. Its warm projection (the active branch's
path) against a plain history of the same length, measured in the same run,
the warm projection after a switch to a branch left long ago (b50), and the
whole decision of a Submit on it (``decide``: the projection plus the
event); then whether the goal (under 50 µs) is met. ``--branches-only``
runs this part alone.

And summaries and pinned items: the same branched session with three items
pinned and 20 summaries recorded on its active path (one of them covers the
turns the budget drops, and is sent); a Submit's whole decision and the
projection against the same session without them, in the same run.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from collections.abc import Callable

sys.path.insert(0, "src")

import attrs

from turnledger.events import (
    BranchId,
    Ledger,
    RequestId,
    SessionStarted,
    SummarySent,
    ToolCall,
    ToolSpec,
)
from turnledger.sessions import (
    Budget,
    Completed,
    Edit,
    History,
    Idle,
    Pin,
    RecordSummary,
    SessionState,
    Start,
    Submit,
    Switch,
    ToolResult,
    ToolRound,
    Turn,
    branches_of,
    decide,
    evolve,
    initial_state,
    plan,
    prompt_token_cap,
)
from turnledger.sessions._projection import naive_plan, pin_messages

SYSTEM = "你是一个简洁的助手。Answer briefly."


TOOLS = (
    ToolSpec(
        "lookup", "Look an order up.", '{"type":"object","properties":{"id":{"type":"string"}}}'
    ),
    ToolSpec("clock", "The time now."),
)


def _rounds(i: int) -> tuple[ToolRound, ...]:
    if i % 3:
        return ()
    out = []
    for r in range(1 + i % 2):
        calls = (ToolCall(f"c{i}-{r}", "lookup", f'{{"id":"{1000 + i}"}}'),)
        results = (ToolResult(f"c{i}-{r}", f'{{"status":"shipped","eta":"day {i % 30}"}}'),)
        out.append(ToolRound(calls, "", results))
    return tuple(out)


def history(n: int, tools: bool = False) -> History:
    h = History()
    for i in range(n):
        q = f"问题 {i}: what about “item {i}”?\n🌱"
        a = f"回答 {i}: " + "lorem ipsum dolor sit amet " * (1 + i % 5)
        h = h.append(Turn(RequestId(f"r{i}"), q, a, _rounds(i) if tools else ()))
    return h


def median_time(fn: Callable[[], object], repeat: int) -> float:
    times = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def row(n: int, repeat: int, naive_max: int, tools: bool = False) -> float:
    q = "现在呢？"
    h = history(n, tools)
    specs = TOOLS if tools else ()
    full = plan("m", SYSTEM, h, 0, q, Budget(None), specs).request_bytes
    budget = Budget(full // 2)
    # cold: a fresh copy of the history has no cached sizes
    cold = median_time(
        lambda: plan("m", SYSTEM, History(list(h)), 0, q, budget, specs), max(3, repeat // 3)
    )
    plan("m", SYSTEM, h, 0, q, budget, specs)  # warm the cache
    warm = median_time(lambda: plan("m", SYSTEM, h, 0, q, budget, specs), repeat * 20)
    fast = plan("m", SYSTEM, h, 0, q, budget, specs)
    if n <= naive_max:
        naive = median_time(
            lambda: naive_plan("m", SYSTEM, h, 0, q, budget, specs), max(3, repeat // 5)
        )
        assert naive_plan("m", SYSTEM, h, 0, q, budget, specs) == fast
        naive_s = f"{naive * 1e6:12.0f}"
        ratio = f"{naive / warm:10.0f}x"
    else:
        naive_s, ratio = f"{'(skipped)':>12}", f"{'-':>11}"
    print(f"{n:>7} {cold * 1e6:10.1f} {warm * 1e6:10.2f} {naive_s} {ratio}")
    if n == 10_000:
        kind = "with tool turns" if tools else "plain"
        print(
            f"\n10,000 turns ({kind}), warm caches: {warm * 1e6:.1f} µs per projection "
            f"({fast.turns_sent} turns sent, {fast.request_bytes} bytes)"
        )
    return warm


def windowed(repeat: int) -> None:
    n = 10_000
    q = "现在呢？"
    h = history(n)
    full = plan("m", SYSTEM, h, 0, q, Budget(None))
    budget = Budget(full.request_bytes // 2)
    plan("m", SYSTEM, h, 0, q, budget)
    bytes_only = median_time(lambda: plan("m", SYSTEM, h, 0, q, budget), repeat * 20)
    # A window that holds about a third of the history once calibrated
    # (the server counted 5 tokens for every 4 estimated).
    reserve = 1024
    window = full.prompt_tokens * 5 // 4 // 3 + reserve
    config = SessionStarted(
        SYSTEM,
        "m",
        Ledger(),
        "reject",
        context_window=window,
        output_reserve=reserve,
        window_source="discovered",
    )
    state = attrs.evolve(Idle(config=config, turns=h), calibration=(5, 4))

    def session_plan() -> object:
        return plan("m", SYSTEM, h, 0, q, budget, token_cap=prompt_token_cap(state, budget))

    session_plan()
    with_window = median_time(session_plan, repeat * 20)
    p = session_plan()
    assert isinstance(p, type(full)) and p.prompt_tokens * 5 <= (window - reserve) * 4
    print(
        f"\n10,000 turns, warm: bytes only {bytes_only * 1e6:.2f} µs, "
        f"bytes + calibrated window {with_window * 1e6:.2f} µs "
        f"(ratio {with_window / bytes_only:.2f}x; {p.turns_sent} turns sent, "
        f"~{p.prompt_tokens} estimated tokens, window {window}, reserve {reserve})"
    )


#: The goal: at 10,000 turns spread over 100 branches, a warm projection
#: stays under 50 µs.
BRANCH_GOAL_S = 50e-6


def _branched_session(branches: int, per_branch: int) -> SessionState:
    state: SessionState = initial_state()

    def send(msg: object) -> None:
        nonlocal state
        for ev in decide(state, msg, budget=Budget(None)):  # type: ignore[arg-type]
            state = evolve(state, ev)

    send(Start(SYSTEM, "m"))
    n = 0
    for b in range(branches):
        for i in range(per_branch):
            rid = RequestId(f"r{n}")
            q = f"问题 {n}: what about “item {n}”?\n🌱"
            if b and i == 0:
                send(Edit(rid, max(len(state.turns) - 10, 0), q))
            else:
                send(Submit(rid, q))
            answer = f"回答 {n}: " + "lorem ipsum dolor sit amet " * (1 + n % 5)
            send(Completed(rid, answer, "stop"))
            n += 1
    return state


def branched(repeat: int) -> None:
    q = "现在呢？"
    state = _branched_session(100, 100)
    listed = branches_of(state)
    total = sum(b.length - (b.at_turn if b.parent else 0) for b in listed)
    path = state.turns
    plain = history(len(path))
    budget = Budget(plan("m", SYSTEM, path, 0, q, Budget(None)).request_bytes // 2)
    plan("m", SYSTEM, path, 0, q, budget)
    plan("m", SYSTEM, plain, 0, q, budget)
    on_branch = median_time(lambda: plan("m", SYSTEM, path, 0, q, budget), repeat * 20)
    linear = median_time(lambda: plan("m", SYSTEM, plain, 0, q, budget), repeat * 20)
    submit = Submit(RequestId("next"), q)
    decide(state, submit, budget=budget)
    decided = median_time(lambda: decide(state, submit, budget=budget), repeat * 20)
    print(
        f"\n{total:,} committed turns over {len(listed)} branches, active path "
        f"{len(path):,} turns, warm: projection {on_branch * 1e6:.2f} µs "
        f"(a plain history of {len(plain):,} turns: {linear * 1e6:.2f} µs, ratio "
        f"{on_branch / linear:.2f}x); a Submit's whole decision {decided * 1e6:.2f} µs"
    )
    # After a switch to a branch left long ago (b50, in the middle of the tree).
    back = state
    for ev in decide(state, Switch(BranchId("b50"))):
        back = evolve(back, ev)
    plan("m", SYSTEM, back.turns, 0, q, budget)
    switched = median_time(lambda: plan("m", SYSTEM, back.turns, 0, q, budget), repeat * 20)
    print(
        f"after a switch to b50 (path {len(back.turns):,} turns), warm: projection "
        f"{switched * 1e6:.2f} µs"
    )
    worst = max(on_branch, switched)
    met = "met" if worst < BRANCH_GOAL_S else "NOT met"
    print(
        f"goal: a warm projection under {BRANCH_GOAL_S * 1e6:.0f} µs at "
        f"{total:,} turns over {len(listed)} branches: {met} (at most {worst * 1e6:.2f} µs)"
    )


def summarized(repeat: int) -> None:
    q = "现在呢？"
    plain_state = _branched_session(100, 100)
    path = plain_state.turns
    budget = Budget(plan("m", SYSTEM, path, 0, q, Budget(None)).request_bytes // 2)
    first_sent = len(path) - plan("m", SYSTEM, path, 0, q, budget).turns_sent
    state = plain_state
    messages: list[object] = [
        Pin(f"p{i}", f"pinned fact {i}: " + "x" * 80, "memory") for i in range(3)
    ]
    # 19 summaries that cannot stand for the dropped turns, then one that can
    ends = [max(1, first_sent - 400 + 20 * i) for i in range(19)] + [first_sent + 10]
    for i, end in enumerate(ends):
        text = f"summary {i}: " + "what was said " * 20
        messages.append(
            RecordSummary(RequestId(f"sum{i}"), state.active_branch, 0, end, text, "function", "f")
        )
    for msg in messages:
        for ev in decide(state, msg, budget=budget):  # type: ignore[arg-type]
            state = evolve(state, ev)
    pins = pin_messages(state.pins)
    submit = Submit(RequestId("next"), q)
    events = decide(state, submit, budget=budget)
    assert any(isinstance(e, SummarySent) for e in events), events
    plan("m", SYSTEM, path, 0, q, budget, pins=pins, summaries=state.summaries)
    plan("m", SYSTEM, path, 0, q, budget)
    with_them = median_time(
        lambda: plan("m", SYSTEM, path, 0, q, budget, pins=pins, summaries=state.summaries),
        repeat * 20,
    )
    without = median_time(lambda: plan("m", SYSTEM, path, 0, q, budget), repeat * 20)
    decide(plain_state, submit, budget=budget)
    decided = median_time(lambda: decide(state, submit, budget=budget), repeat * 20)
    decided_plain = median_time(lambda: decide(plain_state, submit, budget=budget), repeat * 20)
    print(
        f"\nthe same session with 3 pinned items and {len(state.summaries)} summaries (one sent), "
        f"warm: projection {with_them * 1e6:.2f} µs (without them {without * 1e6:.2f} µs, "
        f"ratio {with_them / without:.2f}x); a Submit's whole decision {decided * 1e6:.2f} µs "
        f"(without them {decided_plain * 1e6:.2f} µs, ratio {decided / decided_plain:.2f}x)"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--repeat", type=int, default=15)
    parser.add_argument("--naive-max", type=int, default=1000)
    parser.add_argument(
        "--branches-only", action="store_true", help="only the session of 100 branches"
    )
    args = parser.parse_args()
    if args.branches_only:
        branched(args.repeat)
        return

    header = f"{'turns':>7} {'cold µs':>10} {'warm µs':>10} {'naive µs':>12} {'naive/warm':>11}"
    warm: dict[bool, float] = {}
    for tools in (False, True):
        print("\nwith tool turns (every third turn) and tool definitions" if tools else "plain")
        print(header)
        for n in (10, 100, 300, 1_000, 10_000):
            warm[tools] = row(n, args.repeat, args.naive_max, tools)
    print(f"naive loop timed up to {args.naive_max} turns (it is quadratic in the history size)")
    print(
        f"10,000 turns, warm: tool-turn history / plain history = {warm[True] / warm[False]:.2f}x"
    )
    windowed(args.repeat)
    branched(args.repeat)
    summarized(args.repeat)


if __name__ == "__main__":
    main()
