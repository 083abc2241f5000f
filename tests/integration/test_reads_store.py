"""The read side against real PostgreSQL: listing strategies agree, the 24 h lag window."""

from __future__ import annotations

import itertools

import pytest

from queen.store import Store
from queen.store.admin import MessageFilter, choose_listing
from queen.store.analytics import Filters
from tests import storage
from tests.integration.helpers import ack, pop, push, rows, scalar
from tests.unit.test_analytics_math import histogram

LISTING_COLUMNS = "transaction_id"


def seed_mixed(store: Store) -> None:
    """Three partitions of two queues, every status present, several pushes each."""
    store.queues.configure("mixed", "ns", "t", {"retry_limit": 0, "dlq_after_max_retries": False})
    for round_ in range(3):
        for partition in ("a", "b"):
            push(store, [{"queue": "mixed", "partition": partition, "payload": {"r": round_, "i": i}}
                         for i in range(4)])
        push(store, [{"queue": "other", "partition": "c", "payload": round_}])
    for partition in ("a", "b"):
        popped = pop(store, "mixed", partition, batch=3)
        ack(store, popped[0].transaction_id, "completed")
        ack(store, popped[1].transaction_id, "failed", "no")
        # popped[2] stays processing
    first_pending = store.admin.page(MessageFilter(queue="mixed", status="pending"), 1, 0)[0]
    store.admin.dead_letter(first_pending.transaction_id)


def page(store: Store, query: str, partitions: list, status: str | None, limit: int, offset: int):
    params = {"any": False, "partitions": partitions, "partition": partitions[0],
              "status": status, "limit": limit, "offset": offset, "wanted": limit + offset}
    with store.reads.session() as session:
        return [r["transaction_id"] for r in session.rows(query, params, raw_json=True)]


def test_listing_strategies_return_the_same_pages(store):
    seed_mixed(store)
    ids = [r[0] for r in rows(store.db.dsn, "SELECT p.id FROM queen.partitions p JOIN queen.queues"
                                            " q ON q.id = p.queue_id WHERE q.name = 'mixed'"
                                            " ORDER BY p.name")]
    for status, (limit, offset) in itertools.product(
        (None, "pending", "processing", "completed", "failed", "dead_letter"),
        ((100, 0), (3, 0), (3, 3), (5, 7)),
    ):
        walked = page(store, "read_messages", ids, status, limit, offset)
        gathered = page(store, "read_messages_gathered", ids, status, limit, offset)
        merged = page(store, "read_messages_merged", ids, status, limit, offset)
        assert walked == gathered == merged, (status, limit, offset)
        one = page(store, "read_messages_of_partition", ids[:1], status, limit, offset)
        assert one == page(store, "read_messages_gathered", ids[:1], status, limit, offset)

    everything = store.admin.page(MessageFilter(queue="mixed"), 1000, 0)
    assert len(everything) == 24
    keys = [(m.created_at, m.transaction_id) for m in everything]
    assert keys == sorted(keys, key=lambda k: k[0], reverse=True)
    by_status = {s: len(store.admin.page(MessageFilter(queue="mixed", status=s), 100, 0))
                 for s in ("pending", "processing", "completed", "failed", "dead_letter")}
    # per partition: 12 pushed, 1 completed, 1 failed, 1 processing; then 1 dead-lettered
    assert by_status == {"pending": 17, "processing": 2, "completed": 2, "failed": 2,
                         "dead_letter": 1}
    assert store.admin.page(MessageFilter(namespace="ns", partition="b"), 100, 0)[0].partition == "b"
    assert store.admin.page(MessageFilter(queue="nope"), 10, 0) == []


@pytest.mark.parametrize(
    ("partitions", "matching", "held", "walked", "wanted", "expected"),
    [
        (1, 10, 10, 10_000_000, 100, "read_messages_of_partition"),
        # a queue of 50 partitions and 500k messages in 10M: each partition's newest 101
        (50, 500_000, 500_000, 10_000_000, 101, "read_messages_merged"),
        # half the table over 500 partitions: walking the global index finds 101 soon
        (500, 5_000_000, 5_000_000, 10_000_000, 101, "read_messages"),
        (3, 40, 40, 10_000_000, 101, "read_messages_gathered"),  # a small queue
        (50, 20_000, 500_000, 10_000_000, 101, "read_messages_gathered"),  # a rare status...
        (1000, 9_000_000, 10_000_000, 10_000_000, 101, "read_messages"),  # nearly everything
    ],
)
def test_choose_listing(partitions, matching, held, walked, wanted, expected):
    assert choose_listing(partitions, matching, held, walked, wanted) == expected


