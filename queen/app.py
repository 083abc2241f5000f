"""The WSGI application: routes, CORS, authentication, and the one mapping of errors to HTTP."""

from __future__ import annotations

import functools
import logging
import time
from collections.abc import Callable
from typing import Any

import falcon
from psycopg_pool import PoolClosed

from queen.api import (
    admin,
    alerts,
    analytics,
    console,
    groups,
    leases,
    resources,
    send_json,
    transactions,
)
from queen.api.auth import AuthMiddleware, JSONBodyMiddleware, WhoAmIResource
from queen.api.dashboard import (
    DashboardPageResource,
    DashboardSocketResource,
)
from queen.api.messages import AckBatchResource, AckResource, PopResource, PushResource
from queen.api.metrics import (
    MetricsMiddleware,
    PrometheusResource,
    observe_fused,
    observe_parked,
    observe_statement,
)
from queen.api.queues import ConfigureResource
from queen.api.system import (
    HealthResource,
    LiveResource,
    MetricsResource,
    OpenAPIResource,
    ReadyResource,
    readiness_checks,
)
from queen.auth.cache import TokenVerifier
from queen.config import Settings
from queen.dashboard import STATIC_DIR
from queen.dashboard.hub import Hub
from queen.errors import (
    Conflict,
    InvalidInput,
    NotFound,
    PayloadTooLarge,
    QueenError,
    QueueFull,
    Unavailable,
)
from queen.events import Events
from queen.polling import LongPoller
from queen.store import Store

log = logging.getLogger(__name__)

API = "/api/v1"
STATUS_OF: dict[type[QueenError], str] = {
    InvalidInput: falcon.HTTP_400,
    NotFound: falcon.HTTP_404,
    Conflict: falcon.HTTP_409,
    PayloadTooLarge: falcon.HTTP_413,
    QueueFull: falcon.HTTP_429,
    Unavailable: falcon.HTTP_503,
}
CORS_HEADERS = {
    "Access-Control-Allow-Methods": "GET, POST, PUT, DELETE, OPTIONS",
    "Access-Control-Allow-Headers": "Content-Type, Authorization",
    "Access-Control-Max-Age": "86400",
}
# Every origin: the same four headers on every response, set in one call (tuples are
# falcon's fastest form).
ANY_ORIGIN_HEADERS = [("Access-Control-Allow-Origin", "*"), *CORS_HEADERS.items()]


class CORSMiddleware:
    """Put the CORS headers on every response; answer preflight requests.

    origins: "*" answers every origin; a comma-separated list answers only those, each
    with its own Origin echoed (and `Vary: Origin` for caches).
    """

    def __init__(self, origins: str = "*") -> None:
        listed = {o.strip().rstrip("/") for o in origins.split(",") if o.strip()}
        self.origins: frozenset[str] | None = None if "*" in listed else frozenset(listed)

    def process_request(self, req: falcon.Request, resp: falcon.Response) -> None:
        if req.method == "OPTIONS":
            self._set_headers(req, resp)
            resp.status = falcon.HTTP_204
            resp.complete = True

    def process_response(
        self, req: falcon.Request, resp: falcon.Response, resource: Any, ok: bool
    ) -> None:
        self._set_headers(req, resp)

    def _set_headers(self, req: falcon.Request, resp: falcon.Response) -> None:
        if self.origins is None:
            resp.set_headers(ANY_ORIGIN_HEADERS)
            return
        resp.set_header("Vary", "Origin")
        origin = req.get_header("Origin")
        if origin is not None and origin in self.origins:
            resp.set_header("Access-Control-Allow-Origin", origin)
            resp.set_headers(CORS_HEADERS)


class ClosedPool:
    """Answers requests that meet this worker's database pool closed: the worker is exiting
    (gunicorn's worker_exit closes the pool, and a request may still run then, in a worker
    whose master died too). 503 as in an outage, but logged as what it is, once per worker
    at INFO (the next ones at DEBUG), without a traceback."""

    def __init__(self) -> None:
        self.logged = False

    @staticmethod
    def caused(ex: BaseException | None) -> bool:
        """Tell whether ex, or an exception it was raised from, is the pool's PoolClosed."""
        while ex is not None:
            if isinstance(ex, PoolClosed):
                return True
            ex = ex.__cause__
        return False

    def answer(self, req: falcon.Request, resp: falcon.Response) -> None:
        log.log(
            logging.DEBUG if self.logged else logging.INFO,
            "%s %s answered 503: this worker is shutting down (its database pool is closed)",
            req.method, req.path,
        )
        self.logged = True
        resp.set_header("Retry-After", "1")
        send_json(resp, {"error": SHUTTING_DOWN}, 503)


