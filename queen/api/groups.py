"""Consumer groups: list, describe, seek, delete.

Queue mode's built-in group `__queue__` is listed with the named groups (queueMode: true):
its backlog is the queue's. It can be described and sought; deleting it is refused,
since that would also forget queue mode's dead letters and failures.
"""

from __future__ import annotations

import datetime as dt
from typing import Any

import falcon

from queen.api import auth, read_body, send_json, validation
from queen.errors import InvalidInput, NotFound
from queen.models import iso
from queen.store import Store
from queen.store.lifecycle import QUEUE_MODE, GroupPartition, GroupSummary, SeekTarget

SEEK_TARGETS = ("beginning", "end")


def group_name(value: Any, field: str = "consumer group") -> str:
    """Check a group's name (queue mode's own name, which pops answer with, included)."""
    return value if value == QUEUE_MODE else validation.name(value, field)


def queue_param(req: falcon.Request) -> str | None:
    """Read ?queue= (given once: the token's scope is checked against one name)."""
    raw = req.params.get("queue")
    if raw is not None and not isinstance(raw, str):
        raise InvalidInput("queue must be given once")
    return validation.name(raw, "queue", required=False)


def summary_json(s: GroupSummary) -> dict[str, Any]:
    return {
        "name": s.consumer_group,
        "queue": s.queue,
        "queueMode": s.consumer_group == QUEUE_MODE,
        "subscriptionMode": s.subscription_mode,
        "subscriptionFrom": iso(s.subscription_from),
        "createdAt": iso(s.joined_at),
        "partitions": s.partitions,
        "leasedPartitions": s.leased,
        "pending": s.pending,
        "pendingCapped": s.capped,
        "lagSeconds": round(s.lag_seconds, 3),
    }


def partition_json(p: GroupPartition) -> dict[str, Any]:
    lease = None
    if p.lease_id is not None:
        lease = {
            "leaseId": str(p.lease_id),
            "leasedBy": p.leased_by,
            "leaseExpiresAt": iso(p.lease_expires_at),
            "size": p.lease_size,
        }
    return {
        "partition": p.partition,
        "cursorId": p.cursor_id,
        "pending": p.pending,
        "pendingCapped": p.capped,
        "lagSeconds": round(p.lag_seconds, 3),
        "lease": lease,
        "updatedAt": iso(p.updated_at),
    }


def group_json(name: str, rows: list[GroupPartition]) -> dict[str, Any]:
    """Shape one group's partitions, grouped by queue (rows come in queue order)."""
    queues: dict[str, dict[str, Any]] = {}
    for row in rows:
        queue = queues.get(row.queue)
        if queue is None:
            queue = queues[row.queue] = {
                "queue": row.queue,
                "subscriptionMode": row.subscription_mode,
                "subscriptionFrom": iso(row.subscription_from),
                "createdAt": iso(row.joined_at),
                "pending": 0,
                "pendingCapped": False,
                "lagSeconds": 0.0,
                "partitions": [],
            }
        if row.partition is None:
            continue  # a queue without partitions yet
        queue["pending"] += row.pending
        queue["pendingCapped"] = queue["pendingCapped"] or row.capped
        queue["lagSeconds"] = max(queue["lagSeconds"], round(row.lag_seconds, 3))
        queue["partitions"].append(partition_json(row))
    listed = list(queues.values())
    return {
        "name": name,
        "queueMode": name == QUEUE_MODE,
        "pending": sum(q["pending"] for q in listed),
        "pendingCapped": any(q["pendingCapped"] for q in listed),
        "lagSeconds": max((q["lagSeconds"] for q in listed), default=0.0),
        "queues": listed,
    }


def seek_target(value: Any) -> tuple[SeekTarget, dt.datetime | None]:
    """Read "to": 'beginning', 'end' or an ISO-8601 time (UTC when it names no zone)."""
    if value in SEEK_TARGETS:
        return value, None
    if isinstance(value, str):
        try:
            at = dt.datetime.fromisoformat(value)
        except ValueError:
            pass
        else:
            return "time", at if at.tzinfo is not None else at.replace(tzinfo=dt.UTC)
    raise InvalidInput("to must be 'beginning', 'end' or an ISO-8601 time")


class ConsumerGroupsResource:
    """GET /consumer-groups?queue="""

    def __init__(self, store: Store) -> None:
        self.store = store

    def on_get(self, req: falcon.Request, resp: falcon.Response) -> None:
        queue = queue_param(req)
        summaries = self.store.groups.summaries(queue)
        if queue is not None and not summaries and not self.store.queues.exists(queue):
            raise NotFound(f"queue {queue!r} not found")
        send_json(resp, {"consumerGroups": [summary_json(s) for s in summaries]})


class ConsumerGroupResource:
    """GET /consumer-groups/{group}?queue=, PUT /consumer-groups/{group} {"queue",
    "subscriptionMode" | "subscriptionFrom"}, DELETE /consumer-groups/{group}?queue="""

    def __init__(self, store: Store) -> None:
        self.store = store

    def on_get(self, req: falcon.Request, resp: falcon.Response, group: str) -> None:
        name = group_name(group)
        queue = queue_param(req)
        rows = self.store.groups.partitions(name, queue)
        if not rows:
            where = f" on queue {queue!r}" if queue else ""
            raise NotFound(f"consumer group {name!r} not found{where}")
        send_json(resp, group_json(name, rows))

    def on_put(self, req: falcon.Request, resp: falcon.Response, group: str) -> None:
        name = group_name(group)
        if name == QUEUE_MODE:
            raise InvalidInput("queue mode needs no subscription")
        doc = validation.parse_json_object(read_body(req))
        queue = validation.name(doc.get("queue"), "queue")
        assert queue is not None
        for key in ("subscriptionMode", "subscriptionFrom"):
            if key in doc and not isinstance(doc[key], str):
                raise InvalidInput(f"{key} must be a string")
        _, mode, since = validation.subscription(doc)
        auth.check_queue(req, queue)
        created = self.store.groups.subscribe(queue, name, mode, since)
        send_json(
            resp,
            {"consumerGroup": name, "queue": queue, "created": created},
            201 if created else 200,
        )

    def on_delete(self, req: falcon.Request, resp: falcon.Response, group: str) -> None:
        name = group_name(group)
        if name == QUEUE_MODE:
            raise InvalidInput("queue mode cannot be deleted (seek it instead)")
        queue = queue_param(req)
        deleted = self.store.groups.delete(name, queue)
        if not deleted:
            where = f" on queue {queue!r}" if queue else ""
            raise NotFound(f"consumer group {name!r} not found{where}")
        send_json(
            resp,
            {
                "consumerGroup": name,
                "deleted": [{"queue": q, "partitions": n} for q, n in deleted.items()],
            },
        )


class ConsumerGroupSeekResource:
    """POST /consumer-groups/{group}/seek {"queue", "to"}"""

    def __init__(self, store: Store) -> None:
        self.store = store

    def on_post(self, req: falcon.Request, resp: falcon.Response, group: str) -> None:
        name = group_name(group)
        doc = validation.parse_json_object(read_body(req))
        queue = validation.name(doc.get("queue"), "queue")
        to, at = seek_target(doc.get("to"))
        auth.check_queue(req, queue)
        moved = self.store.groups.seek(queue, name, to, at)  # NotFound: unknown queue or group
        send_json(
            resp,
            {
                "consumerGroup": name,
                "queue": queue,
                "to": doc["to"],
                "partitions": moved,
            },
        )
