"""The maintenance session's statements against a real database: timing scans, cleanup
racing pushes, metric pruning, leadership, vacuum; then lease expiry, ttl, retention and
analyze on queen.store.lifecycle (more of those in test_api_store.py)."""

from __future__ import annotations

import contextlib
import datetime as dt
import re
import threading
import time
from collections.abc import Iterator
from typing import Any

import psycopg
import pytest
from psycopg import sql

from queen.store import Store, lifecycle
from queen.store.maintenance import MaintenanceSession
from queen.store.migrate import function_files
from queen.wakeup import CHANNEL
from tests.integration.helpers import (
    ack_all,
    conn,
    expire_leases_now,
    make_queue,
    numbers,
    pop,
    push,
    push_n,
    scalar,
)

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
        conn.execute(sql.SQL("LISTEN {}").format(sql.Identifier(CHANNEL)))
        yield conn


def payloads(conn: psycopg.Connection, timeout: float = 0.3) -> set[str]:
    return {n.payload for n in conn.notifies(timeout=timeout)}


def age(dsn: str, seconds: float) -> None:
    """Make every message older (as if pushed `seconds` earlier)."""
    execute(
        dsn,
        "UPDATE queen.messages SET created_at = created_at - make_interval(secs => %s)",
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
    execute(dsn, "DELETE FROM queen.messages")
    with psycopg.connect(dsn) as cleaner:  # a cleanup transaction caught in the middle
        cleaned = cleaner.execute("SELECT queen.cleanup_partitions(0, 10)").fetchone()
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
        pusher.execute("""SELECT queen.push_targets('[{"queue": "q", "partition": "p"}]')""")
        assert session.cleanup_partitions(0, 10) == 0
        pusher.rollback()
    assert session.cleanup_partitions(0, 10) == 1


# -- metrics ---------------------------------------------------------------


def test_prune_drops_old_minutes_only(store: Store, session) -> None:
    dsn = store.db.dsn
    push(store, [{"queue": "q", "partition": "p", "payload": 1}])
    execute(
        dsn,
        "INSERT INTO queen.metrics_minute (minute, partition_id, incoming)"
        " SELECT date_trunc('minute', now()) - make_interval(days => d), p.id, 1"
        " FROM queen.partitions p, generate_series(0, 50, 10) d",
    )
    assert session.prune_metrics(30, 1) == 1
    assert session.prune_metrics(30, 100) == 1
    assert scalar(dsn, "SELECT count(*) FROM queen.metrics_minute") == 4  # 30 days kept


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


def wait_for_candidate(session, table: str) -> None:
    """Until maintenance lists table for a vacuum (statistics reach it within a moment)."""
    deadline = time.monotonic() + 5
    while table not in (found := names(session.vacuum_candidates(1000, 0.2, 10))):
        assert time.monotonic() < deadline, found
        time.sleep(0.1)


def test_tables_full_of_dead_rows_are_vacuumed(store: Store, session, db_dsn) -> None:
    push(store, [{"queue": "churn", "partition": f"p{n}", "payload": n} for n in range(4)])
    with psycopg.connect(db_dsn, autocommit=True) as conn:
        for _ in range(400):  # 1,600 dead versions of 4 rows (an indexed column: not HOT)
            conn.execute(
                "UPDATE queen.partitions SET name = CASE WHEN name ^@ 'x' THEN substr(name, 2)"
                " ELSE 'x' || name END"
            )
        conn.execute("SELECT pg_stat_force_next_flush()")
    wait_for_candidate(session, "queen.partitions")
    session.vacuum("queen.partitions")
    vacuumed = "SELECT last_vacuum IS NOT NULL FROM pg_stat_user_tables WHERE relid = 'queen.partitions'::regclass"
    deadline = time.monotonic() + 5
    while not scalar(db_dsn, vacuumed):
        assert time.monotonic() < deadline
        time.sleep(0.1)
    assert "queen.partitions" not in names(session.vacuum_candidates(1000, 0.2, 10))


def test_tables_of_names_with_new_rows_are_vacuumed(store: Store, session, db_dsn) -> None:
    """A new partition's page is marked all-visible by maintenance, not left to an
    autovacuum that a few inserts never bring: a pop reads partitions by an index alone."""
    with psycopg.connect(db_dsn, autocommit=True) as conn:
        lifecycle.push(conn, [{"queue": "fresh", "partition": "p1", "payload": 1}])
        conn.execute("SELECT pg_stat_force_next_flush()")
    wait_for_candidate(session, "queen.partitions")
    visible = ("SELECT relallvisible = relpages AND relpages > 0 FROM pg_class"
               " WHERE oid = 'queen.partitions'::regclass")
    for _ in range(50):  # (a vacuum may leave the page unmarked, as when a reader holds it)
        session.vacuum("queen.partitions")
        if scalar(db_dsn, visible):
            break
        time.sleep(0.1)
    assert scalar(db_dsn, visible)
    assert "queen.partitions" not in names(session.vacuum_candidates(1000, 0.2, 10))


__all__ = ["conn"]  # the fixture

Conn = psycopg.Connection[Any]


def test_the_template_has_every_function_file_installed(conn: Conn) -> None:
    names = {r[0] for r in conn.execute(
        "SELECT p.proname FROM pg_proc p JOIN pg_namespace n ON n.oid = p.pronamespace"
        " WHERE n.nspname = 'queen'").fetchall()}
    defined = {
        name for path in function_files()
        for name in re.findall(r"CREATE OR REPLACE FUNCTION queen\.(\w+)\(", path.read_text())
    }
    assert {"push_rows", "pop_queue", "ack_rows", "extend_lease"} <= defined
    assert defined <= names


def test_expire_leases_works_in_batches(conn: Conn) -> None:
    for p in range(5):
        push_n(conn, "q", 1, partition=f"p{p}")
        lifecycle.pop(conn, "q", partition=f"p{p}")
    assert lifecycle.expire_leases(conn) == 0  # none expired yet
    expire_leases_now(conn)
    assert lifecycle.expire_leases(conn, limit=2) == 2
    assert lifecycle.expire_leases(conn, limit=10) == 3
    assert lifecycle.expire_leases(conn) == 0
    got = lifecycle.pop(conn, "q", batch=10)
    assert numbers(got) == [0] and got[0].retry_count == 1


def ttl_dead_letters(conn: Conn) -> dict[str, tuple[str, str, int]]:
    """transactionId -> (group, error, retryCount) of every ttl dead letter."""
    rows = conn.execute(
        "SELECT m.transaction_id, f.consumer_group, f.error, f.retry_count"
        " FROM queen.failures f JOIN queen.messages m"
        " ON m.partition_id = f.partition_id AND m.id = f.message_id"
        " WHERE f.status = 'dead_letter'").fetchall()
    return {r[0]: (r[1], r[2], r[3]) for r in rows}


def test_ttl_dead_letters_messages_nobody_popped_in_bounded_steps(conn: Conn) -> None:
    make_queue(conn, "q", ttl=60, lease_time=60)
    push_n(conn, "q", 3, partition="a")
    push_n(conn, "q", 2, partition="b")
    assert numbers(lifecycle.pop(conn, "q", partition="b", batch=1)) == [0]  # b leased
    conn.execute("UPDATE queen.messages SET created_at = now() - interval '2 minutes'")
    push_n(conn, "q", 1, partition="a", start=3)  # young: stays
    ttl = "SELECT queen.maintain_ttl(%s)"
    assert conn.execute(ttl, [2]).fetchone() == (2,)
    assert conn.execute(ttl, [10]).fetchone() == (1,)
    assert conn.execute(ttl, [10]).fetchone() == (0,)  # b's lease holds its messages
    assert ttl_dead_letters(conn) == {
        f"q-a-{i}": ("__queue__", "ttl expired", 0) for i in range(3)
    }
    assert numbers(lifecycle.pop(conn, "q", partition="a", batch=10)) == [3]
    expire_leases_now(conn)
    assert conn.execute(ttl, [10]).fetchone() == (0,)  # expired, not ended yet
    assert lifecycle.expire_leases(conn) == 2  # (a and b)
    assert conn.execute(ttl, [10]).fetchone() == (2,)  # b-0 was delivered once
    dead = ttl_dead_letters(conn)
    assert (dead["q-b-0"], dead["q-b-1"]) == (("__queue__", "ttl expired", 1),
                                              ("__queue__", "ttl expired", 0))


def test_ttl_applies_to_each_group_from_its_cursor(conn: Conn) -> None:
    make_queue(conn, "q", ttl=60)
    push_n(conn, "q", 2)
    ack_all(conn, lifecycle.pop(conn, "q", group="g", batch=1))  # g is past q-Default-0
    conn.execute("UPDATE queen.messages SET created_at = now() - interval '2 minutes'")
    assert conn.execute("SELECT queen.maintain_ttl(10)").fetchone() == (3,)
    got = conn.execute(
        "SELECT f.consumer_group, m.transaction_id FROM queen.failures f"
        " JOIN queen.messages m ON m.partition_id = f.partition_id AND m.id = f.message_id"
        " WHERE f.status = 'dead_letter' ORDER BY 1, 2").fetchall()
    assert got == [("__queue__", "q-Default-0"), ("__queue__", "q-Default-1"),
                   ("g", "q-Default-1")]


def test_retention_deletes_old_messages_and_consumed_ones(conn: Conn) -> None:
    make_queue(conn, "q", retention_enabled=True, retention_seconds=7200,
               completed_retention_seconds=60)
    make_queue(conn, "kept", retention_enabled=False, retention_seconds=1)
    push_n(conn, "q", 4)
    push_n(conn, "kept", 1)
    ack_all(conn, lifecycle.pop(conn, "q", batch=2))  # 0 and 1 consumed by queue mode
    lifecycle.pop(conn, "q", group="g", batch=1)  # g has consumed nothing
    conn.execute("UPDATE queen.messages SET created_at = now() - interval '1 hour'")
    # g is active and behind: it holds back completed retention.
    assert lifecycle.retention(conn) == 0
    conn.execute("UPDATE queen.messages SET created_at = now() - interval '3 hours'")
    assert lifecycle.retention(conn, limit=3) == 3  # past retentionSeconds, whatever was done
    assert lifecycle.retention(conn) == 1
    assert conn.execute(
        "SELECT transaction_id FROM queen.messages").fetchall() == [("kept-Default-0",)]


def test_completions_of_deleted_messages_go_with_them(conn: Conn) -> None:
    """An ack's completion record goes once every message it covered is deleted, and
    not before: the history of acks is as long as the messages kept."""
    make_queue(conn, "q", retention_enabled=True, retention_seconds=60)
    push_n(conn, "q", 6)
    for size in (2, 1, 3):
        ack_all(conn, lifecycle.pop(conn, "q", batch=size))
    ack_all(conn, lifecycle.pop(conn, "q", group="g", batch=6))
    ids = [r[0] for r in conn.execute("SELECT id FROM queen.messages ORDER BY id")]
    completions = ("SELECT consumer_group, first_id, last_id FROM queen.completions"
                   " ORDER BY consumer_group, last_id")
    assert len(conn.execute(completions).fetchall()) == 4
    conn.execute("DELETE FROM queen.messages WHERE id <= %s", (ids[2],))  # half of the 3
    assert conn.execute(completions).fetchall() == [
        ("__queue__", ids[3], ids[5]), ("g", ids[0], ids[5])]
    conn.execute("UPDATE queen.messages SET created_at = now() - interval '1 hour'")
    assert lifecycle.retention(conn) == 3
    assert conn.execute(completions).fetchall() == []


def test_a_group_idle_past_retention_no_longer_holds_messages(conn: Conn) -> None:
    make_queue(conn, "q", retention_enabled=True, retention_seconds=7200,
               completed_retention_seconds=60)
    push_n(conn, "q", 2)
    ack_all(conn, lifecycle.pop(conn, "q", batch=2))
    lifecycle.pop(conn, "q", group="idle")
    conn.execute("UPDATE queen.messages SET created_at = now() - interval '1 hour'")
    conn.execute("UPDATE queen.consumers SET updated_at = now() - interval '3 hours'"
                 " WHERE consumer_group = 'idle'")
    assert lifecycle.retention(conn) == 2


def flush_statistics(conn: Conn) -> None:
    """Make this session's table counts visible now (they are otherwise sent each second)."""
    conn.execute("SELECT pg_stat_force_next_flush()")
    conn.execute("SELECT 1")


def test_analyze_runs_on_the_tables_that_changed(conn: Conn) -> None:
    lifecycle.push(conn, [{"queue": "q", "payload": i} for i in range(50)])
    flush_statistics(conn)
    assert lifecycle.analyze(conn, min_changes=10) == ["messages"]
    flush_statistics(conn)
    assert lifecycle.analyze(conn, min_changes=10) == []
    analysed = conn.execute(
        "SELECT last_analyze IS NOT NULL FROM pg_stat_user_tables"
        " WHERE relname = 'messages'").fetchone()
    assert analysed == (True,)


def test_an_analysed_table_is_left_to_autovacuum_where_it_runs(conn: Conn) -> None:
    autovacuum = conn.execute("SELECT current_setting('autovacuum')::boolean").fetchone()
    lifecycle.push(conn, [{"queue": "q", "payload": i} for i in range(50)])
    flush_statistics(conn)
    assert lifecycle.analyze(conn, min_changes=10) == ["messages"]  # never analysed
    lifecycle.push(conn, [{"queue": "q", "payload": i} for i in range(50)])
    flush_statistics(conn)
    assert lifecycle.analyze(conn, min_changes=10) == ([] if autovacuum == (True,)
                                                       else ["messages"])
    conn.execute("ALTER TABLE queen.messages SET (autovacuum_enabled = off)")
    lifecycle.push(conn, [{"queue": "q", "payload": i} for i in range(50)])
    flush_statistics(conn)
    assert lifecycle.analyze(conn, min_changes=10) == ["messages"]  # opted out


def test_a_table_emptied_by_truncate_is_analysed_again_once_it_fills(conn: Conn) -> None:
    lifecycle.push(conn, [{"queue": "q", "payload": i} for i in range(50)])
    flush_statistics(conn)
    assert lifecycle.analyze(conn, min_changes=10) == ["messages"]
    conn.execute("TRUNCATE queen.messages")
    lifecycle.push(conn, [{"queue": "q", "payload": i} for i in range(5)])
    flush_statistics(conn)
    assert lifecycle.analyze(conn, min_changes=10) == []  # (too few changes yet)
    lifecycle.push(conn, [{"queue": "q", "payload": i} for i in range(50)])
    flush_statistics(conn)
    assert lifecycle.analyze(conn, min_changes=10) == ["messages"]  # its size unknown
    flush_statistics(conn)
    assert lifecycle.analyze(conn, min_changes=10) == []


def test_a_table_grown_to_twice_its_statistics_is_analysed_again(conn: Conn) -> None:
    autovacuum = conn.execute("SELECT current_setting('autovacuum')::boolean").fetchone()
    lifecycle.push(conn, [{"queue": "q", "payload": i} for i in range(100)])
    flush_statistics(conn)
    assert lifecycle.analyze(conn, min_changes=10) == ["messages"]  # 100 rows
    lifecycle.push(conn, [{"queue": "q", "payload": i} for i in range(90)])
    flush_statistics(conn)
    assert lifecycle.analyze(conn, min_changes=10) == ([] if autovacuum == (True,)
                                                       else ["messages"])
    lifecycle.push(conn, [{"queue": "q", "payload": i} for i in range(20)])
    flush_statistics(conn)
    assert "messages" in lifecycle.analyze(conn, min_changes=10)  # 210 > 2 x 100


def test_autovacuum_runs_on_a_table_unless_it_or_the_server_turns_it_off(conn: Conn) -> None:
    server = conn.execute("SELECT current_setting('autovacuum')::boolean").fetchone()
    answers = conn.execute(
        "SELECT queen.autovacuum_runs_on(NULL), queen.autovacuum_runs_on('{fillfactor=90}'),"
        " queen.autovacuum_runs_on('{autovacuum_enabled=true}'),"
        " queen.autovacuum_runs_on('{autovacuum_enabled=off}'),"
        " queen.autovacuum_runs_on('{fillfactor=90,autovacuum_enabled=false}')").fetchone()
    assert server is not None and answers is not None
    on = server[0]
    assert answers == (on, on, on, False, False)


def _failure_rows_read(plan: dict[str, Any]) -> int:
    """Rows the nodes on queen.failures produced over all their loops."""
    own = plan.get("Relation Name") == "failures"
    read = int(plan["Actual Rows"] * plan["Actual Loops"]) if own else 0
    return read + sum(_failure_rows_read(child) for child in plan.get("Plans", []))


def test_the_counts_walk_reads_each_failure_record_once(conn: Conn) -> None:
    """Dead letters pile up in a partition; the walk over what queue mode's cursor passed
    reads each of their records once, not every record of the partition per message
    (that made a counts step quadratic in the partition's dead letters)."""
    make_queue(conn, "q", retry_limit=0)  # a failed ack dead-letters the message at once
    push_n(conn, "q", 300)
    dead = 0
    while got := lifecycle.pop(conn, "q", batch=100):
        failed = got[1::3]
        dead += len(failed)
        ack_all(conn, [d for d in got if d not in failed])
        ack_all(conn, failed, status="failed")
    assert dead == 99
    (partition,) = conn.execute("SELECT id FROM queen.partitions").fetchone() or ()
    (plan,) = (
        conn.execute(
            "EXPLAIN (ANALYZE, FORMAT JSON)"
            " SELECT * FROM queen.passed_ends(%s, 0, %s, 5000)",
            (partition, 2**62),
        ).fetchone()
        or ()
    )
    ends = conn.execute(
        "SELECT final, sum(n) FROM queen.passed_ends(%s, 0, %s, 5000) GROUP BY 1",
        (partition, 2**62),
    ).fetchall()
    assert dict(ends) == {None: 201, "dead_letter": 99}
    # one read of each dead letter's record
    assert _failure_rows_read(plan[0]["Plan"]) <= dead


def test_the_counts_walk_ends_every_passed_message_once(conn: Conn) -> None:
    """Completed in acks of several sizes, retried in place, dead-lettered, and passed by a
    seek with no ack at all: the walk over what queue mode's cursor passed ends each
    message once, as its last acknowledgment decided, and puts each completed one in the
    lag histogram."""
    make_queue(conn, "q", retry_limit=1)
    push_n(conn, "q", 40)
    final: dict[str, str] = {}
    for size, failing in ((10, 0), (10, 3), (6, 2), (8, 8), (4, 1), (5, 0)):
        got = lifecycle.pop(conn, "q", batch=size)
        for outcome in [*ack_all(conn, got[failing:]), *ack_all(conn, got[:failing], "failed")]:
            final[outcome.transaction_id] = outcome.status
    push_n(conn, "q", 7, start=40)  # passed by the seek below, never acked
    conn.execute("SELECT queen.seek('q', '__queue__', 'end')")
    (partition, cursor) = conn.execute(
        "SELECT partition_id, cursor_id FROM queen.consumers"
        " WHERE consumer_group = '__queue__'").fetchone() or (None, 0)
    ends = dict(conn.execute(
        "SELECT coalesce(final, 'completed'), sum(n)::integer"
        " FROM queen.passed_ends(%s, 0, %s, 5000) GROUP BY 1", (partition, cursor)
    ).fetchall())
    (passed,) = conn.execute(
        "SELECT count(*)::integer FROM queen.messages WHERE id <= %s", (cursor,)
    ).fetchone() or (0,)
    decided = [s for s in final.values() if s != "retry_scheduled"]
    assert passed == 47 and sum(ends.values()) == passed
    assert ends.get("dead_letter", 0) == decided.count("dead_letter") > 0
    assert ends["completed"] == decided.count("completed") + (passed - len(decided))
    (completed, histogram) = conn.execute(
        "SELECT sum(completed)::integer, sum((SELECT sum(b) FROM unnest(lag_hist) b))::integer"
        " FROM queen.activity_walk(%s, 0, 0, %s, 5000)", (partition, cursor)
    ).fetchone() or (0, 0)
    assert completed == histogram == ends["completed"]


ORACLE = """
WITH w AS (
    SELECT m.id, m.created_at FROM queen.messages m
    WHERE m.partition_id = %(p)s AND m.id > %(after)s AND m.id <= %(upto)s
    ORDER BY m.id LIMIT %(step)s
), each AS (
    SELECT w.id, w.created_at, f.status, f.failed_at,
           (SELECT CASE WHEN c.first_id <= w.id THEN c.acked_at END FROM queen.completions c
            WHERE c.partition_id = %(p)s AND c.consumer_group = '__queue__'
              AND c.last_id >= w.id
            ORDER BY c.last_id LIMIT 1) AS acked_at
    FROM w LEFT JOIN queen.failures f
      ON f.partition_id = %(p)s AND f.consumer_group = '__queue__' AND f.message_id = w.id
     AND f.status <> 'retry'
)
SELECT date_trunc('minute', coalesce(CASE WHEN e.status IS NULL THEN e.acked_at
                                          ELSE e.failed_at END, now())),
       e.status,
       CASE WHEN e.status IS NULL THEN round(greatest(extract(epoch FROM
           coalesce(e.acked_at, now()) - e.created_at) * 1000, 0)::numeric, 3) END,
       count(*)
FROM each e GROUP BY 1, 2, 3 ORDER BY 1, 2, 3, 4
"""


def test_the_walk_of_what_the_cursor_passed_agrees_with_a_lookup_message_by_message(
    conn: Conn,
) -> None:
    """Acks of several sizes and orders, failures retried and dead-lettered, a seek past
    messages never acked: for windows of several steps and starts, queen.passed_ends says
    what a lookup message by message says (its completion: the lowest last_id at or past
    it; else its failure record)."""
    make_queue(conn, "q", retry_limit=1)
    push_n(conn, "q", 60)
    for size, failing in ((10, 0), (7, 3), (1, 0), (6, 2), (8, 8), (4, 1), (9, 0), (3, 3)):
        got = lifecycle.pop(conn, "q", batch=size)
        ack_all(conn, list(reversed(got[failing:])))
        ack_all(conn, got[:failing], "failed")
    push_n(conn, "q", 5, start=60)
    conn.execute("SELECT queen.seek('q', '__queue__', 'end')")
    (partition, cursor) = conn.execute(
        "SELECT partition_id, cursor_id FROM queen.consumers"
        " WHERE consumer_group = '__queue__'").fetchone() or (None, 0)
    ids = [r[0] for r in conn.execute("SELECT id FROM queen.messages ORDER BY id")]
    for step in (1, 4, 13, 5000):
        for after in (0, ids[9], ids[30]):
            args = {"p": partition, "after": after, "upto": cursor, "step": step}
            with conn.transaction():  # (one now() for both)
                walked = conn.execute(
                    "SELECT minute, final, round(ms::numeric, 3), sum(n)"
                    " FROM queen.passed_ends(%(p)s, %(after)s, %(upto)s, %(step)s)"
                    " GROUP BY 1, 2, 3 ORDER BY 1, 2, 3, 4", args).fetchall()
                expected = conn.execute(ORACLE, args).fetchall()
            assert walked == expected, (step, after)


def _rows_read(plan: dict[str, Any], relation: str) -> int:
    """Rows the nodes of an EXPLAIN (ANALYZE, FORMAT JSON) plan read from relation."""
    own = plan["Actual Rows"] * plan["Actual Loops"] if plan.get("Relation Name") == relation else 0
    return own + sum(_rows_read(p, relation) for p in plan.get("Plans", []))


def test_a_count_walk_reads_the_completions_of_its_window_not_the_partition_s_history(
    conn: Conn,
) -> None:
    """The completion after a window is found by a probe of the key from the window's
    end: the walk reads no completion of the history before it, however long that is."""
    make_queue(conn, "q")
    push_n(conn, "q", 300)
    for _ in range(300):
        ack_all(conn, lifecycle.pop(conn, "q", batch=1))
    (partition, cursor) = conn.execute(
        "SELECT partition_id, cursor_id FROM queen.consumers"
        " WHERE consumer_group = '__queue__'").fetchone() or (None, 0)
    conn.execute("ANALYZE queen.completions")
    conn.execute("SET plan_cache_mode = force_generic_plan")  # (as maintenance plans it)
    conn.execute("PREPARE walk(uuid, bigint, bigint) AS"
                 " SELECT * FROM queen.passed_ends($1, $2, $3, 5000)")
    explain = sql.SQL("EXPLAIN (ANALYZE, FORMAT JSON) EXECUTE walk({}, {}, {})").format(
        sql.Literal(str(partition)), sql.Literal(cursor - 3), sql.Literal(cursor))
    (plan,) = conn.execute(explain).fetchone() or (None,)
    assert _rows_read(plan[0]["Plan"], "completions") <= 5

def test_the_activity_walk_is_its_two_walks_from_watermarks_in_either_order(
    conn: Conn,
) -> None:
    """Arrivals and what the cursor passed, from watermarks in either order and steps that
    cut either walk short: the passed window as queen.passed_ends walks it alone; the
    arrivals, when that window starts at or below their watermark, its messages after the
    watermark and then a step more, else a step from the watermark: each arrival counted
    once, none skipped."""
    make_queue(conn, "q", retry_limit=1)
    push_n(conn, "q", 30)
    for size, failing in ((5, 0), (4, 2), (6, 0), (3, 3)):
        got = lifecycle.pop(conn, "q", batch=size)
        ack_all(conn, got[failing:])
        ack_all(conn, got[:failing], "failed")
    push_n(conn, "q", 10, start=30)
    (partition, cursor) = conn.execute(
        "SELECT partition_id, cursor_id FROM queen.consumers"
        " WHERE consumer_group = '__queue__'").fetchone() or (None, 0)
    ids = [r[0] for r in conn.execute("SELECT id FROM queen.messages ORDER BY id")]
    below = [0] + [i for i in ids if i <= cursor]
    for step in (2, 5, 9, 5000):
        for counted in (0, ids[3], ids[12], ids[35]):
            for cursor_counted in (below[0], below[4], below[-3]):
                args = {"p": partition, "c": counted, "cc": cursor_counted, "cur": cursor,
                        "step": step}
                with conn.transaction():
                    walked = conn.execute(
                        "SELECT sum(incoming)::int, max(newest),"
                        " sum(completed + failed + dead_letter)::int, max(reached)"
                        " FROM queen.activity_walk(%(p)s, %(c)s, %(cc)s, %(cur)s, %(step)s)",
                        args).fetchone()
                    passed = conn.execute(
                        "SELECT sum(n)::int, max(reached)"
                        " FROM queen.passed_ends(%(p)s, %(cc)s, %(cur)s, %(step)s)",
                        args).fetchone() or ()
                    shared = cursor_counted <= counted and (passed[1] or 0) > counted
                    args["start"] = passed[1] if shared else counted
                    arrivals = conn.execute(
                        "SELECT count(*)::int, max(id) FROM ("
                        " SELECT id FROM queen.messages WHERE partition_id = %(p)s"
                        " AND id > %(c)s AND id <= %(start)s"
                        " UNION ALL (SELECT id FROM queen.messages WHERE partition_id = %(p)s"
                        " AND id > %(start)s ORDER BY id LIMIT %(step)s)) a",
                        args).fetchone() or ()
                assert walked is not None
                expected = (arrivals[0] or None, arrivals[1], passed[0], passed[1])
                assert walked == expected, args


def _push_both(conn: Conn, n: int, start: int) -> None:
    """Push n messages into each of partitions a and b of queue q, their ids alternating."""
    items = [
        {"queue": "q", "partition": name, "payload": {"n": i}}
        for i in range(start, start + n)
        for name in ("a", "b")
    ]
    assert [r.status for r in lifecycle.push(conn, items)] == ["queued"] * 2 * n


def _counted(conn: Conn) -> dict[str, tuple[int, int, float | None]]:
    """Each partition's count row: messages counted, those below the cursor, its share."""
    rows = conn.execute(
        "SELECT p.name, k.total, k.below, k.share FROM queen.partition_counts k"
        " JOIN queen.partitions p ON p.id = k.partition_id").fetchall()
    return {name: (total, below, share) for name, total, below, share in rows}


def _pending(conn: Conn) -> dict[str, int]:
    rows = conn.execute(
        "SELECT p.name, c.pending FROM queen.partitions p,"
        " queen.message_counts(ARRAY[p.id]) c").fetchall()
    return {name: int(n) for name, n in rows}


def _refresh_settled(conn: Conn) -> None:
    """A count step with a 5 s settle time and a lag of 10 messages."""
    conn.execute("SELECT queen.count_refresh(10, 5000, 5.0, 10)")


def test_a_partition_that_moved_little_waits_for_its_refresh_and_reads_stay_exact(
    conn: Conn,
) -> None:
    """With a settle time and a lag, a partition refreshed a moment ago is left for later
    while few messages arrived or were passed since, refreshed at once past the lag, and
    again once the settle time has gone by; the counts read are exact throughout."""
    make_queue(conn, "q")

    def refresh() -> None:
        _refresh_settled(conn)

    def counted() -> tuple[int, int]:
        total, below, _ = _counted(conn)["Default"]
        return total, below

    def pending() -> int:
        return _pending(conn)["Default"]

    push_n(conn, "q", 4)
    refresh()
    assert counted() == (4, 0)
    push_n(conn, "q", 3, start=4)
    ack_all(conn, lifecycle.pop(conn, "q", batch=2))
    refresh()
    assert counted() == (4, 0)  # moved little: left for later
    assert pending() == 5  # read exactly all the same
    push_n(conn, "q", 11, start=7)
    refresh()
    assert counted() == (18, 2)  # more than the lag arrived: refreshed at once
    ack_all(conn, lifecycle.pop(conn, "q", batch=3))
    refresh()
    assert counted() == (18, 2) and pending() == 13
    conn.execute("UPDATE queen.partition_counts SET refreshed_at = now() - interval '6 s'")
    refresh()
    assert counted() == (18, 5)  # the settle time went by
    conn.execute("SELECT queen.count_refresh(10, 5000)")  # (no settle: as before)
    assert counted() == (18, 5) and pending() == 13


def test_what_a_partition_got_since_its_refresh_is_estimated_from_its_share_of_ids(
    conn: Conn,
) -> None:
    """Between refreshes, the messages a partition got are estimated from the ids drawn
    since and its share of them at its last refresh (unknown at first: every id): a
    partition given every other id waits while about the lag or fewer arrived, and is
    refreshed once more did; the counts read are exact throughout."""
    make_queue(conn, "q")
    _push_both(conn, 4, 0)
    _refresh_settled(conn)
    assert _counted(conn) == {"a": (4, 0, None), "b": (4, 0, None)}  # from id 0 on: no share
    _push_both(conn, 8, 4)
    _refresh_settled(conn)  # 16 ids drawn past each, every one counted: share unknown
    assert _counted(conn) == {"a": (12, 0, 0.5), "b": (12, 0, 0.5)}
    _push_both(conn, 8, 12)
    _refresh_settled(conn)  # 16 ids again, half of them each's: 8, no more than the lag
    assert _counted(conn) == {"a": (12, 0, 0.5), "b": (12, 0, 0.5)}
    assert _pending(conn) == {"a": 20, "b": 20}
    _push_both(conn, 4, 20)
    _refresh_settled(conn)  # 24 ids since, 12 each's: past the lag
    assert _counted(conn) == {"a": (24, 0, 0.5), "b": (24, 0, 0.5)}
    assert _pending(conn) == {"a": 24, "b": 24}


def test_what_a_cursor_passed_since_the_refresh_is_estimated_from_the_share_too(
    conn: Conn,
) -> None:
    """Queue mode's cursor passing the ids of a partition given every other one: about
    half as many messages as the ids it moved over, refreshed once that is past the lag."""
    make_queue(conn, "q")
    _push_both(conn, 24, 0)
    ack_all(conn, lifecycle.pop(conn, "q", partition="a", batch=2))
    _refresh_settled(conn)
    _push_both(conn, 8, 24)
    _refresh_settled(conn)  # 16 ids past each, share unknown: refreshed, share found
    assert _counted(conn) == {"a": (32, 2, 0.5), "b": (32, 0, 0.5)}
    ack_all(conn, lifecycle.pop(conn, "q", partition="a", batch=8))
    _refresh_settled(conn)  # the cursor moved over 16 ids: about 8 messages
    assert _counted(conn)["a"] == (32, 2, 0.5)
    assert _pending(conn) == {"a": 22, "b": 32}
    ack_all(conn, lifecycle.pop(conn, "q", partition="a", batch=4))
    _refresh_settled(conn)  # 24 ids: about 12, past the lag
    assert _counted(conn)["a"] == (32, 14, 0.5)
    assert _pending(conn) == {"a": 18, "b": 32}


@pytest.mark.parametrize("step", [3, 7, 5000])
def test_refreshes_between_pushes_and_acks_count_each_message_once(
    conn: Conn, step: int
) -> None:
    """Pushes, pops, acks and failures interleaved with refreshes of small steps (the
    cursor ahead of the counted arrivals, level with them, behind them): the rollup
    counts every arrival and every end once, as the messages and their records say."""
    make_queue(conn, "q", retry_limit=0, dlq_after_max_retries=True)
    pushed = 0
    for burst, (size, failing) in enumerate(((4, 0), (9, 1), (2, 0), (6, 2), (1, 0), (8, 3))):
        push_n(conn, "q", 5 + burst, start=pushed)
        pushed += 5 + burst
        if burst % 2:
            conn.execute("SELECT queen.count_refresh(10, %s)", (step,))
        got = lifecycle.pop(conn, "q", batch=size)
        ack_all(conn, got[failing:])
        ack_all(conn, got[:failing], "failed")
        conn.execute("SELECT queen.count_refresh(10, %s)", (step,))
    def one(query: str, *params: Any) -> Any:
        return (conn.execute(query, params).fetchone() or (None,))[0]

    while one("SELECT queen.count_refresh(10, %s)", step):
        pass
    cursor = one("SELECT cursor_id FROM queen.consumers WHERE consumer_group = '__queue__'")
    passed = one("SELECT count(*) FROM queen.messages WHERE id <= %s", cursor)
    dead = one("SELECT count(*) FROM queen.failures WHERE status = 'dead_letter'")
    assert conn.execute(
        "SELECT total, below, dead_letter FROM queen.partition_counts").fetchall() == [
        (pushed, passed, dead)]
    assert conn.execute(
        "SELECT sum(incoming)::int, sum(completed)::int, sum(dead_letter)::int,"
        " sum((SELECT sum(b) FROM unnest(lag_hist) b))::int FROM queen.metrics_minute"
    ).fetchone() == (pushed, passed - dead, dead, passed - dead)
