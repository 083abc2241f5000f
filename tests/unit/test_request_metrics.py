"""MetricsMiddleware counts each request under its own method, route and status."""

from __future__ import annotations

import uuid
from types import SimpleNamespace
from typing import Any

import falcon
import falcon.testing
from prometheus_client import REGISTRY

from queen.api.metrics import MetricsMiddleware


class PoolStats:
    def stats(self) -> dict[str, int]:
        return {"size": 1, "idle": 1, "waiting": 0, "max": 1}


class Resource:
    def on_get(self, req: falcon.Request, resp: falcon.Response, name: str) -> None:
        resp.status = int(req.get_param("status") or 200)

    def on_post(self, req: falcon.Request, resp: falcon.Response, name: str) -> None:
        req.context.messages = ("pushed", int(req.get_param("n") or 0))


def value(name: str, **labels: str) -> float:
    return REGISTRY.get_sample_value(name, labels) or 0.0


def test_requests_latency_and_messages_are_counted_per_label_set() -> None:
    route = f"/t-{uuid.uuid4().hex[:8]}/{{name}}"  # labels no other test uses
    app = falcon.App(middleware=[MetricsMiddleware(SimpleNamespace(db=PoolStats()))])  # type: ignore[arg-type]
    app.add_route(route, Resource())
    client = falcon.testing.TestClient(app)
    path = route.replace("{name}", "a")
    pushed = value("queen_messages_total", operation="pushed")
    calls: list[tuple[str, dict[str, Any]]] = [
        ("GET", {}), ("GET", {"status": 404}), ("GET", {}), ("POST", {"n": 3}),
        ("POST", {"n": 0}), ("GET", {"status": 404}), ("GET", {}), ("POST", {"n": 2}),
    ]  # fmt: skip
    for method, params in calls:
        client.simulate_request(method, path.replace("/a", f"/{uuid.uuid4().hex[:4]}"), params=params)

    def requests(method: str, status: str) -> float:
        return value("queen_http_requests_total", method=method, route=route, status=status)

    assert (requests("GET", "200"), requests("GET", "404"), requests("POST", "200")) == (3, 2, 3)
    latency = "queen_http_request_duration_seconds_count"
    assert value(latency, method="GET", route=route) == 5
    assert value(latency, method="POST", route=route) == 3
    assert value("queen_messages_total", operation="pushed") == pushed + 5
