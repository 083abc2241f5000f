"""What the original Queen's clients send and read, over HTTP against a real gunicorn:
partitionId on popped messages and accepted back, a batch ack's top-level consumerGroup,
success beside our own answers, the message routes by partition id, GET /dlq and
DELETE /resources/queues/:queue. (The real upstream client: test_upstream_client.py.)
"""

from __future__ import annotations

from typing import Any

import requests

from tests.conftest import Server
from tests.e2e.servers import API, assert_error, conn, module_dsn, module_server, q

__all__ = ["conn", "module_dsn", "module_server", "q"]  # fixtures

OTHER_PARTITION = "00000000-0000-0000-0000-000000000001"


def call(srv: Server, method: str, path: str, body: Any = None, **params: Any) -> Any:
    return requests.request(method, f"{srv.url}{API}{path}", json=body, params=params, timeout=30)


def push(srv: Server, queue: str, count: int, partition: str = "Default") -> None:
    items = [{"queue": queue, "partition": partition, "payload": {"n": i}} for i in range(count)]
    assert call(srv, "POST", "/push", {"items": items}).status_code == 201


def pop(srv: Server, queue: str, batch: int, group: str | None = None) -> list[dict[str, Any]]:
    params: dict[str, Any] = {"batch": batch, "wait": "false"}
    if group is not None:
        params["consumerGroup"] = group
    resp = call(srv, "GET", f"/pop/queue/{queue}", **params)
    return resp.json()["messages"] if resp.status_code == 200 else []


def partition_id(srv: Server, queue: str, partition: str = "Default") -> str:
    doc = call(srv, "GET", f"/resources/queues/{queue}").json()
    (found,) = [p["id"] for p in doc["partitions"] if p["name"] == partition]
    return str(found)


def test_popped_messages_name_their_partition_by_id(module_server: Server, q: str) -> None:
    push(module_server, q, 2, "a")
    push(module_server, q, 1, "b")
    messages = pop(module_server, q, 10) + pop(module_server, q, 10)
    by_name = {m["partition"]: m["partitionId"] for m in messages}
    assert by_name == {p: partition_id(module_server, q, p) for p in ("a", "b")}


def test_acks_accept_partition_id_and_refuse_a_malformed_one(
    module_server: Server, q: str
) -> None:
    push(module_server, q, 3)
    one, two, three = pop(module_server, q, 3)
    bad = {"transactionId": one["transactionId"], "status": "completed", "partitionId": "p-1"}
    doc = assert_error(call(module_server, "POST", "/ack", bad), 400)
    assert "partitionId" in doc["error"]
    single = {**bad, "partitionId": one["partitionId"], "leaseId": one["leaseId"]}
    answer = call(module_server, "POST", "/ack", single).json()
    assert (answer["status"], answer["success"]) == ("completed", True)
    batch = [
        {"transactionId": m["transactionId"], "partitionId": m["partitionId"],
         "status": "completed"}
        for m in (two, three)
    ]
    answer = call(module_server, "POST", "/ack/batch", {"acknowledgments": batch}).json()
    assert [r["success"] for r in answer["results"]] == [True, True]
    op = {"type": "ack", "transactionId": one["transactionId"], "status": "completed",
          "partitionId": 7}
    assert_error(call(module_server, "POST", "/transaction", {"operations": [op]}), 400, 0)


def test_batch_ack_top_level_group_applies_to_items_naming_none(
    module_server: Server, q: str
) -> None:
    push(module_server, q, 2)
    (first, second) = pop(module_server, q, 2, "ga")
    pop(module_server, q, 2, "gb")
    acks = [
        {"transactionId": first["transactionId"], "status": "completed"},  # ga, the body's
        {"transactionId": first["transactionId"], "status": "completed",
         "consumerGroup": "gb"},  # its own
        {"transactionId": second["transactionId"], "status": "completed",
         "consumerGroup": "gc"},  # never leased there: refused, and says so
    ]
    answer = call(
        module_server, "POST", "/ack/batch", {"acknowledgments": acks, "consumerGroup": "ga"}
    ).json()
    assert [(r["status"], r["success"]) for r in answer["results"][:2]] == [
        ("completed", True),
        ("completed", True),
    ]
    assert answer["results"][2]["success"] is False
    assert answer["results"][2]["reason"] == "not_leased"
    # The same ack sent again reports success (the message is as it asked); a completed
    # ack of a message that failed for good does not.
    again = call(
        module_server, "POST", "/ack/batch", {"acknowledgments": acks[:1], "consumerGroup": "ga"}
    ).json()["results"][0]
    assert (again["reason"], again["success"]) == ("already_completed", True)
    failed = {**acks[0], "status": "failed"}
    answer = call(
        module_server, "POST", "/ack/batch", {"acknowledgments": [failed], "consumerGroup": "ga"}
    ).json()["results"][0]
    assert (answer["reason"], answer["success"]) == ("already_completed", False)


