"""An opt-in, bounded retry before the first byte of a response.

Pure: imports no I/O library; reads no clock and draws no random numbers
(the caller passes ``now`` and a uniform draw).
"""

from __future__ import annotations

import email.utils
import math

import attrs

__all__ = ["RetryPolicy", "parse_retry_after"]


def parse_retry_after(value: str | None, *, now: float) -> float | None:
    """Seconds to wait from a ``Retry-After`` header (RFC 9110 §10.2.3):
    delay-seconds or an HTTP-date. ``None`` if absent or unreadable."""
    if value is None:
        return None
    value = value.strip()
    if value.isascii() and value.isdigit():
        return float(int(value[:12]))
    try:
        when = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError, IndexError):
        return None
    if when.tzinfo is None:
        return None
    return max(0.0, when.timestamp() - now)


@attrs.frozen(kw_only=True)
class RetryPolicy:
    """How often, and after how long, to send a request again.

    A request is sent again only if nothing of a 2xx response was read yet:
    after a connect error or connect timeout, or a response with one of
    ``statuses``. It keeps its request id; every attempt is logged. A read
    timeout waiting for the response is not retried (the server may be
    generating), nor is anything after the stream started.

    Delays grow exponentially with full jitter
    (``uniform(0, min(max_delay, base_delay * 2**(n-1)))``). A
    ``Retry-After`` header is honoured exactly when it is at most
    ``max_retry_after`` seconds; a longer one ends the retries at once.
    """

    #: Attempts in all, the first included (1 = no retry).
    attempts: int = attrs.field(default=3, validator=attrs.validators.ge(1))
    base_delay: float = attrs.field(default=0.5, validator=attrs.validators.ge(0))
    max_delay: float = attrs.field(default=8.0, validator=attrs.validators.ge(0))
    max_retry_after: float = attrs.field(default=30.0, validator=attrs.validators.ge(0))
    #: Status codes worth another attempt.
    statuses: frozenset[int] = attrs.field(
        default=frozenset({429, 502, 503, 504, 529}), converter=frozenset
    )

    def delay(
        self, attempt: int, *, retry_after: str | None, now: float, uniform: float
    ) -> float | None:
        """Seconds to wait before attempt ``attempt + 1``, or ``None`` to give up.

        Args:
            attempt: the attempt that just failed (1-based).
            retry_after: the response's ``Retry-After`` header, if any.
            now: the wall clock (for an HTTP-date ``Retry-After``).
            uniform: a random draw in [0, 1).
        """
        if attempt >= self.attempts:
            return None
        asked = parse_retry_after(retry_after, now=now)
        if asked is not None:
            return asked if asked <= self.max_retry_after else None
        cap = min(self.max_delay, self.base_delay * math.pow(2, attempt - 1))
        return cap * uniform
