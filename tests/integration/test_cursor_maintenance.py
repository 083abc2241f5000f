"""Maintenance of the cursor store: lease expiry by batches, ttl, retention, ANALYZE."""

from __future__ import annotations

import re
from typing import Any

import psycopg

from queen.store import cursors
from queen.store.migrate import function_files
from tests.integration.cursor_helpers import (
    ack_all,
    conn,
    expire_leases_now,
    make_queue,
    numbers,
    push_n,
)

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
    assert {"cursor_push", "cursor_pop_queue", "cursor_ack", "cursor_extend"} <= defined
    assert defined <= names


def test_expire_leases_works_in_batches(conn: Conn) -> None:
    for p in range(5):
        push_n(conn, "q", 1, partition=f"p{p}")
        cursors.pop(conn, "q", partition=f"p{p}")
    assert cursors.expire_leases(conn) == 0  # none expired yet
    expire_leases_now(conn)
    assert cursors.expire_leases(conn, limit=2) == 2
    assert cursors.expire_leases(conn, limit=10) == 3
    assert cursors.expire_leases(conn) == 0
    got = cursors.pop(conn, "q", batch=10)
    assert numbers(got) == [0] and got[0].retry_count == 1


def ttl_dead_letters(conn: Conn) -> dict[str, tuple[str, str, int]]:
    """transactionId -> (group, error, retryCount) of every ttl dead letter."""
    rows = conn.execute(
        "SELECT m.transaction_id, f.consumer_group, f.error, f.retry_count"
        " FROM queen.cursor_failures f JOIN queen.cursor_messages m"
        " ON m.partition_id = f.partition_id AND m.id = f.message_id"
        " WHERE f.status = 'dead_letter'").fetchall()
    return {r[0]: (r[1], r[2], r[3]) for r in rows}


def test_ttl_dead_letters_messages_nobody_popped_in_bounded_steps(conn: Conn) -> None:
    make_queue(conn, "q", ttl=60, lease_time=60)
    push_n(conn, "q", 3, partition="a")
    push_n(conn, "q", 2, partition="b")
    assert numbers(cursors.pop(conn, "q", partition="b", batch=1)) == [0]  # b leased
    conn.execute("UPDATE queen.cursor_messages SET created_at = now() - interval '2 minutes'")
    push_n(conn, "q", 1, partition="a", start=3)  # young: stays
    ttl = "SELECT queen.cursor_maintain_ttl(%s)"
    assert conn.execute(ttl, [2]).fetchone() == (2,)
    assert conn.execute(ttl, [10]).fetchone() == (1,)
    assert conn.execute(ttl, [10]).fetchone() == (0,)  # b's lease holds its messages
    assert ttl_dead_letters(conn) == {
        f"q-a-{i}": ("__queue__", "ttl expired", 0) for i in range(3)
    }
    assert numbers(cursors.pop(conn, "q", partition="a", batch=10)) == [3]
    expire_leases_now(conn)
    assert conn.execute(ttl, [10]).fetchone() == (0,)  # expired, not ended yet
    assert cursors.expire_leases(conn) == 2  # (a and b)
    assert conn.execute(ttl, [10]).fetchone() == (2,)  # b-0 was delivered once
    dead = ttl_dead_letters(conn)
    assert (dead["q-b-0"], dead["q-b-1"]) == (("__queue__", "ttl expired", 1),
                                              ("__queue__", "ttl expired", 0))


def test_ttl_applies_to_each_group_from_its_cursor(conn: Conn) -> None:
    make_queue(conn, "q", ttl=60)
    push_n(conn, "q", 2)
    ack_all(conn, cursors.pop(conn, "q", group="g", batch=1))  # g is past q-Default-0
    conn.execute("UPDATE queen.cursor_messages SET created_at = now() - interval '2 minutes'")
    assert conn.execute("SELECT queen.cursor_maintain_ttl(10)").fetchone() == (3,)
    got = conn.execute(
        "SELECT f.consumer_group, m.transaction_id FROM queen.cursor_failures f"
        " JOIN queen.cursor_messages m ON m.partition_id = f.partition_id AND m.id = f.message_id"
        " WHERE f.status = 'dead_letter' ORDER BY 1, 2").fetchall()
    assert got == [("__queue__", "q-Default-0"), ("__queue__", "q-Default-1"),
                   ("g", "q-Default-1")]