def test_transaction_and_lease_extension_answer_both_names(
    module_server: Server, q: str
) -> None:
    push(module_server, q, 2)
    first, second = pop(module_server, q, 2)
    extended = call(module_server, "POST", f"/lease/{first['leaseId']}/extend", {}).json()
    assert extended["newExpiresAt"] == extended["leaseExpiresAt"]
    op = {"type": "ack", "transactionId": first["transactionId"], "status": "completed",
          "partitionId": first["partitionId"]}
    answer = call(module_server, "POST", "/transaction", {"operations": [op]}).json()
    assert answer["committed"] is True and answer["success"] is True


def test_message_routes_by_partition_id(module_server: Server, q: str) -> None:
    push(module_server, q, 2)
    message, _ = call(module_server, "GET", "/messages", queue=q).json()["messages"]
    txid, pid = message["transactionId"], message["partitionId"]
    got = call(module_server, "GET", f"/messages/{pid}/{txid}")
    assert got.status_code == 200 and got.json()["partitionId"] == pid
    assert_error(call(module_server, "GET", f"/messages/{OTHER_PARTITION}/{txid}"), 404)
    assert_error(call(module_server, "GET", f"/messages/not-a-uuid/{txid}"), 400)
    related = call(module_server, "GET", f"/messages/{pid}/{txid}/related").json()
    assert len(related["messages"]) == 1
    assert call(module_server, "POST", f"/messages/{pid}/{txid}/dlq").json()["movedToDLQ"]
    assert call(module_server, "POST", f"/messages/{pid}/{txid}/retry").json()["retried"]
    assert call(module_server, "DELETE", f"/messages/{pid}/{txid}").json()["deleted"]
    assert_error(call(module_server, "GET", f"/messages/{pid}/{txid}"), 404)


def dead_letter(srv: Server, queue: str, group: str | None) -> str:
    (message,) = pop(srv, queue, 1, group)
    ack = {"transactionId": message["transactionId"], "status": "failed", "error": "bad",
           "consumerGroup": group}
    assert call(srv, "POST", "/ack", ack).json()["status"] == "dead_letter"
    return str(message["transactionId"])


def test_dead_letters_by_queue_and_group(module_server: Server, q: str) -> None:
    options = {"retryLimit": 0, "dlqAfterMaxRetries": True}
    assert call(module_server, "POST", "/configure", {"queue": q, "options": options}).ok
    push(module_server, q, 1, "a")
    push(module_server, q, 1, "b")
    in_queue_mode = dead_letter(module_server, q, None)
    in_group = dead_letter(module_server, q, "audit")
    every = call(module_server, "GET", "/dlq", queue=q).json()
    assert every["total"] == 2
    assert {m["transactionId"] for m in every["messages"]} == {in_queue_mode, in_group}
    (only,) = call(module_server, "GET", "/dlq", queue=q, consumerGroup="audit").json()[
        "messages"
    ]
    assert (only["transactionId"], only["consumerGroup"]) == (in_group, "audit")
    assert only["errorMessage"] == "bad" and only["data"] == {"n": 0}
    page = call(module_server, "GET", "/dlq", queue=q, limit=1, offset=1).json()
    assert page["total"] == 2 and len(page["messages"]) == 1
    assert_error(call(module_server, "GET", "/dlq", queue=f"{q}-none"), 404)
    assert_error(call(module_server, "GET", "/dlq", queue=q, limit=0), 400)


def test_queue_delete(module_server: Server, conn: Any, q: str) -> None:
    push(module_server, q, 3, "a")
    pop(module_server, q, 1, "g")
    answer = call(module_server, "DELETE", f"/resources/queues/{q}").json()
    assert answer == {"deleted": True, "queue": q, "messages": 3}
    assert_error(call(module_server, "GET", f"/resources/queues/{q}"), 404)
    assert_error(call(module_server, "DELETE", f"/resources/queues/{q}"), 404)
    (left,) = conn.execute(
        "SELECT (SELECT count(*) FROM queen.consumer_groups g JOIN queen.queues x"
        "        ON x.id = g.queue_id WHERE x.name = %s)", [q]
    ).fetchone()
    assert left == 0
    push(module_server, q, 1)  # the name is free again: a new, empty queue
    assert len(pop(module_server, q, 10)) == 1
