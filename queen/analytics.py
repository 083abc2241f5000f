"""Records and arithmetic of the read endpoints: counts, time series, processing-time lag.

No SQL and no HTTP: the store builds these records from rows, the API shapes them.
"""

from __future__ import annotations

import bisect
import dataclasses
import datetime as dt
import itertools
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
        return Counts(
            self.pending + other.pending,
            self.processing + other.processing,
            self.completed + other.completed,
            self.failed + other.failed,
            self.dead_letter + other.dead_letter,
        )

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
class QueueInfo:
    """A queue: its identity, labels and options (API names)."""

    id: uuid.UUID
    name: str
    namespace: str | None
    task: str | None
    created_at: dt.datetime
    options: dict[str, Any]


@dataclasses.dataclass(frozen=True, slots=True)
class PartitionRow:
    """A partition with its queue and current counts."""

    queue: QueueInfo
    id: uuid.UUID
    name: str
    created_at: dt.datetime
    counts: Counts


@dataclasses.dataclass(frozen=True, slots=True)
class QueueRows:
    """One queue and its partitions, in name order (none for a queue not pushed to yet)."""

    queue: QueueInfo
    partitions: tuple[PartitionRow, ...]

    @property
    def totals(self) -> Counts:
        return total_counts(p.counts for p in self.partitions)


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
    present = [h for h in histograms if h]
    if not present:
        return [0] * LAG_BUCKETS
    return [sum(column) for column in zip(*present, strict=False)]


def histogram_quantiles(hist: Sequence[int] | None, *qs: float) -> list[float]:
    """Return the qs-quantiles (0..1) of a lag histogram in seconds (0 when it is empty).

    Interpolates geometrically inside the bucket that holds each quantile, so the error
    stays well under the bucket width (a factor of sqrt(2)).
    """
    if not hist:
        return [0.0] * len(qs)
    cumulative = list(itertools.accumulate(hist))
    count = cumulative[-1]
    if count <= 0:
        return [0.0] * len(qs)
    found = []
    for q in qs:
        rank = max(q * count, 1e-9)
        bucket = min(bisect.bisect_left(cumulative, rank), len(cumulative) - 1)
        before = cumulative[bucket - 1] if bucket else 0
        fraction = min(1.0, max(0.0, (rank - before) / (hist[bucket] or 1)))
        found.append(2 ** ((bucket + fraction) / 2) / 1000)
    return found


def histogram_quantile(hist: Sequence[int] | None, q: float) -> float:
    return histogram_quantiles(hist, q)[0]


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
        median, p95 = histogram_quantiles(hist, 0.5, 0.95)
        return cls(completed, lag_ms / completed / 1000, median, p95)


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
