"""OpenTelemetry spans and metrics for turns (``pip install 'turnledger[otel]'``).

The runtime knows nothing of OpenTelemetry: this adapter listens to what it
already produces. :meth:`Telemetry.store` wraps the event store, so a span
starts when a ``turn_submitted`` event is durable and ends when the turn's
``turn_committed``/``turn_discarded`` is: the span says what the log says,
including for turns decided by a timeout, a cancel or a shutdown, and nothing
is reported for an append the store refused. :meth:`Telemetry.provider` wraps
the provider, for what no event records: the server's address, the request
options, and the moments the stream started and its first chunk arrived. The
request task's ``session_id`` and ``request_id`` come from the structlog
context the runtime binds (docs/logging.md).

Attributes follow the OpenTelemetry GenAI semantic conventions 1.44.0
(docs/telemetry.md). No message content is ever put on a span or a metric.
"""

from ._telemetry import SEMCONV_VERSION, Telemetry

__all__ = ["SEMCONV_VERSION", "Telemetry"]
