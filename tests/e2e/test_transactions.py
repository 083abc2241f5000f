"""POST /api/v1/transaction on a real server: all operations or none.

Messages are created through the transaction's own push operations and popped with the
queen.store.lifecycle directly on the server's database (pop over HTTP is another route's work).
"""

from __future__ import annotations

import select
import time
import uuid
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import psycopg
import pytest
import requests
from psycopg import sql

from queen.store import lifecycle
from queen.wakeup import CHANNEL
from tests.e2e.servers import (
    API,
    ack_op,
    assert_error,
    conn,
    module_dsn,
    module_server,
    push_op,
    q,
    stored,
    transaction,
)
from tests.e2e.test_dashboard import connect, wait_for

__all__ = ["conn", "module_dsn", "module_server", "q"]  # fixtures


def push_and_pop(server, conn, queue: str, n: int = 1, group: str = lifecycle.QUEUE_MODE):
    resp = transaction(server, push_op(queue, *[{"n": i} for i in range(n)]))
    assert resp.status_code == 200, resp.text
    return lifecycle.pop(conn, queue, group=group, batch=n)


def test_pushes_commit_together_and_answer_per_item(module_server, conn, q) -> None:
    resp = transaction(
        module_server,
        push_op(f"{q}-a", {"n": 1}, {"n": 2}, txids=[f"{q}-1", f"{q}-2"]),
        push_op(f"{q}-b", {"n": 3}, partition="p1"),
    )
    assert resp.status_code == 200, resp.text
    doc = resp.json()
    assert doc["committed"] is True
    first, second = doc["results"]
    assert first["type"] == "push" and second["type"] == "push"
    assert [m["status"] for m in first["messages"]] == ["queued", "queued"]
    assert [m["transactionId"] for m in first["messages"]] == [f"{q}-1", f"{q}-2"]
    assert [m["status"] for m in second["messages"]] == ["queued"]
    assert stored(conn, f"{q}-a") == [{"n": 1}, {"n": 2}]
    assert stored(conn, f"{q}-b") == [{"n": 3}]
    # A transactionId stored already is a duplicate, as for a plain push.
    again = transaction(module_server, push_op(f"{q}-a", {"n": 9}, txids=[f"{q}-1"]))
    (duplicate,) = again.json()["results"][0]["messages"]
    assert duplicate["status"] == "duplicate"
    assert stored(conn, f"{q}-a") == [{"n": 1}, {"n": 2}]
    # Ids are the API's message ids, as a push and GET /messages answer them.
    shown = requests.get(f"{module_server.url}/api/v1/messages/{q}-1", timeout=10).json()
    assert first["messages"][0]["id"] == shown["id"] == duplicate["id"]
    assert uuid.UUID(first["messages"][1]["id"]).version == 7


def test_a_pipeline_stage_consumes_a_and_produces_b_exactly_once(module_server, conn, q) -> None:
    (got,) = push_and_pop(module_server, conn, f"{q}-in")
    stage = [
        ack_op(got),
        push_op(f"{q}-out", {"from": got.payload["n"]}, txids=[f"{q}-out-of-{got.transaction_id}"]),
    ]
    resp = transaction(module_server, *stage)
    assert resp.status_code == 200, resp.text
    ack, push = resp.json()["results"]
    assert ack == {
        "type": "ack",
        "transactionId": got.transaction_id,
        "consumerGroup": "__queue__",
        "status": "completed",
    }
    assert push["messages"][0]["status"] == "queued"
    assert stored(conn, f"{q}-out") == [{"from": 0}]
    assert lifecycle.pop(conn, f"{q}-in") == []  # consumed
    # The same stage sent again (its answer lost, say) applies nothing a second time, and
    # says it was applied before.
    again = transaction(module_server, *stage)
    assert again.status_code == 200, again.text
    assert again.json()["alreadyApplied"] is True
    ack, push = again.json()["results"]
    assert (ack["status"], ack["reason"]) == ("completed", "already_completed")
    assert push["messages"][0]["status"] == "duplicate"
    assert stored(conn, f"{q}-out") == [{"from": 0}]


