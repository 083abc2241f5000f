"""The maintenance statements against a real database, with time moved by editing rows."""

from __future__ import annotations

import contextlib
import datetime as dt
import threading
import time
from collections.abc import Iterator

import psycopg
import pytest

from queen.store import Store
from queen.store.maintenance import MaintenanceSession
from tests import storage
from tests.integration.helpers import ack, pop, push, rows, scalar

ROWS_ONLY = pytest.mark.skipif(
    storage.CURSORS,
    reason="the rows store's maintenance statements (queen.messages);"
    " the cursor store's: test_cursor_maintenance.py",
)

MINUTE = dt.timedelta(minutes=1)


@pytest.fixture
def session(db_dsn: str) -> Iterator[MaintenanceSession]:
    s = MaintenanceSession(db_dsn, application_name="maint-test")
    s.connect()
    yield s
    s.close()


@contextlib.contextmanager
def listening(dsn: str) -> Iterator[psycopg.Connection]:
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("LISTEN queen")
        yield conn


def payloads(conn: psycopg.Connection, timeout: float = 0.3) -> set[str]:
    return {n.payload for n in conn.notifies(timeout=timeout)}


def execute(dsn: str, query: str, params: tuple = ()) -> None:
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(query, params)  # type: ignore[arg-type]


def age(dsn: str, seconds: float, where: str = "true") -> None:
    """Make messages older (as if pushed `seconds` earlier)."""
    execute(
        dsn,
        f"UPDATE queen.messages SET created_at = created_at - make_interval(secs => %s),"
        f" completed_at = completed_at - make_interval(secs => %s) WHERE {where}",
        (seconds, seconds),
    )


def expire_leases_now(dsn: str) -> None:
    execute(
        dsn,
        "UPDATE queen.partitions SET lease_expires_at = now() - interval '1 ms'"
        " WHERE lease_id IS NOT NULL",
    )


def statuses(dsn: str) -> dict[str, tuple[str, int]]:
    found = rows(dsn, "SELECT transaction_id, status, retry_count FROM queen.messages")
    return {txid: (status, retry) for txid, status, retry in found}


def counts_agree(dsn: str) -> bool:
    """Tell whether partition_stats equals the rows, for every partition."""
    diff = rows(
        dsn,
        """
        SELECT s.partition_id FROM queen.partition_stats s
        LEFT JOIN (SELECT partition_id,
                          count(*) FILTER (WHERE status = 'pending') AS pending,
                          count(*) FILTER (WHERE status = 'processing') AS processing,
                          count(*) FILTER (WHERE status = 'completed') AS completed,
                          count(*) FILTER (WHERE status = 'failed') AS failed,
                          count(*) FILTER (WHERE status = 'dead_letter') AS dead_letter
                   FROM queen.messages GROUP BY 1) m USING (partition_id)
        WHERE (s.pending, s.processing, s.completed, s.failed, s.dead_letter)
              IS DISTINCT FROM (coalesce(m.pending, 0), coalesce(m.processing, 0),
                                coalesce(m.completed, 0), coalesce(m.failed, 0),
                                coalesce(m.dead_letter, 0))
        """,
    )
    return not diff


# -- leases ---------------------------------------------------------------------------


@ROWS_ONLY
def test_expired_lease_returns_messages_with_one_more_retry(store: Store, session) -> None:
    dsn = store.db.dsn
    push(store, [{"queue": "q", "payload": n, "transactionId": f"m{n}"} for n in range(3)])
    assert len(pop(store, "q", batch=2)) == 2
    assert session.expire_leases(100).leases == 0  # not expired yet
    expire_leases_now(dsn)
    with listening(dsn) as listener:
        result = session.expire_leases(100)
        assert (result.leases, result.messages, result.next_expiry_in) == (1, 2, None)
        assert "q/Default//" in payloads(listener)
    assert statuses(dsn) == {"m0": ("pending", 1), "m1": ("pending", 1), "m2": ("pending", 0)}
    assert scalar(dsn, "SELECT count(*) FROM queen.partitions WHERE lease_id IS NOT NULL") == 0
    assert [m.transaction_id for m in pop(store, "q", batch=3)] == ["m0", "m1", "m2"]


