"""A real gunicorn with an OTLP endpoint set exports its spans there."""

from __future__ import annotations

import http.server
import threading
import time

import pytest
import requests

from tests.conftest import Server

trace_service = pytest.importorskip(
    "opentelemetry.proto.collector.trace.v1.trace_service_pb2"
)

EXPORT_WITHIN = 30  # seconds (the batch processor waits 0.1 s; a loaded machine more)


class Collector(http.server.ThreadingHTTPServer):
    """An OTLP/HTTP trace receiver keeping the span names it is sent."""

    def __init__(self) -> None:
        super().__init__(("127.0.0.1", 0), CollectorHandler)
        self.span_names: list[str] = []


class CollectorHandler(http.server.BaseHTTPRequestHandler):
    def do_POST(self) -> None:  # noqa: N802 (the standard library's name)
        body = self.rfile.read(int(self.headers["Content-Length"]))
        if self.path == "/v1/traces":
            request = trace_service.ExportTraceServiceRequest.FromString(body)
            for resource in request.resource_spans:
                for scope in resource.scope_spans:
                    self.server.span_names += [span.name for span in scope.spans]  # type: ignore[attr-defined]
        self.send_response(200)
        self.send_header("Content-Type", "application/x-protobuf")
        self.send_header("Content-Length", "0")
        self.end_headers()

    def log_message(self, *args: object) -> None:
        pass


def test_spans_reach_the_configured_otlp_endpoint(db_dsn) -> None:
    collector = Collector()
    threading.Thread(target=collector.serve_forever, daemon=True).start()
    endpoint = f"http://127.0.0.1:{collector.server_address[1]}"
    srv = Server(db_dsn, OTEL_EXPORTER_OTLP_ENDPOINT=endpoint, OTEL_BSP_SCHEDULE_DELAY="100")
    srv.start()
    try:
        resp = requests.post(f"{srv.url}/api/v1/push", timeout=30,
                             json={"items": [{"queue": "traced", "payload": 1}]})
        assert resp.status_code == 201
        deadline = time.monotonic() + EXPORT_WITHIN
        while not {"queen push", "queen.db push"} <= set(collector.span_names):
            assert time.monotonic() < deadline, collector.span_names
            time.sleep(0.1)
    finally:
        srv.stop()
        collector.shutdown()
        collector.server_close()
