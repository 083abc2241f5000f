"""The read and admin side against real PostgreSQL: the lag histograms, then derived
statuses, counts, pages and actions on data made with queen.store.lifecycle."""

from __future__ import annotations

import uuid
from collections import Counter
from collections.abc import Iterator
from typing import Any

import psycopg
import pytest

from queen.analytics import Counts
from queen.errors import Conflict, NotFound
from queen.store import Store, lifecycle
from queen.store.admin import MessageFilter
from queen.store.analytics import Filters
from queen.store.db import Database
from tests.integration.helpers import ack_all, conn, expire_leases_now, make_queue, push_n, scalar
from tests.unit.test_analytics_math import histogram

BUCKETS = """
    SELECT array_agg(n ORDER BY b) FROM (
        SELECT b, count(v) FILTER (WHERE queen.lag_bucket(v) = b)::integer AS n
        FROM generate_series(0, 63) b CROSS JOIN unnest(%s::double precision[]) v
        GROUP BY b) h
"""


def test_lag_histogram_counts_each_value_in_its_bucket(store):
    """queen.lag_bucket agrees with the bucket rule the quantiles are read with."""
    values = [0.2, 1.0, 1.41, 1.42, 2.0, 3.0, 1000.0, 1000.0, 86_400_000.0, 1e15]
    values += [1.07**i for i in range(300)]
    assert scalar(store.db.dsn, BUCKETS, (values,)) == histogram(values)


def test_lag_histograms_add_up_element_by_element(store):
    a, b = [1, 0, 2] + [0] * 61, [0, 3, 4] + [0] * 61
    total = scalar(store.db.dsn, "SELECT queen.hist_add(%s, %s)", (a, b))
    assert total == [1, 3, 6] + [0] * 61
    summed = scalar(
        store.db.dsn, "SELECT queen.hist_sum(h) FROM (VALUES (%s::integer[]), (%s)) v(h)", (a, b)
    )
    assert summed == total


__all__ = ["conn"]  # the fixture

Conn = psycopg.Connection[Any]


@pytest.fixture
def reads(db_dsn: str) -> Iterator[Store]:
    s = Store(Database(db_dsn, pool_size=4, timeout_s=5))
    s.db.pool.open(wait=True)
    yield s
    s.close()


def refresh(conn: Conn, step: int = 10_000) -> None:
    """One maintenance pass of the count rollup, until every partition is caught up."""
    for _ in range(100):
        behind = conn.execute("SELECT queen.count_refresh(1000, %s)", (step,)).fetchone()
        if behind and behind[0] == 0:
            return
    raise AssertionError("the rollup did not catch up")


def counts_of(store: Store, queue: str) -> dict[str, Counts]:
    (found,) = store.analytics.queues(Filters(queue=queue))
    return {p.name: p.counts for p in found.partitions}


def listed(store: Store, queue: str) -> Counter[str]:
    """Statuses of every message of queue as the message listing derives them."""
    return Counter(m.status for m in store.admin.page(MessageFilter(queue=queue), 1000, 0))


def as_counts(statuses: Counter[str]) -> Counts:
    return Counts(*(statuses[s] for s in ("pending", "processing", "completed", "failed",
                                          "dead_letter")))


def mixed(conn: Conn) -> None:
    """Queue q (no retries, DLQ): 10 messages; a lease of 4: 1 completed, 1 dead-lettered,
    2 still processing; 6 pending."""
    make_queue(conn, "q", retry_limit=0, dlq_after_max_retries=True, namespace="ns", task="t")
    push_n(conn, "q", 10)
    got = lifecycle.pop(conn, "q", partition="Default", batch=4, worker="w1")
    ack_all(conn, got[:1])
    ack_all(conn, got[1:2], status="failed")


