"""The opt-in retry policy (pure)."""

from __future__ import annotations

import email.utils

import pytest

from turnledger.adapters.providers import RetryPolicy, parse_retry_after


def test_parse_retry_after() -> None:
    now = 1_700_000_000.0
    assert parse_retry_after(None, now=now) is None
    assert parse_retry_after("120", now=now) == 120.0
    assert parse_retry_after(" 0 ", now=now) == 0.0
    date = email.utils.formatdate(now + 30, usegmt=True)
    assert parse_retry_after(date, now=now) == pytest.approx(30, abs=1)
    assert parse_retry_after(email.utils.formatdate(now - 30, usegmt=True), now=now) == 0.0
    assert parse_retry_after("soon", now=now) is None
    assert parse_retry_after("-5", now=now) is None


def test_exponential_backoff_with_full_jitter() -> None:
    p = RetryPolicy(attempts=6, base_delay=0.5, max_delay=3.0)
    caps = [p.delay(n, retry_after=None, now=0, uniform=0.999999) for n in range(1, 6)]
    assert caps == pytest.approx([0.5, 1.0, 2.0, 3.0, 3.0], rel=1e-5)
    assert p.delay(3, retry_after=None, now=0, uniform=0.0) == 0.0
    assert p.delay(6, retry_after=None, now=0, uniform=0.5) is None  # attempts used up


def test_retry_after_wins_within_its_cap() -> None:
    p = RetryPolicy(max_retry_after=10)
    assert p.delay(1, retry_after="7", now=0, uniform=0.5) == 7
    assert p.delay(1, retry_after="11", now=0, uniform=0.5) is None


def test_validation() -> None:
    with pytest.raises(ValueError):
        RetryPolicy(attempts=0)
    assert 429 in RetryPolicy().statuses and 500 not in RetryPolicy().statuses