SHUTTING_DOWN = "this server worker is shutting down; retry (another worker or server answers)"


def _queen_error(
    closed: ClosedPool, req: falcon.Request, resp: falcon.Response, ex: QueenError, params: Any
) -> None:
    if closed.caused(ex):
        closed.answer(req, resp)
        return
    status = next((s for cls, s in STATUS_OF.items() if isinstance(ex, cls)), falcon.HTTP_400)
    if isinstance(ex, Unavailable):
        log.warning("%s %s: %s (%r)", req.method, req.path, ex.message, ex.__cause__)
        resp.set_header("Retry-After", "1")
    send_json(resp, {"error": ex.message}, int(status.split()[0]))


def _http_error(
    req: falcon.Request, resp: falcon.Response, ex: falcon.HTTPError, params: Any
) -> None:
    message = ex.description or ex.title or "error"
    send_json(resp, {"error": message}, int(ex.status_code))
    if ex.headers:
        resp.set_headers(ex.headers)


def _unexpected(
    closed: ClosedPool, req: falcon.Request, resp: falcon.Response, ex: Exception, params: Any
) -> None:
    if closed.caused(ex):
        closed.answer(req, resp)
        return
    log.exception("%s %s failed", req.method, req.path)
    send_json(resp, {"error": "internal server error"}, 500)


def create_app(
    settings: Settings,
    store: Store | None = None,
    events: Events | None = None,
    clock: Callable[[], float] = time.monotonic,
    hub: Hub | None = None,
    tracer: Any | None = None,
) -> falcon.App:
    """Build the WSGI app around a store (opened by the caller) and an events registry.

    tracer: an OpenTelemetry tracer for spans of push, pop, ack and their database calls
    (None: no tracing, and nothing of it installed).
    """
    store = store or Store.from_settings(settings)
    hub = hub or Hub.from_settings(settings, store.dashboard)
    poller = LongPoller(store, events, settings.effective_worker_id, clock)
    poller.parked = observe_parked
    measure = MetricsMiddleware(store)
    store.observe_calls(observe_fused)
    store.db.observe = observe_statement
    middleware: list[Any] = [measure, CORSMiddleware(settings.cors_origins)]
    if settings.auth_on:
        verifier = TokenVerifier(store.tokens.find, clock)
        middleware.append(AuthMiddleware(store, verifier, settings.metrics_auth == "on"))
    middleware.append(JSONBodyMiddleware())
    if tracer is not None:
        from queen import tracing
        from queen.api.tracing import TracingMiddleware

        middleware.insert(0, TracingMiddleware(tracer))
        store.trace_calls(tracing.fused_call_spans(tracer))
    app = falcon.App(middleware=middleware)
    app.req_options.strip_url_path_trailing_slash = True
    closed = ClosedPool()
    app.add_error_handler(Exception, functools.partial(_unexpected, closed))
    app.add_error_handler(falcon.HTTPError, _http_error)
    app.add_error_handler(QueenError, functools.partial(_queen_error, closed))

    batch = settings.max_batch
    pop = PopResource(poller, batch, settings.default_timeout_ms, settings.max_timeout_ms, hub)
    app.add_route(f"{API}/push", PushResource(store, batch, hub))
    app.add_route(f"{API}/pop/queue/{{queue}}/partition/{{partition}}", pop)
    app.add_route(f"{API}/pop/queue/{{queue}}", pop)
    app.add_route(f"{API}/pop", pop)
    app.add_route(f"{API}/ack", AckResource(store, hub))
    app.add_route(f"{API}/ack/batch", AckBatchResource(store, batch, hub, pop))
    app.add_route(f"{API}/configure", ConfigureResource(store))
    app.add_route(f"{API}/lease/{{lease}}/extend", leases.LeaseExtendResource(store))
    app.add_route("/health", HealthResource(store, events, clock))
    app.add_route("/health/live", LiveResource())
    app.add_route("/health/ready", ReadyResource(readiness_checks(store, events)))
    _add_group_routes(app, store, batch, hub)
    app.add_route(f"{API}/auth/me", WhoAmIResource())
    _add_dashboard_routes(app, store, hub)
    _add_read_routes(app, store, measure)
    return app