def test_message_uuid_is_a_uuidv7_of_created_at_and_id(conn: Conn) -> None:
    rows = conn.execute(
        "SELECT queen.message_uuid(i, t), i, t FROM (VALUES"
        " (1::bigint, '2026-12-01 12:00:00.123+00'::timestamptz),"
        " (2, '2026-12-01 12:00:00.123+00'), (9223372036854775807, '2026-12-01 12:00:01+00')) v(i, t)"
    ).fetchall()
    ids = [r[0] for r in rows]
    assert len(set(ids)) == 3 and ids == sorted(ids)
    for value, _, created in rows:
        assert value.version == 7 and value.variant == uuid.RFC_4122
        assert value.int >> 80 == int(created.timestamp() * 1000)
    assert ids[0].int & ((1 << 60) - 1) == 1


def test_message_uuid_in_sql_is_the_one_python_makes_and_reads_back(conn: Conn) -> None:
    from queen.store.messages import message_id_of, message_uuid

    rows = conn.execute(
        "SELECT i, t, queen.message_uuid(i, t),"
        " queen.message_id_of(queen.message_uuid(i, t))"
        " FROM (SELECT (random() * 9223372036854775807)::bigint,"
        "              now() - random() * interval '3000 days' FROM generate_series(1, 500)"
        "       UNION ALL VALUES (1::bigint, '2026-12-01 12:00:00.123+00'::timestamptz),"
        "                        (4611686018427387904, '2026-12-01 12:00:00.999999+00'),"
        "                        (9223372036854775807, '1970-01-01 00:00:00+00')) v(i, t)"
    ).fetchall()
    for message_id, created, api_id, back in rows:
        assert api_id == message_uuid(message_id, created), (message_id, created)
        assert back == message_id == message_id_of(api_id)


def test_api_ids_made_by_the_server_are_the_ones_sql_makes(conn: Conn) -> None:
    """A pop answers bigint ids; the server's maker, which keeps the prefix of the last
    created_at, gives the text of queen.message_uuid, in runs of one created_at or not."""
    from queen.store.messages import api_ids

    rows = conn.execute(
        "SELECT i, t, queen.message_uuid(i, t)::text FROM ("
        " SELECT g * 7919::bigint, '2026-12-01 12:00:00.123456+00'::timestamptz"
        "        + (g / 4) * interval '997 microseconds' FROM generate_series(1, 200) g"
        " UNION ALL SELECT (random() * 9223372036854775807)::bigint,"
        "              now() - random() * interval '3000 days' FROM generate_series(1, 200)"
        " UNION ALL VALUES (281474976710655::bigint, '2026-12-01 12:00:00.999+00'::timestamptz),"
        "                  (281474976710656, '2026-12-01 12:00:00.999+00'),"
        "                  (0, '1970-01-01 00:00:00+00')) v(i, t)"
    ).fetchall()
    api_id = api_ids()
    assert [api_id(i, t) for i, t, _ in rows] == [text for _, _, text in rows]


def test_message_uuid_text_from_a_prefix_is_the_whole_uuid_as_text(conn: Conn) -> None:
    """What a push stores and answers (the prefix made once per call) is the API id."""
    rows = conn.execute(
        "SELECT i, queen.message_uuid(i, t)::text,"
        " queen.message_uuid_text(i, queen.uuid_prefix(t), t)"
        " FROM (SELECT (random() * 281474976710655)::bigint,"
        "              now() - random() * interval '3000 days' FROM generate_series(1, 500)"
        "       UNION ALL VALUES (0::bigint, now()), (1, '2026-12-01 12:00:00.123+00'::timestamptz),"
        "                        (281474976710655, now()), (281474976710656, now()),"
        "                        (4611686018427387904, now()), (9223372036854775807, now())) v(i, t)"
    ).fetchall()
    assert len(rows) == 506
    for message_id, whole, made in rows:
        assert made == whole, message_id


def test_counts_are_derived_from_cursor_lease_and_records(conn: Conn, reads: Store) -> None:
    mixed(conn)
    expected = Counts(pending=6, processing=2, completed=1, failed=0, dead_letter=1)
    assert counts_of(reads, "q") == {"Default": expected}  # nothing rolled up yet
    refresh(conn)
    assert counts_of(reads, "q") == {"Default": expected}
    assert as_counts(listed(reads, "q")) == expected
    lifecycle.push(conn, [{"queue": "q", "payload": {"n": 99}}])
    assert counts_of(reads, "q")["Default"].pending == 7  # past the watermark, still counted


