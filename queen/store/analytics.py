"""What the analytics and resources endpoints read: counts, time series, lag, structure.

Counts are queue mode's: the rollup maintenance keeps (queen.partition_counts) plus bounded
walks past its watermarks (queen.message_counts), never a count over the
messages; time series and processing times from the per-minute activity
(queen.metrics_minute) plus the same walks (queen.activity_walk).
"""

from __future__ import annotations

import datetime as dt
import uuid
from collections.abc import Mapping
from typing import Any, NamedTuple

from psycopg.rows import tuple_row

from queen.analytics import Counts, LagRow, Minute, PartitionRow, QueueInfo, QueueRows
from queen.models import options_from_row
from queen.store.reads import Reads


class Filters(NamedTuple):
    """Which queues a read covers (None: any)."""

    queue: str | None = None
    namespace: str | None = None
    task: str | None = None

    def params(self) -> dict[str, Any]:
        return {"queue": self.queue, "namespace": self.namespace, "task": self.task}

    @property
    def any(self) -> bool:
        return self.queue is None and self.namespace is None and self.task is None


EVERYTHING = Filters()


class LabelRow(NamedTuple):
    """Aggregates of the queues sharing a namespace or a task."""

    label: str
    queues: int
    partitions: int
    counts: Counts


class Overview(NamedTuple):
    queues: int
    partitions: int
    namespaces: int
    tasks: int
    counts: Counts
    at: dt.datetime


class Span(NamedTuple):
    oldest: dt.datetime | None
    newest: dt.datetime | None
    oldest_pending: dt.datetime | None


def _counts(row: Mapping[str, Any]) -> Counts:
    return Counts(
        int(row["pending"]),
        int(row["processing"]),
        int(row["completed"]),
        int(row["failed"]),
        int(row["dead_letter"]),
    )


def _queue(row: dict[str, Any]) -> QueueInfo:
    return QueueInfo(
        row["id"],
        row["name"],
        row["namespace"],
        row["task"],
        row["created_at"],
        options_from_row(row),
    )


class QueueTotals(NamedTuple):
    name: str
    partitions: int
    counts: Counts


class Analytics:
    """Read-only queries behind /analytics and /resources."""

    def __init__(self, reads: Reads) -> None:
        self.reads = reads

    def queues(self, filters: Filters = EVERYTHING) -> list[QueueRows]:
        """Return the matching queues by name, each with its partitions by name."""
        with self.reads.session() as session:
            queue_rows = session.rows("read_queues", filters.params())
            partition_rows = session.rows("read_partitions", filters.params(), tuple_row)
        queues = {row["id"]: _queue(row) for row in queue_rows}
        partitions: dict[uuid.UUID, list[PartitionRow]] = {queue_id: [] for queue_id in queues}
        for queue_id, pid, name, created_at, *counts in partition_rows:
            if queue_id in queues:  # a queue created after the first query: next time
                partitions[queue_id].append(
                    PartitionRow(queues[queue_id], pid, name, created_at, Counts(*counts))
                )
        return [QueueRows(queue, tuple(partitions[qid])) for qid, queue in queues.items()]

    def queue_totals(self) -> list[QueueTotals]:
        """Return messages per status and the number of partitions of every queue."""
        rows = self.reads.rows("read_queue_totals")
        return [QueueTotals(row["name"], int(row["partitions"]), _counts(row)) for row in rows]

    def message_span(self, queue: str) -> dict[uuid.UUID, Span]:
        """Return when the oldest, newest and oldest pending message of each partition arrived."""
        rows = self.reads.rows("read_message_span", {"queue": queue})
        return {
            row["partition_id"]: Span(row["oldest"], row["newest"], row["oldest_pending"])
            for row in rows
        }

    def labels(self, label: str) -> list[LabelRow]:
        """Return aggregates per namespace (label 'namespace') or per task ('task')."""
        assert label in ("namespace", "task")
        rows = self.reads.rows("read_labels", {"label": label})
        return [
            LabelRow(row["label"], int(row["queues"]), int(row["partitions"]), _counts(row))
            for row in rows
        ]

    def overview(self) -> Overview:
        (row,) = self.reads.rows("read_overview")
        return Overview(
            int(row["queues"]),
            int(row["partitions"]),
            int(row["namespaces"]),
            int(row["tasks"]),
            _counts(row),
            row["at"],
        )

    def throughput(self, filters: Filters = EVERYTHING) -> list[Minute]:
        """Return the last 60 minutes of activity, newest first, zero-filled."""
        rows = self.reads.rows("read_throughput", {**filters.params(), "any": filters.any})
        return [
            Minute(
                row["minute"],
                row["incoming"],
                row["popped"],
                row["completed"],
                row["failed"],
                row["dead_letter"],
                row["lag_ms"],
            )
            for row in rows
        ]

    def lag(self, filters: Filters = EVERYTHING) -> list[LagRow]:
        """Return backlog and 24 h processing times per partition of the matching queues."""
        rows = self.reads.rows("read_lag", filters.params())
        return [
            LagRow(
                row["queue"],
                row["namespace"],
                row["task"],
                row["partition"],
                int(row["pending"]),
                int(row["processing"]),
                int(row["completed"]),
                int(row["lag_ms"]),
                tuple(row["lag_hist"]) if row["lag_hist"] is not None else None,
            )
            for row in rows
        ]
