"""The read side's SQL against real PostgreSQL: the lag histograms."""

from __future__ import annotations

from tests.integration.helpers import scalar
from tests.unit.test_analytics_math import histogram

BUCKETS = """
    SELECT array_agg(n ORDER BY b) FROM (
        SELECT b, count(v) FILTER (WHERE queen.cursor_lag_bucket(v) = b)::integer AS n
        FROM generate_series(0, 63) b CROSS JOIN unnest(%s::double precision[]) v
        GROUP BY b) h
"""


def test_lag_histogram_counts_each_value_in_its_bucket(store):
    """queen.cursor_lag_bucket agrees with the bucket rule the quantiles are read with."""
    values = [0.2, 1.0, 1.41, 1.42, 2.0, 3.0, 1000.0, 1000.0, 86_400_000.0, 1e15]
    values += [1.07**i for i in range(300)]
    assert scalar(store.db.dsn, BUCKETS, (values,)) == histogram(values)


def test_lag_histograms_add_up_element_by_element(store):
    a, b = [1, 0, 2] + [0] * 61, [0, 3, 4] + [0] * 61
    total = scalar(store.db.dsn, "SELECT queen.cursor_hist_add(%s, %s)", (a, b))
    assert total == [1, 3, 6] + [0] * 61
    summed = scalar(
        store.db.dsn, "SELECT queen.hist_sum(h) FROM (VALUES (%s::integer[]), (%s)) v(h)", (a, b)
    )
    assert summed == total