def test_counts_follow_the_lease_end_and_stay_exact_across_refreshes(conn: Conn, reads: Store) -> None:
    make_queue(conn, "q", retry_limit=1)
    push_n(conn, "q", 30)
    push_n(conn, "q", 5, partition="p2")
    refresh(conn, step=7)  # bounded steps
    for _ in range(3):
        got = lifecycle.pop(conn, "q", partition="Default", batch=6)
        ack_all(conn, got[:5])
        ack_all(conn, got[5:], status="failed")  # one retry each
        refresh(conn, step=4)
    expire_leases_now(conn)
    got = lifecycle.pop(conn, "q", partition="Default", batch=3)  # the failed first, retried
    assert got and got[0].retry_count == 1
    counts = counts_of(reads, "q")
    assert counts["p2"] == Counts(pending=5)
    assert counts["Default"] == as_counts(listed_partition(reads, "q", "Default"))
    assert counts["Default"].total == 30
    refresh(conn, step=3)
    assert counts_of(reads, "q")["Default"] == counts["Default"]


def listed_partition(store: Store, queue: str, partition: str) -> Counter[str]:
    page = store.admin.page(MessageFilter(queue=queue, partition=partition), 1000, 0)
    return Counter(m.status for m in page)


def test_listing_by_status_pages_newest_first(conn: Conn, reads: Store) -> None:
    mixed(conn)
    push_n(conn, "q", 3, partition="other")
    everything = reads.admin.page(MessageFilter(queue="q"), 100, 0)
    assert len(everything) == 13
    ids = [m.id for m in everything]
    assert len(set(ids)) == 13 and all(i.version == 7 for i in ids)
    assert [m.transaction_id for m in everything[:3]] == [f"q-other-{i}" for i in (2, 1, 0)]
    for status, n in (("pending", 9), ("processing", 2), ("completed", 1), ("dead_letter", 1),
                      ("failed", 0)):
        page = reads.admin.page(MessageFilter(queue="q", status=status), 100, 0)
        assert [m.status for m in page] == [status] * n, status
    first = reads.admin.page(MessageFilter(queue="q", status="pending"), 4, 0)
    second = reads.admin.page(MessageFilter(queue="q", status="pending"), 4, 4)
    assert [m.transaction_id for m in first + second] == [
        m.transaction_id for m in reads.admin.page(MessageFilter(queue="q", status="pending"), 8, 0)]
    assert reads.admin.page(MessageFilter(namespace="ns", partition="other"), 10, 0)[0].partition == "other"
    assert reads.admin.page(MessageFilter(queue="nope"), 10, 0) == []
    assert len(reads.admin.page(MessageFilter(), 5, 0)) == 5  # any partition


def test_single_message_shows_its_state(conn: Conn, reads: Store) -> None:
    mixed(conn)
    done, dead, leased, waiting = (reads.admin.get(f"q-Default-{i}") for i in (0, 1, 2, 9))
    assert (done.status, done.completed_at is not None, done.error_message) == ("completed", True, None)
    assert (dead.status, dead.error_message, dead.failed_at is not None) == ("dead_letter", "boom", True)
    assert (leased.status, leased.worker_id) == ("processing", "w1")
    assert leased.lease_expires_at is not None and leased.locked_at is not None
    assert (waiting.status, waiting.retry_count, waiting.worker_id) == ("pending", 0, None)
    assert waiting.options is not None and waiting.options["retryLimit"] == 0
    assert waiting.payload == '{"n": 9}'
    with pytest.raises(NotFound):
        reads.admin.get("nope")


