"""Budget arithmetic of a session (pure): the most *estimated* prompt tokens
its next request may have, from the hub's cap, the session's context window
and output reserve, the calibration that reported usage taught it, and the
cap a context overflow left; and whether a failure looks like an overflow
the server did not name. The machine (``_machine``) decides with these.
"""

from __future__ import annotations

from typing import Final

from ..events import Usage
from ._phases import IN_FLIGHT, SessionState
from ._projection import Budget

__all__ = [
    "calibrated",
    "calibration_after",
    "cap_after_overflow",
    "looks_like_overflow",
    "prompt_token_cap",
]

#: Bounds of the calibration ratio (actual / estimated prompt tokens): a
#: server reporting absurd usage must not shrink the budget to nothing.
_MAX_RATIO: Final = 4


def prompt_token_cap(state: SessionState, budget: Budget) -> int | None:
    """The most *estimated* prompt tokens a request of this session may have.

    The smallest of the hub's ``max_prompt_tokens``, the session's window
    minus its output reserve divided by the calibration (the largest ratio
    of reported to estimated tokens seen, so the calibrated estimate of a
    request never exceeds the room), and the cap a context overflow left.
    ``None``: no token cap.
    """
    caps: list[int] = []
    if budget.max_prompt_tokens is not None:
        caps.append(budget.max_prompt_tokens)
    config = state.config
    if config is not None and config.context_window is not None:
        room = config.context_window - (config.output_reserve or 0)
        reported, estimated = state.calibration or (1, 1)
        # raw * reported / estimated <= room, in integers.
        caps.append(room * estimated // reported)
    if state.overflow_cap is not None:
        caps.append(state.overflow_cap)
    return min(caps) if caps else None


def cap_after_overflow(state: SessionState) -> int | None:
    """The cap after the request in flight overflowed the context: below
    it, the largest request that committed if that was smaller, or else
    three quarters of the one that failed (never above an earlier cap)."""
    assert isinstance(state, IN_FLIGHT)
    failed = state.request.estimated_prompt_tokens
    if failed is None:
        return state.overflow_cap
    ok = state.largest_ok
    cap = ok if 0 < ok < failed else failed * 3 // 4
    return cap if state.overflow_cap is None else min(cap, state.overflow_cap)


def calibrated(state: SessionState, usage: Usage | None) -> tuple[int, int] | None:
    """The calibration once the request in flight committed with ``usage``:
    the larger of the ratios seen, reported over estimated prompt tokens,
    kept within ``1/_MAX_RATIO`` and ``_MAX_RATIO``."""
    assert isinstance(state, IN_FLIGHT)
    reported = usage.prompt_tokens if usage is not None else None
    return calibration_after(state.calibration, state.request.estimated_prompt_tokens, reported)


def calibration_after(
    current: tuple[int, int] | None, estimated: int | None, reported: int | None
) -> tuple[int, int] | None:
    """:func:`calibrated` on plain values: the calibration ``current``
    becomes once a request estimated at ``estimated`` prompt tokens
    committed with ``reported`` prompt tokens (the replay fold's form)."""
    if not estimated or not reported or reported < 0:
        return current
    ratio = (reported, estimated)
    if reported > _MAX_RATIO * estimated:
        ratio = (_MAX_RATIO, 1)
    elif _MAX_RATIO * reported < estimated:
        ratio = (1, _MAX_RATIO)
    if current is None or ratio[0] * current[1] > current[0] * ratio[1]:
        return ratio
    return current


#: Failures that, with nothing shown yet, answer a request larger than any
#: that committed: llama-cpp-python's way of saying the context overflowed.
_SILENT_OVERFLOW: Final = frozenset({"incomplete_stream", "transport"})


def looks_like_overflow(state: SessionState, reason: str, preview: int) -> bool:
    """Whether a failure for ``reason``, with ``preview`` characters shown,
    answers a request larger than any that committed as an overflow would."""
    assert isinstance(state, IN_FLIGHT)
    estimated = state.request.estimated_prompt_tokens
    return (
        reason in _SILENT_OVERFLOW
        and preview == 0
        and state.largest_ok > 0
        and estimated is not None
        and estimated > state.largest_ok
    )
