"""The store's pool hands out the connection returned last (queen.store.db.LifoPool)."""

from __future__ import annotations

from queen.store.db import Database, LifoPool


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
