"""Analytics (API.md section 5): counts per queue and partition, depths, throughput, lag.

Counts are exact at the time of the request (folded counters plus pending deltas);
per-minute series and processing times come from rollups and may lag by a second or two.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import falcon

from queen.analytics import (
    MIN_LAG_SAMPLES,
    Counts,
    LagRow,
    Minute,
    ProcessingTimes,
    QueueRows,
    add_histograms,
    lag_json,
    per_second,
)
from queen.api import send_json, validation
from queen.errors import NotFound
from queen.models import iso
from queen.store import Store
from queen.store.analytics import Filters


def filters_from(req: falcon.Request, *, queue: bool = True) -> Filters:
    """Read the optional queue, namespace and task query parameters."""
    params = req.params
    return Filters(
        queue=validation.name(params.get("queue"), "queue", required=False) if queue else None,
        namespace=validation.name(params.get("namespace"), "namespace", required=False),
        task=validation.name(params.get("task"), "task", required=False),
    )


def partitions_json(queue: QueueRows) -> list[dict[str, Any]]:
    return [{"name": p.name, "stats": p.counts.as_json()} for p in queue.partitions]


def queue_json(queue: QueueRows) -> dict[str, Any]:
    """Shape one queue as API.md 5.2."""
    return {
        "queue": queue.queue.name,
        "namespace": queue.queue.namespace,
        "task": queue.queue.task,
        "partitions": partitions_json(queue),
        "totals": queue.totals.as_json(),
    }


class QueueAnalyticsResource:
    """GET /analytics/queue/{queue}"""

    def __init__(self, store: Store) -> None:
        self.store = store

    def on_get(self, req: falcon.Request, resp: falcon.Response, queue: str) -> None:
        name = validation.name(queue, "queue")
        queues = self.store.analytics.queues(Filters(queue=name))
        if not queues:
            raise NotFound(f"queue {name!r} not found")
        (found,) = queues
        send_json(
            resp,
            {
                "queue": found.queue.name,
                "namespace": found.queue.namespace,
                "task": found.queue.task,
                "totals": found.totals.as_json(),
                "partitions": partitions_json(found),
            },
        )


class QueuesAnalyticsResource:
    """GET /analytics/queues and /analytics/queue-stats: every matching queue."""

    def __init__(self, store: Store, *, by_queue: bool) -> None:
        self.store = store
        self.by_queue = by_queue

    def on_get(self, req: falcon.Request, resp: falcon.Response) -> None:
        queues = self.store.analytics.queues(filters_from(req, queue=self.by_queue))
        send_json(resp, {"queues": [queue_json(q) for q in queues]})


class FilteredAnalyticsResource:
    """GET /analytics?namespace=&task=: the matching queues and their sum."""

    def __init__(self, store: Store) -> None:
        self.store = store

    def on_get(self, req: falcon.Request, resp: falcon.Response) -> None:
        filters = filters_from(req, queue=False)
        queues = self.store.analytics.queues(filters)
        totals = sum((q.totals for q in queues), Counts())
        send_json(
            resp,
            {
                "namespace": filters.namespace,
                "task": filters.task,
                "totals": totals.as_json(),
                "queues": [queue_json(q) for q in queues],
            },
        )


class QueueDepthsResource:
    """GET /analytics/queue-depths"""

    def __init__(self, store: Store) -> None:
        self.store = store

    def on_get(self, req: falcon.Request, resp: falcon.Response) -> None:
        queues = self.store.analytics.queues(filters_from(req))
        depths = []
        for q in queues:
            totals = q.totals
            depths.append(
                {
                    "queue": q.queue.name,
                    "namespace": q.queue.namespace,
                    "task": q.queue.task,
                    "depth": totals.pending,
                    "processing": totals.processing,
                    "partitions": [
                        {
                            "name": p.name,
                            "depth": p.counts.pending,
                            "processing": p.counts.processing,
                        }
                        for p in q.partitions
                    ],
                }
            )
        send_json(resp, {"depths": depths})


def rate(per_minute: int) -> dict[str, Any]:
    return {"messagesPerMinute": per_minute, "messagesPerSecond": per_second(per_minute)}


def minute_json(m: Minute) -> dict[str, Any]:
    avg_ms = m.lag_ms / m.completed if m.completed else 0.0
    return {
        "timestamp": iso(m.minute),
        "incoming": rate(m.incoming),
        "completed": rate(m.completed),
        "processing": rate(m.popped),
        "failed": rate(m.failed),
        "deadLetter": rate(m.dead_letter),
        "lag": {
            "avgSeconds": round(avg_ms / 1000, 3),
            "avgMilliseconds": round(avg_ms),
            "sampleCount": m.completed,
        },
    }


class ThroughputAnalyticsResource:
    """GET /analytics/throughput: 60 per-minute entries, newest first."""

    def __init__(self, store: Store) -> None:
        self.store = store

    def on_get(self, req: falcon.Request, resp: falcon.Response) -> None:
        minutes = self.store.analytics.throughput(filters_from(req))
        send_json(resp, {"throughput": [minute_json(m) for m in minutes]})


def queue_lag_json(rows: list[LagRow]) -> dict[str, Any] | None:
    """Shape one queue's partitions as API.md 5.5; None below MIN_LAG_SAMPLES completions.

    A partition with no completion of its own in the window is estimated with the
    queue's processing times.
    """
    completed = sum(r.completed for r in rows)
    if completed < MIN_LAG_SAMPLES:
        return None
    queue_times = ProcessingTimes.of(
        completed, sum(r.lag_ms for r in rows), add_histograms(r.lag_hist for r in rows)
    )
    partitions = []
    for r in rows:
        own = ProcessingTimes.of(r.completed, r.lag_ms, r.lag_hist)
        times = own if r.completed else dataclasses.replace(queue_times, completed=0)
        partitions.append({"name": r.partition, "stats": lag_json(r.pending, r.processing, times)})
    first = rows[0]
    return {
        "queue": first.queue,
        "namespace": first.namespace,
        "task": first.task,
        "partitions": partitions,
        "totals": lag_json(
            sum(r.pending for r in rows), sum(r.processing for r in rows), queue_times
        ),
    }


class QueueLagResource:
    """GET /analytics/queue-lag"""

    def __init__(self, store: Store) -> None:
        self.store = store

    def on_get(self, req: falcon.Request, resp: falcon.Response) -> None:
        by_queue: dict[str, list[LagRow]] = {}
        for row in self.store.analytics.lag(filters_from(req)):
            by_queue.setdefault(row.queue, []).append(row)
        queues = [doc for rows in by_queue.values() if (doc := queue_lag_json(rows))]
        send_json(resp, {"queues": queues})
