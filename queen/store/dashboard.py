"""What the live dashboard and the console routes read: depths, rates, leases, sessions.

Every query runs under a short statement timeout: a dashboard must never hold a
snapshot long enough to slow the hot paths (see NOTES: xmin horizon).
"""

from __future__ import annotations

import datetime as dt
import uuid
from collections.abc import Mapping, Sequence
from typing import Any, NamedTuple

from psycopg.rows import RowFactory, namedtuple_row

from queen.store.db import Database

DASHBOARD_STATEMENT_TIMEOUT_MS = 5000
DASHBOARD_CHANNEL = "queen_dashboard"  # NOTIFY channel of dashboard batches and presence notes


class PartitionDepth(NamedTuple):
    """Current counts of one partition (partition None: a queue that has none yet)."""

    queue: str
    namespace: str | None
    task: str | None
    partition: str | None
    pending: int
    processing: int
    completed: int
    failed: int
    dead_letter: int


class RecentActivity(NamedTuple):
    created: int  # messages pushed during the last complete minute
    completed: int  # messages completed during the last complete minute


class QueueMinute(NamedTuple):
    """One queue's activity in one minute (minute None: a queue without any this hour)."""

    queue: str
    namespace: str | None
    task: str | None
    minute: dt.datetime | None
    incoming: int
    completed: int
    failed: int
    dead_letter: int
    at: dt.datetime  # the database's clock when read


class LiveLease(NamedTuple):
    """A lease held now on one partition for one group (QUEUE_MODE: queue mode)."""

    queue: str
    partition: str
    consumer_group: str
    leased_by: str | None  # the worker that answered the pop
    lease_id: uuid.UUID
    size: int | None
    acked: int
    leased_at: dt.datetime  # when the lease began (after an extension: no earlier)
    expires_at: dt.datetime


class Sessions(NamedTuple):
    """This database's client sessions of one application name."""

    application: str
    connections: int
    busy: int
    max_connections: int


class Alert(NamedTuple):
    """An operator's alert and its queue's value now (None: no such queue)."""

    name: str
    queue: str
    kind: str  # ALERT_KINDS
    threshold: float
    window_minutes: int
    created_at: dt.datetime
    value: float | None

    @property
    def firing(self) -> bool:
        return self.value is not None and self.value > self.threshold


ALERT_KINDS = ("depth", "lag", "dead_letters")


class MessagePlace(NamedTuple):
    transaction_id: str
    queue: str
    partition: str


class Dashboard:
    """Read-only queries for the dashboard, each one short and cluster-wide."""

    def __init__(self, db: Database, timeout_ms: int = DASHBOARD_STATEMENT_TIMEOUT_MS) -> None:
        self.db = db
        self.timeout_ms = timeout_ms

    def _fetch(
        self, name: str, params: Mapping[str, Any] | None, row_factory: RowFactory[Any]
    ) -> list[Any]:
        with self.db.connection(timeout_ms=self.timeout_ms) as conn, conn.transaction():
            conn.execute(
                self.db.queries["transaction_statement_timeout"], {"ms": str(self.timeout_ms)}
            )
            cur = conn.cursor(row_factory=row_factory)
            cur.execute(self.db.queries[name], params)
            return cur.fetchall()

    def depths(self) -> list[PartitionDepth]:
        """Return the counts of every partition, ordered by queue then partition."""
        rows = self._fetch("dashboard_depths", None, namedtuple_row)
        return [PartitionDepth(*row) for row in rows]

    def recent(self) -> RecentActivity:
        """Return cluster-wide activity of the last complete minute."""
        (row,) = self._fetch("dashboard_recent", None, namedtuple_row)
        return RecentActivity(int(row.created), int(row.completed))

    def rates(self, queue: str | None = None) -> list[QueueMinute]:
        """Return each queue's activity per minute of the last hour, by queue then minute."""
        rows = self._fetch("dashboard_rates", {"queue": queue}, namedtuple_row)
        return [QueueMinute(*row) for row in rows]

    def leases(self, queue: str | None = None, limit: int = 500) -> list[LiveLease]:
        """Return up to limit live leases, oldest first."""
        rows = self._fetch("dashboard_leases", {"queue": queue, "limit": limit}, namedtuple_row)
        return [LiveLease(*row) for row in rows]

    def sessions(self) -> list[Sessions]:
        """Return this database's client sessions per application name."""
        rows = self._fetch("dashboard_connections", None, namedtuple_row)
        return [Sessions(*row) for row in rows]

    def maintenance_leader(self, lock_key: int) -> str | None:
        """Return the application name of the session holding the leader lock, if any."""
        rows = self._fetch("maintenance_leader", {"key": lock_key}, namedtuple_row)
        return rows[0].application_name if rows else None

    def alerts(self) -> list[Alert]:
        """Return every alert (at most 1000) with its value now, by name."""
        rows = self._fetch("alert_values", None, namedtuple_row)
        return [Alert(*row) for row in rows]

    def put_alert(
        self, name: str, queue: str, kind: str, threshold: float, window_minutes: int
    ) -> None:
        """Create or replace one alert."""
        params = {
            "name": name,
            "queue": queue,
            "kind": kind,
            "threshold": threshold,
            "window_minutes": window_minutes,
        }
        with self.db.connection() as conn:
            conn.execute(self.db.queries["alert_put"], params)

    def delete_alert(self, name: str) -> bool:
        """Remove one alert; False when there was none of that name."""
        return bool(self._fetch("alert_delete", {"name": name}, namedtuple_row))

    def pool(self) -> dict[str, int]:
        """Return this worker's pool: size, idle, waiting and max connections."""
        return self.db.stats()

    def locate(self, transaction_ids: Sequence[str]) -> dict[str, MessagePlace]:
        """Map transactionIds to their queue and partition (unknown ones are left out)."""
        if not transaction_ids:
            return {}
        rows = self._fetch("dashboard_locate", {"ids": list(transaction_ids)}, namedtuple_row)
        return {row.transaction_id: MessagePlace(*row) for row in rows}

    def notify(self, payload: str) -> None:
        """Send one dashboard notification to every worker's listener (payload < 8000 bytes)."""
        with self.db.connection() as conn:
            conn.execute(
                self.db.queries["dashboard_notify"],
                {"channel": DASHBOARD_CHANNEL, "payload": payload},
            )