def test_retention_deletes_old_messages_and_consumed_ones(conn: Conn) -> None:
    make_queue(conn, "q", retention_enabled=True, retention_seconds=7200,
               completed_retention_seconds=60)
    make_queue(conn, "kept", retention_enabled=False, retention_seconds=1)
    push_n(conn, "q", 4)
    push_n(conn, "kept", 1)
    ack_all(conn, cursors.pop(conn, "q", batch=2))  # 0 and 1 consumed by queue mode
    cursors.pop(conn, "q", group="g", batch=1)  # g has consumed nothing
    conn.execute("UPDATE queen.cursor_messages SET created_at = now() - interval '1 hour'")
    # g is active and behind: it holds back completed retention.
    assert cursors.retention(conn) == 0
    conn.execute("UPDATE queen.cursor_messages SET created_at = now() - interval '3 hours'")
    assert cursors.retention(conn, limit=3) == 3  # past retentionSeconds, whatever was done
    assert cursors.retention(conn) == 1
    assert conn.execute(
        "SELECT transaction_id FROM queen.cursor_messages").fetchall() == [("kept-Default-0",)]


def test_a_group_idle_past_retention_no_longer_holds_messages(conn: Conn) -> None:
    make_queue(conn, "q", retention_enabled=True, retention_seconds=7200,
               completed_retention_seconds=60)
    push_n(conn, "q", 2)
    ack_all(conn, cursors.pop(conn, "q", batch=2))
    cursors.pop(conn, "q", group="idle")
    conn.execute("UPDATE queen.cursor_messages SET created_at = now() - interval '1 hour'")
    conn.execute("UPDATE queen.cursor_consumers SET updated_at = now() - interval '3 hours'"
                 " WHERE consumer_group = 'idle'")
    assert cursors.retention(conn) == 2


def flush_statistics(conn: Conn) -> None:
    """Make this session's table counts visible now (they are otherwise sent each second)."""
    conn.execute("SELECT pg_stat_force_next_flush()")
    conn.execute("SELECT 1")


def test_analyze_runs_on_the_tables_that_changed(conn: Conn) -> None:
    cursors.push(conn, [{"queue": "q", "payload": i} for i in range(50)])
    flush_statistics(conn)
    assert cursors.analyze(conn, min_changes=10) == ["cursor_messages"]
    flush_statistics(conn)
    assert cursors.analyze(conn, min_changes=10) == []
    analysed = conn.execute(
        "SELECT last_analyze IS NOT NULL FROM pg_stat_user_tables"
        " WHERE relname = 'cursor_messages'").fetchone()
    assert analysed == (True,)


def test_an_analysed_table_is_left_to_autovacuum_where_it_runs(conn: Conn) -> None:
    autovacuum = conn.execute("SELECT current_setting('autovacuum')::boolean").fetchone()
    cursors.push(conn, [{"queue": "q", "payload": i} for i in range(50)])
    flush_statistics(conn)
    assert cursors.analyze(conn, min_changes=10) == ["cursor_messages"]  # never analysed
    cursors.push(conn, [{"queue": "q", "payload": i} for i in range(50)])
    flush_statistics(conn)
    assert cursors.analyze(conn, min_changes=10) == ([] if autovacuum == (True,)
                                                     else ["cursor_messages"])
    conn.execute("ALTER TABLE queen.cursor_messages SET (autovacuum_enabled = off)")
    cursors.push(conn, [{"queue": "q", "payload": i} for i in range(50)])
    flush_statistics(conn)
    assert cursors.analyze(conn, min_changes=10) == ["cursor_messages"]  # opted out


def test_a_table_emptied_by_truncate_is_analysed_again_once_it_fills(conn: Conn) -> None:
    cursors.push(conn, [{"queue": "q", "payload": i} for i in range(50)])
    flush_statistics(conn)
    assert cursors.analyze(conn, min_changes=10) == ["cursor_messages"]
    conn.execute("TRUNCATE queen.cursor_messages")
    cursors.push(conn, [{"queue": "q", "payload": i} for i in range(5)])
    flush_statistics(conn)
    assert cursors.analyze(conn, min_changes=10) == []  # (too few changes yet)
    cursors.push(conn, [{"queue": "q", "payload": i} for i in range(50)])
    flush_statistics(conn)
    assert cursors.analyze(conn, min_changes=10) == ["cursor_messages"]  # its size unknown
    flush_statistics(conn)
    assert cursors.analyze(conn, min_changes=10) == []


