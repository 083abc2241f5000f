"""Ordering, lease exclusivity and idempotency with concurrent clients on a real database."""

from __future__ import annotations

import logging
import random
import threading
import time
import uuid
from collections import Counter, defaultdict
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest

from queen.store import Store
from queen.store.db import Database
from tests import storage
from tests.integration.helpers import ack, data, pop, push, rows, scalar

THREADS = 8
# A stored message's id as the API answers it.
API_ID = "queen.cursor_message_uuid(id, created_at)"


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
    stored = dict(rows(dsn, f"SELECT transaction_id, {API_ID} FROM {storage.MESSAGES}"))
    assert sorted(t for t in stored if t.startswith("tx-")) == ids
    assert len(stored) == len(ids) + 3
    queued = Counter(t for t, status, _ in outcomes if status == "queued")
    assert queued == Counter({t: 1 for t in ids})
    for txid, status, message_id in outcomes:
        assert status in ("queued", "duplicate")
        assert message_id == stored[txid], f"{status} {txid} reported id {message_id}"


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


def test_pushes_with_and_without_chosen_ids_keep_item_order(store: Store) -> None:
    """Without any transactionId a push takes the plain insert; with some, the checked
    one: either way ids made by the server are the message ids, and FIFO is item order."""
    plain = push(store, [{"queue": "q", "payload": n} for n in (1, 2, 3)])
    assert [r.status for r in plain] == ["queued"] * 3
    assert all(r.transaction_id == str(r.id) for r in plain)
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
    assert mixed[0].transaction_id == str(mixed[0].id)
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
        ids = [r.id for r in results]
        assert all(i is not None and i.version == 7 and i.variant == uuid.RFC_4122 for i in ids)
        assert ids == sorted(ids), "ids not in item order"
        assert all(before_ms - 5 <= (i.int >> 80) <= after_ms + 5 for i in ids if i)
        made = [r for r in results if r.transaction_id != "mine"]
        assert all(r.transaction_id == str(r.id) for r in made)
    everything = [r.id for r in first + second]
    assert len(set(everything)) == len(everything) == 306
    stored = rows(store.db.dsn, f"SELECT count(DISTINCT id), count(*) FROM {storage.MESSAGES}")
    assert stored == [(306, 306)]
