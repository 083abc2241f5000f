"""Records and arithmetic of the read endpoints: counts, time series, processing-time lag.

No SQL and no HTTP: the store builds these records from rows, the API shapes them.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import math
import uuid
from collections.abc import Iterable, Sequence
from typing import Any

STATUSES = ("pending", "processing", "completed", "failed", "dead_letter")
LAG_BUCKETS = 64  # histogram bucket b holds [2^(b/2), 2^((b+1)/2)) milliseconds
MIN_LAG_SAMPLES = 5  # queue-lag lists queues with at least this many completions in 24 h


@dataclasses.dataclass(frozen=True, slots=True)
class Counts:
    """Messages per status (of a partition, a queue or anything summed from them)."""

    pending: int = 0
    processing: int = 0
    completed: int = 0
    failed: int = 0
    dead_letter: int = 0

    @property
    def total(self) -> int:
        return self.pending + self.processing + self.completed + self.failed + self.dead_letter

    def __add__(self, other: Counts) -> Counts:
        return Counts(*(getattr(self, s) + getattr(other, s) for s in STATUSES))

    def as_json(self) -> dict[str, int]:
        return {
            "pending": self.pending,
            "processing": self.processing,
            "completed": self.completed,
            "failed": self.failed,
            "deadLetter": self.dead_letter,
            "total": self.total,
        }


def total_counts(counts: Iterable[Counts]) -> Counts:
    return sum(counts, Counts())


@dataclasses.dataclass(frozen=True, slots=True)
class PartitionRow:
    """A partition with its queue and current counts; partition fields are None for a
    queue that has no partition yet."""

    queue_id: uuid.UUID
    queue: str
    namespace: str | None
    task: str | None
    queue_created_at: dt.datetime
    options: dict[str, Any]
    partition_id: uuid.UUID | None
    partition: str | None
    partition_created_at: dt.datetime | None
    counts: Counts


@dataclasses.dataclass(frozen=True, slots=True)
class QueueRows:
    """One queue and the rows of its partitions, in name order."""

    first: PartitionRow
    partitions: tuple[PartitionRow, ...]

    @property
    def totals(self) -> Counts:
        return total_counts(p.counts for p in self.partitions)


def group_by_queue(rows: Iterable[PartitionRow]) -> list[QueueRows]:
    """Group rows ordered by queue name into queues (partition-less queues keep no rows)."""
    grouped: dict[str, list[PartitionRow]] = {}
    firsts: dict[str, PartitionRow] = {}
    for row in rows:
        firsts.setdefault(row.queue, row)
        bucket = grouped.setdefault(row.queue, [])
        if row.partition is not None:
            bucket.append(row)
    return [QueueRows(firsts[name], tuple(parts)) for name, parts in grouped.items()]


@dataclasses.dataclass(frozen=True, slots=True)
class Minute:
    """Activity of one minute: messages in, popped, completed, failed, dead-lettered."""

    minute: dt.datetime
    incoming: int
    popped: int
    completed: int
    failed: int
    dead_letter: int
    lag_ms: int  # sum of created -> completed over the completed ones


@dataclasses.dataclass(frozen=True, slots=True)
class LagRow:
    """A partition's backlog and its processing times over the last 24 h."""

    queue: str
    namespace: str | None
    task: str | None
    partition: str
    pending: int
    processing: int
    completed: int
    lag_ms: int
    lag_hist: tuple[int, ...] | None


def add_histograms(histograms: Iterable[Sequence[int] | None]) -> list[int]:
    total = [0] * LAG_BUCKETS
    for hist in histograms:
        for i, n in enumerate(hist or ()):
            total[i] += n
    return total


def histogram_quantile(hist: Sequence[int] | None, q: float) -> float:
    """Return the q-quantile (0..1) of a lag histogram in seconds (0 when it is empty).

    Interpolates geometrically inside the bucket that holds the quantile, so the error
    stays well under the bucket width (a factor of sqrt(2)).
    """
    if not hist:
        return 0.0
    count = sum(hist)
    if count <= 0:
        return 0.0
    rank = q * count
    seen = 0
    for bucket, n in enumerate(hist):
        if n <= 0:
            continue
        if seen + n >= rank:
            low, high = 2 ** (bucket / 2), 2 ** ((bucket + 1) / 2)
            fraction = min(1.0, max(0.0, (rank - seen) / n))
            return low * (high / low) ** fraction / 1000
        seen += n
    return 2 ** (LAG_BUCKETS / 2) / 1000


@dataclasses.dataclass(frozen=True, slots=True)
class ProcessingTimes:
    """How long messages took from push to completion (seconds)."""

    completed: int
    avg_s: float
    median_s: float
    p95_s: float

    @classmethod
    def of(cls, completed: int, lag_ms: int, hist: Sequence[int] | None) -> ProcessingTimes:
        if completed <= 0:
            return cls(0, 0.0, 0.0, 0.0)
        return cls(
            completed,
            lag_ms / completed / 1000,
            histogram_quantile(hist, 0.5),
            histogram_quantile(hist, 0.95),
        )


def lag_json(pending: int, processing: int, times: ProcessingTimes) -> dict[str, Any]:
    """Shape backlog and processing times as API.md 5.5 (lag = backlog x time)."""
    backlog = pending + processing
    estimated = backlog * times.avg_s
    median = backlog * times.median_s
    p95 = backlog * times.p95_s
    return {
        "pendingCount": pending,
        "processingCount": processing,
        "totalBacklog": backlog,
        "completedMessages": times.completed,
        "avgProcessingTimeSeconds": _round(times.avg_s),
        "medianProcessingTimeSeconds": _round(times.median_s),
        "p95ProcessingTimeSeconds": _round(times.p95_s),
        "estimatedLagSeconds": _round(estimated),
        "medianLagSeconds": _round(median),
        "p95LagSeconds": _round(p95),
        "estimatedLag": format_duration(estimated),
        "medianLag": format_duration(median),
        "p95Lag": format_duration(p95),
        "avgProcessingTime": format_duration(times.avg_s),
        "medianProcessingTime": format_duration(times.median_s),
        "p95ProcessingTime": format_duration(times.p95_s),
    }


def _round(seconds: float) -> float:
    return round(seconds, 3)


def format_duration(seconds: float) -> str:
    """Render seconds for people: 2.5s, 7m 17s, 3h 5m, 2d 4h."""
    if not math.isfinite(seconds) or seconds <= 0:
        return "0s"
    if seconds < 60:
        return f"{seconds:.1f}s"
    whole = int(seconds)
    if whole < 3600:
        return f"{whole // 60}m {whole % 60}s"
    if whole < 86400:
        return f"{whole // 3600}h {whole % 3600 // 60}m"
    return f"{whole // 86400}d {whole % 86400 // 3600}h"


def per_second(per_minute: int) -> float:
    return round(per_minute / 60, 2)
