"""Consumer groups: subscription modes, listing, seek and delete."""

from __future__ import annotations

import datetime as dt
from typing import Any

import psycopg
import pytest

from queen.store import lifecycle
from tests.integration.helpers import ack_all, conn, numbers, push_n

__all__ = ["conn"]  # the fixture

Conn = psycopg.Connection[Any]


def backdate(conn: Conn, hours: int) -> None:
    """Make every message so far older by hours."""
    conn.execute("UPDATE queen.messages SET created_at = created_at - %s * interval '1 hour'",
                 (hours,))


def test_mode_all_reads_history_and_new_reads_only_what_comes(conn: Conn) -> None:
    push_n(conn, "q", 2)
    assert numbers(lifecycle.pop(conn, "q", group="all", mode="all", batch=10)) == [0, 1]
    assert lifecycle.pop(conn, "q", group="new", mode="new", batch=10) == []
    push_n(conn, "q", 1, start=2)
    assert numbers(lifecycle.pop(conn, "q", group="new", mode="new", batch=10)) == [2]


def test_subscription_applies_at_the_first_pop_only(conn: Conn) -> None:
    push_n(conn, "q", 1)
    assert lifecycle.pop(conn, "q", group="g", mode="new") == []
    # A later "all" does not take the group back to history.
    assert lifecycle.pop(conn, "q", group="g", mode="all") == []
    assert [(g.consumer_group, g.subscription_mode) for g in lifecycle.groups(conn, "q")] == [
        ("g", "new")]


def test_mode_new_covers_partitions_created_later(conn: Conn) -> None:
    push_n(conn, "q", 1, partition="old")
    assert lifecycle.pop(conn, "q", group="g", mode="new") == []
    push_n(conn, "q", 2, partition="later")
    assert numbers(lifecycle.pop(conn, "q", group="g", batch=10)) == [0, 1]


def test_subscription_from_a_time(conn: Conn) -> None:
    push_n(conn, "q", 2)
    backdate(conn, 2)
    push_n(conn, "q", 2, start=2)
    since = dt.datetime.now(dt.UTC) - dt.timedelta(hours=1)
    got = lifecycle.pop(conn, "q", group="g", since=since, batch=10)
    assert numbers(got) == [2, 3]
    assert lifecycle.groups(conn, "q")[0].subscription_mode == "from"


def test_groups_list_partitions_pending_and_lag(conn: Conn) -> None:
    push_n(conn, "q", 3, partition="a")
    push_n(conn, "q", 2, partition="b")
    backdate(conn, 1)
    ack_all(conn, lifecycle.pop(conn, "q", partition="a", batch=2))
    lifecycle.pop(conn, "q", group="g", partition="b", batch=1)  # leased, not acked
    listed = {g.consumer_group: g for g in lifecycle.groups(conn)}
    assert set(listed) == {"__queue__", "g"}
    queue_mode, g = listed["__queue__"], listed["g"]
    # Pending counts every partition, also those where the group has no cursor yet.
    assert (queue_mode.queue, queue_mode.partitions, queue_mode.pending) == ("q", 1, 3)
    assert (g.partitions, g.pending) == (1, 5)
    assert 3500 < g.lag_seconds < 3700
    assert lifecycle.groups(conn, "other") == []


def test_seek_to_the_end_skips_the_backlog(conn: Conn) -> None:
    push_n(conn, "q", 3)
    lifecycle.pop(conn, "q", group="g", batch=1)  # a lease, ended by the seek
    assert lifecycle.seek(conn, "q", "g", "end") == 1
    assert lifecycle.pop(conn, "q", group="g") == []
    push_n(conn, "q", 1, start=3)
    assert numbers(lifecycle.pop(conn, "q", group="g")) == [3]


def test_seek_ends_the_lease_so_its_acks_are_stale(conn: Conn) -> None:
    push_n(conn, "q", 1)
    got = lifecycle.pop(conn, "q", group="g")
    lifecycle.seek(conn, "q", "g", "beginning")
    assert ack_all(conn, got)[0].status == "lease_expired"
    assert numbers(lifecycle.pop(conn, "q", group="g")) == [0]


def test_seek_to_the_beginning_replays_and_to_a_time_starts_there(conn: Conn) -> None:
    push_n(conn, "q", 2)
    backdate(conn, 2)
    push_n(conn, "q", 2, start=2)
    ack_all(conn, lifecycle.pop(conn, "q", group="g", batch=10))
    assert lifecycle.seek(conn, "q", "g", "beginning") == 1
    assert numbers(lifecycle.pop(conn, "q", group="g", batch=10)) == [0, 1, 2, 3]
    lifecycle.seek(conn, "q", "g", "time", dt.datetime.now(dt.UTC) - dt.timedelta(hours=1))
    assert numbers(lifecycle.pop(conn, "q", group="g", batch=10)) == [2, 3]


def test_seek_of_an_unknown_queue_and_bad_arguments(conn: Conn) -> None:
    assert lifecycle.seek(conn, "nope", "g", "end") is None
    with pytest.raises(ValueError):
        lifecycle.seek(conn, "q", "g", "time")


def test_deleted_group_starts_over_at_its_next_pop(conn: Conn) -> None:
    make = push_n(conn, "q", 2)
    assert len(make) == 2
    ack_all(conn, lifecycle.pop(conn, "q", group="g", batch=10))
    ack_all(conn, lifecycle.pop(conn, "q", batch=1), status="failed")
    assert lifecycle.delete_group(conn, "q", "g") == 1
    assert [g.consumer_group for g in lifecycle.groups(conn, "q")] == ["__queue__"]
    assert numbers(lifecycle.pop(conn, "q", group="g", batch=10)) == [0, 1]
    # Queue mode kept its own state (its retry of message 0).
    again = lifecycle.pop(conn, "q", batch=10)
    assert numbers(again) == [0, 1] and again[0].retry_count == 1
    assert lifecycle.delete_group(conn, "q", "unknown") == 0


def test_one_ack_batch_settles_queue_mode_and_groups_each_in_its_own(conn: Conn) -> None:
    """A batch naming queue mode and two groups (as fused acks of their consumers do):
    each item is decided in its own group, and each group's lease ends."""
    push_n(conn, "q", 3)
    got = [d for g in ("__queue__", "a", "b") for d in lifecycle.pop(conn, "q", group=g, batch=3)]
    outcomes = lifecycle.ack(conn, [  # queue mode's items name no group
        {"transactionId": d.transaction_id, "status": "completed", "leaseId": str(d.lease_id),
         **({} if d.consumer_group == "__queue__" else {"consumerGroup": d.consumer_group})}
        for d in got
    ])
    assert [(o.consumer_group, o.status) for o in outcomes] == [
        (g, "completed") for g in ("__queue__", "a", "b") for _ in range(3)
    ]
    assert all(lifecycle.pop(conn, "q", group=g, batch=3) == [] for g in ("__queue__", "a", "b"))
