"""What the live dashboard reads: depth snapshots, recent activity, throughput.

Every query runs under a short statement timeout: a dashboard must never hold a
snapshot long enough to slow the hot paths (see NOTES: xmin horizon).
"""

from __future__ import annotations

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
        with self.db.connection() as conn, conn.transaction():
            conn.execute(
                self.db.queries["dashboard_statement_timeout"], {"ms": str(self.timeout_ms)}
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
