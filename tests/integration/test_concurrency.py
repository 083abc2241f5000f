"""Ordering, lease exclusivity and idempotency with concurrent clients on a real database:
through the Store, and through queen.store.lifecycle on connections of their own."""

from __future__ import annotations

import logging
import random
import threading
import time
import uuid
from collections import Counter, defaultdict
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import orjson
import psycopg
import pytest

from queen.store import Store, lifecycle
from queen.store.db import QUERIES, Database
from queen.store.messages import ack_columns, ack_lease_params, message_id_of
from tests import storage
from tests.integration.helpers import ack, ack_all, data, pop, push, rows, scalar

THREADS = 8
# A stored message's id as the API answers it.
API_ID = "queen.message_uuid(m.id, m.created_at)"


@pytest.fixture
def big_store(db_dsn: str) -> Any:
    """A store whose pool holds a connection for every test thread, opened beforehand."""
    s = Store(Database(db_dsn, pool_size=THREADS + 4, timeout_s=10))
    s.db.pool.open(wait=True)
    s.db.pool.resize(min_size=THREADS + 4)
    s.db.pool.wait()
    yield s
    s.close()


def run_together(n: int, target: Any) -> list[Any]:
    """Run target(i) in n threads released at the same moment; return results, re-raise errors."""
    barrier = threading.Barrier(n)

    def go(i: int) -> Any:
        barrier.wait()
        return target(i)

    with ThreadPoolExecutor(n) as pool:
        return list(pool.map(go, range(n)))


# -- FIFO -------------------------------------------------------------------------


def test_fifo_per_pusher_with_concurrent_pushers_and_a_consumer(big_store: Store) -> None:
    pushers, per_pusher = 6, 60
    received: list[dict[str, int]] = []
    done_pushing = threading.Event()

    def pusher(i: int) -> None:
        rng = random.Random(i)
        n = 0
        while n < per_pusher:
            size = min(rng.randint(1, 6), per_pusher - n)
            items = [
                {"queue": "fifo", "partition": "p", "payload": {"pusher": i, "n": n + k}}
                for k in range(size)
            ]
            results = push(big_store, items)
            assert [r.status for r in results] == ["queued"] * size
            n += size

    def consumer() -> None:
        idle = 0
        while idle < 20:
            batch = pop(big_store, "fifo", "p", batch=7)
            if not batch:
                idle = idle + 1 if done_pushing.is_set() else 0
                time.sleep(0.005)
                continue
            received.extend(data(m) for m in batch)
            for m in batch:
                assert ack(big_store, m.transaction_id).status == "completed"

    with ThreadPoolExecutor(pushers + 1) as pool:
        consuming = pool.submit(consumer)
        pushing = [pool.submit(pusher, i) for i in range(pushers)]
        for f in pushing:
            f.result()
        done_pushing.set()
        consuming.result()

    by_pusher: dict[int, list[int]] = defaultdict(list)
    for d in received:
        by_pusher[d["pusher"]].append(d["n"])
    assert set(by_pusher) == set(range(pushers))
    for i, seen in by_pusher.items():
        assert seen == list(range(per_pusher)), f"pusher {i} out of order or incomplete"


def test_fifo_within_one_large_batch(store: Store) -> None:
    # Generated ids for half, client ids sorting in reverse for the other half:
    # delivery follows item order either way.
    items = [
        {"queue": "q", "payload": n, **({"transactionId": f"id-{999 - n:04d}"} if n % 2 else {})}
        for n in range(1000)
    ]
    push(store, items)
    seen: list[int] = []
    while batch := pop(store, "q", "Default", batch=333):
        seen.extend(data(m) for m in batch)
        store.messages.ack(
            [
                {"transactionId": m.transaction_id, "status": "completed", "error": None}
                for m in batch
            ]
        )
    assert seen == list(range(1000))


# -- lease exclusivity ------------------------------------------------------------


def _seed_partitions(store: Store, queue: str, partitions: int, per_partition: int) -> None:
    items = [
        {"queue": queue, "partition": f"p{p}", "payload": {"p": p, "n": n}}
        for n in range(per_partition)
        for p in range(partitions)
    ]
    push(store, items)