def test_related_messages_are_the_partitions_nearest(conn: Conn, reads: Store) -> None:
    mixed(conn)
    related = reads.admin.related("q-Default-5", 4)
    assert len(related) == 4 and "q-Default-5" not in {r.transaction_id for r in related}
    assert {r.status for r in related} <= {"pending", "processing", "completed", "dead_letter"}
    push_n(conn, "alone", 1)
    assert reads.admin.related("alone-Default-0", 10) == []
    with pytest.raises(NotFound):
        reads.admin.related("nope", 10)


def test_delete_keeps_cursor_and_lease_whole(conn: Conn, reads: Store) -> None:
    mixed(conn)
    refresh(conn)
    assert reads.admin.delete("q-Default-2") == "processing"
    assert reads.admin.delete("q-Default-0") == "completed"
    assert reads.admin.delete("q-Default-1") == "dead_letter"
    assert counts_of(reads, "q")["Default"] == Counts(pending=6, processing=1)
    # The lease had 4; 2 acked, 1 deleted: acking the last one ends it.
    last = lifecycle.ack(conn, [{"transactionId": "q-Default-3", "status": "completed"}])
    assert last[0].status == "completed"
    got = lifecycle.pop(conn, "q", partition="Default", batch=10)
    assert [d.transaction_id for d in got] == [f"q-Default-{i}" for i in range(4, 10)]
    assert counts_of(reads, "q")["Default"] == Counts(processing=6, completed=1)
    refresh(conn)
    assert counts_of(reads, "q")["Default"] == Counts(processing=6, completed=1)
    with pytest.raises(NotFound):
        reads.admin.delete("q-Default-2")


def test_retry_delivers_a_dead_letter_again_to_queue_mode_only(conn: Conn, reads: Store) -> None:
    make_queue(conn, "q", retry_limit=0, dlq_after_max_retries=True)
    push_n(conn, "q", 3)
    group = lifecycle.pop(conn, "q", partition="Default", batch=3, group="audit")
    ack_all(conn, group)  # a named group completed all three
    got = lifecycle.pop(conn, "q", partition="Default", batch=3)
    ack_all(conn, got[:1], status="failed")
    ack_all(conn, got[1:])
    refresh(conn)
    before = reads.admin.get("q-Default-0")
    assert before.status == "dead_letter"
    with pytest.raises(Conflict):
        reads.admin.retry("q-Default-1")  # completed
    reads.admin.retry("q-Default-0")
    after = reads.admin.get("q-Default-0")
    assert (after.status, after.retry_count, after.created_at) == ("pending", 0, before.created_at)
    assert counts_of(reads, "q")["Default"] == Counts(pending=1, completed=2)
    again = lifecycle.pop(conn, "q", partition="Default", batch=10)
    assert [d.transaction_id for d in again] == ["q-Default-0"]
    assert lifecycle.pop(conn, "q", partition="Default", batch=10, group="audit") == []
    ack_all(conn, again)
    assert counts_of(reads, "q")["Default"] == Counts(completed=3)
    with pytest.raises(NotFound):
        reads.admin.retry("nope")


def test_dead_letter_move_of_pending_and_failed(conn: Conn, reads: Store) -> None:
    make_queue(conn, "q", retry_limit=0, dlq_after_max_retries=False)
    push_n(conn, "q", 4)
    reads.admin.dead_letter("q-Default-0")  # never popped: pending
    got = lifecycle.pop(conn, "q", partition="Default", batch=1)
    assert [d.transaction_id for d in got] == ["q-Default-1"]  # the cursor moved past it
    ack_all(conn, got, status="failed")
    assert reads.admin.get("q-Default-1").status == "failed"
    refresh(conn)
    reads.admin.dead_letter("q-Default-1")
    assert counts_of(reads, "q")["Default"] == Counts(pending=2, dead_letter=2)
    with pytest.raises(Conflict):
        reads.admin.dead_letter("q-Default-1")
    assert reads.admin.get("q-Default-0").error_message == "moved to dead letter queue"


