"""OpenTelemetry in the SDK, with the `queen[otel]` extra installed.

A push runs in a PRODUCER span and each message carries its context (W3C `traceparent`,
as the item's `traceId`); a consumer runs its handler for that message in a CONSUMER span
whose parent is that context, so the consumer continues the producer's trace. Spans go
wherever the application's tracer provider sends them. Without opentelemetry installed,
or without a tracer provider, messages carry nothing and no span is made.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

try:
    from opentelemetry import trace
    from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator
except ImportError:  # the extra is not installed
    trace = None  # type: ignore[assignment]

TRACER = "queen.client"
SYSTEM = {"messaging.system": "queen"}
_propagator: Any = TraceContextTextMapPropagator() if trace is not None else None


def traceparent() -> str | None:
    """The current span's context as a W3C traceparent; None without a recording span."""
    if trace is None or not trace.get_current_span().get_span_context().is_valid:
        return None
    carrier: dict[str, str] = {}
    _propagator.inject(carrier)
    return carrier.get("traceparent")


@contextlib.contextmanager
def producing(queue: str) -> Iterator[None]:
    """Run a push in a PRODUCER span (its messages then carry that span's context)."""
    if trace is None:
        yield
        return
    with trace.get_tracer(TRACER).start_as_current_span(
        f"{queue} publish",
        kind=trace.SpanKind.PRODUCER,
        attributes={**SYSTEM, "messaging.destination.name": queue},
    ):
        yield


@contextlib.contextmanager
def consuming(queue: str, transaction_id: str, parent: str | None) -> Iterator[None]:
    """Run the handling of one message in a CONSUMER span continuing parent's trace."""
    if trace is None:
        yield
        return
    context = _propagator.extract({"traceparent": parent}) if parent else None
    with trace.get_tracer(TRACER).start_as_current_span(
        f"{queue} process",
        context=context,
        kind=trace.SpanKind.CONSUMER,
        attributes={
            **SYSTEM,
            "messaging.destination.name": queue,
            "messaging.message.id": transaction_id,
        },
    ):
        yield