@pytest.mark.parametrize("route", ["queue", "filter"])
def test_leased_partition_is_served_to_one_consumer_only(big_store: Store, route: str) -> None:
    partitions, per_partition, batch = 40, 5, 2
    big_store.queues.configure("lx", "ns-lx", None, {})
    _seed_partitions(big_store, "lx", partitions, per_partition)

    def consumer(i: int) -> list[list[dict[str, int]]]:
        got = []
        empty = 0
        while empty < 3:
            if route == "queue":
                msgs = pop(big_store, "lx", batch=batch, worker=f"w{i}")
            else:
                msgs = pop(big_store, batch=batch, worker=f"w{i}", namespace="ns-lx")
            if msgs:
                got.append([data(m) for m in msgs])
            else:
                empty += 1
        return got

    pops = [p for per_thread in run_together(THREADS, consumer) for p in per_thread]
    # Nothing is acked and the lease is long: every partition is served exactly once.
    assert len(pops) == partitions
    partitions_served = Counter()
    for msgs in pops:
        assert len({m["p"] for m in msgs}) == 1, "a batch mixes partitions"
        assert [m["n"] for m in msgs] == list(range(batch)), "not the head of the partition"
        partitions_served[msgs[0]["p"]] += 1
    assert partitions_served == Counter({p: 1 for p in range(partitions)})


def test_no_partition_held_by_two_consumers_while_acking(big_store: Store) -> None:
    partitions, per_partition = 30, 8
    _seed_partitions(big_store, "busy", partitions, per_partition)
    total = partitions * per_partition
    holder: dict[int, int] = {}
    delivered: list[tuple[int, int]] = []
    lock = threading.Lock()
    violations: list[str] = []

    def consumer(i: int) -> None:
        while True:
            with lock:
                if len(delivered) >= total:
                    return
            msgs = pop(big_store, "busy", batch=3, worker=f"w{i}")
            if not msgs:
                time.sleep(0.002)
                continue
            part = data(msgs[0])["p"]
            with lock:
                if part in holder:
                    violations.append(f"p{part} popped by w{i} while held by w{holder[part]}")
                holder[part] = i
                delivered.extend((data(m)["p"], data(m)["n"]) for m in msgs)
            time.sleep(0.001)
            with lock:
                del holder[part]
            results = big_store.messages.ack(
                [
                    {"transactionId": m.transaction_id, "status": "completed", "error": None}
                    for m in msgs
                ]
            )
            assert {r.status for r in results} == {"completed"}

    run_together(THREADS, consumer)
    assert violations == []
    assert len(delivered) == total
    assert len(set(delivered)) == total, "a message was delivered twice"
    order: dict[int, list[int]] = defaultdict(list)
    for p, n in delivered:
        order[p].append(n)
    assert all(seq == list(range(per_partition)) for seq in order.values())
    dsn = big_store.db.dsn
    assert rows(dsn, storage.STATUS_COUNTS) == [("completed", total)]
    assert scalar(dsn, storage.LEASED_PARTITIONS) == 0


@pytest.mark.parametrize("shuffle", [False, True], ids=["same-order", "shuffled"])
def test_concurrent_duplicate_pushes_store_each_id_once(
    big_store: Store, shuffle: bool, caplog: pytest.LogCaptureFixture
) -> None:
    # Large enough that the inserts overlap: overlapping ids taken in different
    # orders must not deadlock (retries would not save 8 pushers from each other).
    ids = [f"tx-{n:03d}" for n in range(400)]
    # Queue and partitions exist beforehand, so the pushes race on the messages alone.
    push(big_store, [{"queue": "idem", "partition": f"p{p}", "payload": 0} for p in range(3)])

    def pusher(i: int) -> list[tuple[str, str, Any]]:
        order = list(ids)
        if shuffle:
            random.Random(i).shuffle(order)
        items = [
            {
                "queue": "idem",
                "partition": f"p{int(t[3:]) % 3}",
                "payload": {"by": i},
                "transactionId": t,
            }
            for t in order
        ]
        results = push(big_store, items)
        assert [r.transaction_id for r in results] == order
        return [(r.transaction_id, r.status, r.id) for r in results]

    with caplog.at_level(logging.WARNING, logger="queen.store.db"):
        outcomes = [row for per_thread in run_together(THREADS, pusher) for row in per_thread]
    assert [r.message for r in caplog.records] == [], "pushes deadlocked and were retried"
    dsn = big_store.db.dsn
    stored = dict(rows(dsn, f"SELECT {storage.TXID}, {API_ID} FROM {storage.MESSAGES} m"))
    assert sorted(t for t in stored if t.startswith("tx-")) == ids
    assert len(stored) == len(ids) + 3
    queued = Counter(t for t, status, _ in outcomes if status == "queued")
    assert queued == Counter({t: 1 for t in ids})
    for txid, status, message_id in outcomes:
        assert status in ("queued", "duplicate")
        assert message_id == str(stored[txid]), f"{status} {txid} reported id {message_id}"


