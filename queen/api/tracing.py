"""A span per push, pop and ack request (imported only when tracing is on: queen.tracing)."""

from __future__ import annotations

from typing import Any

import falcon
from opentelemetry import context, trace
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

API = "/api/v1"
SPAN_NAMES = {
    f"{API}/push": "queen push",
    f"{API}/pop/queue/{{queue}}/partition/{{partition}}": "queen pop",
    f"{API}/pop/queue/{{queue}}": "queen pop",
    f"{API}/pop": "queen pop",
    f"{API}/ack": "queen ack",
    f"{API}/ack/batch": "queen ack",
}
_propagator = TraceContextTextMapPropagator()


class TracingMiddleware:
    """Run the traced routes in a SERVER span, continuing the caller's traceparent."""

    def __init__(self, tracer: Any) -> None:
        self.tracer = tracer

    def process_resource(
        self, req: falcon.Request, resp: falcon.Response, resource: Any, params: dict[str, Any]
    ) -> None:
        name = SPAN_NAMES.get(req.uri_template or "")
        if name is None:
            return
        parent = req.get_header("traceparent")
        carrier = {"traceparent": parent} if parent else {}
        attributes = {"http.request.method": req.method, "http.route": req.uri_template}
        if "queue" in params:
            attributes["messaging.destination.name"] = params["queue"]
        span = self.tracer.start_span(
            name,
            context=_propagator.extract(carrier),
            kind=trace.SpanKind.SERVER,
            attributes=attributes,
        )
        req.context.trace_span = (span, context.attach(trace.set_span_in_context(span)))

    def process_response(
        self, req: falcon.Request, resp: falcon.Response, resource: Any, ok: bool
    ) -> None:
        held = getattr(req.context, "trace_span", None)
        if held is None:
            return
        span, token = held
        status = resp.status_code
        span.set_attribute("http.response.status_code", status)
        if status >= 500:
            span.set_status(trace.StatusCode.ERROR)
        context.detach(token)
        span.end()
