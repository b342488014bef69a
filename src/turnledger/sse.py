"""A strict, incremental Server-Sent Events decoder (WHATWG rules), usable on
its own::

    from turnledger.sse import SSEDecoder

    decoder = SSEDecoder()
    for chunk in reads:              # bytes (strict UTF-8) or str
        for event in decoder.decode(chunk):
            print(event.event, event.data)
    decoder.flush()                  # end of stream

When a read holds whole events followed by a fault (a line over the limit),
``decode`` returns the events first and keeps the error for the next call;
``decoder.check()`` raises it at once.

Invalid UTF-8 raises :class:`~turnledger.DecodeError` (never U+FFFD); lines,
events and the number of events are bounded by
:class:`~turnledger.wire.StreamLimits` (``LimitExceeded``).
"""

from .wire import ServerSentEvent, SSEDecoder, StreamLimits

__all__ = ["SSEDecoder", "ServerSentEvent", "StreamLimits"]