def test_duplicates_within_one_batch_and_across_batches(store: Store) -> None:
    first = push(
        store,
        [
            {"queue": "q", "payload": 1, "transactionId": "a"},
            {"queue": "q", "payload": 2, "transactionId": "a"},
            {"queue": "q", "payload": 3, "transactionId": "b"},
        ],
    )
    assert [r.status for r in first] == ["queued", "duplicate", "queued"]
    assert first[0].id == first[1].id
    again = push(
        store,
        [
            {"queue": "other", "payload": 4, "transactionId": "b"},
            {"queue": "q", "payload": 5, "transactionId": "c"},
        ],
    )
    assert [r.status for r in again] == ["duplicate", "queued"]
    assert again[0].id == first[2].id
    assert scalar(store.db.dsn, f"SELECT count(*) FROM {storage.MESSAGES}") == 3
    msgs = pop(store, "q", "Default", batch=10)
    assert [data(m) for m in msgs] == [1, 3, 5]


def made_for(result: Any) -> bool:
    """Whether a push result's transactionId is one made for its message: a version 8
    UUID carrying the message's id (queen.made_txid)."""
    txid = uuid.UUID(result.transaction_id)
    return (str(txid) == result.transaction_id and txid.version == 8
            and txid.int & (2**62 - 1) == message_id_of(uuid.UUID(str(result.id))))


def test_pushes_with_and_without_chosen_ids_keep_item_order(store: Store) -> None:
    """Without any transactionId a push takes the plain insert; with some, the checked
    one: either way the transactionIds made by the server name the messages, and FIFO is
    item order."""
    plain = push(store, [{"queue": "q", "payload": n} for n in (1, 2, 3)])
    assert [r.status for r in plain] == ["queued"] * 3
    assert all(made_for(r) for r in plain)
    mixed = push(
        store,
        [
            {"queue": "q", "payload": 4},
            {"queue": "q", "payload": 5, "transactionId": plain[1].transaction_id},
            {"queue": "q", "payload": 6, "transactionId": "chosen"},
            {"queue": "q", "payload": 7},
        ],
    )
    assert [r.status for r in mixed] == ["queued", "duplicate", "queued", "queued"]
    assert mixed[1].id == plain[1].id
    assert made_for(mixed[0]) and made_for(mixed[3])
    msgs = pop(store, "q", "Default", batch=10)
    assert [data(m) for m in msgs] == [1, 2, 3, 4, 6, 7]


