"""Resources (API.md section 8): queues, partitions, namespaces, tasks and an overview."""

from __future__ import annotations

from typing import Any

import falcon

from queen.analytics import Counts, PartitionRow, QueueRows
from queen.api import send_json, validation
from queen.api.analytics import filters_from
from queen.errors import NotFound
from queen.models import iso
from queen.store import Store
from queen.store.analytics import Filters, LabelRow

MAX_INT = validation.MAX_INT


def queue_summary_json(q: QueueRows) -> dict[str, Any]:
    totals = q.totals
    return {
        "id": q.queue.id,
        "name": q.queue.name,
        "namespace": q.queue.namespace,
        "task": q.queue.task,
        "priority": q.queue.options["priority"],
        "createdAt": iso(q.queue.created_at),
        "partitions": len(q.partitions),
        "messages": {
            "total": totals.total,
            "pending": totals.pending,
            "processing": totals.processing,
            "completed": totals.completed,
            "failed": totals.failed,
            "deadLetter": totals.dead_letter,
        },
    }


class QueuesResource:
    """GET /resources/queues"""

    def __init__(self, store: Store) -> None:
        self.store = store

    def on_get(self, req: falcon.Request, resp: falcon.Response) -> None:
        queues = self.store.analytics.queues(filters_from(req, queue=False))
        send_json(resp, {"queues": [queue_summary_json(q) for q in queues]})


class QueueResource:
    """GET /resources/queues/{queue}: the queue, its options and every partition;
    DELETE: the queue, with its messages, partitions and consumer groups (admin)."""

    def __init__(self, store: Store) -> None:
        self.store = store

    def on_get(self, req: falcon.Request, resp: falcon.Response, queue: str) -> None:
        name = validation.name(queue, "queue")
        assert name is not None
        queues = self.store.analytics.queues(Filters(queue=name))
        if not queues:
            raise NotFound(f"queue {name!r} not found")
        (q,) = queues
        spans = self.store.analytics.message_span(name)
        partitions = []
        for p in q.partitions:
            span = spans.get(p.id)
            partitions.append(
                {
                    "id": p.id,
                    "name": p.name,
                    "priority": q.queue.options["priority"],
                    "options": q.queue.options,
                    "createdAt": iso(p.created_at),
                    "stats": counts_json(p.counts),
                    "oldestMessage": iso(span.oldest) if span else None,
                    "newestMessage": iso(span.newest) if span else None,
                    "oldestPending": iso(span.oldest_pending) if span else None,
                }
            )
        send_json(
            resp,
            {
                "id": q.queue.id,
                "name": q.queue.name,
                "namespace": q.queue.namespace,
                "task": q.queue.task,
                "createdAt": iso(q.queue.created_at),
                "options": q.queue.options,
                "partitions": partitions,
                "totals": counts_json(q.totals),
            },
        )

    def on_delete(self, req: falcon.Request, resp: falcon.Response, queue: str) -> None:
        name = validation.name(queue, "queue")
        assert name is not None
        deleted = self.store.admin.delete_queue(name)
        send_json(resp, {"deleted": True, "queue": name, "messages": deleted})


def counts_json(counts: Counts) -> dict[str, int]:
    """Counts in the order of API.md 8.2 (total first)."""
    doc = counts.as_json()
    return {"total": doc.pop("total"), **doc}


def partition_json(p: PartitionRow) -> dict[str, Any]:
    return {
        "id": p.id,
        "name": p.name,
        "queue": p.queue.name,
        "namespace": p.queue.namespace,
        "task": p.queue.task,
        "priority": p.queue.options["priority"],
        "options": p.queue.options,
        "createdAt": iso(p.created_at),
        "depth": p.counts.pending,
        "processing": p.counts.processing,
        "completed": p.counts.completed,
        "failed": p.counts.failed,
        "deadLetter": p.counts.dead_letter,
        "total": p.counts.total,
    }


class PartitionsResource:
    """GET /resources/partitions?queue=&namespace=&task=&minDepth="""

    def __init__(self, store: Store) -> None:
        self.store = store

    def on_get(self, req: falcon.Request, resp: falcon.Response) -> None:
        filters = filters_from(req)
        min_depth = validation.int_param(req.params, "minDepth", 0, 0, MAX_INT)
        queues = self.store.analytics.queues(filters)
        send_json(
            resp,
            {
                "partitions": [
                    partition_json(p)
                    for q in queues
                    for p in q.partitions
                    if p.counts.pending >= min_depth
                ]
            },
        )


def label_json(key: str, row: LabelRow) -> dict[str, Any]:
    return {
        key: row.label,
        "queues": row.queues,
        "partitions": row.partitions,
        "messages": {
            "total": row.counts.total,
            "pending": row.counts.pending,
            "processing": row.counts.processing,
            "completed": row.counts.completed,
            "failed": row.counts.failed,
            "deadLetter": row.counts.dead_letter,
        },
    }


class LabelsResource:
    """GET /resources/namespaces and /resources/tasks"""

    def __init__(self, store: Store, label: str) -> None:
        self.store = store
        self.label = label  # namespace | task

    def on_get(self, req: falcon.Request, resp: falcon.Response) -> None:
        rows = self.store.analytics.labels(self.label)
        key = "namespaces" if self.label == "namespace" else "tasks"
        send_json(resp, {key: [label_json(self.label, row) for row in rows]})


class OverviewResource:
    """GET /resources/overview"""

    def __init__(self, store: Store) -> None:
        self.store = store

    def on_get(self, req: falcon.Request, resp: falcon.Response) -> None:
        o = self.store.analytics.overview()
        send_json(
            resp,
            {
                "queues": o.queues,
                "partitions": o.partitions,
                "namespaces": o.namespaces,
                "tasks": o.tasks,
                "messages": counts_json(o.counts),
                "timestamp": iso(o.at),
            },
        )
