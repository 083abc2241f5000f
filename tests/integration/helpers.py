"""Small helpers for the integration tests: push, pop and ack through the Store, and the
same on a plain connection through queen.store.lifecycle."""

from __future__ import annotations

import re
from collections.abc import Iterator
from typing import Any

import orjson
import psycopg
import pytest

from queen.models import AckResult, Popped, PopRoute, PushResult
from queen.store import Store, lifecycle


def push(store: Store, items: list[dict[str, Any]]) -> list[PushResult]:
    """Push already-valid items the way the API does (raw body plus parsed items)."""
    return store.messages.push(orjson.dumps({"items": items}), items)


def pop(
    store: Store,
    queue: str | None = None,
    partition: str | None = None,
    batch: int = 1,
    worker: str = "test",
    **filters: str,
) -> list[Popped]:
    route = PopRoute(queue=queue, partition=partition, **filters)
    return store.messages.pop(route, batch, worker)


def ack(store: Store, txid: str, status: str = "completed", error: str | None = None) -> AckResult:
    (result,) = store.messages.ack([{"transactionId": txid, "status": status, "error": error}])
    return result


def data(message: Popped) -> Any:
    return orjson.loads(message.payload)


def scalar(dsn: str, query: str, params: tuple[Any, ...] = ()) -> Any:
    with psycopg.connect(dsn, autocommit=True) as conn:
        row = conn.execute(query, params).fetchone()  # type: ignore[arg-type]
        return None if row is None else row[0]


def rows(dsn: str, query: str, params: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    with psycopg.connect(dsn, autocommit=True) as conn:
        return conn.execute(query, params).fetchall()  # type: ignore[arg-type]


FUNCTION_CALLS = "SELECT funcname, calls FROM pg_stat_xact_user_functions"


def with_calls(
    conn: psycopg.Connection[Any], query: str, params: Any = ()
) -> tuple[list[tuple[Any, ...]], dict[str, int]]:
    """query's rows, run in a transaction of its own, and how often it called each
    function (the session's counts not yet reported are taken before and after it)."""
    with conn.transaction():
        conn.execute("SET LOCAL track_functions = 'all'")
        before = dict(conn.execute(FUNCTION_CALLS).fetchall())
        got = conn.execute(query, params).fetchall()
        after = dict(conn.execute(FUNCTION_CALLS).fetchall())
    return got, {f: n - before.get(f, 0) for f, n in after.items() if n > before.get(f, 0)}


# A ranking of a queue's partitions, as queen.pop and queen.pop_rows make it (a narrow
# queue's in place, a wide one's by queen.candidates): the statement that assigns it.
RANKING = re.compile(r"^Query Text: (?:ranking|candidates) :=", re.MULTILINE)
# A set claim of queen.pop_rows: the statement that leases the rows it locked.
SET_CLAIM = re.compile(r"^Query Text: WITH picked AS MATERIALIZED", re.MULTILINE)
# (auto_explain reporting every statement run, nested ones too, to the session.)
AUTO_EXPLAIN = (
    "LOAD 'auto_explain'",
    "SET auto_explain.log_min_duration = 0",
    "SET auto_explain.log_nested_statements = on",
    "SET auto_explain.log_level = 'notice'",
    "SET client_min_messages = 'notice'",
)


def with_statements(
    conn: psycopg.Connection[Any], query: str, params: Any = ()
) -> tuple[list[tuple[Any, ...]], dict[str, int]]:
    """with_calls, with how many rankings of a queue's partitions ("rankings") and set
    claims ("set_claims") the query made among the calls, counted from the statements
    auto_explain reports (an inlined SQL function and a statement leave no call count)."""
    notes: list[str] = []

    def note(diagnostic: psycopg.errors.Diagnostic) -> None:
        notes.append(diagnostic.message_primary or "")

    conn.add_notice_handler(note)
    try:
        for setting in AUTO_EXPLAIN:
            conn.execute(setting)
        got, calls = with_calls(conn, query, params)
    finally:
        conn.execute("SET auto_explain.log_min_duration = -1")
        conn.remove_notice_handler(note)
    for name, statement in (("rankings", RANKING), ("set_claims", SET_CLAIM)):
        made = sum(1 for n in notes if statement.search(n))
        if made:
            calls[name] = made
    return got, calls


def partition_id(dsn: str, queue: str, partition: str) -> Any:
    """The id of a queue's partition (None when it does not exist)."""
    return scalar(
        dsn,
        "SELECT p.id FROM queen.partitions p JOIN queen.queues q ON q.id = p.queue_id"
        " WHERE q.name = %s AND p.name = %s",
        (queue, partition),
    )


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
    results = lifecycle.push(conn, items)
    assert [r.status for r in results] == ["queued"] * n
    return txids


def ack_all(
    conn: psycopg.Connection[Any], got: list[lifecycle.Delivery], status: str = "completed"
) -> list[lifecycle.AckOutcome]:
    """Acknowledge every delivery under its own lease and group."""
    return lifecycle.ack(conn, [
        {"transactionId": d.transaction_id, "status": status, "consumerGroup": d.consumer_group,
         "leaseId": str(d.lease_id), "error": None if status == "completed" else "boom"}
        for d in got
    ])


def expire_leases_now(conn: psycopg.Connection[Any]) -> None:
    """Move every live lease's expiry into the past (time passing, without the wait)."""
    conn.execute(
        "UPDATE queen.consumers SET lease_expires_at = now() - interval '1 second'"
        " WHERE lease_id IS NOT NULL"
    )


def numbers(got: list[lifecycle.Delivery]) -> list[int]:
    return [d.payload["n"] for d in got]
