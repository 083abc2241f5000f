"""A fused ack call of several consumers' whole leases, decided as a set (queen.ack_leases),
and the calls that are not such a set, decided pair by pair as before."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import psycopg
import pytest
from falcon import testing

from queen.app import create_app
from queen.config import Settings
from queen.store import Store
from queen.store.db import Database

A = "/api/v1"
Conn = psycopg.Connection[Any]


@pytest.fixture
def client(db_dsn: str) -> Iterator[testing.TestClient]:
    store = Store(Database(db_dsn, pool_size=2, timeout_s=5))
    store.db.pool.open(wait=True)
    settings = Settings.from_env({}, database_url=db_dsn)
    yield testing.TestClient(create_app(settings, store=store))
    store.close()


@pytest.fixture
def conn(db_dsn: str) -> Iterator[Conn]:
    with psycopg.connect(db_dsn, autocommit=True) as c:
        yield c


def push(client: testing.TestClient, queue: str, partition: str, *txids: str) -> None:
    items = [{"queue": queue, "partition": partition, "payload": {"t": t}, "transactionId": t}
             for t in txids]
    assert client.simulate_post(f"{A}/push", json={"items": items}).status_code == 201


def pop(client: testing.TestClient, queue: str, partition: str, batch: int,
        group: str | None = None) -> list[dict[str, Any]]:
    params = {"batch": str(batch)}
    if group:
        params["consumerGroup"] = group
    resp = client.simulate_get(f"{A}/pop/queue/{queue}/partition/{partition}", params=params)
    assert resp.status_code == 200, resp.text
    return list(resp.json["messages"])


def batch_ack(client: testing.TestClient, items: list[dict[str, Any]]) -> list[dict[str, Any]]:
    resp = client.simulate_post(f"{A}/ack/batch", json={"acknowledgments": items})
    assert resp.status_code == 200, resp.text
    return list(resp.json["results"])


def item(m: dict[str, Any], with_lease: bool = True, status: str = "completed") -> dict[str, Any]:
    doc = {"transactionId": m["transactionId"], "status": status,
           "consumerGroup": m["consumerGroup"]}
    if with_lease:
        doc["leaseId"] = m["leaseId"]
    return doc


def rows(conn: Conn, queue: str) -> list[tuple[Any, ...]]:
    return conn.execute(
        "SELECT p.name, c.consumer_group, c.lease_id IS NULL, c.done_ids,"
        " (SELECT count(*) FROM queen.completions k WHERE k.partition_id = c.partition_id"
        "  AND k.consumer_group = c.consumer_group)"
        " FROM queen.consumers c JOIN queen.partitions p ON p.id = c.partition_id"
        " JOIN queen.queues q ON q.id = p.queue_id WHERE q.name = %s ORDER BY 1, 2",
        [queue],
    ).fetchall()


def test_whole_leases_of_several_partitions_and_groups_complete_together(
    client: testing.TestClient, conn: Conn
) -> None:
    for p in ("a", "b", "c"):
        push(client, "sets", p, f"{p}1", f"{p}2", f"{p}3")
    leases = [pop(client, "sets", "a", 2), pop(client, "sets", "b", 1),
              pop(client, "sets", "c", 3), pop(client, "sets", "a", 3, "audit")]
    items = [item(m, with_lease=(n % 2 == 0)) for n, lease in enumerate(leases) for m in lease]
    results = batch_ack(client, items)
    assert [(r["transactionId"], r["status"], r.get("reason")) for r in results] == [
        (i["transactionId"], "completed", None) for i in items]
    assert rows(conn, "sets") == [("a", "__queue__", True, [], 1), ("a", "audit", True, [], 1),
                                  ("b", "__queue__", True, [], 1),
                                  ("c", "__queue__", True, [], 1)]
    # The cursors moved past the leases: the next pops start after them.
    assert [m["transactionId"] for m in pop(client, "sets", "a", 5)] == ["a3"]
    assert [m["transactionId"] for m in pop(client, "sets", "b", 5)] == ["b2", "b3"]
    # Sent again, each answers already_completed (decided pair by pair: no live lease).
    again = batch_ack(client, items[:2] + items[-1:])
    assert {r["reason"] for r in again} == {"already_completed"}


def test_the_set_declines_what_is_not_whole_leases(client: testing.TestClient,
                                                   conn: Conn) -> None:
    for p in ("a", "b"):
        push(client, "partial", p, f"{p}1", f"{p}2")
    a, b = pop(client, "partial", "a", 2), pop(client, "partial", "b", 2)
    ids = {m["transactionId"]: m for m in a + b}

    def try_set(*txids: str, stale: bool = False) -> Any:
        found = conn.execute(
            "SELECT array_agg(m.partition_id ORDER BY u.k), array_agg(m.id ORDER BY u.k)"
            " FROM unnest(%s::text[]) WITH ORDINALITY u(t, k)"
            " JOIN queen.messages m ON m.transaction_id = u.t", [list(txids)]).fetchone()
        leases = [("00000000-0000-0000-0000-000000000000" if stale else ids[t]["leaseId"])
                  for t in txids]
        (decided,) = conn.execute(
            "SELECT cardinality(queen.ack_leases(%s, %s, %s, %s, %s, %s, %s))",
            [found[0], ["__queue__"] * len(txids), list(range(1, len(txids) + 1)),
             list(txids), found[1], [None] * len(txids), leases]).fetchone()
        return decided

    assert try_set("a1", "b1", "b2") is None  # a's lease only in part
    assert try_set("a1", "a2", "b1", "b2", stale=True) is None  # a lease that is not theirs
    decided = try_set("a1", "a2", "b1", "b2")  # whole leases: decided, and applied
    assert decided == 4
    assert [r[2] for r in rows(conn, "partial")] == [True, True]  # both leases ended

    # A partial lease through the route: decided pair by pair, as before.
    for p in ("c", "d"):
        push(client, "partial", p, f"{p}1", f"{p}2")
    c, d = pop(client, "partial", "c", 2), pop(client, "partial", "d", 2)
    results = batch_ack(client, [item(c[0]), item(d[0]), item(d[1])])
    assert [r["status"] for r in results] == ["completed"] * 3
    assert [r[2] for r in rows(conn, "partial")][2:] == [False, True]  # c2 still leased


def test_a_request_whose_items_share_their_values_is_decided_item_by_item(
    client: testing.TestClient, conn: Conn
) -> None:
    # (Two items of a lease of three, failed alike: the call sends one status, error and
    # leaseId for the request, and the items path gives each item its own.)
    push(client, "shared", "a", "s1", "s2", "s3")
    got = pop(client, "shared", "a", 3)
    results = batch_ack(client, [{**item(m, status="failed"), "error": "boom"} for m in got[:2]])
    assert [(r["transactionId"], r["status"]) for r in results] == [
        ("s1", "retry_scheduled"), ("s2", "retry_scheduled")]
    recorded = conn.execute(
        "SELECT m.transaction_id, f.status, f.error FROM queen.failures f"
        " JOIN queen.messages m ON m.partition_id = f.partition_id AND m.id = f.message_id"
        " ORDER BY 1").fetchall()
    assert recorded == [("s1", "retry", "boom"), ("s2", "retry", "boom")]
    # The lease's last message, completed alone.
    assert [r["status"] for r in batch_ack(client, [item(got[2])])] == ["completed"]