def test_clear_empties_a_partition_and_keeps_it_working(conn: Conn, reads: Store) -> None:
    mixed(conn)
    push_n(conn, "q", 2, partition="other")
    refresh(conn)
    assert reads.admin.clear("q", "Default") == 10
    counts = counts_of(reads, "q")
    assert counts == {"Default": Counts(), "other": Counts(pending=2)}
    push_n(conn, "q", 2, start=100)
    got = lifecycle.pop(conn, "q", partition="Default", batch=10)
    assert [d.transaction_id for d in got] == ["q-Default-100", "q-Default-101"]
    assert reads.admin.clear("q", None) == 4
    with pytest.raises(NotFound):
        reads.admin.clear("q", "nope")
    with pytest.raises(NotFound):
        reads.admin.clear("nope", None)


def test_deletes_by_retention_leave_the_counts(conn: Conn, reads: Store) -> None:
    mixed(conn)
    refresh(conn)
    lifecycle.ack(conn, [{"transactionId": f"q-Default-{i}", "status": "completed"} for i in (2, 3)])
    conn.execute("DELETE FROM queen.messages WHERE transaction_id IN"
                 " ('q-Default-0', 'q-Default-1', 'q-Default-9')")
    counts = counts_of(reads, "q")["Default"]
    assert counts == as_counts(listed(reads, "q"))
    assert counts.dead_letter == 0 and counts.total == 7
    refresh(conn)
    assert counts_of(reads, "q")["Default"] == counts


def test_throughput_lag_and_dashboard_from_the_rollup(conn: Conn, reads: Store) -> None:
    mixed(conn)
    def busy() -> list[Any]:
        return [m for m in reads.analytics.throughput(Filters(queue="q")) if m.incoming or m.popped]

    live = busy()  # nothing rolled up yet
    live_lag = reads.analytics.lag(Filters(queue="q"))
    refresh(conn)
    assert busy() == live
    assert reads.analytics.lag(Filters(queue="q")) == live_lag
    # (Summed over the minutes: the acks may fall in the minute after the pushes.)
    assert [m.incoming for m in live if m.incoming] == [10]
    assert sum(m.completed for m in live) == 1 and sum(m.dead_letter for m in live) == 1
    assert sum(m.popped for m in live) == 4  # 2 ended, 2 leased now
    assert all(m.incoming == 0 for m in reads.analytics.throughput(Filters(queue="other")))
    (lag,) = reads.analytics.lag(Filters(queue="q"))
    assert (lag.pending, lag.processing, lag.completed) == (6, 2, 1)
    assert lag.lag_hist is not None and sum(lag.lag_hist) == 1
    depths = {d.partition: d for d in reads.dashboard.depths() if d.queue == "q"}
    assert depths["Default"].pending == 6 and depths["Default"].dead_letter == 1
    assert reads.dashboard.locate(["q-Default-3", "nope"])["q-Default-3"].partition == "Default"
    totals = {t.name: t for t in reads.analytics.queue_totals()}
    assert totals["q"].counts.total == 10 and totals["q"].partitions == 1
    (label,) = reads.analytics.labels("namespace")
    assert (label.label, label.counts.completed) == ("ns", 1)
    overview = reads.analytics.overview()
    assert (overview.queues, overview.counts.pending) == (1, 6)
    span = reads.analytics.message_span("q")
    (only,) = span.values()
    assert only.oldest is not None and only.oldest <= only.newest  # type: ignore[operator]


def test_maintenance_brings_the_count_rollup_up_to_date(conn: Conn, db_dsn: str) -> None:
    from queen.config import Settings
    from workers.maintenance import Maintenance

    mixed(conn)
    m = Maintenance(Settings(database_url=db_dsn))
    m.session.connect()
    try:
        assert m._counts() is None  # caught up in one step
    finally:
        m.session.close()
    (row,) = conn.execute("SELECT total, below, dead_letter FROM queen.partition_counts").fetchall()
    assert row == (10, 2, 1)  # the cursor passed the completed and the dead-lettered one


