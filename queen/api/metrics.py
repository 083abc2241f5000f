"""Request and message metrics: Prometheus text for every worker of a host, and JSON views.

Under gunicorn, gunicorn.conf.py points PROMETHEUS_MULTIPROC_DIR at a fresh directory
before any worker starts (prometheus_client reads it at import). Each worker then
writes its samples to memory-mapped files there, and whichever worker answers a scrape
sums every worker's files (prometheus_client's multiprocess mode). Without that
variable (tests, a bare WSGI server) the samples live in this process only.

Queue depths are not kept as samples: the worker answering a scrape reads them from
PostgreSQL at that moment (queue mode's counts, as the analytics read them).
"""

from __future__ import annotations

import glob
import os
import resource
import time
from collections.abc import Iterator
from typing import Any

import falcon
from prometheus_client import (
    CONTENT_TYPE_LATEST,
    REGISTRY,
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    generate_latest,
    multiprocess,
)
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric

from queen.analytics import STATUSES
from queen.errors import Unavailable
from queen.server import multiproc
from queen.server.status import maintenance_state
from queen.store import Store

MULTIPROC_ENV = multiproc.MULTIPROC_ENV
STARTED_AT_ENV = multiproc.STARTED_AT_ENV
POOL_REFRESH_S = 1.0  # seconds between updates of this worker's pool gauges
PAGE_BYTES = os.sysconf("SC_PAGE_SIZE")
LATENCY_BUCKETS = (
    0.001,
    0.0025,
    0.005,
    0.01,
    0.025,
    0.05,
    0.1,
    0.25,
    0.5,
    1.0,
    2.5,
    5.0,
    10.0,
    30.0,
    60.0,
)  # seconds; long polls wait up to 60 s

REQUESTS = Counter("queen_http_requests", "HTTP requests answered", ["method", "route", "status"])
LATENCY = Histogram(
    "queen_http_request_duration_seconds",
    "Time to answer an HTTP request (long polls include their wait)",
    ["method", "route"],
    buckets=LATENCY_BUCKETS,
)
MESSAGES = Counter(
    "queen_messages", "Messages handled: pushed (queued), popped, acked", ["operation"]
)
POOL = Gauge(
    "queen_db_pool_connections",
    "Database pool of the workers: size, idle connections, requests waiting",
    ["state"],
    multiprocess_mode="livesum",
)

FUSED_KINDS = ("push", "pop", "ack", "extend")
FUSED = Histogram(
    "queen_fused_call_requests",
    "Requests each push, pop, ack or lease-renewal database call served (fusion: above 1)",
    ["kind"],
    buckets=(1, 2, 4, 8, 16, 32, 64, 128, 256),
)
_fused = {kind: FUSED.labels(kind) for kind in FUSED_KINDS}
STATEMENTS = Counter(
    "queen_db_statements",
    "Statements the workers sent to PostgreSQL, by query (queen/store/*.sql; other: the rest)",
    ["query"],
)
COMMITS = Counter(
    "queen_db_commits",
    "Commits the workers made, by query (transaction: a block of several statements)",
    ["query"],
)
PARKED = Counter(
    "queen_long_polls_parked",
    "Long polls that found nothing at once and waited for a wake-up or their timeout",
)
_statements: dict[str, Any] = {}
_commits: dict[str, Any] = {}

_process_started = time.time()


def observe_fused(kind: str, requests: int) -> None:
    """Count one database call of kind that served requests requests."""
    _fused[kind].observe(requests)


def observe_statement(query: str, ran: bool, committed: bool) -> None:
    """Count a statement of query the database ran, and its commit (queen.store.db)."""
    if ran:
        child = _statements.get(query)
        if child is None:
            child = _statements[query] = STATEMENTS.labels(query)
        child.inc()
    if committed:
        child = _commits.get(query)
        if child is None:
            child = _commits[query] = COMMITS.labels(query)
        child.inc()


def observe_parked() -> None:
    """Count a long poll that parked (queen.polling.LongPoller)."""
    PARKED.inc()


def multiprocess_mode() -> bool:
    return bool(os.environ.get(MULTIPROC_ENV))


def uptime_s() -> float:
    """Seconds since the server (the gunicorn master, if any) started."""
    started = float(os.environ.get(STARTED_AT_ENV) or _process_started)
    return max(0.0, time.time() - started)


class _WorkersCollector(multiprocess.MultiProcessCollector):
    """Every worker's samples, passing over a file its worker is still creating.

    prometheus_client creates a worker's file empty and then sizes it; read in between,
    the empty file fails the whole scrape (struct.error). It holds no sample yet.
    """

    def collect(self) -> Iterator[Metric]:
        files = [f for f in glob.glob(os.path.join(self._path, "*.db")) if _has_header(f)]
        return self.merge(files, accumulate=True)


def _has_header(path: str) -> bool:
    try:
        return os.path.getsize(path) > 0
    except OSError:  # (removed meanwhile: a worker that ended)
        return False


