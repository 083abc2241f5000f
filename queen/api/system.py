"""Health, metrics and the API description (API.md section 7).

Request and message totals count every worker of this host; pool, memory and CPU
figures are those of the worker that answers.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from importlib import resources
from typing import Any

import falcon

from queen.api import metrics, send_json
from queen.errors import Unavailable
from queen.events import Events
from queen.server import status
from queen.store import Store

# A readiness check returns None when ready, else the reason in one line.
ReadinessCheck = Callable[[], str | None]


def _pool_json(store: Store) -> dict[str, int]:
    pool = store.db.stats()
    return {"total": pool["size"], "idle": pool["idle"], "waiting": pool["waiting"]}


class HealthResource:
    def __init__(self, store: Store, events: Events | None, clock: Callable[[], float]) -> None:
        self.store = store
        self.events = events
        self.clock = clock

    def on_get(self, req: falcon.Request, resp: falcon.Response) -> None:
        counted = metrics.rates()
        pool = _pool_json(self.store)
        doc: dict[str, Any] = {
            "uptime": f"{int(counted['uptime'])}s",
            "connections": pool["total"],
            "stats": {
                "requests": counted["requests"],
                "messages": counted["messages"],
                "requestsPerSecond": f"{counted['requestsPerSecond']:.2f}",
                "messagesPerSecond": f"{counted['messagesPerSecond']:.2f}",
                "pool": pool,
            },
        }
        maintenance = status.maintenance_state()
        if maintenance is not None:  # run by `queen serve`: how its maintenance child fares
            doc["maintenance"] = maintenance
        try:
            self.store.ping()
        except Unavailable as exc:
            send_json(resp, {"status": "unhealthy", "reason": exc.message, **doc}, 503)
            return
        send_json(resp, {"status": "healthy", **doc})


class LiveResource:
    """GET /health/live: the process serves requests (it asks nothing of the database)."""

    def on_get(self, req: falcon.Request, resp: falcon.Response) -> None:
        send_json(resp, {"status": "live"})


def readiness_checks(store: Store, events: Events | None) -> dict[str, ReadinessCheck]:
    """The checks of GET /health/ready, by name, in the order they run.

    A further check (the maintenance process's state, say) is one more entry: a name and a
    function returning None or its reason; /health/ready reports it with the others.
    """

    def database() -> str | None:
        try:
            store.ping()
        except Unavailable as exc:
            return exc.message
        return None

    def schema() -> str | None:
        try:
            return store.schema_problem()
        except Unavailable as exc:
            return exc.message

    checks: dict[str, ReadinessCheck] = {"database": database, "schema": schema}
    if events is not None:  # (an app built without a listener, as tests build it)
        checks["listener"] = lambda: (
            None if events.connected.is_set() else "the LISTEN connection is not connected"
        )
    return checks


class ReadyResource:
    """GET /health/ready: 200 when every check passes, else 503 naming what failed."""

    def __init__(self, checks: dict[str, ReadinessCheck]) -> None:
        self.checks = checks

    def on_get(self, req: falcon.Request, resp: falcon.Response) -> None:
        results: dict[str, Any] = {}
        for name, check in self.checks.items():
            reason = check()
            results[name] = {"ok": True} if reason is None else {"ok": False, "reason": reason}
        ready = all(result["ok"] for result in results.values())
        doc: dict[str, Any] = {"status": "ready" if ready else "not ready", "checks": results}
        maintenance = status.maintenance_state()
        if maintenance is not None:  # reported, not checked: the API serves without it
            doc["maintenance"] = maintenance
        send_json(resp, doc, 200 if ready else 503)


class MetricsResource:
    """GET /metrics: the JSON view of API.md 7.2."""

    def __init__(self, store: Store) -> None:
        self.store = store

    def on_get(self, req: falcon.Request, resp: falcon.Response) -> None:
        counted = metrics.rates()
        done = metrics.work()
        pool = self.store.db.stats()
        send_json(
            resp,
            {
                "uptime": round(counted["uptime"], 3),
                "requests": {
                    "total": counted["requests"],
                    "rate": round(counted["requestsPerSecond"], 2),
                },
                "messages": {
                    "total": counted["messages"],
                    "rate": round(counted["messagesPerSecond"], 2),
                    "pushed": counted["pushed"],
                    "popped": counted["popped"],
                    "acked": counted["acked"],
                },
                "database": {
                    "poolSize": pool["size"],
                    "maxPoolSize": pool["max"],
                    "idleConnections": pool["idle"],
                    "waitingRequests": pool["waiting"],
                    **metrics.database_work(done, counted["acked"]),
                },
                "fusion": metrics.fusion(),
                "longPolls": metrics.long_polls(done),
                "memory": metrics.memory(),
                "cpu": metrics.cpu(),
                "process": {"pid": os.getpid()},
            },
        )


def openapi_document() -> bytes:
    """Return the OpenAPI description shipped with the package (queen/api/openapi.json)."""
    return resources.files("queen.api").joinpath("openapi.json").read_bytes()


class OpenAPIResource:
    """GET /api/v1/openapi.json"""

    def __init__(self) -> None:
        self.document = openapi_document()

    def on_get(self, req: falcon.Request, resp: falcon.Response) -> None:
        resp.content_type = falcon.MEDIA_JSON
        resp.data = self.document