def test_failed_acks_in_a_transaction_schedule_retries(module_server, conn, q) -> None:
    (got,) = push_and_pop(module_server, conn, q)
    resp = transaction(module_server, ack_op(got, "failed", error="boom"))
    assert resp.status_code == 200, resp.text
    (ack,) = resp.json()["results"]
    assert (ack["status"], ack["retryCount"]) == ("retry_scheduled", 1)
    (again,) = lifecycle.pop(conn, q)
    assert (again.transaction_id, again.retry_count) == (got.transaction_id, 1)


def test_acks_of_several_groups_and_partitions_in_one_transaction(module_server, conn, q) -> None:
    transaction(
        module_server, push_op(q, {"n": 0}, partition="a"), push_op(q, {"n": 1}, partition="b")
    )
    popped = [
        lifecycle.pop(conn, q, partition=p, group=g)[0] for p in ("a", "b") for g in ("g1", "g2")
    ]
    resp = transaction(module_server, *[ack_op(d) for d in popped])
    assert resp.status_code == 200, resp.text
    assert [r["status"] for r in resp.json()["results"]] == ["completed"] * 4
    assert [r["consumerGroup"] for r in resp.json()["results"]] == ["g1", "g2", "g1", "g2"]
    for group in ("g1", "g2"):
        assert lifecycle.pop(conn, q, group=group, batch=10) == []


def lease_state(conn: psycopg.Connection[Any], txid: str) -> tuple[Any, ...]:
    """(cursor_id, lease_acked, lease live) of the queue-mode row of txid's partition."""
    row = conn.execute(
        "SELECT c.cursor_id, c.lease_acked, c.lease_expires_at > now()"
        " FROM queen.consumers c JOIN queen.named(%s) m"
        " ON m.partition_id = c.partition_id WHERE c.consumer_group = '__queue__'",
        (txid,),
    ).fetchone()
    assert row is not None
    return tuple(row)


def bad_operation(kind: str, server, conn, q: str) -> tuple[dict[str, Any], int]:
    """An operation that cannot be applied, and the status it must answer."""
    if kind == "unknown message":
        return {"type": "ack", "transactionId": f"{q}-nope", "status": "completed"}, 404
    if kind == "stale lease":
        (d,) = push_and_pop(server, conn, f"{q}-stale")
        return ack_op(d, leaseId="00000000-0000-0000-0000-000000000000"), 409
    if kind == "not leased":
        transaction(server, push_op(f"{q}-idle", {"n": 1}, txids=[f"{q}-idle-1"]))
        return {"type": "ack", "transactionId": f"{q}-idle-1", "status": "completed"}, 409
    if kind == "full queue":
        requests.post(
            f"{server.url}{API}/configure",
            json={"queue": f"{q}-full", "options": {"maxSize": 1}},
            timeout=30,
        )
        transaction(server, push_op(f"{q}-full", {"n": 1}))
        return push_op(f"{q}-full", {"n": 2}), 429
    assert kind == "invalid item"
    return {"type": "push", "items": [{"queue": "no spaces allowed", "payload": 1}]}, 400


@pytest.mark.parametrize(
    "kind", ["unknown message", "stale lease", "not leased", "full queue", "invalid item"]
)
def test_one_bad_operation_applies_nothing(module_server, conn, q, kind) -> None:
    (got,) = push_and_pop(module_server, conn, f"{q}-in")
    bad, status = bad_operation(kind, module_server, conn, q)
    before = lease_state(conn, got.transaction_id)
    resp = transaction(module_server, ack_op(got), push_op(f"{q}-out", {"n": 1}), bad)
    assert_error(resp, status, operation=2)
    # Read back from the database: the ack and the push of the same request left nothing.
    assert stored(conn, f"{q}-out") == []
    assert lease_state(conn, got.transaction_id) == before
    assert before[1] == [] and before[2] is True  # still leased, nothing acked
    assert transaction(module_server, ack_op(got)).status_code == 200  # the lease still holds


