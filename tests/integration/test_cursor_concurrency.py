"""The cursor store under concurrent consumers and pushers (real threads, real PostgreSQL)."""

from __future__ import annotations

import random
import threading
import time
from collections import Counter, defaultdict
from collections.abc import Callable
from typing import Any

import orjson
import psycopg
import pytest

from queen.store import cursors
from tests.integration.cursor_helpers import ack_all

Conn = psycopg.Connection[Any]


def run_threads(targets: list[Callable[[], None]], timeout: float = 120) -> None:
    """Run each target in a thread; fail on the first exception or on a thread still running."""
    errors: list[BaseException] = []

    def guarded(target: Callable[[], None]) -> Callable[[], None]:
        def run() -> None:
            try:
                target()
            except BaseException as exc:  # noqa: BLE001 - reported below
                errors.append(exc)
        return run

    threads = [threading.Thread(target=guarded(t)) for t in targets]
    for t in threads:
        t.start()
    deadline = time.monotonic() + timeout
    for t in threads:
        t.join(max(0.1, deadline - time.monotonic()))
    assert not errors, errors[0]
    assert not any(t.is_alive() for t in threads), "threads still running"


def test_twenty_consumers_of_two_groups_get_every_message_once_per_group(db_dsn: str) -> None:
    partitions, per_partition, groups = 8, 100, ["__queue__", "billing"]
    with psycopg.connect(db_dsn, autocommit=True) as conn:
        for p in range(partitions):
            cursors.push(conn, [
                {"queue": "q", "partition": f"p{p}", "payload": {"i": i},
                 "transactionId": f"p{p}-{i}"} for i in range(per_partition)])
    total = partitions * per_partition
    seen: dict[str, list[tuple[str, int]]] = {g: [] for g in groups}
    lock = threading.Lock()

    def consumer() -> None:
        with psycopg.connect(db_dsn, autocommit=True) as conn:
            idle = 0
            while idle < 20:
                got_any = False
                for group in groups:
                    got = cursors.pop(conn, "q", group=group, batch=random.randint(1, 15))
                    with lock:  # recorded before the ack: the partition is still ours
                        seen[group] += [(d.partition, d.payload["i"]) for d in got]
                    if got:
                        got_any = True
                        assert {o.status for o in ack_all(conn, got)} == {"completed"}
                with lock:
                    done = all(len(s) >= total for s in seen.values())
                if done:
                    return
                idle = 0 if got_any else idle + 1
                if not got_any:
                    time.sleep(0.05)

    run_threads([consumer] * 20)
    for group in groups:
        counts = Counter(seen[group])
        assert len(counts) == total and set(counts.values()) == {1}, group
        by_partition: dict[str, list[int]] = defaultdict(list)
        for partition, i in seen[group]:
            by_partition[partition].append(i)
        assert all(v == list(range(per_partition)) for v in by_partition.values()), group


def test_racing_pushers_into_one_partition_never_lose_a_message(db_dsn: str) -> None:
    pushers, batches, size = 4, 50, 5
    expected = {f"w{w}-{b}-{i}" for w in range(pushers) for b in range(batches) for i in range(size)}
    received: list[str] = []
    lock = threading.Lock()
    pushing = threading.Event()
    pushing.set()
    finished = Counter[str]()

    ready = threading.Barrier(pushers + 3)  # everyone connected before the first push

    def pusher(w: int) -> Callable[[], None]:
        def run() -> None:
            with psycopg.connect(db_dsn, autocommit=True) as conn:
                ready.wait()
                for b in range(batches):
                    # Hold the push's transaction open a little after the insert: a push
                    # that drew its ids earlier then commits later than others.
                    with conn.transaction():
                        cursors.push(conn, [
                            {"queue": "q", "partition": "one", "payload": {},
                             "transactionId": f"w{w}-{b}-{i}"} for i in range(size)])
                        time.sleep(random.random() * 0.02)
            with lock:
                finished["pushers"] += 1
                if finished["pushers"] == pushers:
                    pushing.clear()
        return run

    def consumer() -> None:
        with psycopg.connect(db_dsn, autocommit=True) as conn:
            ready.wait()
            while True:
                still_pushing = pushing.is_set()
                got = cursors.pop(conn, "q", partition="one", batch=7)
                with lock:  # recorded before the ack: the partition is still ours
                    received.extend(d.transaction_id for d in got)
                if got:
                    ack_all(conn, got)
                elif not still_pushing:
                    return
                else:
                    time.sleep(0.002)

    run_threads([pusher(w) for w in range(pushers)] + [consumer] * 3)
    # A cursor that had passed a message would never deliver it: a last pop after the
    # consumers stopped finds only what they left, if anything.
    with psycopg.connect(db_dsn, autocommit=True) as conn:
        leftover = cursors.pop(conn, "q", partition="one", batch=1000)
        ack_all(conn, leftover)
        received.extend(d.transaction_id for d in leftover)
        assert cursors.pop(conn, "q", partition="one", batch=1000) == []
        order = [r[0] for r in conn.execute(
            "SELECT transaction_id FROM queen.cursor_messages ORDER BY id").fetchall()]
    assert Counter(received) == Counter(expected)  # every message, once
    assert received == order  # in the partition's order