@ROWS_ONLY
@pytest.mark.parametrize(("dlq", "final"), [(True, "dead_letter"), (False, "failed")])
def test_expiry_past_the_retry_limit(store: Store, session, dlq: bool, final: str) -> None:
    dsn = store.db.dsn
    store.queues.configure("q", None, None, {"retry_limit": 1, "dlq_after_max_retries": dlq})
    push(store, [{"queue": "q", "payload": n, "transactionId": f"m{n}"} for n in range(2)])
    for retry in (0, 1):
        (m,) = pop(store, "q")
        assert (m.transaction_id, m.retry_count) == ("m0", retry)
        expire_leases_now(dsn)
        with listening(dsn) as listener:
            assert session.expire_leases(100).messages == 1
            # m1 still waits in the freed partition: its polls are woken either way.
            assert "q/Default//" in payloads(listener)
    assert statuses(dsn)["m0"] == (final, 1)
    assert scalar(dsn, "SELECT error_message FROM queen.messages WHERE transaction_id = 'm0'") == (
        "lease expired"
    )
    (m,) = pop(store, "q")
    assert m.transaction_id == "m1"


@ROWS_ONLY
def test_next_expiry_and_renewed_leases(store: Store, session) -> None:
    store.queues.configure("q", None, None, {"lease_time": 30})
    push(store, [{"queue": "q", "payload": 1}])
    pop(store, "q")
    result = session.expire_leases(100)
    assert result.leases == 0
    assert 28 < result.next_expiry_in <= 30


@ROWS_ONLY
def test_lease_batches_are_bounded(store: Store, session) -> None:
    push(store, [{"queue": "q", "partition": f"p{n}", "payload": n} for n in range(5)])
    for _ in range(5):
        assert pop(store, "q")
    expire_leases_now(store.db.dsn)
    assert session.expire_leases(3).leases == 3
    assert session.expire_leases(3).leases == 2
    assert session.expire_leases(3).leases == 0


# -- delayed and windowed -------------------------------------------------------------


@ROWS_ONLY
def test_delayed_partition_is_woken_once_when_due(store: Store, session) -> None:
    dsn = store.db.dsn
    store.queues.configure("d", None, None, {"delayed_processing": 30})
    push(store, [{"queue": "d", "payload": 1}])
    first = session.wake_due(None)
    assert first.woken == 0
    assert 28 < first.next_due_in <= 30
    assert pop(store, "d") == []
    age(dsn, 31)  # time moved back: the due time now lies in the minute before the scan
    with listening(dsn) as listener:
        second = session.wake_due(first.scanned_at - MINUTE)
        assert (second.woken, second.next_due_in) == (1, None)
        assert payloads(listener) == {"d/Default//"}
        assert session.wake_due(second.scanned_at).woken == 0  # already announced
        assert payloads(listener, 0.1) == set()
    assert len(pop(store, "d")) == 1


@ROWS_ONLY
def test_window_waits_for_the_newest_message(store: Store, session) -> None:
    dsn = store.db.dsn
    store.queues.configure("w", None, None, {"window_buffer": 20})
    push(store, [{"queue": "w", "payload": 1, "transactionId": "old"}])
    age(dsn, 15)
    push(store, [{"queue": "w", "payload": 2, "transactionId": "new"}])
    scan = session.wake_due(None)
    assert 18 < scan.next_due_in <= 20  # from the newest message, not the oldest
    assert pop(store, "w") == []
    age(dsn, 21)
    assert session.wake_due(scan.scanned_at - MINUTE).woken == 1
    assert [m.transaction_id for m in pop(store, "w", batch=5)] == ["old", "new"]


def test_queues_without_timing_are_not_scanned(store: Store, session) -> None:
    push(store, [{"queue": "plain", "payload": 1}])
    scan = session.wake_due(None)
    assert (scan.woken, scan.next_due_in) == (0, None)
    assert session.timed_queues() == {}
    store.queues.configure("d", None, None, {"delayed_processing": 5, "window_buffer": 2})
    assert session.timed_queues()["d"].soonest_s == 2


# -- ttl and retention ----------------------------------------------------------------


