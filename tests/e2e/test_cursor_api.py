"""The hot path over HTTP: consumer groups, leases, retryDelay, filters."""

from __future__ import annotations

import datetime as dt
import threading
import time
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
import requests

from tests.conftest import Server
from tests.e2e.test_maintenance import NO_FALLBACK, ON_TIME, Maintainer, leader, wait_for

API = "/api/v1"


@pytest.fixture
def srv(db_dsn: str) -> Iterator[Server]:
    """One gunicorn."""
    server = Server(db_dsn).start()
    yield server
    server.stop()


def push(srv: Server, items: list[dict[str, Any]]) -> list[dict[str, Any]]:
    resp = requests.post(f"{srv.url}{API}/push", json={"items": items}, timeout=10)
    assert resp.status_code == 201, resp.text
    return resp.json()["messages"]  # type: ignore[no-any-return]


def push_n(srv: Server, queue: str, n: int, partition: str = "p") -> list[str]:
    """Push n messages {"n": i} in one request; return their transactionIds in order."""
    items = [{"queue": queue, "partition": partition, "payload": {"n": i}} for i in range(n)]
    return [m["transactionId"] for m in push(srv, items)]


def pop(srv: Server, path: str, **params: Any) -> list[dict[str, Any]]:
    """GET a pop route; the messages ([] for 204)."""
    resp = requests.get(f"{srv.url}{API}/pop{path}", params=params, timeout=10)
    if resp.status_code == 204:
        return []
    assert resp.status_code == 200, resp.text
    return resp.json()["messages"]  # type: ignore[no-any-return]


def ack(
    srv: Server, message: dict[str, Any], status: str = "completed", **extra: Any
) -> requests.Response:
    body = {"transactionId": message["transactionId"], "status": status,
            "leaseId": message["leaseId"], "consumerGroup": message["consumerGroup"], **extra}
    return requests.post(f"{srv.url}{API}/ack", json=body, timeout=10)


def configure(srv: Server, queue: str, **options: Any) -> dict[str, Any]:
    body: dict[str, Any] = {"queue": queue, "options": options}
    for key in ("namespace", "task"):
        if key in options:
            body[key] = options.pop(key)
    resp = requests.post(f"{srv.url}{API}/configure", json=body, timeout=10)
    assert resp.status_code == 200, resp.text
    return resp.json()  # type: ignore[no-any-return]


def consume_all(srv: Server, queue: str, group: str | None, batch: int = 3) -> list[str]:
    """Pop and ack everything the group can get now; the transactionIds in delivery order."""
    params: dict[str, Any] = {"batch": batch}
    if group is not None:
        params["consumerGroup"] = group
    seen: list[str] = []
    while messages := pop(srv, f"/queue/{queue}", **params):
        for m in messages:
            assert m["consumerGroup"] == group
            seen.append(m["transactionId"])
            assert ack(srv, m).json()["status"] == "completed"
    return seen


def test_every_group_gets_every_message_in_order_and_queue_mode_is_a_group_of_its_own(srv):
    pushed = push_n(srv, "fan", 10)
    assert consume_all(srv, "fan", "billing") == pushed
    assert consume_all(srv, "fan", "audit", batch=4) == pushed
    assert consume_all(srv, "fan", None) == pushed  # queue mode: consumerGroup null
    assert consume_all(srv, "fan", "billing") == []


def test_ids_are_uuids_the_same_in_push_and_pop(srv):
    (stored,) = push(srv, [{"queue": "ids", "payload": {"a": 1}}])
    (duplicate,) = push(srv, [{"queue": "ids", "payload": {}, "transactionId": stored["transactionId"]}])
    (message,) = pop(srv, "/queue/ids")
    assert uuid.UUID(stored["id"]).version == 7
    assert stored["id"] == duplicate["id"] == message["id"]
    assert duplicate["status"] == "duplicate"
    assert uuid.UUID(message["leaseId"])
    assert message["consumerGroup"] is None


def test_a_failed_ack_is_retried_for_its_group_only(srv):
    configure(srv, "retry", retryLimit=3)
    first, *rest = push_n(srv, "retry", 3)
    for group in ("a", "b"):
        messages = pop(srv, "/queue/retry", batch=3, consumerGroup=group)
        assert [m["transactionId"] for m in messages] == [first, *rest]
        for m in messages:
            failed = group == "a" and m["transactionId"] == first
            result = ack(srv, m, "failed" if failed else "completed", error="boom").json()
            assert result["status"] == ("retry_scheduled" if failed else "completed")
    (again,) = pop(srv, "/queue/retry", batch=3, consumerGroup="a")
    assert again["transactionId"] == first and again["retryCount"] == 1
    assert pop(srv, "/queue/retry", consumerGroup="b") == []