def test_a_table_grown_to_twice_its_statistics_is_analysed_again(conn: Conn) -> None:
    autovacuum = conn.execute("SELECT current_setting('autovacuum')::boolean").fetchone()
    cursors.push(conn, [{"queue": "q", "payload": i} for i in range(100)])
    flush_statistics(conn)
    assert cursors.analyze(conn, min_changes=10) == ["cursor_messages"]  # 100 rows
    cursors.push(conn, [{"queue": "q", "payload": i} for i in range(90)])
    flush_statistics(conn)
    assert cursors.analyze(conn, min_changes=10) == ([] if autovacuum == (True,)
                                                     else ["cursor_messages"])
    cursors.push(conn, [{"queue": "q", "payload": i} for i in range(20)])
    flush_statistics(conn)
    assert "cursor_messages" in cursors.analyze(conn, min_changes=10)  # 210 > 2 x 100


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
    """Rows the nodes on queen.cursor_failures produced over all their loops."""
    own = plan.get("Relation Name") == "cursor_failures"
    read = int(plan["Actual Rows"] * plan["Actual Loops"]) if own else 0
    return read + sum(_failure_rows_read(child) for child in plan.get("Plans", []))


def test_the_counts_walk_reads_each_failure_record_once(conn: Conn) -> None:
    """Dead letters pile up in a partition; the walk over what queue mode's cursor passed
    reads each of their records once, not every record of the partition per message
    (that made a counts step quadratic in the partition's dead letters)."""
    make_queue(conn, "q", retry_limit=0)  # a failed ack dead-letters the message at once
    push_n(conn, "q", 300)
    dead = 0
    while got := cursors.pop(conn, "q", batch=100):
        failed = got[1::3]
        dead += len(failed)
        ack_all(conn, [d for d in got if d not in failed])
        ack_all(conn, failed, status="failed")
    assert dead == 99
    (partition,) = conn.execute("SELECT id FROM queen.partitions").fetchone() or ()
    (plan,) = (
        conn.execute(
            "EXPLAIN (ANALYZE, FORMAT JSON)"
            " SELECT * FROM queen.cursor_passed_ends(%s, 0, %s, 5000)",
            (partition, 2**62),
        ).fetchone()
        or ()
    )
    ends = conn.execute(
        "SELECT final, sum(n) FROM queen.cursor_passed_ends(%s, 0, %s, 5000) GROUP BY 1",
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
        got = cursors.pop(conn, "q", batch=size)
        for outcome in [*ack_all(conn, got[failing:]), *ack_all(conn, got[:failing], "failed")]:
            final[outcome.transaction_id] = outcome.status
    push_n(conn, "q", 7, start=40)  # passed by the seek below, never acked
    conn.execute("SELECT queen.cursor_seek('q', '__queue__', 'end')")
    (partition, cursor) = conn.execute(
        "SELECT partition_id, cursor_id FROM queen.cursor_consumers"
        " WHERE consumer_group = '__queue__'").fetchone() or (None, 0)
    ends = dict(conn.execute(
        "SELECT coalesce(final, 'completed'), sum(n)::integer"
        " FROM queen.cursor_passed_ends(%s, 0, %s, 5000) GROUP BY 1", (partition, cursor)
    ).fetchall())
    (passed,) = conn.execute(
        "SELECT count(*)::integer FROM queen.cursor_messages WHERE id <= %s", (cursor,)
    ).fetchone() or (0,)
    decided = [s for s in final.values() if s != "retry_scheduled"]
    assert passed == 47 and sum(ends.values()) == passed
    assert ends.get("dead_letter", 0) == decided.count("dead_letter") > 0
    assert ends["completed"] == decided.count("completed") + (passed - len(decided))
    (completed, histogram) = conn.execute(
        "SELECT sum(completed)::integer, sum((SELECT sum(b) FROM unnest(lag_hist) b))::integer"
        " FROM queen.cursor_activity_walk(%s, 0, 0, %s, 5000)", (partition, cursor)
    ).fetchone() or (0, 0)
    assert completed == histogram == ends["completed"]