@ROWS_ONLY
def test_ttl_moves_old_pending_messages_to_the_dead_letter_queue(store: Store, session) -> None:
    dsn = store.db.dsn
    store.queues.configure("t", None, None, {"ttl": 60})
    push(store, [{"queue": "t", "payload": n, "transactionId": f"m{n}"} for n in range(4)])
    push(store, [{"queue": "other", "payload": 1, "transactionId": "x"}])
    age(dsn, 120, "transaction_id IN ('m0', 'm1', 'm2', 'x')")
    assert session.expire_ttl(2) == 2  # bounded
    assert session.expire_ttl(100) == 1
    assert session.expire_ttl(100) == 0
    found = rows(dsn, "SELECT transaction_id, status, error_message FROM queen.messages")
    by_id = {txid: (status, error) for txid, status, error in found}
    assert by_id["m0"] == by_id["m1"] == by_id["m2"] == ("dead_letter", "ttl expired")
    assert by_id["m3"] == ("pending", None)
    assert by_id["x"] == ("pending", None)  # no ttl on that queue


@ROWS_ONLY
def test_retention_deletes_old_pending_and_completed(store: Store, session) -> None:
    dsn = store.db.dsn
    opts = {"retention_enabled": True, "retention_seconds": 60, "completed_retention_seconds": 30}
    store.queues.configure("r", None, None, opts)
    store.queues.configure("keep", None, None, {"retention_seconds": 1})  # not enabled
    push(store, [{"queue": "r", "payload": n, "transactionId": f"r{n}"} for n in range(4)])
    push(store, [{"queue": "keep", "payload": 1, "transactionId": "k"}])
    for _ in range(2):
        (m,) = pop(store, "r")
        ack(store, m.transaction_id)
    age(dsn, 45)  # completed r0, r1 are past 30 s; pending r2, r3 not past 60 s
    assert session.delete_retained_pending(100) == 0
    assert session.delete_retained_completed(1) == 1
    assert session.delete_retained_completed(100) == 1
    age(dsn, 30)
    assert session.delete_retained_pending(100) == 2
    assert set(statuses(dsn)) == {"k"}


# -- partitions -----------------------------------------------------------------------


def partitions(dsn: str) -> set[str]:
    return {r[0] for r in rows(dsn, "SELECT name FROM queen.partitions")}


@ROWS_ONLY
def test_cleanup_removes_only_idle_empty_free_partitions(store: Store, session) -> None:
    dsn = store.db.dsn
    push(
        store,
        [
            {"queue": "q", "partition": p, "payload": 1, "transactionId": p}
            for p in ("empty", "full", "leased", "recent")
        ],
    )
    pop(store, "q", "leased")
    execute(dsn, "DELETE FROM queen.messages WHERE transaction_id IN ('empty', 'leased', 'recent')")
    execute(
        dsn,
        "UPDATE queen.partitions SET created_at = now() - interval '1 h',"
        " last_activity_at = now() - interval '1 h' WHERE name <> 'recent'",
    )
    assert session.cleanup_partitions(600, 100) == 1
    assert partitions(dsn) == {"full", "leased", "recent"}
    assert session.cleanup_partitions(0, 100) == 1  # recent, with no idle time required
    assert partitions(dsn) == {"full", "leased"}


def test_a_push_racing_cleanup_lands_in_a_live_partition(store: Store, session) -> None:
    dsn = store.db.dsn
    push(store, [{"queue": "q", "partition": "p", "payload": 1, "transactionId": "a"}])
    execute(dsn, "DELETE FROM queen.messages")
    with psycopg.connect(dsn) as cleaner:  # a cleanup transaction caught in the middle
        assert cleaner.execute("SELECT queen.cleanup_partitions(0, 10)").fetchone() == (1,)
        results: list[object] = []
        pusher = threading.Thread(
            target=lambda: results.extend(
                push(store, [{"queue": "q", "partition": "p", "payload": 2, "transactionId": "b"}])
            )
        )
        pusher.start()
        pusher.join(0.5)
        assert pusher.is_alive()  # waits for the cleanup to end
        cleaner.commit()
    pusher.join(5)
    assert [r.status for r in results] == ["queued"]
    orphans = scalar(
        dsn,
        "SELECT count(*) FROM queen.messages m WHERE NOT EXISTS"
        " (SELECT 1 FROM queen.partitions p WHERE p.id = m.partition_id)",
    )
    assert orphans == 0
    (m,) = pop(store, "q", "p")
    assert m.transaction_id == "b"


def test_cleanup_skips_a_partition_a_push_holds(store: Store, session) -> None:
    dsn = store.db.dsn
    push(store, [{"queue": "q", "partition": "p", "payload": 1}])
    execute(dsn, "DELETE FROM queen.messages")
    with psycopg.connect(dsn) as pusher:  # a push between its partition lock and its insert
        pusher.execute("SELECT 1 FROM queen.partitions FOR KEY SHARE")
        assert session.cleanup_partitions(0, 10) == 0
        pusher.rollback()
    assert session.cleanup_partitions(0, 10) == 1