def test_an_ack_under_a_stale_lease_is_refused_and_changes_nothing(srv):
    configure(srv, "stale", leaseTime=1)
    push_n(srv, "stale", 2)
    old = pop(srv, "/queue/stale", batch=2, consumerGroup="g")
    deadline = time.monotonic() + 15
    while not (new := pop(srv, "/queue/stale", batch=2, consumerGroup="g")):
        assert time.monotonic() < deadline, "the lease never expired"
        time.sleep(0.2)
    assert [m["transactionId"] for m in new] == [m["transactionId"] for m in old]
    assert new[0]["leaseId"] != old[0]["leaseId"]

    refused = ack(srv, old[0])
    assert refused.status_code == 409
    assert "error" in refused.json()
    batch = requests.post(f"{srv.url}{API}/ack/batch", timeout=10, json={"acknowledgments": [
        {"transactionId": m["transactionId"], "status": "completed", "leaseId": m["leaseId"],
         "consumerGroup": "g"} for m in old]})
    assert batch.status_code == 200
    assert [r["status"] for r in batch.json()["results"]] == ["lease_expired"] * 2

    # Nothing changed: the current lease still holds both messages, and its acks apply.
    assert [ack(srv, m).json()["status"] for m in new] == ["completed", "completed"]
    assert pop(srv, "/queue/stale", consumerGroup="g") == []


def test_subscription_mode_new_and_subscription_from_skip_what_came_before(srv):
    early = push_n(srv, "subs", 2)
    time.sleep(0.05)
    between = dt.datetime.now(dt.UTC).isoformat().replace("+00:00", "Z")
    time.sleep(0.05)
    middle = push_n(srv, "subs", 1)
    assert pop(srv, "/queue/subs", consumerGroup="late", subscriptionMode="new") == []
    late = push_n(srv, "subs", 1)
    assert consume_all(srv, "subs", "late") == late
    since = pop(srv, "/queue/subs", batch=10, consumerGroup="from", subscriptionFrom=between)
    assert [m["transactionId"] for m in since] == middle + late
    assert consume_all(srv, "subs", "all", batch=10) == early + middle + late


def test_retry_delay_holds_the_failed_partition_and_serves_the_others(srv):
    shown = configure(srv, "delayed", retryDelay=1500, retryLimit=3)
    assert shown["options"]["retryDelay"] == 1500
    (held,) = push_n(srv, "delayed", 1, partition="a")
    (other,) = push_n(srv, "delayed", 1, partition="b")
    (first,) = pop(srv, "/queue/delayed")
    assert first["transactionId"] == held
    failed_at = time.monotonic()
    assert ack(srv, first, "failed").json()["status"] == "retry_scheduled"
    (served,) = pop(srv, "/queue/delayed")
    assert served["transactionId"] == other
    assert pop(srv, "/queue/delayed/partition/a") == []
    deadline = time.monotonic() + 15
    while not (again := pop(srv, "/queue/delayed/partition/a")):
        assert time.monotonic() < deadline, "the partition was never served again"
        time.sleep(0.1)
    assert time.monotonic() - failed_at >= 1.4
    assert again[0]["transactionId"] == held and again[0]["retryCount"] == 1


def test_retry_delay_is_validated(srv):
    for bad in (-1, "5", 1.5, True):
        resp = requests.post(f"{srv.url}{API}/configure", timeout=10,
                             json={"queue": "q", "options": {"retryDelay": bad}})
        assert resp.status_code == 400, bad
        assert "retryDelay" in resp.json()["error"]


def test_pop_by_namespace_and_task_serves_the_highest_priority_queue_first(srv):
    configure(srv, "low", namespace="ns", task="mail", priority=1)
    configure(srv, "high", namespace="ns", task="sms", priority=5)
    configure(srv, "elsewhere", namespace="other", priority=9)
    for queue in ("low", "high", "elsewhere"):
        push_n(srv, queue, 1)
    assert [m["queue"] for m in pop(srv, "?namespace=ns")] == ["high"]
    assert [m["queue"] for m in pop(srv, "?namespace=ns")] == ["low"]  # (high is leased)
    assert pop(srv, "?namespace=ns") == []
    assert [m["queue"] for m in pop(srv, "?task=mail&consumerGroup=g")] == ["low"]
    assert [m["queue"] for m in pop(srv, "?namespace=ns&consumerGroup=g")] == ["high"]


