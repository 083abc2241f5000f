"""Bounded backlogs of consumer groups, and acknowledgments that say whether they applied."""

from __future__ import annotations

from typing import Any

import psycopg

from queen.store import lifecycle
from tests.integration.helpers import ack_all, conn, push_n

__all__ = ["conn"]  # the fixture

Conn = psycopg.Connection[Any]


def test_backlogs_are_counted_up_to_the_cap(conn: Conn) -> None:
    push_n(conn, "q", 30, partition="a")
    push_n(conn, "q", 5, partition="b")
    lifecycle.pop(conn, "q", group="g", partition="a", batch=1)
    (summary,) = lifecycle.group_summaries(conn, "q", cap=10)
    assert (summary.pending, summary.capped, summary.partitions) == (15, True, 1)
    (exact,) = lifecycle.group_summaries(conn, "q", cap=100)
    assert (exact.pending, exact.capped) == (35, False)
    rows = {p.partition: p for p in lifecycle.group_partitions(conn, "g", "q", cap=10)}
    assert (rows["a"].pending, rows["a"].capped) == (10, True)
    assert (rows["b"].pending, rows["b"].capped, rows["b"].cursor_id) == (5, False, None)


def test_a_request_shares_its_budget_among_its_partitions(conn: Conn) -> None:
    for partition in "abcd":
        push_n(conn, "q", 30, partition=partition)
    lifecycle.pop(conn, "q", group="g", partition="a", batch=1)
    (shared,) = lifecycle.group_summaries(conn, "q", cap=100, budget=80)  # 20 a partition
    assert (shared.pending, shared.capped) == (80, True)
    (least,) = lifecycle.group_summaries(conn, "q", cap=100, budget=1)  # never under 10
    assert (least.pending, least.capped) == (40, True)
    (enough,) = lifecycle.group_summaries(conn, "q", cap=100, budget=1000)
    assert (enough.pending, enough.capped) == (120, False)


def test_a_group_counts_from_where_its_subscription_starts(conn: Conn) -> None:
    push_n(conn, "q", 3, partition="old")
    assert lifecycle.pop(conn, "q", group="late", mode="new") == []
    push_n(conn, "q", 2, partition="old", start=3)
    push_n(conn, "q", 4, partition="later")  # no cursor there yet: counted from the mode
    rows = {p.partition: p for p in lifecycle.group_partitions(conn, "late", "q")}
    assert rows["old"].pending == 2
    assert (rows["later"].pending, rows["later"].cursor_id) == (4, None)
    (summary,) = lifecycle.group_summaries(conn, "q", "late")
    assert (summary.subscription_mode, summary.pending) == ("new", 6)


def test_done_messages_and_leases_show_in_the_partition_rows(conn: Conn) -> None:
    push_n(conn, "q", 3)
    got = lifecycle.pop(conn, "q", group="g", batch=3, worker="w1")
    ack_all(conn, got[1:])  # acked past the head: done, the lease goes on
    (row,) = lifecycle.group_partitions(conn, "g", "q")
    assert (row.pending, row.lease_id, row.leased_by, row.lease_size) == (
        1, got[0].lease_id, "w1", 3,
    )
    assert row.lag_seconds >= 0
    ack_all(conn, got[:1])
    (row,) = lifecycle.group_partitions(conn, "g", "q")
    assert (row.pending, row.lease_id, row.lag_seconds) == (0, None, 0)
    assert lifecycle.group_partitions(conn, "nobody", "q") == []


def test_checked_acks_say_what_applied(conn: Conn) -> None:
    push_n(conn, "q", 2)
    got = lifecycle.pop(conn, "q", batch=2)
    acks = [{"transactionId": d.transaction_id, "status": "completed",
             "leaseId": str(d.lease_id)} for d in got]
    first = lifecycle.ack_checked(conn, acks[:1])
    assert [(o.status, o.applied, o.reason) for o in first] == [("completed", True, None)]
    again = lifecycle.ack_checked(conn, acks[:1] + [{"transactionId": "nope", "status": "completed"}])
    assert [(o.status, o.applied, o.reason) for o in again] == [
        ("completed", False, "already_completed"), ("not_found", False, "not_found")]
    stale = dict(acks[1], leaseId="00000000-0000-0000-0000-000000000000")
    assert [(o.status, o.applied, o.reason) for o in lifecycle.ack_checked(conn, [stale])] == [
        ("leased_by_other", False, "leased_by_other")]
    assert lifecycle.queues_of(conn, [d.transaction_id for d in got] + ["nope"]) == {
        d.transaction_id: "q" for d in got}