# -- counts and metrics ---------------------------------------------------------------


@ROWS_ONLY
def test_fold_then_reconcile_corrects_drift(store: Store, session) -> None:
    dsn = store.db.dsn
    push(
        store, [{"queue": "q", "partition": p, "payload": n} for p in ("a", "b") for n in range(5)]
    )
    (m,) = pop(store, "q", "a")
    ack(store, m.transaction_id)
    pop(store, "q", "b")
    assert session.fold_deltas(1000) > 0
    assert session.fold_deltas(1000) == 0
    assert counts_agree(dsn)
    execute(dsn, "UPDATE queen.partition_counts SET pending = pending + 7, completed = 0")
    push(store, [{"queue": "q", "partition": "a", "payload": 9}])  # unfolded deltas too
    assert not counts_agree(dsn)
    result = session.reconcile_counts(None, 10, 1000)
    assert (result.looked_at, result.drifted) == (2, 2)
    assert counts_agree(dsn)
    assert session.reconcile_counts(None, 10, 1000).drifted == 0


@ROWS_ONLY
def test_reconcile_leaves_terminal_counts_of_big_partitions(store: Store, session) -> None:
    dsn = store.db.dsn
    push(store, [{"queue": "q", "payload": n} for n in range(5)])
    for _ in range(2):
        (m,) = pop(store, "q")
        ack(store, m.transaction_id)
    session.fold_deltas(1000)
    execute(dsn, "UPDATE queen.partition_counts SET pending = 0, completed = 10")
    session.reconcile_counts(None, 10, 5)  # 10 rows believed: terminal statuses skipped
    (pending, completed) = rows(dsn, "SELECT pending, completed FROM queen.partition_counts")[0]
    assert (pending, completed) == (3, 10)
    session.reconcile_counts(None, 10, 100)
    assert counts_agree(dsn)


@ROWS_ONLY
def test_reconcile_walks_partitions_in_turn_within_a_row_budget(store: Store, session) -> None:
    push(store, [{"queue": "q", "partition": f"p{n}", "payload": n} for n in range(5)])
    seen = []
    after = None
    for _ in range(5):
        result = session.reconcile_counts(after, 2, 1000)
        seen.append(result.looked_at)
        after = result.last
    assert seen == [2, 2, 1, 0, 2]  # an empty run starts the walk again
    # Each partition holds one row: a budget of 3 rows admits three partitions.
    assert session.reconcile_counts(None, 10, 3).looked_at == 3
    assert session.reconcile_counts(None, 10, 0).looked_at == 1  # the first always counts


def test_prune_drops_old_minutes_only(store: Store, session) -> None:
    dsn = store.db.dsn
    execute(
        dsn,
        "INSERT INTO queen.metrics_minute (minute, queue, partition, incoming)"
        " SELECT date_trunc('minute', now()) - make_interval(days => d), 'q', 'p', 1"
        " FROM generate_series(0, 50, 10) d",
    )
    assert session.prune_metrics(30, 1) == 1
    assert session.prune_metrics(30, 100) == 1
    assert scalar(dsn, "SELECT count(*) FROM queen.metrics_minute") == 4  # 30 days is kept


# -- leadership -----------------------------------------------------------------------


def test_one_leader_and_a_successor(db_dsn: str) -> None:
    first = MaintenanceSession(db_dsn, application_name="first")
    second = MaintenanceSession(db_dsn, application_name="second")
    first.connect()
    second.connect()
    try:
        assert second.leader() is None
        assert first.try_lead()
        assert first.try_lead()  # re-entrant for the holder
        assert not second.try_lead()
        assert second.leader() == "first"
        first.close()  # the server ends the session (and frees the lock) a moment later
        deadline = time.monotonic() + 5
        while not second.try_lead():
            assert time.monotonic() < deadline
            time.sleep(0.01)
        assert second.leader() == "second"
        assert second.connected and not first.connected
    finally:
        first.close()
        second.close()


