"""Push, pop and ack: FIFO per partition and group, leases, retries."""

from __future__ import annotations

import threading
import time
import uuid
from typing import Any

import psycopg
import pytest

from queen.errors import InvalidInput
from queen.store import lifecycle
from queen.store.db import QUERIES
from tests.integration.helpers import (
    ack_all,
    conn,
    expire_leases_now,
    make_queue,
    numbers,
    push_n,
)

__all__ = ["conn"]  # the fixture

Conn = psycopg.Connection[Any]


def test_push_pop_ack_round_trip(conn: Conn) -> None:
    results = lifecycle.push(conn, [
        {"queue": "q", "payload": {"n": 0}, "transactionId": "a"},
        {"queue": "q", "partition": "p2", "payload": {"n": 1}},
        {"queue": "q", "payload": {"n": 2}, "traceId": "trace-1"},
    ], producer="svc")
    assert [(r.position, r.status) for r in results] == [(1, "queued"), (2, "queued"), (3, "queued")]
    assert results[0].transaction_id == "a" and results[1].transaction_id
    got = lifecycle.pop(conn, "q", partition="Default", batch=10, worker="w1")
    assert numbers(got) == [0, 2]
    first = got[0]
    assert (first.queue, first.partition, first.consumer_group) == ("q", "Default", "__queue__")
    assert (first.producer, got[1].trace_id, first.retry_count) == ("svc", "trace-1", 0)
    assert got[0].lease_id == got[1].lease_id and first.lease_expires_at > first.created_at
    assert lifecycle.pop(conn, "q", partition="Default") == []  # leased
    outcomes = ack_all(conn, got)
    assert [(o.position, o.status) for o in outcomes] == [(1, "completed"), (2, "completed")]
    assert lifecycle.pop(conn, "q", partition="Default") == []  # all done
    assert numbers(lifecycle.pop(conn, "q", batch=10)) == [1]  # by queue: the other partition


def test_pop_of_unknown_queue_or_partition_is_empty(conn: Conn) -> None:
    assert lifecycle.pop(conn, "nope") == []
    push_n(conn, "q", 1)
    assert lifecycle.pop(conn, "q", partition="nope") == []


def test_duplicates_by_transaction_id_store_nothing(conn: Conn) -> None:
    push_n(conn, "q", 2)
    results = lifecycle.push(conn, [
        {"queue": "q", "payload": {"n": 9}, "transactionId": "q-Default-1"},
        {"queue": "other", "payload": {"n": 8}, "transactionId": "fresh"},
        {"queue": "other", "payload": {"n": 7}, "transactionId": "fresh"},
    ])
    assert [r.status for r in results] == ["duplicate", "queued", "duplicate"]
    assert results[2].id == results[1].id  # the stored message's id
    assert numbers(lifecycle.pop(conn, "q", batch=10)) == [0, 1]
    assert numbers(lifecycle.pop(conn, "other", batch=10)) == [8]


def test_a_made_transaction_id_is_stored_nowhere_and_names_its_message(conn: Conn) -> None:
    # An item naming no transactionId gets one made of its partition's id and its own:
    # no column value, no entry in the unique index; it finds the message all the same.
    (made,) = lifecycle.push(conn, [{"queue": "q", "payload": {"n": 0}}])
    assert uuid.UUID(made.transaction_id).version == 8
    assert conn.execute("SELECT transaction_id FROM queen.messages").fetchall() == [(None,)]
    (size,) = conn.execute(
        "SELECT count(*) FROM queen.messages m"
        " WHERE m.transaction_id IS NOT NULL").fetchone() or (None,)
    assert size == 0
    assert conn.execute("SELECT id FROM queen.named(%s)", (made.transaction_id,)).fetchall() == [
        (made.id,)]
    (popped,) = lifecycle.pop(conn, "q")
    assert popped.transaction_id == made.transaction_id
    assert [r.status for r in lifecycle.ack(conn, [{"transactionId": made.transaction_id,
                                                    "status": "completed"}])] == ["completed"]


