"""A gunicorn shared by a module's tests.

One server and one database per test module (each test uses queues of its own name):
starting gunicorn per test would dominate these tests' time.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from typing import Any

import psycopg
import pytest
import requests

from queen.store import lifecycle
from tests.conftest import Server, cloned_database

ENCRYPTION_KEY = "ab" * 32
API = "/api/v1"


@pytest.fixture(scope="module")
def module_dsn(server_dsn: str, template_db: str) -> Iterator[str]:
    with cloned_database(server_dsn, template_db) as dsn:
        yield dsn


@pytest.fixture(scope="module")
def module_server(module_dsn: str) -> Iterator[Server]:
    srv = Server(module_dsn, QUEEN_ENCRYPTION_KEY=ENCRYPTION_KEY)
    srv.start()
    yield srv
    srv.stop()


@pytest.fixture
def fresh_server(db_dsn: str) -> Iterator[Server]:
    """A server of its own, on this test's fresh database."""
    srv = Server(db_dsn).start()
    yield srv
    srv.stop()


@pytest.fixture
def conn(module_dsn: str) -> Iterator[psycopg.Connection[Any]]:
    """An autocommit connection to the server's database."""
    with psycopg.connect(module_dsn, autocommit=True) as connection:
        yield connection


@pytest.fixture
def q() -> str:
    """A queue name prefix of this test's own."""
    return f"q{uuid.uuid4().hex[:10]}"


def transaction(server: Server, *operations: dict[str, Any]) -> requests.Response:
    return requests.post(
        f"{server.url}{API}/transaction", json={"operations": list(operations)}, timeout=30
    )


def push_op(
    queue: str, *payloads: Any, partition: str | None = None, txids: list[str] | None = None
) -> dict[str, Any]:
    items = []
    for i, payload in enumerate(payloads):
        item: dict[str, Any] = {"queue": queue, "payload": payload}
        if partition is not None:
            item["partition"] = partition
        if txids is not None:
            item["transactionId"] = txids[i]
        items.append(item)
    return {"type": "push", "items": items}


def ack_op(d: lifecycle.Delivery, status: str = "completed", **extra: Any) -> dict[str, Any]:
    return {
        "type": "ack",
        "transactionId": d.transaction_id,
        "status": status,
        "consumerGroup": d.consumer_group,
        "leaseId": str(d.lease_id),
        **extra,
    }


def stored(conn: psycopg.Connection[Any], queue: str) -> list[Any]:
    """The payloads stored in queue, in id order (read from the database)."""
    rows = conn.execute(
        "SELECT m.payload FROM queen.messages m"
        " JOIN queen.partitions p ON p.id = m.partition_id"
        " JOIN queen.queues q ON q.id = p.queue_id WHERE q.name = %s ORDER BY m.id",
        (queue,),
    ).fetchall()
    return [r[0] for r in rows]


def assert_error(resp: requests.Response, status: int, operation: int | None = None) -> dict:
    assert resp.status_code == status, (resp.status_code, resp.text)
    assert resp.headers["content-type"].startswith("application/json")
    doc = resp.json()
    assert isinstance(doc["error"], str) and doc["error"]
    if operation is not None:
        assert doc["operation"] == operation, doc
        assert doc["error"].startswith(f"operations[{operation}]"), doc
    return doc