def test_ids_made_for_a_push_are_uuid_v7_unique_and_in_item_order(store: Store) -> None:
    before_ms = int(time.time() * 1000)
    first = push(
        store,
        [{"queue": "ids", "payload": n} for n in range(150)]
        + [{"queue": "ids", "payload": "chosen", "transactionId": "mine"}]
        + [{"queue": "ids", "payload": n, "partition": "other"} for n in range(150)],
    )
    second = push(store, [{"queue": "ids", "payload": n} for n in range(5)])
    after_ms = int(time.time() * 1000)
    for results in (first, second):
        ids = [uuid.UUID(r.id) for r in results if r.id is not None]
        assert len(ids) == len(results)
        assert all(i.version == 7 and i.variant == uuid.RFC_4122 for i in ids)
        assert ids == sorted(ids), "ids not in item order"
        assert all(before_ms - 5 <= (i.int >> 80) <= after_ms + 5 for i in ids)
        made = [r for r in results if r.transaction_id != "mine"]
        assert all(made_for(r) for r in made)
    everything = [r.id for r in first + second]
    assert len(set(everything)) == len(everything) == 306
    stored = rows(store.db.dsn, f"SELECT count(DISTINCT id), count(*) FROM {storage.MESSAGES}")
    assert stored == [(306, 306)]


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
            lifecycle.push(conn, [
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
                    got = lifecycle.pop(conn, "q", group=group, batch=random.randint(1, 15))
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
                        lifecycle.push(conn, [
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
                got = lifecycle.pop(conn, "q", partition="one", batch=7)
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
        leftover = lifecycle.pop(conn, "q", partition="one", batch=1000)
        ack_all(conn, leftover)
        received.extend(d.transaction_id for d in leftover)
        assert lifecycle.pop(conn, "q", partition="one", batch=1000) == []
        order = [r[0] for r in conn.execute(
            "SELECT transaction_id FROM queen.messages ORDER BY id").fetchall()]
    assert Counter(received) == Counter(expected)  # every message, once
    assert received == order  # in the partition's order


def test_a_push_committing_later_is_not_passed_by_the_cursor(db_dsn: str) -> None:
    """An open push holds its partition: a second push waits, and a pop sees neither."""
    with psycopg.connect(db_dsn, autocommit=True) as first, \
            psycopg.connect(db_dsn, autocommit=True) as consumer:
        lifecycle.push(consumer, [{"queue": "q", "payload": {}, "transactionId": "existing"}])
        ack_all(consumer, lifecycle.pop(consumer, "q"))
        first.execute("BEGIN")
        lifecycle.push(first, [{"queue": "q", "payload": {}, "transactionId": "early"}])
        second_done = threading.Event()

        def second() -> None:
            with psycopg.connect(db_dsn, autocommit=True) as conn:
                lifecycle.push(conn, [{"queue": "q", "payload": {}, "transactionId": "late"}])
            second_done.set()

        thread = threading.Thread(target=second)
        thread.start()
        try:
            assert not second_done.wait(1.0), "the second push did not wait for the first"
            assert lifecycle.pop(consumer, "q", batch=10) == []
        finally:
            first.execute("COMMIT")
            thread.join(30)
        assert second_done.is_set()
        got = lifecycle.pop(consumer, "q", batch=10)
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
    "SELECT m.transaction_id, queen.message_status_of(m.partition_id, m.id)"
    " FROM queen.messages m ORDER BY m.id"
)


@pytest.mark.parametrize(
    ("change", "wanted", "answer", "final"),
    [
        # the message deleted: not found, and the rest of the lease is still to ack
        ("delete", "completed", "not_found", [("r1", "processing")]),
        # the lease expired past retryLimit 0: the message is dead-lettered, and stays so
        ("expire", "completed", "dead_letter", [("r0", "dead_letter"), ("r1", "dead_letter")]),
        # the lease given back: outside any lease, an ack changes nothing, counts no retry
        ("give back", "completed", "not_leased", [("r0", "pending"), ("r1", "pending")]),
        ("give back", "failed", "not_leased", [("r0", "pending"), ("r1", "pending")]),
    ],
)
def test_an_ack_racing_an_operator_change_decides_on_what_was_committed(
    db_dsn: str, change: str, wanted: str, answer: str, final: list[tuple[str, str]]
) -> None:
    """An ack finds its messages before it locks their partition's consumer row: when
    another transaction changes that row (or the messages) in between, the ack waits for
    it and decides on what it committed."""
    app = "queen-race-ack"
    results: list[tuple[Any, ...]] = []
    with psycopg.connect(db_dsn, autocommit=True) as conn:
        conn.execute("INSERT INTO queen.queues (name, retry_limit) VALUES ('race', 0)")
        lifecycle.push(conn, [{"queue": "race", "payload": n, "transactionId": f"r{n}"}
                            for n in range(2)])
        leased = lifecycle.pop(conn, "race", batch=2)
        assert [d.transaction_id for d in leased] == ["r0", "r1"]
    with psycopg.connect(db_dsn) as mover:
        if change == "delete":
            moved = mover.execute("SELECT queen.delete_message('r0')").fetchone()
            assert moved == ("processing",)
        elif change == "expire":
            mover.execute("UPDATE queen.consumers"
                          " SET lease_expires_at = now() - interval '1 second'")
            assert mover.execute("SELECT queen.expire_leases(10)").fetchone() == (1,)
        else:
            given = mover.execute("SELECT queen.give_back(%s)", (leased[0].lease_id,))
            assert given.fetchone() == (2,)

        def acker() -> None:
            with psycopg.connect(db_dsn, autocommit=True, application_name=app) as conn:
                row = conn.execute(
                    "SELECT status, retry_count FROM queen.ack_rows(%s::jsonb)",
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
            "SELECT count(*) FROM queen.failures WHERE status = 'retry'").fetchone()
        assert retries == (0,)
        if change == "delete":  # r1 is still leased: acking it ends the lease
            assert [o.status for o in lifecycle.ack(
                conn, [{"transactionId": "r1", "status": "completed"}])] == ["completed"]
            assert conn.execute(QUEUE_MODE_STATUSES).fetchall() == [("r1", "completed")]


@pytest.mark.parametrize(
    ("change", "fit", "answers", "final"),
    [
        # the lease extended: still the lease popped, ended (by ack_whole where it found the
        # row by a TID scan; on a table this small by a scan whose ctid check fails on the
        # row's new version, so queen.ack_items ends it, in its one row for whole leases)
        ("extend", [1], ["completed"], [("r0", "completed"), ("r1", "completed")]),
        # a message of it deleted: no longer the lease popped, decided item by item
        ("delete", None, ["not_found", "completed"], [("r1", "completed")]),
        ("expire", None, ["dead_letter", "dead_letter"],
         [("r0", "dead_letter"), ("r1", "dead_letter")]),
        # (the acks name the lease popped, which is no longer live)
        ("give back", None, ["lease_expired", "lease_expired"],
         [("r0", "pending"), ("r1", "pending")]),
    ],
)
@pytest.mark.parametrize("statement", ["ack_whole", "ack_lease"])
def test_a_whole_lease_ack_racing_an_operator_change_checks_the_row_as_committed(
    db_dsn: str, change: str, fit: list[int] | None, answers: list[str],
    final: list[tuple[str, str]], statement: str,
) -> None:
    """The server's one-statement acks of a whole lease (ack_whole; ack_lease, for one
    request naming its lease) check the lease in their UPDATE: when another transaction
    holds the consumer row, the ack waits for it and checks the row as that transaction
    left it; what it did not end, the server's ack (queen.ack_items) then decides item by
    item."""
    app = "queen-race-whole"
    results: list[Any] = []
    with psycopg.connect(db_dsn, autocommit=True) as conn:
        conn.execute("INSERT INTO queen.queues (name, retry_limit) VALUES ('race', 0)")
        lifecycle.push(conn, [{"queue": "race", "payload": n, "transactionId": f"r{n}"}
                            for n in range(2)])
        leased = lifecycle.pop(conn, "race", batch=2)
    with psycopg.connect(db_dsn) as mover:
        if change == "extend":
            assert mover.execute("SELECT queen.extend_lease(%s, 600)",
                                 (leased[0].lease_id,)).fetchone() != (None,)
        elif change == "delete":
            assert mover.execute("SELECT queen.delete_message('r0')").fetchone() == (
                "processing",)
        elif change == "expire":
            mover.execute("UPDATE queen.consumers"
                          " SET lease_expires_at = now() - interval '1 second'")
            assert mover.execute("SELECT queen.expire_leases(10)").fetchone() == (1,)
        else:
            assert mover.execute("SELECT queen.give_back(%s)",
                                 (leased[0].lease_id,)).fetchone() == (2,)

        def acker() -> None:
            acks = [{"transactionId": f"r{n}", "status": "completed",
                     "leaseId": str(leased[0].lease_id)} for n in range(2)]
            columns = ack_columns(acks)
            params = columns if statement == "ack_whole" else ack_lease_params(acks)
            with psycopg.connect(db_dsn, autocommit=True, application_name=app) as conn:
                ((ended, _, _),) = conn.execute(QUERIES[statement], params).fetchall()
                results.append(ended or None)
                if not ended:
                    results.append([r[2] for r in conn.execute(QUERIES["ack"], columns)])

        thread = threading.Thread(target=acker)
        thread.start()
        _wait_for_lock_wait(db_dsn, app)  # the ack waits on the consumer row
        mover.commit()
        thread.join(10)
        assert not thread.is_alive()
    assert results == [None, answers] or (fit and results == [fit])
    with psycopg.connect(db_dsn, autocommit=True) as conn:
        assert conn.execute(QUEUE_MODE_STATUSES).fetchall() == final

def test_a_push_into_a_partition_removed_while_it_waited_for_the_lock_stores_nothing(
    db_dsn: str,
) -> None:
    """The server's one-statement push (push_new) finds its partition, then waits for
    the partition's push lock, which a removal holds (as queen.cleanup_partitions does):
    once the removal commits, queen.push_locks' own statement sees the partition gone, and
    nothing is stored; the server's push (queen.push_batch) then makes it again."""
    app = "queen-race-push"
    results: list[Any] = []
    body = orjson.dumps([{"items": [{"queue": "gone", "partition": "p", "payload": 1}]}])
    params = {"bodies": body.decode(), "producer": None,
              "queues": "{gone}", "partitions": "{p}", "slots": "{1}"}
    with psycopg.connect(db_dsn, autocommit=True) as conn:
        lifecycle.push(conn, [{"queue": "gone", "partition": "p", "payload": 0}])
        conn.execute("DELETE FROM queen.messages")
    with psycopg.connect(db_dsn) as remover:
        (partition,) = remover.execute("SELECT id FROM queen.partitions").fetchone()
        remover.execute("SELECT pg_advisory_xact_lock(queen.push_lock_key(%s))", (partition,))
        remover.execute("DELETE FROM queen.partitions WHERE id = %s", (partition,))

        def pusher() -> None:
            with psycopg.connect(db_dsn, autocommit=True, application_name=app) as conn:
                ((fits, _, ids, *_),) = conn.execute(QUERIES["push_new"], params).fetchall()
                results.append((fits, ids))
                if not fits:
                    conn.execute(QUERIES["push"], params).fetchall()

        thread = threading.Thread(target=pusher)
        thread.start()
        _wait_for_lock_wait(db_dsn, app)  # push_new found the partition, waits on its lock
        remover.commit()
        thread.join(10)
        assert not thread.is_alive()
    assert results == [(False, None)]
    with psycopg.connect(db_dsn, autocommit=True) as conn:
        stored = conn.execute("SELECT p.name, m.payload FROM queen.messages m"
                              " JOIN queen.partitions p ON p.id = m.partition_id").fetchall()
        assert stored == [("p", 1)]  # in the partition made again, none orphaned

@pytest.mark.parametrize("mover_commits", [True, False], ids=["moved", "rolled-back"])
def test_a_pop_passes_over_a_partition_whose_head_is_being_changed_and_keeps_fifo(
    db_dsn: str, mover_commits: bool
) -> None:
    """A partition whose consumer row another transaction holds (an operator moving its
    head to the dead letter queue) is passed over by a pop, which takes another partition:
    the messages behind that head are not delivered before it is decided. (The row
    store's: test_concurrency.py's test_a_claim_waits_for_a_pending_row_being_changed_and_keeps_fifo.)"""
    with psycopg.connect(db_dsn, autocommit=True) as conn:
        lifecycle.push(conn, [{"queue": "fifo-race", "payload": 0, "transactionId": "done"}])
        ack_all(conn, lifecycle.pop(conn, "fifo-race"))  # queue mode's consumer row exists
        lifecycle.push(conn, [{"queue": "fifo-race", "payload": n, "transactionId": f"f{n}"}
                            for n in range(3)])
        lifecycle.push(conn, [{"queue": "fifo-race", "partition": "other", "payload": 0,
                             "transactionId": "o0"}])
        with psycopg.connect(db_dsn) as mover:
            moved = mover.execute("SELECT queen.dead_letter_message('f0')").fetchone()
            assert moved == ("pending",)
            got = lifecycle.pop(conn, "fifo-race", batch=3)
            assert [d.transaction_id for d in got] == ["o0"]  # not f1: f0 is undecided
            if mover_commits:
                mover.commit()
            else:
                mover.rollback()
        got = lifecycle.pop(conn, "fifo-race", batch=3)
        expected = ["f1", "f2"] if mover_commits else ["f0", "f1", "f2"]
        assert [d.transaction_id for d in got] == expected
        statuses = dict(conn.execute(QUEUE_MODE_STATUSES).fetchall())
        assert statuses["f0"] == ("dead_letter" if mover_commits else "processing")
