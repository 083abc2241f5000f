"""Maintenance of the cursor store: lease expiry by batches, retention, ANALYZE."""

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
