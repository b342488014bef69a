"""Stream limits: every layer of the streaming boundary is bounded.

Pure: imports no I/O library.
"""

from __future__ import annotations

import attrs

__all__ = ["StreamLimits"]

_positive = attrs.validators.ge(1)


@attrs.frozen(kw_only=True)
class StreamLimits:
    """Caps on what one response may cost; each fails closed.

    Every limit except ``max_json_depth`` raises
    :class:`~turnledger.LimitExceeded` (discard reason ``limit``) as soon as it
    is crossed; the stream is abandoned, nothing is committed. A JSON text
    nested deeper than ``max_json_depth`` is a :class:`~turnledger.DecodeError`
    (reason ``malformed``), as DESIGN.md groups "nesting too deep" with
    malformed input.

    Why these defaults. The per-item limits are the seed's (8,192 characters
    per SSE line and per event, JSON depth 16): a chat chunk is a few hundred
    bytes, so anything near 8 KiB on one line is not a chat stream. The volume
    limits are sized for real answers instead of the seed's toy ones (4,096
    output characters and 256 events would discard any answer longer than a
    page): a long answer of 32k tokens is about 130k characters of English
    (fewer for CJK, about one character per token) and arrives as at most one
    event per token, so ``max_output_chars`` = 262,144 and ``max_events`` =
    65,536 leave 2x headroom; ``max_input_bytes`` = 32 MiB covers 65,536
    events of up to ~500 bytes (chunks repeat id, model and fingerprint) plus
    keep-alive comments. Use :meth:`seed` for the seed's exact values.
    """

    #: Characters (code points) in one line of a stream (SSE or NDJSON),
    #: line end excluded.
    max_line_chars: int = attrs.field(default=8_192, validator=_positive)
    #: Characters in one SSE event's data buffer (its data lines joined).
    max_event_chars: int = attrs.field(default=8_192, validator=_positive)
    #: Bytes of response body read (after any content decoding).
    max_input_bytes: int = attrs.field(default=32 * 1024 * 1024, validator=_positive)
    #: Characters of answer text accumulated.
    max_output_chars: int = attrs.field(default=262_144, validator=_positive)
    #: Events dispatched (SSE events with data, or NDJSON lines).
    max_events: int = attrs.field(default=65_536, validator=_positive)
    #: Nesting depth of one JSON text (the outermost object is depth 1).
    max_json_depth: int = attrs.field(default=16, validator=_positive)
    #: Bytes of a non-2xx body read (and thrown away) so the connection can
    #: be reused; the body is never logged or reported.
    max_error_body_bytes: int = attrs.field(default=4_096, validator=attrs.validators.ge(0))

    @classmethod
    def seed(cls) -> StreamLimits:
        """The values of seed 002 (lines, events, input, output, events, depth):
        8,192 / 8,192 / 65,536 / 4,096 / 256 / 16."""
        return cls(
            max_line_chars=8_192,
            max_event_chars=8_192,
            max_input_bytes=65_536,
            max_output_chars=4_096,
            max_events=256,
            max_json_depth=16,
        )