BAD_BODIES: list[tuple[str, Any, int]] = [
    ("not an object", [], 400),
    ("no operations", {}, 400),
    ("empty operations", {"operations": []}, 400),
    ("operations not a list", {"operations": {"type": "ack"}}, 400),
    ("operation not an object", {"operations": [1]}, 400),
    ("unknown type", {"operations": [{"type": "delete"}]}, 400),
    ("ack without transactionId", {"operations": [{"type": "ack", "status": "completed"}]}, 400),
    (
        "ack with a bad status",
        {"operations": [{"type": "ack", "transactionId": "t", "status": "done"}]},
        400,
    ),
    (
        "ack with a bad leaseId",
        {
            "operations": [
                {"type": "ack", "transactionId": "t", "status": "completed", "leaseId": "nope"}
            ]
        },
        400,
    ),
    (
        "ack with a numeric leaseId",
        {
            "operations": [
                {"type": "ack", "transactionId": "t", "status": "completed", "leaseId": 7}
            ]
        },
        400,
    ),
    (
        "ack with a bad consumerGroup",
        {
            "operations": [
                {
                    "type": "ack",
                    "transactionId": "t",
                    "status": "completed",
                    "consumerGroup": "no spaces",
                }
            ]
        },
        400,
    ),
    ("push without items", {"operations": [{"type": "push"}]}, 400),
    ("push with empty items", {"operations": [{"type": "push", "items": []}]}, 400),
    (
        "push item without payload",
        {"operations": [{"type": "push", "items": [{"queue": "x"}]}]},
        400,
    ),
    (
        "push item with NUL",
        {"operations": [{"type": "push", "items": [{"queue": "x", "payload": "a\u0000"}]}]},
        400,
    ),
    (
        "the same ack twice",
        {
            "operations": [
                {"type": "ack", "transactionId": "t", "status": "completed"},
                {"type": "ack", "transactionId": "t", "status": "failed"},
            ]
        },
        400,
    ),
    (
        "the same ack twice, once as queue mode by name",
        {
            "operations": [
                {"type": "ack", "transactionId": "t", "status": "completed"},
                {
                    "type": "ack",
                    "transactionId": "t",
                    "status": "completed",
                    "consumerGroup": "__queue__",
                },
            ]
        },
        400,
    ),
    (
        "too many operations",
        {
            "operations": [
                {"type": "ack", "transactionId": f"t{i}", "status": "completed"}
                for i in range(1001)
            ]
        },
        413,
    ),
    (
        "too many items",
        {
            "operations": [
                {"type": "push", "items": [{"queue": "x", "payload": i} for i in range(600)]}
            ]
            * 2
        },
        413,
    ),
]


@pytest.mark.parametrize(("why", "body", "status"), BAD_BODIES, ids=[b[0] for b in BAD_BODIES])
def test_bad_bodies_are_4xx_json(module_server, conn, why, body, status) -> None:
    resp = requests.post(f"{module_server.url}{API}/transaction", json=body, timeout=30)
    assert_error(resp, status)
    assert stored(conn, "x") == []


def test_malformed_json_is_400(module_server) -> None:
    resp = requests.post(
        f"{module_server.url}{API}/transaction",
        data=b"{nope",
        headers={"Content-Type": "application/json"},
        timeout=30,
    )
    assert_error(resp, 400)


