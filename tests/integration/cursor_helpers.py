"""Helpers for the tests of the cursor store (queen.store.cursors) over plain connections."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import psycopg
import pytest

from queen.store import cursors


@pytest.fixture
def conn(db_dsn: str) -> Iterator[psycopg.Connection[Any]]:
    """An autocommit connection to a fresh database."""
    with psycopg.connect(db_dsn, autocommit=True) as connection:
        yield connection


def make_queue(conn: psycopg.Connection[Any], name: str, **options: Any) -> None:
    """Create queue name with option columns set (lease_time=1, retry_limit=2, ...)."""
    columns = ["name", *options]
    placeholders = ", ".join(["%s"] * len(columns))
    conn.execute(
        f"INSERT INTO queen.queues ({', '.join(columns)}) VALUES ({placeholders})",  # type: ignore[arg-type]
        [name, *options.values()],
    )


def push_n(
    conn: psycopg.Connection[Any], queue: str, n: int, partition: str = "Default", start: int = 0
) -> list[str]:
    """Push n messages {"n": i} with transactionIds '<queue>-<partition>-<i>'; return the ids."""
    txids = [f"{queue}-{partition}-{i}" for i in range(start, start + n)]
    items = [
        {"queue": queue, "partition": partition, "payload": {"n": i}, "transactionId": t}
        for i, t in zip(range(start, start + n), txids, strict=True)
    ]
    results = cursors.push(conn, items)
    assert [r.status for r in results] == ["queued"] * n
    return txids


def ack_all(
    conn: psycopg.Connection[Any], got: list[cursors.Delivery], status: str = "completed"
) -> list[cursors.AckOutcome]:
    """Acknowledge every delivery under its own lease and group."""
    return cursors.ack(conn, [
        {"transactionId": d.transaction_id, "status": status, "consumerGroup": d.consumer_group,
         "leaseId": str(d.lease_id), "error": None if status == "completed" else "boom"}
        for d in got
    ])


def expire_leases_now(conn: psycopg.Connection[Any]) -> None:
    """Move every live lease's expiry into the past (time passing, without the wait)."""
    conn.execute(
        "UPDATE queen.cursor_consumers SET lease_expires_at = now() - interval '1 second'"
        " WHERE lease_id IS NOT NULL"
    )


def numbers(got: list[cursors.Delivery]) -> list[int]:
    return [d.payload["n"] for d in got]
