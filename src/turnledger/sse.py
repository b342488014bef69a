"""A strict, incremental Server-Sent Events decoder (WHATWG rules), usable on
its own::

    from turnledger.sse import SSEDecoder

    decoder = SSEDecoder()
    for chunk in reads:              # bytes (strict UTF-8) or str
        for event in decoder.decode(chunk):
            print(event.event, event.data)
    decoder.flush()                  # end of stream

Invalid UTF-8 raises :class:`~turnledger.DecodeError` (never U+FFFD); lines,
events and the number of events are bounded by
:class:`~turnledger.adapters.providers.StreamLimits` (``LimitExceeded``).
"""

from .adapters.providers._limits import StreamLimits
from .adapters.providers._sse import ServerSentEvent, SSEDecoder

__all__ = ["SSEDecoder", "ServerSentEvent", "StreamLimits"]