def test_retry_keeps_its_place_even_under_a_live_lease(conn: Conn, reads: Store) -> None:
    make_queue(conn, "q", retry_limit=0, dlq_after_max_retries=True)
    push_n(conn, "q", 4)
    got = lifecycle.pop(conn, "q", partition="Default", batch=3)
    ack_all(conn, got[:1], status="failed")  # dead letter; the lease goes on
    refresh(conn)
    reads.admin.retry("q-Default-0")
    assert reads.admin.get("q-Default-0").status == "pending"
    assert counts_of(reads, "q")["Default"] == Counts(pending=2, processing=2)
    ack_all(conn, got[1:])  # the lease ends: the retried one comes first, then the rest
    again = lifecycle.pop(conn, "q", partition="Default", batch=10)
    assert [d.transaction_id for d in again] == ["q-Default-0", "q-Default-3"]
    ack_all(conn, again)
    refresh(conn)
    assert counts_of(reads, "q")["Default"] == Counts(completed=4)


def test_retry_far_back_writes_the_message_again_at_the_tail(conn: Conn, reads: Store) -> None:
    make_queue(conn, "q", retry_limit=0, dlq_after_max_retries=True)
    push_n(conn, "q", 3)
    ack_all(conn, lifecycle.pop(conn, "q", partition="Default", batch=3, group="audit"))
    got = lifecycle.pop(conn, "q", partition="Default", batch=3)
    ack_all(conn, got[:1], status="failed")
    ack_all(conn, got[1:])
    refresh(conn)
    before = reads.admin.get("q-Default-0")
    (status,) = conn.execute("SELECT queen.retry_message('q-Default-0', 1)").fetchone()
    assert status == "dead_letter"  # two done messages after it: more than 1
    after = reads.admin.get("q-Default-0")
    assert (after.status, after.created_at) == ("pending", before.created_at)
    assert after.id != before.id  # a new id: the tail of the partition
    push_n(conn, "q", 1, start=3)
    again = lifecycle.pop(conn, "q", partition="Default", batch=10)
    assert [d.transaction_id for d in again] == ["q-Default-0", "q-Default-3"]
    audit = lifecycle.pop(conn, "q", partition="Default", batch=10, group="audit")
    assert [d.transaction_id for d in audit] == ["q-Default-3"]  # it had it done already
    ack_all(conn, again)
    assert counts_of(reads, "q")["Default"] == Counts(completed=4)


def test_encrypted_payloads_are_shown_decrypted(conn: Conn, db_dsn: str) -> None:
    import orjson

    from queen import crypto

    key = "00112233445566778899aabbccddeeff00112233445566778899aabbccddeeff"
    envelope = crypto.encrypt(crypto.load_key(key), orjson.dumps({"card": "4242"}))
    lifecycle.push(conn, [{"queue": "secret", "payload": envelope, "encrypted": True,
                         "transactionId": "s1"}])
    store = Store(Database(db_dsn, pool_size=2, timeout_s=5), key)
    store.db.pool.open(wait=True)
    try:
        assert orjson.loads(store.admin.get("s1").payload) == {"card": "4242"}
        (listed_one,) = store.admin.page(MessageFilter(queue="secret"), 10, 0)
        assert orjson.loads(listed_one.payload) == {"card": "4242"}
    finally:
        store.close()


def test_deletes_racing_with_refreshes_leave_exact_counts(conn: Conn, db_dsn: str,
                                                          reads: Store) -> None:
    import threading

    make_queue(conn, "q", retry_limit=0, dlq_after_max_retries=True)
    push_n(conn, "q", 400)
    got = lifecycle.pop(conn, "q", partition="Default", batch=200)
    ack_all(conn, got[:150])
    ack_all(conn, got[150:], status="failed")
    stop = threading.Event()

    def refresher() -> None:
        with psycopg.connect(db_dsn, autocommit=True) as own:
            while not stop.is_set():
                own.execute("SELECT queen.count_refresh(10, 7)")

    thread = threading.Thread(target=refresher)
    thread.start()
    try:
        for i in range(0, 400, 3):  # completed, dead-lettered and pending ones
            conn.execute("DELETE FROM queen.messages WHERE transaction_id = %s",
                         (f"q-Default-{i}",))
        push_n(conn, "q", 50, start=1000)
    finally:
        stop.set()
        thread.join()
    counts = counts_of(reads, "q")["Default"]
    assert counts == as_counts(listed(reads, "q"))
    assert counts.total == 400 - len(range(0, 400, 3)) + 50
    refresh(conn)
    assert counts_of(reads, "q")["Default"] == counts


