"""Real sessions' events, built with the pure state machine, for store tests."""

from __future__ import annotations

from turnledger.events import (
    DEFAULT_CODEC,
    Ledger,
    RequestId,
    StoredEvent,
    StreamStarted,
    Usage,
    Window,
)
from turnledger.sessions import (
    Cancel,
    Completed,
    Failed,
    Failure,
    Message,
    ResponseStarted,
    SessionState,
    Start,
    Submit,
    Timeout,
    decide,
    evolve,
    initial_state,
)


def conversation(
    session_id: str, turns: int = 4, t0: float = 1.7e9
) -> tuple[list[list[StoredEvent]], SessionState]:
    """The appends (one per message that produced events) of a session that
    commits, cancels, times out and ignores a late answer; and its final state."""
    state: SessionState = initial_state()
    batches: list[list[StoredEvent]] = []
    seq = 0

    def feed(msg: Message) -> None:
        nonlocal state, seq
        events = decide(state, msg)
        batch = []
        for ev in events:
            state = evolve(state, ev)
            seq += 1
            batch.append(
                DEFAULT_CODEC.encode(ev, session_id=session_id, seq=seq, recorded_at=t0 + seq / 4)
            )
        if batch:
            batches.append(batch)

    policy = Window(3) if len(session_id) % 2 else Ledger()
    feed(Start(system=f"system of {session_id}: 你好 \x00", model="m-1", policy=policy))
    for i in range(turns):
        rid = RequestId(f"{session_id}/r{i}")
        feed(Submit(rid, f'question {i} 🌱 "quoted"\n'))
        feed(ResponseStarted(rid))
        kind = i % 4
        if kind == 0:
            feed(Completed(rid, f"answer {i}", "stop", Usage(3, 5, 8)))
        elif kind == 1:
            feed(Cancel(rid))
            feed(Completed(rid, "too late", "stop"))  # ignored: the turn was cancelled
        elif kind == 2:
            feed(Timeout(rid))
            feed(Failed(rid, Failure("transport", "reset")))
        else:
            feed(Completed(rid, f"answer {i} again", "stop"))
    return batches, state


def stream_events(session_id: str, after: int, n: int = 3, text: str = "") -> list[StoredEvent]:
    """``n`` small events of ``session_id`` after ``after`` (``text`` goes
    into their request ids)."""
    return [
        DEFAULT_CODEC.encode(
            StreamStarted(RequestId(f"{session_id}/{after + i}{text}")),
            session_id=session_id,
            seq=after + i,
            recorded_at=1.7e9 + after + i,
        )
        for i in range(1, n + 1)
    ]