def test_a_clients_transaction_id_of_the_made_form_is_a_duplicate_or_refused(
        conn: Conn) -> None:
    # Sent again as a client's own, a made transactionId is its message's duplicate; one
    # of that form naming no stored message is refused (a 400), nothing stored, so that a
    # client's never equals one made later.
    (made,) = lifecycle.push(conn, [{"queue": "q", "payload": {"n": 0}}])
    again = lifecycle.push(conn, [{"queue": "q", "payload": {"n": 1},
                                   "transactionId": made.transaction_id},
                                  {"queue": "q", "payload": {"n": 2}, "transactionId": "own"}])
    assert [(r.status, r.id) for r in again] == [("duplicate", made.id), ("queued", again[1].id)]
    future = made.transaction_id[:-12] + f"{made.id + 1000:012x}"
    with pytest.raises(InvalidInput, match="has the form"), conn.transaction():
        lifecycle.push(conn, [{"queue": "q", "payload": {"n": 3}},
                              {"queue": "q", "payload": {"n": 4}, "transactionId": future}])
    assert numbers(lifecycle.pop(conn, "q", batch=10)) == [0, 2]
    # Another case, or a version 7 UUID, is a client's like any other.
    upper = lifecycle.push(conn, [{"queue": "q", "payload": {"n": 5},
                                   "transactionId": future.upper()}])
    assert [r.status for r in upper] == ["queued"]


