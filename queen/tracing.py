"""OpenTelemetry on the server, with the `queen[otel]` extra installed.

Spans for push, pop and ack requests (continuing a caller's `traceparent` header) and for
the fused database calls that serve them, exported by OTLP over HTTP, in batches, when
OTEL_EXPORTER_OTLP_ENDPOINT or OTEL_EXPORTER_OTLP_TRACES_ENDPOINT is set (the other
OTEL_* variables apply as usual; OTEL_SERVICE_NAME defaults to "queen"). Otherwise
nothing is installed: no middleware, no hook, nothing imported.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Mapping
from contextlib import AbstractContextManager
from typing import Any

from queen.fusion import Trace

log = logging.getLogger(__name__)

ENDPOINT_VARS = ("OTEL_EXPORTER_OTLP_ENDPOINT", "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT")


def configured(environ: Mapping[str, str] = os.environ) -> bool:
    """Tell whether an OTLP endpoint is set."""
    return any(environ.get(name) for name in ENDPOINT_VARS)


def provider_from_env() -> Any | None:
    """This worker's tracer provider exporting by OTLP; None when none is configured (or
    the extra is missing, which is said once)."""
    if not configured():
        return None
    try:
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
        from opentelemetry.sdk.resources import Resource
        from opentelemetry.sdk.trace import TracerProvider
        from opentelemetry.sdk.trace.export import BatchSpanProcessor
    except ImportError:
        log.warning("an OTLP endpoint is set but queen[otel] is not installed: no traces")
        return None
    name = os.environ.get("OTEL_SERVICE_NAME") or "queen"
    provider = TracerProvider(resource=Resource.create({"service.name": name}))
    provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter()))
    return provider


def fused_call_spans(tracer: Any) -> Trace:
    """A span for each fused database call: its kind and how many requests it served."""
    from opentelemetry.trace import SpanKind

    def span(kind: str, requests: int) -> AbstractContextManager[object]:
        return tracer.start_as_current_span(  # type: ignore[no-any-return]
            f"queen.db {kind}",
            kind=SpanKind.CLIENT,
            attributes={"db.system": "postgresql", "queen.fused.requests": requests},
        )

    return span
