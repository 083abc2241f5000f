"""Small helpers for the integration tests: push, pop and ack through the store."""

from __future__ import annotations

from typing import Any

import orjson
import psycopg

from queen.models import AckResult, Popped, PopRoute, PushResult
from queen.store import Store


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


def partition_id(dsn: str, queue: str, partition: str) -> Any:
    """The id of a queue's partition (None when it does not exist)."""
    return scalar(
        dsn,
        "SELECT p.id FROM queen.partitions p JOIN queen.queues q ON q.id = p.queue_id"
        " WHERE q.name = %s AND p.name = %s",
        (queue, partition),
    )