def _samples_registry() -> CollectorRegistry:
    if not multiprocess_mode():
        return REGISTRY
    registry = CollectorRegistry()
    _WorkersCollector(registry)
    return registry


def totals() -> dict[str, int]:
    """Requests and messages so far, summed over every worker of this host."""
    found = {"requests": 0, "pushed": 0, "popped": 0, "acked": 0}
    for metric in _samples_registry().collect():
        for sample in metric.samples:
            if sample.name == "queen_http_requests_total":
                found["requests"] += int(sample.value)
            elif sample.name == "queen_messages_total":
                operation = sample.labels.get("operation", "")
                if operation in found:
                    found[operation] += int(sample.value)
    return found


WAKEUP_QUERIES = ("notify_sent", "notify_wakes")  # queen/store/queries.sql


def work() -> dict[str, int]:
    """What the workers of this host did so far, summed over them in one pass: statements
    sent, commits made, long polls parked, and wake-up transactions sent (pushes' and
    acks'); for database_work() and long_polls()."""
    found = {"statements": 0, "commits": 0, "parked": 0, "wakeupCalls": 0}
    for metric in _samples_registry().collect():
        for sample in metric.samples:
            if sample.name == "queen_db_statements_total":
                found["statements"] += int(sample.value)
                if sample.labels.get("query") in WAKEUP_QUERIES:
                    found["wakeupCalls"] += int(sample.value)
            elif sample.name == "queen_db_commits_total":
                found["commits"] += int(sample.value)
            elif sample.name == "queen_long_polls_parked_total":
                found["parked"] += int(sample.value)
    return found


def database_work(done: dict[str, int], acked: int) -> dict[str, Any]:
    """Statements and commits (of work()), and per message acked (acked so far, as
    totals() counts it: a message's push, pop and ack, with everything else the workers
    ran)."""
    found = {k: done[k] for k in ("statements", "commits")}
    return {
        **found,
        "perMessage": {k: round(v / acked, 3) if acked else None for k, v in found.items()},
    }


def long_polls(done: dict[str, int]) -> dict[str, int]:
    """Long polls parked and wake-up transactions sent (of work())."""
    return {k: done[k] for k in ("parked", "wakeupCalls")}


def fusion() -> dict[str, dict[str, float]]:
    """Database calls and the requests they served, per kind, over every worker of this host."""
    found = {kind: {"calls": 0, "requests": 0} for kind in FUSED_KINDS}
    for metric in _samples_registry().collect():
        if metric.name != "queen_fused_call_requests":
            continue
        for sample in metric.samples:
            kind = sample.labels.get("kind", "")
            if kind not in found:
                continue
            if sample.name.endswith("_count"):
                found[kind]["calls"] += int(sample.value)
            elif sample.name.endswith("_sum"):
                found[kind]["requests"] += int(sample.value)
    return {
        kind: {**c, "requestsPerCall": round(c["requests"] / c["calls"], 2) if c["calls"] else 0}
        for kind, c in found.items()
    }


def rates() -> dict[str, Any]:
    """Totals and per-second rates since start (messages: pushed)."""
    counted = totals()
    uptime = uptime_s()
    return {
        "uptime": uptime,
        "requests": counted["requests"],
        "messages": counted["pushed"],
        "requestsPerSecond": counted["requests"] / uptime if uptime else 0.0,
        "messagesPerSecond": counted["pushed"] / uptime if uptime else 0.0,
        **{k: counted[k] for k in ("pushed", "popped", "acked")},
    }


def memory() -> dict[str, int]:
    """This process's memory in bytes (from /proc; maxRss from getrusage)."""
    usage = resource.getrusage(resource.RUSAGE_SELF)
    doc = {"maxRss": usage.ru_maxrss * 1024}
    try:
        with open("/proc/self/statm", "rb") as f:
            size, rss, shared, _text, _lib, data = (int(x) for x in f.read().split()[:6])
    except (OSError, ValueError):
        return doc
    return {
        "rss": rss * PAGE_BYTES,
        "vms": size * PAGE_BYTES,
        "shared": shared * PAGE_BYTES,
        "data": data * PAGE_BYTES,
        **doc,
    }


def cpu() -> dict[str, int]:
    """This process's CPU time in microseconds."""
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return {"user": int(usage.ru_utime * 1e6), "system": int(usage.ru_stime * 1e6)}


