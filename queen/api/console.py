"""The console's reads (API.md "Console"): rates per queue, live leases, the cluster's nodes.

Each is one bounded query of queen.store.dashboard (or none: the nodes come from the
node notes every worker receives), under the dashboard's statement timeout.
"""

from __future__ import annotations

import datetime as dt
from typing import Any

import falcon

from queen.api import send_json, validation
from queen.dashboard.hub import Hub
from queen.models import iso
from queen.store import Store
from queen.store.dashboard import LiveLease, QueueMinute
from queen.store.lifecycle import QUEUE_MODE
from queen.store.maintenance import LEADER_LOCK

MINUTES = 60  # minutes of rates listed: the last hour, this minute included
MAX_LEASES = 1000  # leases one answer lists at most
DEFAULT_LEASES = 500


def _per_second(messages: int, seconds: float) -> float:
    return round(messages / seconds, 4) if seconds > 0 else 0.0


def _minute_json(minute: dt.datetime, row: QueueMinute | None) -> dict[str, Any]:
    incoming, completed, failed, dead = row[4:8] if row else (0, 0, 0, 0)
    return {
        "timestamp": iso(minute),
        "incoming": incoming,
        "completed": completed,
        "failed": failed,
        "deadLetter": dead,
        "outgoing": completed + failed + dead,
    }


def queue_rates(rows: list[QueueMinute], at: dt.datetime) -> dict[str, Any]:
    """Shape one queue's minutes (API.md "Rates"): now, last hour, and each minute."""
    this_minute = at.replace(second=0, microsecond=0)
    by_minute = {r.minute: r for r in rows if r.minute is not None}
    minutes = [
        _minute_json(m, by_minute.get(m))
        for m in (this_minute - dt.timedelta(minutes=MINUTES - 1 - i) for i in range(MINUTES))
    ]
    elapsed = (at - this_minute).total_seconds()  # of this minute, still filling up
    recent = minutes[-2:]
    hour_s = (MINUTES - 1) * 60 + elapsed
    now_s = 60 + elapsed

    def rates(window: list[dict[str, Any]], seconds: float) -> dict[str, float]:
        return {
            "incomingPerSecond": _per_second(sum(m["incoming"] for m in window), seconds),
            "outgoingPerSecond": _per_second(sum(m["outgoing"] for m in window), seconds),
        }

    first = rows[0]
    return {
        "queue": first.queue,
        "namespace": first.namespace,
        "task": first.task,
        "now": {**rates(recent, now_s), "seconds": round(now_s)},
        "lastHour": {**rates(minutes, hour_s), "seconds": round(hour_s)},
        "minutes": minutes,
    }


class RatesResource:
    """GET /analytics/rates: messages in and out per second per queue, now and over the hour."""

    def __init__(self, store: Store) -> None:
        self.store = store

    def on_get(self, req: falcon.Request, resp: falcon.Response) -> None:
        queue = validation.name(req.params.get("queue"), "queue", required=False)
        by_queue: dict[str, list[QueueMinute]] = {}
        at = None
        for row in self.store.dashboard.rates(queue):
            by_queue.setdefault(row.queue, []).append(row)
            at = row.at
        if at is None:
            send_json(resp, {"at": None, "queues": []})
            return
        doc = {"at": iso(at), "queues": [queue_rates(rows, at) for rows in by_queue.values()]}
        send_json(resp, doc)


def lease_json(lease: LiveLease) -> dict[str, Any]:
    return {
        "queue": lease.queue,
        "partition": lease.partition,
        "consumerGroup": None if lease.consumer_group == QUEUE_MODE else lease.consumer_group,
        "workerId": lease.leased_by,
        "leaseId": str(lease.lease_id),
        "messages": lease.size,
        "acked": lease.acked,
        "leasedAt": iso(lease.leased_at),
        "expiresAt": iso(lease.expires_at),
    }


class LeasesResource:
    """GET /leases: who holds which partition now, for which group, since when."""

    def __init__(self, store: Store) -> None:
        self.store = store

    def on_get(self, req: falcon.Request, resp: falcon.Response) -> None:
        queue = validation.name(req.params.get("queue"), "queue", required=False)
        limit = validation.int_param(req.params, "limit", DEFAULT_LEASES, 1, MAX_LEASES)
        leases = self.store.dashboard.leases(queue, limit + 1)
        send_json(
            resp,
            {
                "leases": [lease_json(lease) for lease in leases[:limit]],
                "truncated": len(leases) > limit,
            },
        )


class NodesResource:
    """GET /system/nodes: every live worker by host, the maintenance leader, database sessions."""

    def __init__(self, store: Store, hub: Hub) -> None:
        self.store = store
        self.hub = hub

    def on_get(self, req: falcon.Request, resp: falcon.Response) -> None:
        hosts: dict[str, list[dict[str, Any]]] = {}
        for worker in self.hub.workers():
            hosts.setdefault(str(worker.get("host")), []).append(worker)
        sessions = self.store.dashboard.sessions()
        send_json(
            resp,
            {
                "at": iso(dt.datetime.now(dt.UTC)),
                "maintenanceLeader": self.store.dashboard.maintenance_leader(LEADER_LOCK),
                "hosts": [{"host": host, "workers": workers} for host, workers in hosts.items()],
                "database": {
                    "maxConnections": sessions[0].max_connections if sessions else None,
                    "sessions": [
                        {"application": s.application, "connections": s.connections, "busy": s.busy}
                        for s in sessions
                    ],
                },
            },
        )
