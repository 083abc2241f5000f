"""The store's pool hands out the connection returned last (queen.store.db.LifoPool)."""

from __future__ import annotations

import gc

from queen.server.memory import return_large_frees
from queen.store import Store, db
from queen.store.db import Database, LifoPool
from tests.integration.helpers import ack, pop, push


def test_the_connection_returned_last_is_handed_out_first(db_dsn: str) -> None:
    pool = LifoPool(db_dsn, min_size=3, max_size=3, open=True, kwargs={"autocommit": True})
    try:
        pool.wait()
        first, second, third = pool.getconn(), pool.getconn(), pool.getconn()
        for conn in (first, second, third):
            pool.putconn(conn)
        # psycopg_pool's own order would give back `first`, idle longest.
        assert pool.getconn() is third
    finally:
        pool.close()


def test_sequential_requests_reuse_one_backend(db_dsn: str) -> None:
    db = Database(db_dsn, pool_size=4)
    db.pool.open(wait=True)
    db.pool.resize(min_size=4)
    db.pool.wait()
    try:
        pids = {_backend_pid(db) for _ in range(20)}
        assert len(pids) == 1
    finally:
        db.close()


def _backend_pid(db: Database) -> int:
    with db.connection() as conn:
        row = conn.execute("SELECT pg_backend_pid()").fetchone()
        assert row is not None
        return int(row[0])


def _rss_bytes() -> int:
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    raise AssertionError("no VmRSS")


def test_a_connection_that_carried_a_huge_message_is_replaced(db_dsn: str) -> None:
    assert return_large_frees()  # as each worker does (queen.worker)
    # One connection: with two, the replacement of one retired during the warm-up could
    # arrive between the measurements below and take the huge push in its place.
    store = Store(Database(db_dsn, pool_size=1))
    store.db.pool.open(wait=True)
    try:
        size = 3 * db.LARGE_CALL_BYTES
        items = [{"queue": "huge", "payload": "x" * size}]
        push(store, items[:1])  # warm up allocations of the same shape
        (warm,) = pop(store, "huge")
        ack(store, warm.transaction_id)
        del warm
        gc.collect()
        baseline, before = _rss_bytes(), _backend_pid(store.db)
        push(store, items)
        assert _backend_pid(store.db) != before  # libpq's buffers went with the old one
        after_push = _backend_pid(store.db)
        (message,) = pop(store, "huge")
        assert len(message.payload) == size + 2
        del message
        assert _backend_pid(store.db) != after_push
        gc.collect()
        # Each kept connection would hold about `size` bytes more.
        assert _rss_bytes() - baseline < size / 2, (_rss_bytes() - baseline) / 2**20
    finally:
        store.close()
