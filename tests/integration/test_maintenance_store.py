"""The maintenance session's statements against a real database: timing scans, cleanup
racing pushes, metric pruning, leadership, vacuum. (Leases, ttl, retention and analyze:
test_cursor_maintenance.py and test_cursor_api_store.py.)"""

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
from tests.integration.helpers import pop, push, scalar

MINUTE = dt.timedelta(minutes=1)


@pytest.fixture
def session(db_dsn: str) -> Iterator[MaintenanceSession]:
    s = MaintenanceSession(db_dsn, application_name="maint-test")
    s.connect()
    yield s
    s.close()


def execute(dsn: str, query: str, params: tuple = ()) -> None:
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(query, params)  # type: ignore[arg-type]


@contextlib.contextmanager
def listening(dsn: str) -> Iterator[psycopg.Connection]:
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("LISTEN queen")
        yield conn


def payloads(conn: psycopg.Connection, timeout: float = 0.3) -> set[str]:
    return {n.payload for n in conn.notifies(timeout=timeout)}


def age(dsn: str, seconds: float) -> None:
    """Make every message older (as if pushed `seconds` earlier)."""
    execute(
        dsn,
        "UPDATE queen.cursor_messages SET created_at = created_at - make_interval(secs => %s)",
        (seconds,),
    )


# -- delayed and windowed ---------------------------------------------------------------


def test_delayed_partition_is_woken_once_when_due(store: Store, session) -> None:
    dsn = store.db.dsn
    store.queues.configure("d", None, None, {"delayed_processing": 30})
    push(store, [{"queue": "d", "payload": 1}])
    assert pop(store, "d") == []  # a poll came too early: it parks
    store.polling.list_waiting_worker("w1", 60)  # (wake-ups go out only while polls wait)
    first = session.wake_due(None)
    assert first.woken == 0
    assert 28 < first.next_due_in <= 30
    age(dsn, 31)  # time moved back: the due time now lies in the minute before the scan
    with listening(dsn) as listener:
        second = session.wake_due(first.scanned_at - MINUTE)
        assert (second.woken, second.next_due_in) == (1, None)
        assert payloads(listener) == {"d/Default//"}
        assert session.wake_due(second.scanned_at).woken == 0  # already announced
        assert payloads(listener, 0.1) == set()
    assert len(pop(store, "d")) == 1


def test_window_waits_for_the_newest_message(store: Store, session) -> None:
    dsn = store.db.dsn
    store.queues.configure("w", None, None, {"window_buffer": 20})
    push(store, [{"queue": "w", "payload": 1, "transactionId": "old"}])
    age(dsn, 15)
    push(store, [{"queue": "w", "payload": 2, "transactionId": "new"}])
    assert pop(store, "w") == []  # a poll came too early (it would park now)
    scan = session.wake_due(None)
    assert 18 < scan.next_due_in <= 20  # from the newest message, not the oldest
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


# -- partitions -------------------------------------------------------------------------


def test_a_push_racing_cleanup_lands_in_a_live_partition(store: Store, session) -> None:
    dsn = store.db.dsn
    push(store, [{"queue": "q", "partition": "p", "payload": 1, "transactionId": "a"}])
    execute(dsn, "DELETE FROM queen.cursor_messages")
    with psycopg.connect(dsn) as cleaner:  # a cleanup transaction caught in the middle
        cleaned = cleaner.execute("SELECT queen.cursor_cleanup_partitions(0, 10)").fetchone()
        assert cleaned == (1,)
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
        "SELECT count(*) FROM queen.cursor_messages m WHERE NOT EXISTS"
        " (SELECT 1 FROM queen.partitions p WHERE p.id = m.partition_id)",
    )
    assert orphans == 0
    (m,) = pop(store, "q", "p")
    assert m.transaction_id == "b"


def test_cleanup_skips_a_partition_a_push_holds(store: Store, session) -> None:
    dsn = store.db.dsn
    push(store, [{"queue": "q", "partition": "p", "payload": 1}])
    execute(dsn, "DELETE FROM queen.cursor_messages")
    with psycopg.connect(dsn) as pusher:  # a push between its partition lock and its insert
        pusher.execute("""SELECT queen.cursor_targets('[{"queue": "q", "partition": "p"}]')""")
        assert session.cleanup_partitions(0, 10) == 0
        pusher.rollback()
    assert session.cleanup_partitions(0, 10) == 1


# -- metrics ---------------------------------------------------------------


def test_prune_drops_old_minutes_only(store: Store, session) -> None:
    dsn = store.db.dsn
    push(store, [{"queue": "q", "partition": "p", "payload": 1}])
    execute(
        dsn,
        "INSERT INTO queen.cursor_metrics_minute (minute, partition_id, incoming)"
        " SELECT date_trunc('minute', now()) - make_interval(days => d), p.id, 1"
        " FROM queen.partitions p, generate_series(0, 50, 10) d",
    )
    assert session.prune_metrics(30, 1) == 1
    assert session.prune_metrics(30, 100) == 1
    assert scalar(dsn, "SELECT count(*) FROM queen.cursor_metrics_minute") == 4  # 30 days kept


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


def names(candidates: list) -> list[str]:
    return [c.name for c in candidates]


def test_tables_full_of_dead_rows_are_vacuumed(store: Store, session, db_dsn) -> None:
    push(store, [{"queue": "churn", "partition": f"p{n}", "payload": n} for n in range(4)])
    with psycopg.connect(db_dsn, autocommit=True) as conn:
        for _ in range(400):  # 1,600 dead versions of 4 rows (an indexed column: not HOT)
            conn.execute(
                "UPDATE queen.partitions SET name = CASE WHEN name ^@ 'x' THEN substr(name, 2)"
                " ELSE 'x' || name END"
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