def test_a_push_committing_later_is_not_passed_by_the_cursor(db_dsn: str) -> None:
    """An open push holds its partition: a second push waits, and a pop sees neither."""
    with psycopg.connect(db_dsn, autocommit=True) as first, \
            psycopg.connect(db_dsn, autocommit=True) as consumer:
        cursors.push(consumer, [{"queue": "q", "payload": {}, "transactionId": "existing"}])
        ack_all(consumer, cursors.pop(consumer, "q"))
        first.execute("BEGIN")
        cursors.push(first, [{"queue": "q", "payload": {}, "transactionId": "early"}])
        second_done = threading.Event()

        def second() -> None:
            with psycopg.connect(db_dsn, autocommit=True) as conn:
                cursors.push(conn, [{"queue": "q", "payload": {}, "transactionId": "late"}])
            second_done.set()

        thread = threading.Thread(target=second)
        thread.start()
        try:
            assert not second_done.wait(1.0), "the second push did not wait for the first"
            assert cursors.pop(consumer, "q", batch=10) == []
        finally:
            first.execute("COMMIT")
            thread.join(30)
        assert second_done.is_set()
        got = cursors.pop(consumer, "q", batch=10)
        assert [d.transaction_id for d in got] == ["early", "late"]


def _wait_for_lock_wait(dsn: str, application_name: str, timeout: float = 10.0) -> None:
    """Return once a backend of that application waits on a heavyweight lock."""
    deadline = time.monotonic() + timeout
    with psycopg.connect(dsn, autocommit=True) as conn:
        while time.monotonic() < deadline:
            (waiting,) = conn.execute(
                "SELECT count(*) FROM pg_stat_activity"
                " WHERE application_name = %s AND wait_event_type = 'Lock'",
                (application_name,),
            ).fetchone() or (0,)
            if waiting:
                return
            time.sleep(0.01)
    raise AssertionError(f"no backend of {application_name} ever waited on a lock")


QUEUE_MODE_STATUSES = (
    "SELECT m.transaction_id, queen.cursor_status_of(m.partition_id, m.id)"
    " FROM queen.cursor_messages m ORDER BY m.id"
)