def test_a_parked_poll_of_a_group_wakes_on_a_push(srv):
    assert pop(srv, "/queue/woken", consumerGroup="g") == []  # the group joins the queue
    pusher = threading.Timer(0.5, push_n, (srv, "woken", 1))
    started = time.monotonic()
    pusher.start()
    resp = requests.get(f"{srv.url}{API}/pop/queue/woken", timeout=20,
                        params={"consumerGroup": "g", "wait": "true", "timeout": 15000})
    pusher.join()
    assert resp.status_code == 200
    assert resp.json()["messages"][0]["consumerGroup"] == "g"
    assert time.monotonic() - started < 10  # woken by the push, not at its timeout


@pytest.mark.parametrize("params", [
    {"consumerGroup": "bad name"},
    {"consumerGroup": "__queue__"},
    {"consumerGroup": "x" * 200},
    {"subscriptionMode": "old"},
    {"subscriptionFrom": "yesterday"},
    {"subscriptionFrom": "2025-13-01T00:00:00Z"},
    {"subscriptionMode": "new", "subscriptionFrom": "2025-01-01T00:00:00Z"},
])
def test_bad_pop_parameters_are_400(srv, params):
    for path in ("/queue/q", "/queue/q/partition/p", ""):
        resp = requests.get(f"{srv.url}{API}/pop{path}", params=params, timeout=10)
        assert resp.status_code == 400, (path, params)
        assert "error" in resp.json()


def test_bad_ack_fields_are_400(srv):
    (message,) = push(srv, [{"queue": "q", "payload": {}}])
    for extra in ({"leaseId": "nope"}, {"leaseId": 5}, {"consumerGroup": "bad name"},
                  {"consumerGroup": 7}):
        body = {"transactionId": message["transactionId"], "status": "completed", **extra}
        single = requests.post(f"{srv.url}{API}/ack", json=body, timeout=10)
        assert single.status_code == 400, extra
        assert "error" in single.json()
        many = requests.post(f"{srv.url}{API}/ack/batch", json={"acknowledgments": [body]},
                             timeout=10)
        assert many.status_code == 400, extra


def test_twenty_consumers_in_two_groups_get_every_message_once_per_group_in_order(srv):
    partitions, per_partition = 4, 25
    for p in range(partitions):
        push(srv, [{"queue": "crowd", "partition": f"p{p}", "payload": {"p": p, "i": i}}
                   for i in range(per_partition)])
    delivered: dict[str, list[tuple[int, int]]] = {"a": [], "b": []}
    lock = threading.Lock()

    def consumer(group: str) -> None:
        idle_until = time.monotonic() + 3
        with requests.Session() as http:
            while time.monotonic() < idle_until:
                resp = http.get(f"{srv.url}{API}/pop/queue/crowd", timeout=10,
                                params={"batch": 5, "consumerGroup": group})
                if resp.status_code == 204:
                    time.sleep(0.05)
                    continue
                assert resp.status_code == 200, resp.text
                messages = resp.json()["messages"]
                with lock:  # recorded in delivery order, before the ack frees the partition
                    delivered[group] += [(m["data"]["p"], m["data"]["i"]) for m in messages]
                batch = http.post(f"{srv.url}{API}/ack/batch", timeout=10, json={
                    "acknowledgments": [{"transactionId": m["transactionId"], "status": "completed",
                                         "leaseId": m["leaseId"], "consumerGroup": group}
                                        for m in messages]})
                assert {r["status"] for r in batch.json()["results"]} == {"completed"}
                idle_until = time.monotonic() + 3

    threads = [threading.Thread(target=consumer, args=(g,)) for g in ("a", "b") for _ in range(10)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    for group, seen in delivered.items():
        assert sorted(seen) == [(p, i) for p in range(partitions) for i in range(per_partition)]
        for p in range(partitions):  # FIFO per partition within the group
            assert [i for q, i in seen if q == p] == list(range(per_partition)), group


def test_maintenance_wakes_a_parked_poll_when_the_retry_delay_ends(db_dsn, tmp_path):
    maintainer = Maintainer(db_dsn, tmp_path).start()
    server = Server(db_dsn, **NO_FALLBACK).start()
    try:
        wait_for(lambda: leader(db_dsn) is not None, 10)
        configure(server, "later", retryDelay=1500, retryLimit=3)
        push_n(server, "later", 1)
        (first,) = pop(server, "/queue/later")
        assert ack(server, first, "failed").json()["status"] == "retry_scheduled"
        failed_at = time.monotonic()
        resp = requests.get(f"{server.url}{API}/pop/queue/later", timeout=20,
                            params={"wait": "true", "timeout": 15000})
        assert resp.status_code == 200
        assert resp.json()["messages"][0]["retryCount"] == 1
        waited = time.monotonic() - failed_at
        assert 1.4 <= waited < 1.5 + ON_TIME  # woken by maintenance (no fallback re-check)
    finally:
        server.stop()
        maintainer.stop()