def test_tables_that_outgrow_their_statistics_are_analyzed(store: Store, session, db_dsn) -> None:
    # The hot functions keep their plans for the session; a table that fills up after
    # they were planned must get statistics (which replans them) without waiting for
    # autovacuum.
    push(store, [{"queue": "grow", "payload": {}}])
    assert session.analyze_grown() == []  # everything still tiny
    execute(
        db_dsn,
        "INSERT INTO queen.messages (transaction_id, id, partition_id, payload)"
        " SELECT 'g' || g, gen_random_uuid(), p.id, '{}' FROM queen.partitions p,"
        " generate_series(1, 20000) g",
    )
    assert session.analyze_grown() == ["queen.messages"]
    stats = "SELECT reltuples FROM pg_class WHERE oid = 'queen.messages'::regclass"
    assert scalar(db_dsn, stats) > 10000
    assert session.analyze_grown() == []  # statistics now match the size


@ROWS_ONLY
def test_every_status_change_is_counted(store: Store, session) -> None:
    # Status changes are counted by the functions that make them (no UPDATE trigger):
    # run each one, then the counts must equal the rows, before and after folding.
    dsn = store.db.dsn
    store.queues.configure("acct", None, None, {"retry_limit": 1})
    store.queues.configure("acct-ttl", None, None, {"ttl": 60})
    push(
        store,
        [
            {"queue": "acct", "partition": f"p{n % 3}", "payload": n, "transactionId": f"a{n}"}
            for n in range(12)
        ],
    )
    push(store, [{"queue": "acct-ttl", "payload": n, "transactionId": f"t{n}"} for n in range(3)])
    # pop (pending -> processing) and acks: completed, failed -> retry, failed -> dead letter
    first = pop(store, "acct", "p0", batch=4)
    ack(store, first[0].transaction_id)
    ack(store, first[1].transaction_id, "failed", "once")
    # an ack of a message still pending completes it
    ack(store, "a1")
    # expired lease (processing -> pending with a retry, or dead letter past the limit)
    pop(store, "acct", "p2", batch=2)
    expire_leases_now(dsn)
    assert session.expire_leases(10).leases == 2  # p2, and p0 with two messages unacked
    # unclaim: processing -> pending without a retry
    taken = pop(store, "acct", "p2", batch=1)
    assert store.polling.unclaim(taken[0].lease_id, [taken[0].transaction_id]) == 1
    # message management: retry a dead letter, move a pending message to the DLQ
    twice = pop(store, "acct", "p0", batch=4)
    for message in twice:
        ack(store, message.transaction_id, "failed", "twice")
    store.admin.dead_letter("a4")
    dead = [t for t, (status, _) in statuses(dsn).items() if status == "dead_letter"]
    assert dead
    store.admin.retry(dead[0])
    # ttl in maintenance and in the claim (pending -> dead_letter)
    age(dsn, 120, "transaction_id ^@ 't'")
    assert session.expire_ttl(1) == 1
    assert pop(store, "acct-ttl", batch=5) == []
    assert {s for s, _ in statuses(dsn).values()} >= {"pending", "completed", "dead_letter"}
    assert counts_agree(dsn)
    session.fold_deltas(1000)
    assert counts_agree(dsn)


def names(candidates: list) -> list[str]:
    return [c.name for c in candidates]


def test_tables_full_of_dead_rows_are_vacuumed(store: Store, session, db_dsn) -> None:
    push(store, [{"queue": "churn", "partition": f"p{n}", "payload": n} for n in range(4)])
    with psycopg.connect(db_dsn, autocommit=True) as conn:
        for _ in range(400):  # 1,600 dead versions of 4 rows, like leases taken and freed
            conn.execute(
                "UPDATE queen.partitions SET lease_expires_at = now(),"
                " lease_id = CASE WHEN lease_id IS NULL THEN gen_random_uuid() END"
            )
        conn.execute("SELECT pg_stat_force_next_flush()")
    deadline = time.monotonic() + 5
    while "queen.partitions" not in (found := names(session.vacuum_candidates(1000, 0.2, 10))):
        assert time.monotonic() < deadline, found
        time.sleep(0.1)
    session.vacuum("queen.partitions")
    vacuumed = "SELECT last_vacuum IS NOT NULL FROM pg_stat_user_tables WHERE relid = 'queen.partitions'::regclass"
    deadline = time.monotonic() + 5
    while not scalar(db_dsn, vacuumed):
        assert time.monotonic() < deadline
        time.sleep(0.1)
    assert "queen.partitions" not in names(session.vacuum_candidates(1000, 0.2, 10))