def test_choose_listing_walks_the_small_index_of_failures():
    # ...dead letters of one queue among 1M failures: the failures' own index is walked.
    assert choose_listing(50, 20_000, 500_000, 1_000_000, 101, rare=True) == "read_messages"


def completed_in_window(store: Store, queue: str) -> int:
    return sum(r.completed for r in store.analytics.lag(Filters(queue=queue)))


@pytest.mark.skipif(storage.CURSORS, reason="the rows store's folds and lag window; the cursor"
                    " store's lag: test_cursor_reads.test_throughput_lag_and_dashboard_from_the_rollup")
def test_lag_window_follows_folds_and_forgets_old_hours(store):
    push(store, [{"queue": "lag", "payload": i} for i in range(6)])
    for m in pop(store, "lag", batch=6):
        ack(store, m.transaction_id)
    assert completed_in_window(store, "lag") == 6  # unfolded deltas count too
    assert scalar(store.db.dsn, "SELECT queen.fold_deltas()") > 0
    assert scalar(store.db.dsn, "SELECT completed FROM queen.lag_window WHERE queue = 'lag'") == 6
    assert completed_in_window(store, "lag") == 6  # now from the window, not twice

    push(store, [{"queue": "lag", "payload": 9}])
    (m,) = pop(store, "lag")
    ack(store, m.transaction_id)
    scalar(store.db.dsn, "SELECT queen.fold_deltas()")  # same minute: an UPDATE of metrics_minute
    assert scalar(store.db.dsn, "SELECT completed FROM queen.lag_window WHERE queue = 'lag'") == 7
    hist_total = scalar(store.db.dsn, "SELECT sum(x) FROM queen.lag_window, unnest(lag_hist) x"
                                      " WHERE queue = 'lag'")
    assert hist_total == 7

    # Age the hour past the window: expiry subtracts it and drops the row.
    scalar(store.db.dsn, "UPDATE queen.lag_hour SET hour = hour - interval '30 hours' RETURNING 1")
    assert scalar(store.db.dsn, "SELECT queen.expire_lag_window()") == 1
    assert scalar(store.db.dsn, "SELECT count(*) FROM queen.lag_window") == 0
    assert scalar(store.db.dsn, "SELECT count(*) FROM queen.lag_hour") == 0
    assert completed_in_window(store, "lag") == 0


def test_lag_histogram_counts_each_value_in_its_bucket(store):
    """queen.lag_histogram agrees with the bucket rule the quantiles are read with."""
    values = [0.2, 1.0, 1.41, 1.42, 2.0, 3.0, 1000.0, 1000.0, 86_400_000.0, 1e15]
    values += [1.07**i for i in range(300)]
    got = scalar(store.db.dsn, "SELECT queen.lag_histogram(%s::double precision[])", (values,))
    assert got == histogram(values)
    # A lag it could not compute (NULL) counts as the first bucket, as lag_bucket says.
    nulls = scalar(store.db.dsn, "SELECT queen.lag_histogram(ARRAY[NULL, 5]::float8[])")
    assert nulls == histogram([0.0, 5.0])
    assert scalar(store.db.dsn, "SELECT queen.lag_histogram(NULL)") == [0] * 64


def test_late_folds_of_an_old_hour_do_not_stick(store):
    scalar(store.db.dsn, """
        INSERT INTO queen.metrics_minute (minute, queue, partition, completed, lag_ms, lag_hist)
        VALUES (date_trunc('minute', now()) - interval '2 hours', 'q', 'p', 10, 1000,
                array_fill(0, ARRAY[20]) || 10 || array_fill(0, ARRAY[43])),
               (date_trunc('minute', now()) - interval '30 hours', 'q', 'p', 5, 500,
                array_fill(0, ARRAY[20]) || 5 || array_fill(0, ARRAY[43]))
        RETURNING 1""")
    assert rows(store.db.dsn, "SELECT completed, lag_ms FROM queen.lag_window") == [(10, 1000)]
    assert scalar(store.db.dsn, "SELECT count(*) FROM queen.lag_hour") == 1
