"""The consumer-group routes on a real server.

Groups come to exist by popping with queen.store.lifecycle directly on the server's database;
messages come through the transaction endpoint's push operations.
"""

from __future__ import annotations

import datetime as dt
from typing import Any

import requests

from queen.store import lifecycle
from tests.e2e.servers import (
    API,
    assert_error,
    conn,
    module_dsn,
    module_server,
    push_op,
    q,
    transaction,
)

__all__ = ["conn", "module_dsn", "module_server", "q"]  # fixtures


def get(server, path: str, **params: str) -> requests.Response:
    return requests.get(f"{server.url}{API}{path}", params=params or None, timeout=30)


def seek(server, group: str, body: Any) -> requests.Response:
    return requests.post(f"{server.url}{API}/consumer-groups/{group}/seek", json=body, timeout=30)


def delete(server, group: str, **params: str) -> requests.Response:
    return requests.delete(
        f"{server.url}{API}/consumer-groups/{group}", params=params or None, timeout=30
    )


def push(server, queue: str, n: int, partition: str = "Default") -> None:
    resp = transaction(server, push_op(queue, *[{"n": i} for i in range(n)], partition=partition))
    assert resp.status_code == 200, resp.text


def ack(conn, got: list[lifecycle.Delivery]) -> None:
    outcomes = lifecycle.ack(
        conn,
        [
            {
                "transactionId": d.transaction_id,
                "status": "completed",
                "consumerGroup": d.consumer_group,
                "leaseId": str(d.lease_id),
            }
            for d in got
        ],
    )
    assert {o.status for o in outcomes} == {"completed"}


def numbers(got: list[lifecycle.Delivery]) -> list[int]:
    return [d.payload["n"] for d in got]


def test_list_shows_each_group_with_its_backlog(module_server, conn, q) -> None:
    push(module_server, q, 3, partition="a")
    push(module_server, q, 2, partition="b")
    ack(conn, lifecycle.pop(conn, q, group="done", batch=10))  # one partition's worth
    lifecycle.pop(conn, q, group="held", partition="b", batch=1)  # leased, not acked
    lifecycle.pop(conn, q, partition="a", batch=1)  # queue mode
    resp = get(module_server, "/consumer-groups", queue=q)
    assert resp.status_code == 200, resp.text
    listed = {g["name"]: g for g in resp.json()["consumerGroups"]}
    assert set(listed) == {"__queue__", "done", "held"}
    assert {g["queue"] for g in listed.values()} == {q}
    assert listed["__queue__"]["queueMode"] is True and listed["held"]["queueMode"] is False
    # "done" acked partition a (3) or b (2); pending counts what is left in both.
    assert listed["done"]["pending"] in (2, 3)
    assert (listed["held"]["pending"], listed["held"]["leasedPartitions"]) == (5, 1)
    assert listed["__queue__"]["pending"] == 5
    for g in listed.values():
        assert g["subscriptionMode"] == "all" and g["subscriptionFrom"] is None
        assert g["pendingCapped"] is False
        assert 0 <= g["lagSeconds"] < 600
        assert g["createdAt"].endswith("Z")
    # Every queue when no filter is given; a queue that does not exist is 404.
    everything = get(module_server, "/consumer-groups").json()["consumerGroups"]
    assert {(g["name"], g["queue"]) for g in everything} >= {(n, q) for n in listed}
    assert_error(get(module_server, "/consumer-groups", queue=f"{q}-none"), 404)


def test_pending_is_counted_up_to_a_cap(module_server, conn, q) -> None:
    for _ in range(2):  # 1,200 messages: more than a listing counts per partition
        push(module_server, q, 600)
    lifecycle.pop(conn, q, group="g", batch=1)
    (listed,) = get(module_server, "/consumer-groups", queue=q).json()["consumerGroups"]
    assert (listed["pending"], listed["pendingCapped"]) == (1000, True)
    detail = get(module_server, "/consumer-groups/g", queue=q).json()
    assert (detail["pending"], detail["pendingCapped"]) == (1200, False)


def test_describe_one_group_per_queue_and_partition(module_server, conn, q) -> None:
    push(module_server, q, 2, partition="a")
    push(module_server, q, 1, partition="b")
    push(module_server, f"{q}-2", 1)
    ack(conn, lifecycle.pop(conn, q, group="g", partition="a", batch=1))
    held = lifecycle.pop(conn, q, group="g", partition="b", batch=1, worker="worker-7")
    lifecycle.pop(conn, f"{q}-2", group="g")
    resp = get(module_server, "/consumer-groups/g")
    assert resp.status_code == 200, resp.text
    doc = resp.json()
    assert (doc["name"], doc["queueMode"]) == ("g", False)
    mine = {entry["queue"]: entry for entry in doc["queues"] if entry["queue"].startswith(q)}
    assert set(mine) == {q, f"{q}-2"}
    by_partition = {p["partition"]: p for p in mine[q]["partitions"]}
    assert set(by_partition) == {"a", "b"}
    a, b = by_partition["a"], by_partition["b"]
    assert (a["pending"], a["lease"]) == (1, None)
    assert a["cursorId"] > 0 and b["cursorId"] == 0
    assert b["pending"] == 1
    assert b["lease"]["leaseId"] == str(held[0].lease_id)
    assert b["lease"]["leasedBy"] == "worker-7"
    assert b["lease"]["size"] == 1
    assert b["lease"]["leaseExpiresAt"].endswith("Z")
    assert mine[q]["pending"] == 2
    only = get(module_server, "/consumer-groups/g", queue=f"{q}-2").json()
    assert [entry["queue"] for entry in only["queues"]] == [f"{q}-2"]
    assert_error(get(module_server, "/consumer-groups/nobody"), 404)
    assert_error(get(module_server, "/consumer-groups/g", queue=f"{q}-none"), 404)
    lifecycle.pop(conn, q)
    assert get(module_server, "/consumer-groups/__queue__", queue=q).json()["queueMode"] is True


