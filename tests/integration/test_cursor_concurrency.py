"""The cursor store under concurrent consumers and pushers (real threads, real PostgreSQL)."""

from __future__ import annotations

import random
import threading
import time
from collections import Counter, defaultdict
from collections.abc import Callable
from typing import Any

import psycopg

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