def test_pushes_into_encrypted_queues_are_sealed(module_server, conn, q) -> None:
    resp = requests.post(
        f"{module_server.url}{API}/configure",
        json={"queue": q, "options": {"encryptionEnabled": True}},
        timeout=30,
    )
    assert resp.status_code == 200, resp.text
    time.sleep(2.2)  # the server's cache of queue flags (queen.store.queues.FLAGS_TTL)
    item = {"queue": q, "payload": {"secret": 1}, "encrypted": False}
    assert transaction(module_server, {"type": "push", "items": [item]}).status_code == 200
    row = conn.execute(
        "SELECT m.payload, m.encrypted FROM queen.messages m"
        " JOIN queen.partitions p ON p.id = m.partition_id"
        " JOIN queen.queues q ON q.id = p.queue_id WHERE q.name = %s",
        (q,),
    ).fetchone()
    assert row is not None
    payload, encrypted = row
    assert encrypted is True
    assert "secret" not in str(payload)
    # A client's own marker does not make a plain queue's payload count as sealed.
    plain = {"queue": f"{q}-plain", "payload": {"x": 1}, "encrypted": True}
    assert transaction(module_server, {"type": "push", "items": [plain]}).status_code == 200
    flags = conn.execute(
        "SELECT encrypted FROM queen.messages WHERE payload = %s::jsonb", ('{"x": 1}',)
    ).fetchall()
    assert flags == [(False,)]


def wakeups(listener: psycopg.Connection[Any], timeout: float) -> list[str]:
    """Wake-up notifications within timeout seconds."""
    deadline = time.monotonic() + timeout
    seen: list[str] = []
    while time.monotonic() < deadline:
        select.select([listener.fileno()], [], [], max(0.0, deadline - time.monotonic()))
        seen += [n.payload for n in listener.notifies(timeout=0)]
        if seen:
            return seen
    return seen


def test_long_polls_are_woken_after_commit_and_not_after_a_rollback(
    module_server, module_dsn, conn, q
) -> None:
    with psycopg.connect(module_dsn, autocommit=True) as listener:
        listener.execute(sql.SQL("LISTEN {}").format(sql.Identifier(CHANNEL)))
        conn.execute("SELECT queen.list_waiting_worker('parked-test', 60)")
        try:
            bad = {"type": "ack", "transactionId": f"{q}-nope", "status": "completed"}
            assert transaction(module_server, push_op(q, {"n": 1}), bad).status_code == 404
            assert [p for p in wakeups(listener, 1.0) if q in p] == []
            assert transaction(module_server, push_op(q, {"n": 1})).status_code == 200
            assert any(q in p for p in wakeups(listener, 20.0))
        finally:
            conn.execute("DELETE FROM queen.waiting_workers WHERE worker = 'parked-test'")


def test_racing_copies_of_a_stage_commit_once(module_server, conn, q) -> None:
    """Four copies of each stage at once (different output ids): one commits, three get 409."""
    popped = push_and_pop(module_server, conn, f"{q}-in", n=10)

    def stage(d: lifecycle.Delivery, copy: int) -> int:
        out = push_op(f"{q}-out", {"n": d.payload["n"]}, txids=[f"{d.transaction_id}-{copy}"])
        return transaction(module_server, ack_op(d), out).status_code

    with ThreadPoolExecutor(8) as pool:
        statuses = list(
            pool.map(lambda args: stage(*args), [(d, c) for d in popped for c in range(4)])
        )
    assert Counter(statuses) == {200: 10, 409: 30}
    assert sorted(p["n"] for p in stored(conn, f"{q}-out")) == list(range(10))


def test_dashboards_see_a_transactions_pushes_and_acks(module_server, conn, q) -> None:
    (got,) = push_and_pop(module_server, conn, f"{q}-in")
    ws = connect(module_server)
    try:
        out = push_op(f"{q}-out", {"n": 1}, txids=[f"{q}-out-1"])
        assert transaction(module_server, ack_op(got), out).status_code == 200
        pushed = wait_for(
            ws,
            lambda e: e["event"] == "message.pushed" and e["data"]["transactionId"] == f"{q}-out-1",
        )
        assert pushed["data"]["queue"] == f"{q}-out"
        wait_for(
            ws,
            lambda e: (
                e["event"] == "message.completed"
                and e["data"]["transactionId"] == got.transaction_id
            ),
        )
    finally:
        ws.close()