def test_two_pushes_racing_with_one_transaction_id_store_one_message(db_dsn: str) -> None:
    rounds, racers = 10, 4
    for r in range(rounds):
        barrier = threading.Barrier(racers)
        statuses: list[str] = []

        def racer(
            i: int, r: int = r, barrier: threading.Barrier = barrier, statuses: list[str] = statuses
        ) -> None:
            with psycopg.connect(db_dsn, autocommit=True) as c:
                barrier.wait()
                (res,) = lifecycle.push(c, [{"queue": "q", "partition": f"p{i % 2}",
                                           "payload": {"i": i}, "transactionId": f"t{r}"}])
                statuses.append(res.status)

        threads = [threading.Thread(target=racer, args=(i,)) for i in range(racers)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(30)
        assert sorted(statuses) == ["duplicate"] * (racers - 1) + ["queued"]
    with psycopg.connect(db_dsn, autocommit=True) as c:
        assert c.execute("SELECT count(*) FROM queen.messages").fetchone() == (rounds,)


def test_max_size_rejects_items_past_the_room(conn: Conn) -> None:
    make_queue(conn, "q", max_size=3)
    push_n(conn, "q", 2)
    results = lifecycle.push(conn, [{"queue": "q", "payload": i} for i in range(3)])
    assert [r.status for r in results] == ["queued", "rejected", "rejected"]
    ack_all(conn, lifecycle.pop(conn, "q", batch=2))  # room again for two
    results = lifecycle.push(conn, [{"queue": "q", "payload": i} for i in range(3)])
    assert [r.status for r in results] == ["queued", "queued", "rejected"]


def test_max_size_counts_pending_messages_not_leased_ones(conn: Conn) -> None:
    make_queue(conn, "q", max_size=3, lease_time=60)
    push_n(conn, "q", 2)
    got = lifecycle.pop(conn, "q", batch=2)  # both processing: nothing pending
    lifecycle.ack(conn, [{"transactionId": got[0].transaction_id, "status": "failed",
                        "leaseId": str(got[0].lease_id)}])  # pending again, though leased
    results = lifecycle.push(conn, [{"queue": "q", "payload": i} for i in range(3)])
    assert [r.status for r in results] == ["queued", "queued", "rejected"]
    expire_leases_now(conn)  # the other one is pending again too: over the limit
    assert [r.status for r in lifecycle.push(conn, [{"queue": "q", "payload": 9}])] == ["rejected"]


def test_failed_message_is_redelivered_before_what_follows_it(conn: Conn) -> None:
    push_n(conn, "q", 5)
    got = lifecycle.pop(conn, "q", batch=3)
    lease = str(got[0].lease_id)
    outcomes = lifecycle.ack(conn, [
        {"transactionId": "q-Default-0", "status": "completed", "leaseId": lease},
        {"transactionId": "q-Default-1", "status": "failed", "error": "boom", "leaseId": lease},
        {"transactionId": "q-Default-2", "status": "completed", "leaseId": lease},
    ])
    assert [(o.status, o.retry_count) for o in outcomes] == [
        ("completed", 0), ("retry_scheduled", 1), ("completed", 0)]
    again = lifecycle.pop(conn, "q", batch=10)
    # 1 first, with its retry; 2 was completed in that lease and is not delivered again.
    assert numbers(again) == [1, 3, 4]
    assert [d.retry_count for d in again] == [1, 0, 0]
    ack_all(conn, again)
    assert lifecycle.pop(conn, "q", batch=10) == []
    assert conn.execute(
        "SELECT status, retry_count, error FROM queen.failures").fetchall() == [
        ("retry", 1, "boom")]


def test_lease_ends_only_when_every_message_is_acked(conn: Conn) -> None:
    push_n(conn, "q", 3)
    got = lifecycle.pop(conn, "q", batch=3)
    ack_all(conn, got[2:])
    assert lifecycle.pop(conn, "q") == []  # still leased
    ack_all(conn, got[:1])
    assert lifecycle.pop(conn, "q") == []
    ack_all(conn, got[1:2])
    push_n(conn, "q", 1, start=3)
    assert numbers(lifecycle.pop(conn, "q", batch=10)) == [3]


def test_expired_lease_redelivers_the_unacked_in_order_with_a_retry(conn: Conn) -> None:
    push_n(conn, "q", 4)
    got = lifecycle.pop(conn, "q", batch=3)
    ack_all(conn, got[1:2])  # message 1 done, 0 and 2 not
    expire_leases_now(conn)
    assert lifecycle.expire_leases(conn) == 1
    again = lifecycle.pop(conn, "q", batch=10)
    assert numbers(again) == [0, 2, 3]
    assert [d.retry_count for d in again] == [1, 1, 0]


def test_pop_takes_over_an_expired_lease_without_maintenance(conn: Conn) -> None:
    push_n(conn, "q", 2)
    first = lifecycle.pop(conn, "q", batch=2, worker="a")
    expire_leases_now(conn)
    second = lifecycle.pop(conn, "q", batch=2, worker="b")
    assert numbers(second) == [0, 1] and second[0].lease_id != first[0].lease_id
    assert [d.retry_count for d in second] == [1, 1]


def test_real_lease_expiry_with_a_short_lease_time(conn: Conn) -> None:
    make_queue(conn, "q", lease_time=1)
    push_n(conn, "q", 1)
    assert numbers(lifecycle.pop(conn, "q")) == [0]
    assert lifecycle.pop(conn, "q") == []
    deadline = time.monotonic() + 30
    while not (again := lifecycle.pop(conn, "q")):
        assert time.monotonic() < deadline, "the lease of 1 s never expired"
        time.sleep(0.2)
    assert numbers(again) == [0] and again[0].retry_count == 1


def test_stale_ack_changes_nothing(conn: Conn) -> None:
    push_n(conn, "q", 2)
    old = lifecycle.pop(conn, "q", batch=2, worker="slow")
    expire_leases_now(conn)
    new = lifecycle.pop(conn, "q", batch=2, worker="fast")
    before = conn.execute("SELECT * FROM queen.consumers").fetchall()
    outcomes = ack_all(conn, old)  # the messages went to another consumer
    assert [o.status for o in outcomes] == ["leased_by_other", "leased_by_other"]
    assert ack_all(conn, old, status="failed")[0].status == "leased_by_other"
    assert conn.execute("SELECT * FROM queen.consumers").fetchall() == before
    assert [o.status for o in ack_all(conn, new)] == ["completed", "completed"]
    # Once done, a late ack of the old lease still changes nothing: it reports them done.
    done = conn.execute("SELECT * FROM queen.consumers").fetchall()
    assert ack_all(conn, old)[0].status == "completed"
    assert conn.execute("SELECT * FROM queen.consumers").fetchall() == done


def test_ack_without_lease_id_uses_the_current_lease(conn: Conn) -> None:
    push_n(conn, "q", 2)
    lifecycle.pop(conn, "q", batch=1)
    outcomes = lifecycle.ack(conn, [
        {"transactionId": "q-Default-0", "status": "completed"},
        {"transactionId": "q-Default-1", "status": "completed"},  # not leased
        {"transactionId": "missing", "status": "completed"},
    ])
    assert [o.status for o in outcomes] == ["completed", "not_leased", "not_found"]
    # Acking a done message again reports it done.
    assert lifecycle.ack(conn, [{"transactionId": "q-Default-0", "status": "failed"}])[0].status == (
        "completed")


def test_dead_letter_after_retry_limit(conn: Conn) -> None:
    make_queue(conn, "q", retry_limit=2)
    push_n(conn, "q", 2)
    seen = []
    for _ in range(3):
        got = lifecycle.pop(conn, "q", batch=1)
        seen.append((numbers(got), got[0].retry_count))
        (outcome,) = ack_all(conn, got, status="failed")
    assert seen == [([0], 0), ([0], 1), ([0], 2)]
    assert (outcome.status, outcome.retry_count) == ("dead_letter", 2)
    assert numbers(lifecycle.pop(conn, "q")) == [1]
    assert conn.execute(
        "SELECT message_id, status, retry_count, error FROM queen.failures").fetchall() == [
        (1, "dead_letter", 2, "boom")]


def test_failed_for_good_without_dead_letter_queue(conn: Conn) -> None:
    make_queue(conn, "q", retry_limit=0, dlq_after_max_retries=False)
    push_n(conn, "q", 1)
    (outcome,) = ack_all(conn, lifecycle.pop(conn, "q"), status="failed")
    assert outcome.status == "failed"
    assert lifecycle.pop(conn, "q") == []


def test_expiry_past_the_retry_limit_dead_letters(conn: Conn) -> None:
    make_queue(conn, "q", retry_limit=0)
    push_n(conn, "q", 2)
    lifecycle.pop(conn, "q", batch=1)
    expire_leases_now(conn)
    assert lifecycle.expire_leases(conn) == 1
    assert numbers(lifecycle.pop(conn, "q")) == [1]
    assert conn.execute("SELECT status, error FROM queen.failures").fetchall() == [
        ("dead_letter", "lease expired")]


def test_lease_extension(conn: Conn) -> None:
    push_n(conn, "q", 1)
    (got,) = lifecycle.pop(conn, "q")
    extended = lifecycle.extend(conn, got.lease_id, 600)
    assert extended is not None and extended > got.lease_expires_at
    assert lifecycle.extend(conn, uuid.uuid4(), 600) is None
    ack_all(conn, [got])
    assert lifecycle.extend(conn, got.lease_id, 600) is None  # ended


def test_an_expired_lease_cannot_be_extended(conn: Conn) -> None:
    push_n(conn, "q", 1)
    (got,) = lifecycle.pop(conn, "q")
    expire_leases_now(conn)
    assert lifecycle.extend(conn, got.lease_id, 600) is None


def test_retry_delay_holds_the_partition(conn: Conn) -> None:
    make_queue(conn, "q", retry_delay=60_000)
    push_n(conn, "q", 2, partition="a")
    push_n(conn, "q", 1, partition="b")
    ack_all(conn, lifecycle.pop(conn, "q", partition="a", batch=1), status="failed")
    assert lifecycle.pop(conn, "q", partition="a") == []  # held, with its later message
    assert numbers(lifecycle.pop(conn, "q", batch=5)) == [0]  # partition b still served
    conn.execute("UPDATE queen.consumers SET not_before = now() - interval '1 second'")
    again = lifecycle.pop(conn, "q", partition="a", batch=5)
    assert numbers(again) == [0, 1] and again[0].retry_count == 1


def test_short_retry_delay_passes(conn: Conn) -> None:
    make_queue(conn, "q", retry_delay=300)
    push_n(conn, "q", 1)
    ack_all(conn, lifecycle.pop(conn, "q"), status="failed")
    deadline = time.monotonic() + 30
    while not (again := lifecycle.pop(conn, "q")):
        assert time.monotonic() < deadline, "a retryDelay of 300 ms never passed"
        time.sleep(0.1)
    assert again[0].retry_count == 1


def test_delayed_processing_and_window_buffer_hide_messages(conn: Conn) -> None:
    make_queue(conn, "delayed", delayed_processing=3600)
    make_queue(conn, "windowed", window_buffer=3600)
    push_n(conn, "delayed", 1)
    push_n(conn, "windowed", 1)
    assert lifecycle.pop(conn, "delayed") == []
    assert lifecycle.pop(conn, "windowed") == []
    conn.execute("UPDATE queen.queues SET delayed_processing = 0, window_buffer = 0")
    assert numbers(lifecycle.pop(conn, "delayed")) == [0]
    assert numbers(lifecycle.pop(conn, "windowed")) == [0]


def test_messages_past_ttl_are_dead_lettered_not_delivered(conn: Conn) -> None:
    make_queue(conn, "q", ttl=60)
    push_n(conn, "q", 3)
    conn.execute("UPDATE queen.messages SET created_at = now() - interval '1 hour'"
                 " WHERE transaction_id <> 'q-Default-2'")
    assert numbers(lifecycle.pop(conn, "q", batch=1)) == [2]
    assert conn.execute(
        "SELECT message_id, status, error FROM queen.failures ORDER BY 1").fetchall() == [
        (1, "dead_letter", "ttl expired"), (2, "dead_letter", "ttl expired")]


def test_a_push_is_written_once_however_many_groups_read_it(conn: Conn) -> None:
    push_n(conn, "q", 3)
    for group in ["__queue__", "g1", "g2", "g3"]:
        got = lifecycle.pop(conn, "q", group=group, batch=10)
        assert numbers(got) == [0, 1, 2] and {d.consumer_group for d in got} == {group}
        ack_all(conn, got)
    assert conn.execute("SELECT count(*) FROM queen.messages").fetchone() == (3,)
    assert conn.execute("SELECT count(*) FROM queen.completions").fetchone() == (4,)


def test_another_group_reads_the_same_messages_independently(conn: Conn) -> None:
    push_n(conn, "q", 2)
    mine = lifecycle.pop(conn, "q", batch=1)
    theirs = lifecycle.pop(conn, "q", group="g", batch=2)
    assert numbers(mine) == [0] and numbers(theirs) == [0, 1]
    ack_all(conn, theirs, status="failed")
    ack_all(conn, mine)
    assert numbers(lifecycle.pop(conn, "q", batch=5)) == [1]
    again = lifecycle.pop(conn, "q", group="g", batch=5)
    assert numbers(again) == [0, 1] and [d.retry_count for d in again] == [1, 1]


def test_one_completion_record_per_acked_batch(conn: Conn) -> None:
    push_n(conn, "q", 100)
    ack_all(conn, lifecycle.pop(conn, "q", batch=100))
    assert conn.execute(
        "SELECT first_id, last_id, acked FROM queen.completions").fetchall() == [(1, 100, 100)]


def test_no_update_of_the_message_table_over_a_full_lifecycle(conn: Conn) -> None:
    make_queue(conn, "q", retry_limit=1)
    push_n(conn, "q", 6, partition="a")
    push_n(conn, "q", 6, partition="b")
    got = lifecycle.pop(conn, "q", partition="a", batch=3)
    ack_all(conn, got[:1])
    ack_all(conn, got[1:], status="failed")
    expire_leases_now(conn)
    lifecycle.expire_leases(conn)
    for group in ["__queue__", "g"]:
        while got := lifecycle.pop(conn, "q", group=group, batch=4):
            ack_all(conn, got[:2], status="failed")
            ack_all(conn, got[2:])
    lifecycle.extend(conn, uuid.uuid4(), 5)
    lifecycle.seek(conn, "q", "g", "beginning")
    lifecycle.delete_group(conn, "q", "g")
    conn.execute("SELECT pg_stat_force_next_flush()")  # this session's counts, at commit
    conn.execute("SELECT 1")
    conn.execute("SELECT pg_stat_clear_snapshot()")
    counts = conn.execute(
        "SELECT n_tup_ins, n_tup_upd, n_tup_hot_upd FROM pg_stat_user_tables"
        " WHERE relname = 'messages'").fetchone()
    assert counts == (12, 0, 0)  # (the inserts show that the counts have arrived)


def test_calls_compose_in_one_transaction(conn: Conn) -> None:
    push_n(conn, "in", 1)
    (got,) = lifecycle.pop(conn, "in")
    try:
        with conn.transaction():
            ack_all(conn, [got])
            lifecycle.push(conn, [{"queue": "out", "payload": 1, "transactionId": "o"}])
            raise RuntimeError("roll back")
    except RuntimeError:
        pass
    assert lifecycle.pop(conn, "out") == []
    assert lifecycle.pop(conn, "in") == []  # still leased: the ack was rolled back
    with conn.transaction():
        ack_all(conn, [got])
        lifecycle.push(conn, [{"queue": "out", "payload": 1, "transactionId": "o"}])
    assert [d.transaction_id for d in lifecycle.pop(conn, "out")] == ["o"]


def test_pop_taking_over_an_expired_lease_skips_what_it_dead_lettered(conn: Conn) -> None:
    make_queue(conn, "q", retry_limit=0)
    push_n(conn, "q", 3)
    lifecycle.pop(conn, "q", batch=2)
    expire_leases_now(conn)
    assert numbers(lifecycle.pop(conn, "q", batch=10)) == [2]


def test_the_pop_and_ack_routes_commit_without_waiting_for_the_disk(conn: Conn) -> None:
    # Pushes stay durable once answered; a claim or an ack a crash forgets only makes the
    # message be delivered again (at-least-once).
    def setting() -> str:
        (value,) = conn.execute("SELECT current_setting('synchronous_commit')").fetchone() or ("",)
        return str(value)

    assert setting() == "on"
    with conn.transaction():
        conn.execute("SELECT count(*) FROM queen.push(%s::jsonb)",
                     ('[{"queue": "q", "payload": 1}]',))
        assert setting() == "on"
    with conn.transaction():
        (txid,) = conn.execute(
            "SELECT (message).transaction_id FROM queen.pop_many(%s::jsonb)",
            ('[{"kind": "queue", "queue": "q", "group": "__queue__", "batch": 1,'
             ' "worker": "w"}]',)).fetchone() or (None,)
        assert setting() == "off"
    assert setting() == "on"  # (for that transaction only)
    with conn.transaction():
        (status,) = conn.execute(
            "SELECT status FROM queen.ack(%s::jsonb)",
            (f'[{{"transactionId": "{txid}", "status": "completed"}}]',)).fetchone() or (None,)
        assert (status, setting()) == ("completed", "off")
    assert setting() == "on"
    conn.execute("SELECT count(*) FROM queen.push(%s::jsonb)",
                 ('[{"queue": "q", "payload": 2}]',))
    one = {"kind": "queue", "queue": "q", "partition": None, "namespace": None, "task": None,
           "group": "__queue__", "batch": 1, "worker": "w", "mode": None, "since": None,
           "prefer": None}
    for found in (1, 0):  # a call of one pop (the route's own statement); then none left
        with conn.transaction():
            rows = conn.execute(QUERIES["pop_one"], {**one, "lease": str(uuid.uuid4())}).fetchall()
            assert (len(rows), setting()) == (found, "off")
        assert setting() == "on"


def ack_calls(conn: Conn, acks: list[dict[str, Any]]) -> tuple[list[Any], set[str]]:
    """Ack in one transaction; the outcomes and the functions it called."""
    with conn.transaction():
        conn.execute("SET LOCAL track_functions = 'all'")
        outcomes = lifecycle.ack(conn, acks)
        called = {r[0] for r in conn.execute("SELECT funcname FROM pg_stat_xact_user_functions")}
    return outcomes, called


def test_a_whole_lease_completed_at_once_is_decided_as_a_set(conn: Conn) -> None:
    push_n(conn, "q", 4)
    lifecycle.pop(conn, "q", batch=3)
    expire_leases_now(conn)
    got = lifecycle.pop(conn, "q", batch=3)  # again, each with a retry behind it
    outcomes, called = ack_calls(conn, [
        {"transactionId": d.transaction_id, "status": "completed", "leaseId": str(d.lease_id)}
        for d in reversed(got)])
    assert "ack_lease" in called and "ack_consumer" not in called
    assert [(o.position, o.status, o.retry_count) for o in outcomes] == [
        (1, "completed", 1), (2, "completed", 1), (3, "completed", 1)]
    assert [o.transaction_id for o in outcomes] == [d.transaction_id for d in reversed(got)]
    assert conn.execute("SELECT first_id, last_id, acked FROM queen.completions"
                        ).fetchall() == [(1, 3, 3)]
    last = lifecycle.pop(conn, "q", batch=10)
    assert numbers(last) == [3]
    # Without leaseId: the current lease's, as any ack without one.
    outcomes, called = ack_calls(conn, [{"transactionId": last[0].transaction_id,
                                         "status": "completed"}])
    assert "ack_consumer" not in called
    assert [(o.status, o.retry_count) for o in outcomes] == [("completed", 0)]
    assert conn.execute("SELECT first_id, last_id, acked FROM queen.completions"
                        " ORDER BY first_id").fetchall() == [(1, 3, 3), (4, 4, 1)]
    push_n(conn, "q", 1, start=4)
    assert numbers(lifecycle.pop(conn, "q")) == [4]


def test_whole_leases_of_several_partitions_in_one_call_are_each_decided_as_a_set(
    conn: Conn,
) -> None:
    """What a fused call of several consumers' acks holds: each partition's items are
    its whole lease, and each is decided as a set; a partition whose items are not falls
    back alone."""
    for partition in ("a", "b", "c"):
        push_n(conn, "q", 2, partition=partition)
    a = lifecycle.pop(conn, "q", partition="a", batch=2)
    b = lifecycle.pop(conn, "q", partition="b", batch=1)
    c = lifecycle.pop(conn, "q", partition="c", batch=2)
    acks = [{"transactionId": d.transaction_id, "status": "completed"} for d in a + b]
    outcomes, called = ack_calls(conn, acks)
    assert "ack_lease" in called and "ack_consumer" not in called
    assert [(o.position, o.status) for o in outcomes] == [
        (1, "completed"), (2, "completed"), (3, "completed")]
    assert numbers(lifecycle.pop(conn, "q", partition="a")) == []  # (its messages all done)
    assert numbers(lifecycle.pop(conn, "q", partition="b")) == [1]
    # c's first message only, with a of no lease any more: one by one, c alone.
    acks = [{"transactionId": c[0].transaction_id, "status": "completed"},
            {"transactionId": a[0].transaction_id, "status": "completed"}]
    outcomes, called = ack_calls(conn, acks)
    assert "ack_consumer" in called
    assert [o.status for o in outcomes] == ["completed", "completed"]
    assert conn.execute(
        "SELECT p.name, c.acked FROM queen.completions c"
        " JOIN queen.partitions p ON p.id = c.partition_id ORDER BY p.name, c.first_id"
    ).fetchall() == [("a", 2), ("b", 1), ("c", 1)]


def test_an_ack_that_is_not_its_whole_lease_is_decided_one_by_one(conn: Conn) -> None:
    push_n(conn, "q", 3)
    got = lifecycle.pop(conn, "q", batch=2)
    lease = str(got[0].lease_id)
    twice = [{"transactionId": got[0].transaction_id, "status": "completed", "leaseId": lease}] * 2
    outcomes, called = ack_calls(conn, twice)  # as many items as the lease, one message
    assert "ack_consumer" in called
    assert [o.status for o in outcomes] == ["completed", "completed"]
    assert lifecycle.pop(conn, "q") == []  # the other message is still leased
    rest = [{"transactionId": got[1].transaction_id, "status": "completed", "leaseId": lease},
            {"transactionId": "q-Default-2", "status": "completed", "leaseId": lease}]
    outcomes, called = ack_calls(conn, rest)  # one of them outside the lease
    assert [o.status for o in outcomes] == ["completed", "not_leased"]
    assert numbers(lifecycle.pop(conn, "q")) == [2]
