"""The read and admin routes over HTTP on a real gunicorn.

Messages are made with queen.store.cursors on a connection of the test's own; every
answer comes from the server.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from typing import Any

import psycopg
import pytest
import requests

from queen.store import cursors
from tests.conftest import Server, cloned_database

Conn = psycopg.Connection[Any]
STATS = ("pending", "processing", "completed", "failed", "deadLetter", "total")


@pytest.fixture(scope="module")
def served(server_dsn: str, template_db: str) -> Iterator[tuple[str, Conn]]:
    with cloned_database(server_dsn, template_db) as dsn:
        srv = Server(dsn).start()
        try:
            with psycopg.connect(dsn, autocommit=True) as conn:
                yield srv.url, conn
        finally:
            srv.stop()


def get(url: str, path: str, **params: Any) -> Any:
    resp = requests.get(url + path, params=params, timeout=30)
    assert resp.status_code == 200, resp.text
    return resp.json()


def stats(pending=0, processing=0, completed=0, failed=0, dead_letter=0) -> dict[str, int]:
    values = (pending, processing, completed, failed, dead_letter)
    return dict(zip(STATS, (*values, sum(values)), strict=True))


def history(conn: Conn) -> str:
    """A queue with partitions a (3: 2 completed, 1 failed for good) and b (2: 1 processing)."""
    queue = f"cr-{uuid.uuid4().hex[:8]}"
    conn.execute(
        "INSERT INTO queen.queues (name, namespace, task, retry_limit, dlq_after_max_retries)"
        " VALUES (%s, 'ns', 'task', 0, false)", (queue,))
    cursors.push(conn, [{"queue": queue, "partition": "a", "payload": {"n": i},
                         "transactionId": f"{queue}-a{i}"} for i in range(3)])
    cursors.push(conn, [{"queue": queue, "partition": "b", "payload": {"n": i},
                         "transactionId": f"{queue}-b{i}"} for i in range(2)])
    got = cursors.pop(conn, queue, partition="a", batch=3, worker="w")
    cursors.ack(conn, [{"transactionId": d.transaction_id, "status": s, "error": "boom"}
                       for d, s in zip(got, ("completed", "completed", "failed"), strict=True)])
    assert len(cursors.pop(conn, queue, partition="b", batch=1, worker="w")) == 1
    return queue


def test_counts_over_http_are_derived(served: tuple[str, Conn]) -> None:
    url, conn = served
    queue = history(conn)
    one = get(url, f"/api/v1/analytics/queue/{queue}")
    assert one["partitions"] == [
        {"name": "a", "stats": stats(completed=2, failed=1)},
        {"name": "b", "stats": stats(pending=1, processing=1)},
    ]
    assert one["totals"] == stats(pending=1, processing=1, completed=2, failed=1)
    (summary,) = [q for q in get(url, "/api/v1/resources/queues")["queues"] if q["name"] == queue]
    assert summary["messages"]["total"] == 5 and summary["partitions"] == 2
    detail = get(url, f"/api/v1/resources/queues/{queue}")
    assert detail["partitions"][0]["oldestMessage"] is not None
    (depth,) = [d for d in get(url, "/api/v1/analytics/queue-depths", queue=queue)["depths"]]
    assert (depth["depth"], depth["processing"]) == (1, 1)
    assert get(url, "/api/v1/resources/overview")["messages"]["total"] >= 5
    assert len(get(url, "/api/v1/analytics/throughput", queue=queue)["throughput"]) == 60
    assert get(url, "/api/v1/analytics/queue-lag", queue=queue) == {"queues": []}  # < 5 done
    metrics = requests.get(url + "/metrics/prometheus", timeout=30).text
    assert queue in metrics


def test_messages_over_http_carry_uuids_and_statuses(served: tuple[str, Conn]) -> None:
    url, conn = served
    queue = history(conn)
    page = get(url, "/api/v1/messages", queue=queue, limit=10)
    assert [m["transactionId"] for m in page["messages"]] == [
        f"{queue}-b1", f"{queue}-b0", f"{queue}-a2", f"{queue}-a1", f"{queue}-a0"]
    assert all(uuid.UUID(m["id"]).version == 7 for m in page["messages"])
    assert [m["status"] for m in page["messages"]] == [
        "pending", "processing", "failed", "completed", "completed"]
    assert page["hasMore"] is False
    failed = get(url, "/api/v1/messages", queue=queue, status="failed")["messages"]
    assert [m["errorMessage"] for m in failed] == ["boom"]
    one = get(url, f"/api/v1/messages/{queue}-b0")
    assert (one["status"], one["workerId"], one["options"]["retryLimit"]) == ("processing", "w", 0)
    related = get(url, f"/api/v1/messages/{queue}-a1/related")["messages"]
    assert {m["transactionId"] for m in related} == {f"{queue}-a0", f"{queue}-a2"}
    assert requests.get(url + "/api/v1/messages/nope", timeout=30).status_code == 404


def test_admin_actions_over_http(served: tuple[str, Conn]) -> None:
    url, conn = served
    queue = history(conn)
    base = f"{url}/api/v1/messages"
    assert requests.post(f"{base}/{queue}-a0/retry", timeout=30).status_code == 409
    resp = requests.post(f"{base}/{queue}-a2/retry", timeout=30)
    assert resp.status_code == 200 and resp.json()["retried"] is True
    assert get(url, f"/api/v1/messages/{queue}-a2")["status"] == "pending"
    again = cursors.pop(conn, queue, partition="a", batch=10)
    assert [d.transaction_id for d in again] == [f"{queue}-a2"]
    assert requests.post(f"{base}/{queue}-b1/dlq", timeout=30).status_code == 200
    assert get(url, f"/api/v1/messages/{queue}-b1")["status"] == "dead_letter"
    resp = requests.delete(f"{base}/{queue}-a0", timeout=30)
    assert resp.status_code == 200 and resp.json()["deleted"] is True
    assert requests.delete(f"{base}/{queue}-a0", timeout=30).status_code == 404
    resp = requests.delete(f"{url}/api/v1/queues/{queue}/clear", timeout=30)
    assert resp.status_code == 200 and resp.json()["count"] == 4
    assert get(url, f"/api/v1/analytics/queue/{queue}")["totals"] == stats()
    assert requests.delete(f"{url}/api/v1/queues/nope/clear", timeout=30).status_code == 404