@pytest.mark.parametrize(
    ("change", "wanted", "answer", "final"),
    [
        # the message deleted: not found, and the rest of the lease is still to ack
        ("delete", "completed", "not_found", [("r1", "processing")]),
        # the lease expired past retryLimit 0: the message is dead-lettered, and stays so
        ("expire", "completed", "dead_letter", [("r0", "dead_letter"), ("r1", "dead_letter")]),
        # the lease given back: outside any lease, an ack changes nothing, counts no retry
        ("give back", "completed", "lease_expired", [("r0", "pending"), ("r1", "pending")]),
        ("give back", "failed", "lease_expired", [("r0", "pending"), ("r1", "pending")]),
    ],
)
def test_an_ack_racing_an_operator_change_decides_on_what_was_committed(
    db_dsn: str, change: str, wanted: str, answer: str, final: list[tuple[str, str]]
) -> None:
    """An ack finds its messages before it locks their partition's consumer row: when
    another transaction changes that row (or the messages) in between, the ack waits for
    it and decides on what it committed. (The row store's: test_concurrency.py's
    test_ack_racing_a_status_change_decides_on_the_new_status.)"""
    app = "queen-race-cursor-ack"
    results: list[tuple[Any, ...]] = []
    with psycopg.connect(db_dsn, autocommit=True) as conn:
        conn.execute("INSERT INTO queen.queues (name, retry_limit) VALUES ('race', 0)")
        cursors.push(conn, [{"queue": "race", "payload": n, "transactionId": f"r{n}"}
                            for n in range(2)])
        leased = cursors.pop(conn, "race", batch=2)
        assert [d.transaction_id for d in leased] == ["r0", "r1"]
    with psycopg.connect(db_dsn) as mover:
        if change == "delete":
            moved = mover.execute("SELECT queen.cursor_delete_message('r0')").fetchone()
            assert moved == ("processing",)
        elif change == "expire":
            mover.execute("UPDATE queen.cursor_consumers"
                          " SET lease_expires_at = now() - interval '1 second'")
            assert mover.execute("SELECT queen.cursor_expire_leases(10)").fetchone() == (1,)
        else:
            given = mover.execute("SELECT queen.cursor_unclaim(%s)", (leased[0].lease_id,))
            assert given.fetchone() == (2,)

        def acker() -> None:
            with psycopg.connect(db_dsn, autocommit=True, application_name=app) as conn:
                row = conn.execute(
                    "SELECT status, retry_count FROM queen.cursor_ack(%s::jsonb)",
                    (orjson.dumps([{"transactionId": "r0", "status": wanted}]).decode(),),
                ).fetchone()
                assert row is not None
                results.append(row)

        thread = threading.Thread(target=acker)
        thread.start()
        _wait_for_lock_wait(db_dsn, app)  # the ack found r0 and waits on the consumer row
        mover.commit()
        thread.join(10)
        assert not thread.is_alive()
    assert [status for status, _ in results] == [answer]
    with psycopg.connect(db_dsn, autocommit=True) as conn:
        assert conn.execute(QUEUE_MODE_STATUSES).fetchall() == final
        retries = conn.execute(
            "SELECT count(*) FROM queen.cursor_failures WHERE status = 'retry'").fetchone()
        assert retries == (0,)
        if change == "delete":  # r1 is still leased: acking it ends the lease
            assert [o.status for o in cursors.ack(
                conn, [{"transactionId": "r1", "status": "completed"}])] == ["completed"]
            assert conn.execute(QUEUE_MODE_STATUSES).fetchall() == [("r1", "completed")]


@pytest.mark.parametrize("mover_commits", [True, False], ids=["moved", "rolled-back"])
def test_a_pop_passes_over_a_partition_whose_head_is_being_changed_and_keeps_fifo(
    db_dsn: str, mover_commits: bool
) -> None:
    """A partition whose consumer row another transaction holds (an operator moving its
    head to the dead letter queue) is passed over by a pop, which takes another partition:
    the messages behind that head are not delivered before it is decided. (The row
    store's: test_concurrency.py's test_a_claim_waits_for_a_pending_row_being_changed_and_keeps_fifo.)"""
    with psycopg.connect(db_dsn, autocommit=True) as conn:
        cursors.push(conn, [{"queue": "fifo-race", "payload": 0, "transactionId": "done"}])
        ack_all(conn, cursors.pop(conn, "fifo-race"))  # queue mode's consumer row exists
        cursors.push(conn, [{"queue": "fifo-race", "payload": n, "transactionId": f"f{n}"}
                            for n in range(3)])
        cursors.push(conn, [{"queue": "fifo-race", "partition": "other", "payload": 0,
                             "transactionId": "o0"}])
        with psycopg.connect(db_dsn) as mover:
            moved = mover.execute("SELECT queen.cursor_dead_letter_message('f0')").fetchone()
            assert moved == ("pending",)
            got = cursors.pop(conn, "fifo-race", batch=3)
            assert [d.transaction_id for d in got] == ["o0"]  # not f1: f0 is undecided
            if mover_commits:
                mover.commit()
            else:
                mover.rollback()
        got = cursors.pop(conn, "fifo-race", batch=3)
        expected = ["f1", "f2"] if mover_commits else ["f0", "f1", "f2"]
        assert [d.transaction_id for d in got] == expected
        statuses = dict(conn.execute(QUEUE_MODE_STATUSES).fetchall())
        assert statuses["f0"] == ("dead_letter" if mover_commits else "processing")