def test_a_retried_message_failing_again_before_a_refresh_is_counted(conn: Conn,
                                                                     reads: Store) -> None:
    make_queue(conn, "q", retry_limit=0, dlq_after_max_retries=True)
    push_n(conn, "q", 5)
    got = lifecycle.pop(conn, "q", partition="Default", batch=5)
    ack_all(conn, got[:2], status="failed")
    ack_all(conn, got[2:])
    refresh(conn)  # the watermark passed both dead letters
    reads.admin.retry("q-Default-1")
    again = lifecycle.pop(conn, "q", partition="Default", batch=5)
    assert [d.transaction_id for d in again] == ["q-Default-1"]
    ack_all(conn, again, status="failed")  # dead again: the cursor is back where it was
    expected = Counts(completed=3, dead_letter=2)
    assert counts_of(reads, "q")["Default"] == expected
    refresh(conn)
    assert counts_of(reads, "q")["Default"] == expected == as_counts(listed(reads, "q"))


def test_a_leased_message_deleted_by_retention_leaves_exact_counts(conn: Conn, reads: Store) -> None:
    mixed(conn)
    conn.execute("DELETE FROM queen.messages WHERE transaction_id = 'q-Default-2'")
    counts = counts_of(reads, "q")["Default"]
    assert counts == Counts(pending=6, processing=1, completed=1, dead_letter=1)
    assert counts == as_counts(listed(reads, "q"))


def test_a_seek_of_queue_mode_back_and_forward_between_refreshes_keeps_exact_counts(
    conn: Conn, reads: Store
) -> None:
    make_queue(conn, "q", retry_limit=0, dlq_after_max_retries=True)
    push_n(conn, "q", 4)
    ack_all(conn, lifecycle.pop(conn, "q", partition="Default", batch=4))
    refresh(conn)
    assert counts_of(reads, "q")["Default"] == Counts(completed=4)
    lifecycle.seek(conn, "q", lifecycle.QUEUE_MODE, "beginning")
    again = lifecycle.pop(conn, "q", partition="Default", batch=4)
    assert len(again) == 4  # delivered again from the start
    ack_all(conn, again, status="failed")  # dead letters now, the cursor where it was
    refresh(conn)
    counts = counts_of(reads, "q")["Default"]
    assert counts == as_counts(listed_partition(reads, "q", "Default"))
    assert counts.dead_letter == 4


def test_a_refresh_passes_over_partitions_with_nothing_new(conn: Conn, reads: Store) -> None:
    """Idle partitions cost no write: their count rows stay as they are until a message
    arrives or queue mode's cursor moves."""
    make_queue(conn, "q")
    push_n(conn, "q", 3, partition="busy")
    push_n(conn, "q", 3, partition="idle")
    refresh(conn)

    def versions() -> dict[str, str]:
        rows = conn.execute(
            "SELECT p.name, k.xmin::text FROM queen.partition_counts k"
            " JOIN queen.partitions p ON p.id = k.partition_id").fetchall()
        return dict(rows)

    before = versions()
    refresh(conn)
    assert versions() == before  # nothing new anywhere: nothing rewritten
    push_n(conn, "q", 2, partition="busy", start=3)
    refresh(conn)
    after = versions()
    assert after["idle"] == before["idle"] and after["busy"] != before["busy"]
    ack_all(conn, lifecycle.pop(conn, "q", partition="idle", batch=2))
    refresh(conn)
    assert versions()["idle"] != after["idle"]  # the cursor moved: counted again
    assert counts_of(reads, "q")["idle"] == Counts(pending=1, completed=2)