def _add_group_routes(app: falcon.App, store: Store, max_batch: int, hub: Hub) -> None:
    """Transactions and consumer-group management."""
    app.add_route(f"{API}/transaction", transactions.TransactionResource(store, max_batch, hub))
    g = f"{API}/consumer-groups"
    app.add_route(g, groups.ConsumerGroupsResource(store))
    app.add_route(f"{g}/{{group}}", groups.ConsumerGroupResource(store))
    app.add_route(f"{g}/{{group}}/seek", groups.ConsumerGroupSeekResource(store))


def _add_dashboard_routes(app: falcon.App, store: Store, hub: Hub) -> None:
    """The page, its socket and the console's routes (rates, leases, nodes, alerts)."""
    page = DashboardPageResource()
    app.add_route("/", page)
    app.add_route("/dashboard", page)
    app.add_static_route("/dashboard/static", str(STATIC_DIR))
    app.add_route("/ws/dashboard", DashboardSocketResource(hub))
    app.add_route(f"{API}/analytics/rates", console.RatesResource(store))
    app.add_route(f"{API}/leases", console.LeasesResource(store))
    app.add_route(f"{API}/system/nodes", console.NodesResource(store, hub))
    app.add_route(f"{API}/alerts", alerts.AlertsResource(store))
    app.add_route(f"{API}/alerts/{{name}}", alerts.AlertResource(store))


def _add_read_routes(app: falcon.App, store: Store, measure: MetricsMiddleware) -> None:
    """Analytics, resources, message management, metrics and the API description."""
    a = f"{API}/analytics"
    app.add_route(a, analytics.FilteredAnalyticsResource(store))
    app.add_route(f"{a}/queue/{{queue}}", analytics.QueueAnalyticsResource(store))
    app.add_route(f"{a}/queues", analytics.QueuesAnalyticsResource(store, by_queue=False))
    app.add_route(f"{a}/queue-stats", analytics.QueuesAnalyticsResource(store, by_queue=True))
    app.add_route(f"{a}/queue-depths", analytics.QueueDepthsResource(store))
    app.add_route(f"{a}/throughput", analytics.ThroughputAnalyticsResource(store))
    app.add_route(f"{a}/queue-lag", analytics.QueueLagResource(store))

    m = f"{API}/messages"
    app.add_route(m, admin.MessagesResource(store))
    app.add_route(f"{m}/{{txid}}", admin.MessageResource(store))
    app.add_route(f"{m}/{{txid}}/retry", admin.MessageRetryResource(store))
    app.add_route(f"{m}/{{txid}}/dlq", admin.MessageDeadLetterResource(store))
    app.add_route(f"{m}/{{txid}}/related", admin.RelatedMessagesResource(store))
    by_id = {
        "": admin.MessageResource(store),
        "/retry": admin.MessageRetryResource(store),
        "/dlq": admin.MessageDeadLetterResource(store),
        "/related": admin.RelatedMessagesResource(store),
    }
    for suffix, resource in by_id.items():  # (by partition id and transactionId)
        app.add_route(f"{m}/{{txid}}/{{scoped}}{suffix}", admin.InPartition(store, resource))
    app.add_route(f"{API}/dlq", admin.DeadLettersResource(store))
    app.add_route(f"{API}/queues/{{queue}}/clear", admin.ClearQueueResource(store))

    r = f"{API}/resources"
    app.add_route(f"{r}/queues", resources.QueuesResource(store))
    app.add_route(f"{r}/queues/{{queue}}", resources.QueueResource(store))
    app.add_route(f"{r}/partitions", resources.PartitionsResource(store))
    app.add_route(f"{r}/namespaces", resources.LabelsResource(store, "namespace"))
    app.add_route(f"{r}/tasks", resources.LabelsResource(store, "task"))
    app.add_route(f"{r}/overview", resources.OverviewResource(store))

    app.add_route("/metrics", MetricsResource(store))
    app.add_route("/metrics/prometheus", PrometheusResource(store, measure))
    app.add_route(f"{API}/openapi.json", OpenAPIResource())
