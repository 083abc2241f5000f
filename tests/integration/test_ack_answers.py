"""What the ack and transaction routes answer for each outcome, over a real database."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import orjson
import psycopg
import pytest
from falcon import testing

from queen.app import create_app
from queen.config import Settings
from queen.store import Store
from queen.store.db import Database
from tests.integration.helpers import expire_leases_now

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


def push(client: testing.TestClient, queue: str, *txids: str, **options: Any) -> None:
    if options:
        resp = client.simulate_post(f"{A}/configure", json={"queue": queue, "options": options})
        assert resp.status_code == 200, resp.text
    items = [{"queue": queue, "payload": {"n": t}, "transactionId": t} for t in txids]
    resp = client.simulate_post(f"{A}/push", json={"items": items})
    assert resp.status_code == 201, resp.text


def pop(client: testing.TestClient, queue: str, batch: int = 1) -> list[dict[str, Any]]:
    resp = client.simulate_get(f"{A}/pop/queue/{queue}", params={"batch": str(batch)})
    assert resp.status_code in (200, 204), resp.text
    return list(resp.json["messages"]) if resp.status_code == 200 else []


def ack(
    client: testing.TestClient, txid: str, lease: str | None = None, status: str = "completed"
) -> testing.Result:
    body: dict[str, Any] = {"transactionId": txid, "status": status}
    if lease is not None:
        body["leaseId"] = lease
    if status == "failed":
        body["error"] = "boom"
    return client.simulate_post(f"{A}/ack", json=body)


def consumers(conn: Conn) -> list[tuple[Any, ...]]:
    return conn.execute("SELECT * FROM queen.consumers ORDER BY partition_id").fetchall()


def test_an_ack_sent_again_answers_already_completed_with_its_first_time(
    client: testing.TestClient, conn: Conn
) -> None:
    push(client, "q", "a")
    (m,) = pop(client, "q")
    first = ack(client, "a", m["leaseId"])
    assert first.status_code == 200 and first.json["status"] == "completed"
    assert "reason" not in first.json
    row = consumers(conn)
    # With the lease (now ended), without it, and as a failure: 200, nothing changes.
    # (success: the message is as the ack asked; not for the failed one.)
    for again, success in ((ack(client, "a", m["leaseId"]), True), (ack(client, "a"), True),
                           (ack(client, "a", status="failed"), False)):
        assert again.status_code == 200, again.text
        assert again.json == {"transactionId": "a", "status": "completed", "success": success,
                              "reason": "already_completed",
                              "acknowledgedAt": first.json["acknowledgedAt"]}
    assert consumers(conn) == row
    assert conn.execute("SELECT count(*) FROM queen.failures").fetchone() == (0,)


def test_an_ack_sent_again_under_its_live_lease_changes_nothing(
    client: testing.TestClient, conn: Conn
) -> None:
    push(client, "q", "a", "b")
    first, second = pop(client, "q", batch=2)
    assert ack(client, "a", first["leaseId"]).json["status"] == "completed"
    row = consumers(conn)
    again = ack(client, "a", first["leaseId"])
    assert (again.status_code, again.json["reason"]) == (200, "already_completed")
    assert consumers(conn) == row  # the lease still holds b
    assert pop(client, "q") == []
    done = ack(client, "b", second["leaseId"])
    assert done.status_code == 200 and "reason" not in done.json  # and ends the lease
    push(client, "q", "c")
    assert [m["transactionId"] for m in pop(client, "q")] == ["c"]


def test_an_ack_of_a_message_never_leased_is_not_leased(client: testing.TestClient) -> None:
    push(client, "q", "a", "b")
    for refused in (ack(client, "a"), ack(client, "a", status="failed")):
        assert refused.status_code == 409, refused.text
        assert refused.json["reason"] == "not_leased"
        assert refused.json["transactionId"] == "a"
    (m,) = pop(client, "q")  # leases a only: b is outside the lease, with its leaseId too
    outside = ack(client, "b", m["leaseId"])
    assert (outside.status_code, outside.json["reason"]) == (409, "not_leased")
    assert ack(client, "a", m["leaseId"]).json["status"] == "completed"


def test_an_ack_under_a_lease_that_expired_is_lease_expired(
    client: testing.TestClient, conn: Conn
) -> None:
    push(client, "q", "a", retryLimit=3)
    (m,) = pop(client, "q")
    expire_leases_now(conn)
    assert conn.execute("SELECT queen.expire_leases(10)").fetchone() == (1,)
    row = consumers(conn)
    refused = ack(client, "a", m["leaseId"])
    assert (refused.status_code, refused.json["reason"]) == (409, "lease_expired")
    assert consumers(conn) == row
    (again,) = pop(client, "q")  # delivered again, the retry counted by the expiry alone
    assert again["retryCount"] == 1


def test_an_ack_under_a_lease_whose_message_went_to_another_is_leased_by_other(
    client: testing.TestClient, conn: Conn
) -> None:
    push(client, "q", "a")
    (old,) = pop(client, "q")
    expire_leases_now(conn)
    (new,) = pop(client, "q")
    for status in ("completed", "failed"):
        refused = ack(client, "a", old["leaseId"], status)
        assert (refused.status_code, refused.json["reason"]) == (409, "leased_by_other")
    assert ack(client, "a", new["leaseId"]).json["status"] == "completed"
    late = ack(client, "a", old["leaseId"])  # once done, the late one reports it done
    assert (late.status_code, late.json["reason"]) == (200, "already_completed")


def test_a_failed_ack_sent_again_answers_already_failed(client: testing.TestClient) -> None:
    push(client, "retried", "r", retryLimit=3)
    (m,) = pop(client, "retried")
    first = ack(client, "r", m["leaseId"], "failed")
    assert first.json["status"] == "retry_scheduled" and first.json["retryCount"] == 1
    again = ack(client, "r", m["leaseId"], "failed")
    assert again.status_code == 200, again.text
    assert (again.json["status"], again.json["reason"], again.json["retryCount"]) == (
        "retry_scheduled", "already_failed", 1)
    assert again.json["acknowledgedAt"] == first.json["acknowledgedAt"]
    # A completed ack of it now is refused: it waits for its redelivery.
    assert ack(client, "r", m["leaseId"]).json["reason"] == "lease_expired"
    push(client, "dead", "d", retryLimit=0, dlqAfterMaxRetries=True)
    (m,) = pop(client, "dead")
    assert ack(client, "d", m["leaseId"], "failed").json["status"] == "dead_letter"
    for status in ("failed", "completed"):
        again = ack(client, "d", m["leaseId"], status)
        assert (again.status_code, again.json["status"], again.json["reason"]) == (
            200, "dead_letter", "already_failed")


def test_a_batch_says_per_item_what_changed_and_why_not(client: testing.TestClient) -> None:
    push(client, "q", "a", "b", "c")
    m, n = pop(client, "q", batch=2)
    assert ack(client, "a", m["leaseId"]).status_code == 200
    resp = client.simulate_post(f"{A}/ack/batch", json={"acknowledgments": [
        {"transactionId": "a", "status": "completed", "leaseId": m["leaseId"]},
        {"transactionId": "b", "status": "completed", "leaseId": n["leaseId"]},
        {"transactionId": "c", "status": "completed"},
        {"transactionId": "nope", "status": "completed"},
    ]})
    assert resp.status_code == 200, resp.text
    results = resp.json["results"]
    assert [(r["status"], r.get("reason")) for r in results] == [
        ("completed", "already_completed"), ("completed", None),
        ("not_leased", "not_leased"), ("not_found", "not_found")]
    assert "acknowledgedAt" in results[0] and "acknowledgedAt" not in results[1]
    assert resp.json["acknowledgedAt"] is not None  # the time of b's, which applied
    again = client.simulate_post(f"{A}/ack/batch", json={"acknowledgments": [
        {"transactionId": "a", "status": "completed"}]})
    assert again.json["acknowledgedAt"] is None  # nothing applied
    assert again.json["results"][0]["reason"] == "already_completed"


def stage(txid: str, lease: str, out: str) -> dict[str, Any]:
    return {"operations": [
        {"type": "ack", "transactionId": txid, "status": "completed", "leaseId": lease},
        {"type": "push", "items": [{"queue": "out", "payload": {"from": txid},
                                   "transactionId": out}]},
    ]}


def test_a_transaction_sent_again_after_it_committed_is_already_applied(
    client: testing.TestClient, conn: Conn
) -> None:
    push(client, "in", "i1")
    (m,) = pop(client, "in")
    body = stage("i1", m["leaseId"], "o1")
    first = client.simulate_post(f"{A}/transaction", json=body)
    assert first.status_code == 200, first.text
    assert "alreadyApplied" not in first.json
    row = consumers(conn)
    again = client.simulate_post(f"{A}/transaction", json=body)
    assert again.status_code == 200, again.text
    assert again.json["committed"] is True and again.json["alreadyApplied"] is True
    ack_result, push_result = again.json["results"]
    assert (ack_result["status"], ack_result["reason"]) == ("completed", "already_completed")
    (pushed,) = push_result["messages"]
    assert pushed["transactionId"] == "o1" and pushed["status"] == "duplicate"
    assert pushed["id"] == first.json["results"][1]["messages"][0]["id"]
    assert consumers(conn) == row
    assert conn.execute("SELECT count(*) FROM queen.messages WHERE transaction_id LIKE 'o%'"
                        ).fetchone() == (1,)


def test_an_ack_only_transaction_sent_again_is_already_applied(
    client: testing.TestClient,
) -> None:
    push(client, "in", "i1", "i2")
    got = pop(client, "in", batch=2)
    body = {"operations": [
        {"type": "ack", "transactionId": g["transactionId"], "status": "completed",
         "leaseId": g["leaseId"]} for g in got]}
    assert client.simulate_post(f"{A}/transaction", json=body).status_code == 200
    again = client.simulate_post(f"{A}/transaction", json=body)
    assert (again.status_code, again.json.get("alreadyApplied")) == (200, True), again.text


def test_a_transaction_is_refused_with_its_acks_reason(
    client: testing.TestClient, conn: Conn
) -> None:
    push(client, "in", "i1", "i2")
    refused = client.simulate_post(f"{A}/transaction", json=stage("i1", "", "o1") | {
        "operations": [{"type": "ack", "transactionId": "i1", "status": "completed"}]})
    assert (refused.status_code, refused.json["reason"], refused.json["operation"]) == (
        409, "not_leased", 0)
    (m,) = pop(client, "in")
    assert ack(client, "i1", m["leaseId"]).status_code == 200  # done by a plain ack
    # The same ack in a transaction that pushes something new: not this one's doing.
    other = client.simulate_post(f"{A}/transaction", json=stage("i1", m["leaseId"], "o2"))
    assert (other.status_code, other.json["reason"]) == (409, "already_completed"), other.text
    # Pushes without transactionIds cannot be recognised: refused as well.
    body = stage("i1", m["leaseId"], "o3")
    del body["operations"][1]["items"][0]["transactionId"]
    unnamed = client.simulate_post(f"{A}/transaction", json=body)
    assert (unnamed.status_code, unnamed.json["reason"]) == (409, "already_completed")
    assert conn.execute("SELECT count(*) FROM queen.messages m JOIN queen.partitions p"
                        " ON p.id = m.partition_id JOIN queen.queues q ON q.id = p.queue_id"
                        " WHERE q.name = 'out'").fetchone() in ((0,), None)
    # A stale lease in a transaction: its own reason too.
    (n,) = pop(client, "in")
    expire_leases_now(conn)
    pop(client, "in")
    stale = client.simulate_post(f"{A}/transaction", json=stage("i2", n["leaseId"], "o4"))
    assert (stale.status_code, stale.json["reason"]) == (409, "leased_by_other")


def acked_with_calls(conn: Conn, acks: list[dict[str, Any]]) -> tuple[list[Any], set[str]]:
    """Ack as the ack routes do (queen.ack); its rows and the functions it called."""
    with conn.transaction():
        conn.execute("SET LOCAL track_functions = 'all'")
        rows = conn.execute("SELECT status, reason FROM queen.ack(%s::jsonb)",
                            (orjson.dumps(acks).decode(),)).fetchall()
        called = {r[0] for r in conn.execute("SELECT funcname FROM pg_stat_xact_user_functions")}
    return rows, called


def test_reasons_are_looked_up_only_for_acks_that_did_not_apply(
    client: testing.TestClient, conn: Conn
) -> None:
    push(client, "q", "a", "b", "c")
    got = pop(client, "q", batch=3)
    whole = [{"transactionId": g["transactionId"], "status": "completed",
              "leaseId": g["leaseId"]} for g in got[:1]]
    rows, called = acked_with_calls(conn, whole)  # one by one: not the whole lease
    assert rows == [("completed", None)]
    assert "ack_consumer" in called
    assert not {"ack_refusal", "acknowledged_at"} & called
    rest = [{"transactionId": g["transactionId"], "status": "completed",
             "leaseId": g["leaseId"]} for g in got[1:]]
    rows, called = acked_with_calls(conn, rest)
    assert rows == [("completed", None)] * 2
    assert not {"ack_refusal", "acknowledged_at"} & called
    rows, called = acked_with_calls(conn, whole + [{"transactionId": "x", "status": "completed"}])
    assert rows == [("completed", "already_completed"), ("not_found", "not_found")]
    assert "acknowledged_at" in called