def test_seek_to_the_beginning_the_end_and_a_time(module_server, conn, q) -> None:
    push(module_server, q, 3)
    ack(conn, lifecycle.pop(conn, q, group="g", batch=10))
    resp = seek(module_server, "g", {"queue": q, "to": "beginning"})
    assert resp.status_code == 200, resp.text
    assert resp.json() == {"consumerGroup": "g", "queue": q, "to": "beginning", "partitions": 1}
    assert numbers(lifecycle.pop(conn, q, group="g", batch=10)) == [0, 1, 2]  # a lease...
    assert seek(module_server, "g", {"queue": q, "to": "end"}).status_code == 200
    assert lifecycle.pop(conn, q, group="g", batch=10) == []  # ...ended by the seek
    conn.execute(
        "UPDATE queen.messages m SET created_at = m.created_at - interval '2 hours'"
        " FROM queen.partitions p, queen.queues q WHERE p.id = m.partition_id"
        " AND q.id = p.queue_id AND q.name = %s",
        (q,),
    )
    push(module_server, q, 1)
    hour_ago = (dt.datetime.now(dt.UTC) - dt.timedelta(hours=1)).isoformat()
    assert seek(module_server, "g", {"queue": q, "to": hour_ago}).status_code == 200
    assert numbers(lifecycle.pop(conn, q, group="g", batch=10)) == [0]  # the newest only
    # Queue mode is always there to seek, without a pop first.
    assert seek(module_server, "__queue__", {"queue": q, "to": "end"}).status_code == 200


def test_a_seek_never_creates_a_group(module_server, conn, q) -> None:
    push(module_server, q, 2)
    doc = assert_error(seek(module_server, "typo", {"queue": q, "to": "end"}), 404)
    assert "typo" in doc["error"] and q in doc["error"]
    listed = get(module_server, "/consumer-groups", queue=q).json()["consumerGroups"]
    assert "typo" not in [g["name"] for g in listed]
    assert_error(get(module_server, "/consumer-groups/typo"), 404)
    # Its first pop subscribes it, from the oldest message (the seek left no trace).
    assert numbers(lifecycle.pop(conn, q, group="typo", batch=10)) == [0, 1]


def test_an_unknown_queue_is_404_on_every_group_route(module_server, q) -> None:
    push(module_server, q, 1)
    none = f"{q}-none"
    for resp in (
        get(module_server, "/consumer-groups", queue=none),
        get(module_server, "/consumer-groups/__queue__", queue=none),
        seek(module_server, "__queue__", {"queue": none, "to": "end"}),
        delete(module_server, "g", queue=none),
    ):
        assert none in assert_error(resp, 404)["error"]
    # A queue nobody has read yet is known: an empty listing, not a 404.
    assert get(module_server, "/consumer-groups", queue=q).json() == {"consumerGroups": []}


def test_seek_refuses_bad_input(module_server, q) -> None:
    push(module_server, q, 1)
    assert_error(seek(module_server, "g", {"queue": f"{q}-none", "to": "end"}), 404)
    for body in (
        {"to": "end"},
        {"queue": "bad name", "to": "end"},
        {"queue": q},
        {"queue": q, "to": "tomorrow"},
        {"queue": q, "to": 12},
        [],
    ):
        assert_error(seek(module_server, "g", body), 400)
    resp = requests.post(
        f"{module_server.url}{API}/consumer-groups/g/seek",
        data=b"{",
        headers={"Content-Type": "application/json"},
        timeout=30,
    )
    assert_error(resp, 400)
    assert_error(seek(module_server, "bad%20group", {"queue": q, "to": "end"}), 400)


def test_a_deleted_group_starts_over_on_its_next_pop(module_server, conn, q) -> None:
    push(module_server, q, 2)
    push(module_server, f"{q}-2", 1)
    ack(conn, lifecycle.pop(conn, q, group="g", batch=10))
    lifecycle.pop(conn, f"{q}-2", group="g")
    resp = delete(module_server, "g", queue=q)
    assert resp.status_code == 200, resp.text
    assert resp.json() == {"consumerGroup": "g", "deleted": [{"queue": q, "partitions": 1}]}
    assert numbers(lifecycle.pop(conn, q, group="g", batch=10)) == [0, 1]
    assert_error(delete(module_server, "g", queue=f"{q}-none"), 404)
    # Without a queue: the group on every queue it reads.
    everywhere = delete(module_server, "g").json()["deleted"]
    assert {d["queue"] for d in everywhere} >= {q, f"{q}-2"}
    assert_error(get(module_server, "/consumer-groups/g"), 404)
    assert_error(delete(module_server, "g"), 404)
    assert_error(delete(module_server, "__queue__", queue=q), 400)
    assert_error(delete(module_server, "bad%20group"), 400)


def test_bad_query_parameters_are_400(module_server) -> None:
    assert_error(get(module_server, "/consumer-groups", queue="bad name"), 400)
    resp = requests.get(f"{module_server.url}{API}/consumer-groups?queue=a&queue=b", timeout=30)
    assert_error(resp, 400)
    assert_error(get(module_server, "/consumer-groups/bad%20group"), 400)
