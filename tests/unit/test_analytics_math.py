"""Counts, lag histograms and duration formatting (no database)."""

from __future__ import annotations

import datetime as dt
import math
import uuid

import pytest

from queen.analytics import (
    LAG_BUCKETS,
    Counts,
    PartitionRow,
    ProcessingTimes,
    QueueInfo,
    QueueRows,
    format_duration,
    histogram_quantile,
    lag_json,
    per_second,
)


def bucket_of(ms: float) -> int:
    """The same rule as queen.lag_bucket()."""
    return min(63, max(0, math.floor(2 * math.log2(max(ms, 1)))))


def histogram(samples_ms: list[float]) -> list[int]:
    hist = [0] * LAG_BUCKETS
    for ms in samples_ms:
        hist[bucket_of(ms)] += 1
    return hist


def test_counts_add_and_total():
    a = Counts(1, 2, 3, 4, 5)
    b = Counts(pending=10, dead_letter=1)
    assert (a + b).as_json() == {
        "pending": 11, "processing": 2, "completed": 3, "failed": 4, "deadLetter": 6, "total": 26,
    }


@pytest.mark.parametrize("q", [0.5, 0.95, 0.99])
def test_quantile_is_within_a_bucket_of_the_exact_value(q):
    samples = [10 * 1.07**i for i in range(100)]  # 10 ms .. ~8.7 s, spread over many buckets
    exact = sorted(samples)[math.ceil(q * len(samples)) - 1] / 1000
    estimate = histogram_quantile(histogram(samples), q)
    assert exact / math.sqrt(2) <= estimate <= exact * math.sqrt(2)


def test_quantile_of_nothing_is_zero():
    assert histogram_quantile(None, 0.5) == 0.0
    assert histogram_quantile([0] * LAG_BUCKETS, 0.95) == 0.0


def test_processing_times_average_is_exact():
    times = ProcessingTimes.of(4, 10_000, histogram([1000, 2000, 3000, 4000]))
    assert times.avg_s == 2.5
    assert 1.4 <= times.median_s <= 2.9
    assert 2.8 <= times.p95_s <= 5.7


def test_lag_is_backlog_times_processing_time():
    times = ProcessingTimes(completed=1250, avg_s=2.5, median_s=2.1, p95_s=4.8)
    doc = lag_json(150, 25, times)
    assert doc["totalBacklog"] == 175
    assert doc["estimatedLagSeconds"] == 437.5
    assert doc["medianLagSeconds"] == 367.5
    assert doc["p95LagSeconds"] == 840.0
    assert doc["estimatedLag"] == "7m 17s"
    assert doc["medianLag"] == "6m 7s"
    assert doc["p95Lag"] == "14m 0s"
    assert doc["avgProcessingTime"] == "2.5s"
    assert doc["completedMessages"] == 1250


@pytest.mark.parametrize(
    ("seconds", "text"),
    [(0, "0s"), (-1, "0s"), (2.5, "2.5s"), (59.94, "59.9s"), (60, "1m 0s"), (437.5, "7m 17s"),
     (3600, "1h 0m"), (3 * 3600 + 5 * 60 + 9, "3h 5m"), (2 * 86400 + 4 * 3600, "2d 4h"),
     (float("inf"), "0s")],
)
def test_format_duration(seconds, text):
    assert format_duration(seconds) == text


def test_per_second():
    assert per_second(120) == 2
    assert per_second(115) == 1.92


def test_queue_totals_sum_its_partitions():
    now = dt.datetime.now(dt.UTC)
    queue = QueueInfo(uuid.uuid4(), "a", None, None, now, {})
    parts = tuple(
        PartitionRow(queue, uuid.uuid4(), name, now, Counts(pending=n, failed=1))
        for name, n in (("p1", 1), ("p2", 2))
    )
    assert QueueRows(queue, parts).totals == Counts(pending=3, failed=2)
    assert QueueRows(queue, ()).totals == Counts()
