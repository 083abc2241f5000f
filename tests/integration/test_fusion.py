"""Fused calls on a real PostgreSQL: requests that waited while a call was in flight share
the next one, and each gets its own results, in its own order, and only its own errors.

The first call of each test is held until the others have queued behind it (a wrapper
around the fuser's call that waits before calling through), so which requests share a
call is decided, not timed.
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from typing import Any

import orjson
import psycopg
import pytest

from queen.errors import InvalidInput
from queen.fusion import Fuser
from queen.models import PopRoute
from queen.store import Store
from queen.store.db import Database
from queen.store.messages import _Push
from tests.conftest import ROOT
from tests.integration.helpers import data, push

WAIT_S = 20.0


@pytest.fixture
def fstore(db_dsn: str) -> Iterator[Store]:
    """A store whose calls of a kind run one at a time: what waits meanwhile fuses."""
    s = Store(Database(db_dsn, pool_size=8, timeout_s=5), fused_calls=1)
    s.db.pool.open(wait=True)
    s.sizes: list[tuple[str, int]] = []  # type: ignore[attr-defined]
    s.observe_calls(lambda kind, n: s.sizes.append((kind, n)))  # type: ignore[attr-defined]
    yield s
    s.close()


class Held:
    """Hold the first call of a fuser until the requests given afterwards have queued."""

    def __init__(self, fuser: Fuser[Any, Any]) -> None:
        self.fuser = fuser
        self.entered = threading.Event()
        self.release = threading.Event()
        self._run = fuser.run
        self._first = True
        fuser.run = self._call

    def _call(self, requests: list[Any]) -> Any:
        if self._first:
            self._first = False
            self.entered.set()
            assert self.release.wait(WAIT_S)
        return self._run(requests)


def fused(fuser: Fuser[Any, Any], first: Callable[[], Any], rest: list[Callable[[], Any]]) -> list[Any]:
    """Run first (held in its call), queue each of rest behind it in order, then let go.

    Returns each one's outcome (its result or the exception it raised), first's first.
    """
    held = Held(fuser)
    outcomes: list[Any] = [None] * (1 + len(rest))

    def run(n: int, fn: Callable[[], Any]) -> None:
        try:
            outcomes[n] = fn()
        except Exception as exc:  # noqa: BLE001 - the test looks at it
            outcomes[n] = exc

    threads = [threading.Thread(target=run, args=(0, first))]
    threads[0].start()
    assert held.entered.wait(WAIT_S)
    for n, fn in enumerate(rest, 1):
        t = threading.Thread(target=run, args=(n, fn))
        t.start()
        threads.append(t)
        deadline = time.monotonic() + WAIT_S
        while len(fuser._queued) < n:
            assert time.monotonic() < deadline, "request did not queue"
            time.sleep(0.005)
    held.release.set()
    for t in threads:
        t.join(WAIT_S)
    return outcomes


def pusher(store: Store, items: list[dict[str, Any]]) -> Callable[[], Any]:
    return lambda: push(store, items)


def test_fused_pushes_answer_each_request_its_own_results_in_its_order(fstore: Store) -> None:
    push(fstore, [{"queue": "f", "payload": "before"}])
    requests = [
        [{"queue": "f", "payload": 1}, {"queue": "f", "payload": 2, "transactionId": "a"}],
        [{"queue": "f", "payload": 3, "transactionId": "dup"}],
        [{"queue": "f", "payload": 4}, {"queue": "f", "payload": 5, "transactionId": "dup"}],
        [{"queue": "f", "payload": 6, "transactionId": "dup"}, {"queue": "f", "payload": 7}],
    ]
    first, *rest = (pusher(fstore, items) for items in requests)
    outcomes = fused(fstore.messages._push_fusers[None], first, rest)
    assert fstore.sizes[-2:] == [("push", 1), ("push", 3)]  # type: ignore[attr-defined]
    for items, results in zip(requests, outcomes, strict=True):
        assert [r.position for r in results] == list(range(1, len(items) + 1))
        for item, r in zip(items, results, strict=True):
            if "transactionId" in item:
                assert r.transaction_id == item["transactionId"]
    # One transactionId in one fused call: the first request's item is stored, later ones
    # are duplicates carrying the stored message's id.
    assert [r.status for r in outcomes[1]] == ["queued"]
    assert [r.status for r in outcomes[2]] == ["queued", "duplicate"]
    assert [r.status for r in outcomes[3]] == ["duplicate", "queued"]
    assert outcomes[2][1].id == outcomes[1][0].id == outcomes[3][0].id
    popped = fstore.messages.pop(PopRoute(queue="f"), 100, "w")
    assert [data(m) for m in popped] == ["before", 1, 2, 3, 4, 7]  # arrival order, FIFO


@pytest.mark.parametrize("pad", [0, 3000], ids=["small bodies", "large bodies"])
def test_fused_pushes_into_several_partitions_name_each_item_its_message(
    fstore: Store, db_dsn: str, pad: int
) -> None:
    """The server's one-statement push of several requests, their items gathered (small
    bodies) or read a body at a time (large ones): each item's answer names its own
    message by its id and by its transactionId, and each partition keeps arrival order."""
    queue = f"spread{pad}"
    push(fstore, [{"queue": queue, "partition": p, "payload": "before"} for p in "ab"])
    requests = [[{"queue": queue, "partition": "ab"[(r + n) % 2],
                  "payload": {"r": r, "n": n, "pad": "x" * pad}} for n in range(3)]
                for r in range(4)]
    first, *rest = (pusher(fstore, items) for items in requests)
    outcomes = fused(fstore.messages._push_fusers[None], first, rest)
    assert fstore.sizes[-2:] == [("push", 1), ("push", 3)]  # type: ignore[attr-defined]
    with psycopg.connect(db_dsn, autocommit=True) as conn:
        for items, results in zip(requests, outcomes, strict=True):
            assert [r.position for r in results] == [1, 2, 3]
            for item, r in zip(items, results, strict=True):
                (by_id,) = conn.execute(
                    "SELECT p.name, m.payload FROM queen.messages m"
                    " JOIN queen.partitions p ON p.id = m.partition_id"
                    " WHERE m.id = queen.message_id_of(%s::uuid)", (r.id,)).fetchall()
                assert by_id == (item["partition"], item["payload"])
                assert conn.execute(
                    "SELECT queen.message_id_of(%s::uuid) IN (SELECT id FROM queen.named(%s))",
                    (r.id, r.transaction_id)).fetchone() == (True,)
    for p in "ab":
        popped = fstore.messages.pop(PopRoute(queue=queue, partition=p), 100, "w")
        assert [data(m) for m in popped] == ["before"] + [
            item["payload"] for items in requests for item in items if item["partition"] == p]


def test_max_size_counts_across_the_requests_of_a_call(fstore: Store) -> None:
    push(fstore, [{"queue": "small", "payload": 0}])
    fstore.queues.configure("small", None, None, {"max_size": 3})
    first, *rest = (pusher(fstore, [{"queue": "small", "payload": n}]) for n in range(1, 5))
    outcomes = fused(fstore.messages._push_fusers[None], first, rest)
    statuses = [r.status for results in outcomes for r in results]
    assert statuses == ["queued", "queued", "rejected", "rejected"]
    assert fstore.sizes[-1] == ("push", 3)  # type: ignore[attr-defined]


def test_a_value_the_database_refuses_fails_only_the_request_that_sent_it(fstore: Store) -> None:
    good = [{"queue": "iso", "payload": "fine"}]
    # Validation refuses NUL in a payload; sent anyway, PostgreSQL refuses it (class 22).
    bad_body = '{"items": [{"queue": "iso", "payload": "nul \\u0000 here"}]}'
    bad = [{"queue": "iso", "payload": "nul \x00 here"}]
    outcomes = fstore.messages._push_call(
        None, [_Push(orjson.dumps({"items": good}).decode(), good), _Push(bad_body, bad)]
    )
    assert [r.status for r in outcomes[0]] == ["queued"]  # type: ignore[union-attr]
    assert isinstance(outcomes[1], InvalidInput)
    popped = fstore.messages.pop(PopRoute(queue="iso"), 10, "w")
    assert [data(m) for m in popped] == ["fine"]


def test_fused_pops_each_lease_a_partition_of_their_own(fstore: Store) -> None:
    push(fstore, [{"queue": "pp", "partition": f"p{n % 4}", "payload": n} for n in range(12)])
    popper = lambda: fstore.messages.pop(PopRoute(queue="pp"), 3, "w")  # noqa: E731
    outcomes = fused(fstore.messages._pops, popper, [popper, popper, popper])
    assert fstore.sizes[-2:] == [("pop", 1), ("pop", 3)]  # type: ignore[attr-defined]
    partitions = [{m.partition for m in msgs} for msgs in outcomes]
    assert all(len(p) == 1 for p in partitions)
    assert sorted(p.pop() for p in partitions) == ["p0", "p1", "p2", "p3"]
    leases = {m.lease_id for msgs in outcomes for m in msgs}
    assert len(leases) == 4
    for msgs in outcomes:
        values = [data(m) for m in msgs]
        assert values == sorted(values) and len(values) == 3  # FIFO, the whole partition
    assert fstore.messages.pop(PopRoute(queue="pp"), 3, "w") == []  # all four leased


def test_an_undelivered_fused_pop_gives_back_its_own_lease_only(fstore: Store) -> None:
    push(fstore, [{"queue": "ud", "partition": f"p{n}", "payload": n} for n in range(2)])
    popper = lambda: fstore.messages.pop(PopRoute(queue="ud"), 1, "w")  # noqa: E731
    first, second = fused(fstore.messages._pops, popper, [popper])
    assert fstore.polling.unclaim(first[0].lease_id) == 1
    (again,) = fstore.messages.pop(PopRoute(queue="ud"), 1, "w")
    assert again.partition == first[0].partition  # back at once, the other still leased
    assert fstore.messages.pop(PopRoute(queue="ud"), 1, "w") == []


def test_fused_acks_decide_each_request_on_its_own(fstore: Store) -> None:
    push(fstore, [{"queue": "ak", "partition": f"p{n % 2}", "payload": n} for n in range(4)])
    a = fstore.messages.pop(PopRoute(queue="ak", partition="p0"), 2, "w")
    b = fstore.messages.pop(PopRoute(queue="ak", partition="p1"), 2, "w")

    def acker(acks: list[dict[str, Any]]) -> Callable[[], Any]:
        return lambda: fstore.messages.ack(acks)

    def item(m: Any, lease: Any, status: str = "completed") -> dict[str, Any]:
        return {"transactionId": m.transaction_id, "status": status, "error": None,
                "leaseId": str(lease)}

    requests = [
        [item(a[0], a[0].lease_id)],
        [item(b[0], uuid.uuid4())],  # a lease that is not the partition's
        [item(a[1], a[1].lease_id), {"transactionId": "nope", "status": "completed",
                                     "error": None}],
        [item(b[1], b[1].lease_id, "failed"), item(b[0], b[0].lease_id)],
    ]
    first, *rest = (acker(r) for r in requests)
    outcomes = fused(fstore.messages._acks, first, rest)
    assert fstore.sizes[-2:] == [("ack", 1), ("ack", 3)]  # type: ignore[attr-defined]
    assert [[(r.position, r.status) for r in results] for results in outcomes] == [
        [(1, "completed")],
        [(1, "leased_by_other")],
        [(1, "completed"), (2, "not_found")],
        [(1, "retry_scheduled"), (2, "completed")],
    ]
    (redelivered,) = fstore.messages.pop(PopRoute(queue="ak", partition="p1"), 2, "w")
    assert redelivered.transaction_id == b[1].transaction_id and redelivered.retry_count == 1


def test_fused_acks_of_whole_leases_answer_each_item_of_each_request(fstore: Store) -> None:
    """Decided as whole leases, the call answers one row; each request still gets one
    result an item, in its order, with its own transactionIds."""
    push(fstore, [{"queue": "wl", "partition": f"p{n % 2}", "payload": n} for n in range(5)])
    a = fstore.messages.pop(PopRoute(queue="wl", partition="p0"), 3, "w")
    b = fstore.messages.pop(PopRoute(queue="wl", partition="p1"), 2, "w")
    requests = [[{"transactionId": m.transaction_id, "status": "completed", "error": None,
                  "leaseId": str(m.lease_id)} for m in got] for got in (a, b)]
    first, *rest = (lambda r=r: fstore.messages.ack(r) for r in requests)
    outcomes = fused(fstore.messages._acks, first, rest)
    assert [[(r.position, r.transaction_id, r.status, r.retry_count, r.reason)
             for r in results] for results in outcomes] == [
        [(k, m.transaction_id, "completed", 0, None) for k, m in enumerate(got, 1)]
        for got in (a, b)
    ]
    assert all(r.acknowledged_at is not None for results in outcomes for r in results)
    assert fstore.messages.pop(PopRoute(queue="wl"), 5, "w") == []  # both leases ended


def test_fused_lease_renewals_answer_each_its_own_expiry(fstore: Store) -> None:
    push(fstore, [{"queue": "lx", "partition": f"p{n}", "payload": n} for n in range(2)])
    (a,) = fstore.messages.pop(PopRoute(queue="lx", partition="p0"), 1, "w")
    (b,) = fstore.messages.pop(PopRoute(queue="lx", partition="p1"), 1, "w")
    ext = fstore.leases.extend
    outcomes = fused(
        fstore.leases._extends,
        lambda: ext(a.lease_id, 1000),
        [lambda: ext(b.lease_id, 5000), lambda: ext(uuid.uuid4(), 10), lambda: ext(a.lease_id, None)],
    )
    assert fstore.sizes[-2:] == [("extend", 1), ("extend", 3)]  # type: ignore[attr-defined]
    first, second, unknown, default = outcomes
    assert unknown is None
    assert (second - first).total_seconds() == pytest.approx(4000, abs=1)
    assert (default - first).total_seconds() == pytest.approx(300 - 1000, abs=1)  # leaseTime


def test_without_fusion_every_request_is_a_call_of_its_own(db_dsn: str) -> None:
    s = Store(Database(db_dsn, pool_size=4, timeout_s=5), fused_calls=0)
    s.db.pool.open(wait=True)
    try:
        (r,) = push(s, [{"queue": "off", "payload": 1}])
        assert r.status == "queued"
        (m,) = s.messages.pop(PopRoute(queue="off"), 1, "w")
        (acked,) = s.messages.ack([{"transactionId": m.transaction_id, "status": "completed",
                                    "error": None}])
        assert acked.status == "completed" and not s.messages._pops._queued
    finally:
        s.close()


HUB_WORKLOAD = textwrap.dedent(
    """
    from gevent import monkey
    monkey.patch_all()
    import json, sys, time
    import gevent, orjson, psycopg
    from queen.store import Store
    from queen.store.db import Database

    dsn = sys.argv[1]
    store = Store(Database(dsn, pool_size=6, timeout_s=30), fused_calls=1)
    store.db.pool.open(wait=True)
    sizes = []
    store.observe_calls(lambda kind, n: sizes.append(n))
    def push(n):
        items = [{"queue": "hub", "payload": n}]
        return store.messages.push(orjson.dumps({"items": items}), items)
    push(0)  # the queue and its partition exist
    with psycopg.connect(dsn) as blocker:
        # Hold the partition's push lock: the next push call waits in PostgreSQL.
        blocker.execute(
            "SELECT pg_advisory_xact_lock(queen.push_lock_key(p.id))"
            " FROM queen.partitions p JOIN queen.queues q ON q.id = p.queue_id"
            " WHERE q.name = 'hub'")
        ticks = []
        def ticker():
            while True:
                ticks.append(time.monotonic())
                gevent.sleep(0.01)
        tick = gevent.spawn(ticker)
        pushes = [gevent.spawn(push, n) for n in range(1, 21)]
        gevent.sleep(1.0)
        during = len(ticks)
        blocker.commit()
    gevent.joinall(pushes, raise_error=True)
    tick.kill()
    store.close()
    print(json.dumps({"ticks_during_call": during, "sizes": sizes[1:],
                      "statuses": [r.status for g in pushes for r in g.value]}))
    """
)


def test_under_gevent_a_fused_call_waiting_on_postgresql_leaves_the_hub_running(
    db_dsn: str,
) -> None:
    done = subprocess.run(
        [sys.executable, "-c", HUB_WORKLOAD, db_dsn],
        cwd=ROOT, capture_output=True, text=True, timeout=120, check=False,
    )
    assert done.returncode == 0, done.stderr
    found = json.loads(done.stdout.strip().splitlines()[-1])
    assert found["ticks_during_call"] >= 10  # ~100 expected: the ticker ran throughout
    assert sum(found["sizes"]) == 20 and max(found["sizes"]) > 1  # the waiting pushes fused
    assert found["statuses"] == ["queued"] * 20