class MetricsMiddleware:
    """Count and time every request; count messages the resources report handling.

    The labelled samples of each (method, route, status) are looked up once and kept:
    prometheus_client's labels() takes a lock and builds its key at every call.
    """

    def __init__(self, store: Store) -> None:
        self.store = store
        self._pool_at = float("-inf")
        self._requests: dict[tuple[str, str, int], tuple[Any, Any]] = {}
        self._messages: dict[str, Any] = {}

    def process_request(self, req: falcon.Request, resp: falcon.Response) -> None:
        req.context.started = time.perf_counter()

    def process_response(
        self, req: falcon.Request, resp: falcon.Response, resource: Any, ok: bool
    ) -> None:
        started = req.context.get("started")
        key = (req.method, req.uri_template or "unmatched", resp.status_code)
        samples = self._requests.get(key)
        if samples is None:
            method, route, status = key
            samples = (REQUESTS.labels(method, route, str(status)), LATENCY.labels(method, route))
            self._requests[key] = samples
        samples[0].inc()
        if started is not None:
            samples[1].observe(time.perf_counter() - started)
        handled = req.context.get("messages")
        if handled and handled[1]:
            self._count(*handled)
        popped = req.context.get("popped")  # (a pop, or an ack batch's next pop)
        if popped:
            self._count("popped", popped)
        if time.monotonic() - self._pool_at > POOL_REFRESH_S:
            self.refresh_pool()

    def _count(self, operation: str, messages: int) -> None:
        counter = self._messages.get(operation)
        if counter is None:
            counter = self._messages[operation] = MESSAGES.labels(operation)
        counter.inc(messages)

    def refresh_pool(self) -> None:
        self._pool_at = time.monotonic()
        stats = self.store.db.stats()
        for state in ("size", "idle", "waiting"):
            POOL.labels(state).set(stats[state])


class _Forward:
    """Expose another registry's samples through a scrape registry."""

    def __init__(self, source: CollectorRegistry) -> None:
        self.source = source

    def collect(self) -> Iterator[Metric]:
        yield from self.source.collect()


class QueueDepthCollector:
    """Messages per queue and status, read from PostgreSQL when scraped."""

    def __init__(self, store: Store) -> None:
        self.store = store

    def collect(self) -> Iterator[Metric]:
        up = GaugeMetricFamily("queen_database_up", "1 when PostgreSQL answered this scrape")
        try:
            queues = self.store.analytics.queue_totals()
        except Unavailable:
            up.add_metric([], 0)
            yield up
            return
        up.add_metric([], 1)
        yield up
        messages = GaugeMetricFamily(
            "queen_queue_messages", "Messages per queue and status", labels=["queue", "status"]
        )
        partitions = GaugeMetricFamily(
            "queen_queue_partitions", "Partitions per queue", labels=["queue"]
        )
        for queue in queues:
            for status in STATUSES:
                messages.add_metric([queue.name, status], getattr(queue.counts, status))
            partitions.add_metric([queue.name], queue.partitions)
        yield messages
        yield partitions


class AlertCollector:
    """Every alert's value and whether it fires (API.md "Alerts"), evaluated when scraped."""

    def __init__(self, store: Store) -> None:
        self.store = store

    def collect(self) -> Iterator[Metric]:
        try:
            alerts = self.store.dashboard.alerts()
        except Unavailable:
            return  # queen_database_up says why
        labels = ["alert", "queue", "kind"]
        value = GaugeMetricFamily(
            "queen_alert_value", "The value an alert compares with its threshold", labels=labels
        )
        threshold = GaugeMetricFamily(
            "queen_alert_threshold", "An alert's threshold", labels=labels
        )
        firing = GaugeMetricFamily(
            "queen_alert_firing", "1 while an alert's value exceeds its threshold", labels=labels
        )
        for alert in alerts:
            names = [alert.name, alert.queue, alert.kind]
            if alert.value is not None:
                value.add_metric(names, alert.value)
            threshold.add_metric(names, alert.threshold)
            firing.add_metric(names, 1 if alert.firing else 0)
        yield value
        yield threshold
        yield firing


class SupervisionCollector:
    """How `queen serve`'s maintenance child fares, from its supervisor's state file."""

    def collect(self) -> Iterator[Metric]:
        maintenance = maintenance_state()
        if maintenance is None:  # not run by `queen serve`
            return
        looping = GaugeMetricFamily(
            "queen_maintenance_crash_looping",
            "1 while the maintenance process keeps exiting (restarted with backoff)",
        )
        looping.add_metric([], 1 if maintenance["status"] == "crash-looping" else 0)
        yield looping
        running = GaugeMetricFamily(
            "queen_maintenance_running", "1 while the maintenance process runs"
        )
        running.add_metric([], 0 if maintenance["pid"] is None else 1)
        yield running
        restarts = CounterMetricFamily(
            "queen_maintenance_restarts", "Restarts of the maintenance process by the supervisor"
        )
        restarts.add_metric([], maintenance["restarts"])
        yield restarts


class PrometheusResource:
    """GET /metrics/prometheus: the Prometheus text format."""

    def __init__(self, store: Store, middleware: MetricsMiddleware) -> None:
        self.store = store
        self.middleware = middleware

    def on_get(self, req: falcon.Request, resp: falcon.Response) -> None:
        self.middleware.refresh_pool()
        registry = CollectorRegistry(auto_describe=False)
        if multiprocess_mode():
            _WorkersCollector(registry)
        else:
            registry.register(_Forward(REGISTRY))
        registry.register(QueueDepthCollector(self.store))
        registry.register(AlertCollector(self.store))
        registry.register(SupervisionCollector())
        resp.content_type = CONTENT_TYPE_LATEST
        resp.data = generate_latest(registry)
