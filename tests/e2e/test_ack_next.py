"""POST /ack/batch with "next": the acks, then a pop, in one request (a real gunicorn)."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest
import requests

from tests.conftest import Server
from tests.e2e.test_api import API, pop, push_n


@pytest.fixture
def srv(db_dsn: str) -> Iterator[Server]:
    """One gunicorn."""
    server = Server(db_dsn).start()
    yield server
    server.stop()


def ack_next(srv: Server, messages: list[dict[str, Any]], **next_pop: Any) -> requests.Response:
    acks = [
        {
            "transactionId": m["transactionId"],
            "status": "completed",
            "leaseId": m["leaseId"],
            "consumerGroup": m["consumerGroup"],
        }
        for m in messages
    ]
    body = {"acknowledgments": acks, "next": next_pop}
    return requests.post(f"{srv.url}{API}/ack/batch", json=body, timeout=30)


def status_of(srv: Server, transaction_id: str) -> str:
    resp = requests.get(f"{srv.url}{API}/messages/{transaction_id}", timeout=10)
    assert resp.status_code == 200, resp.text
    return str(resp.json()["status"])


def test_a_consumer_loop_of_ack_and_next_gets_every_message_once_in_order(srv: Server) -> None:
    sent = push_n(srv, "an-loop", 10)
    batch = pop(srv, "/queue/an-loop", batch=3)
    seen = [m["transactionId"] for m in batch]
    while batch:
        resp = ack_next(srv, batch, queue="an-loop", batch=3)
        assert resp.status_code == 200, resp.text
        doc = resp.json()
        assert doc["processed"] == len(batch)
        assert [r["transactionId"] for r in doc["results"]] == [m["transactionId"] for m in batch]
        assert {r["status"] for r in doc["results"]} == {"completed"}
        batch = doc["messages"]
        assert len(batch) <= 3
        seen += [m["transactionId"] for m in batch]
    assert seen == sent
    assert {status_of(srv, t) for t in sent} == {"completed"}
    assert pop(srv, "/queue/an-loop") == []


def test_next_pops_for_its_own_group_and_route(srv: Server) -> None:
    sent = push_n(srv, "an-groups", 4, partition="p1")
    first = pop(srv, "/queue/an-groups/partition/p1", batch=2, consumerGroup="g")
    resp = ack_next(srv, first, queue="an-groups", partition="p1", consumerGroup="g", batch=5)
    assert resp.status_code == 200, resp.text
    rest = resp.json()["messages"]
    assert [m["transactionId"] for m in first + rest] == sent
    assert {m["consumerGroup"] for m in rest} == {"g"}
    assert {m["partition"] for m in rest} == {"p1"}
    assert len({m["leaseId"] for m in rest}) == 1 and rest[0]["leaseId"] != first[0]["leaseId"]
    # Queue mode is a group of its own: it still has all four.
    assert [m["transactionId"] for m in pop(srv, "/queue/an-groups", batch=10)] == sent


def test_nothing_to_pop_answers_the_acks_and_no_messages(srv: Server) -> None:
    push_n(srv, "an-empty", 1)
    resp = ack_next(srv, pop(srv, "/queue/an-empty"), queue="an-empty")
    assert resp.status_code == 200, resp.text
    doc = resp.json()
    assert doc["messages"] == [] and [r["status"] for r in doc["results"]] == ["completed"]
    assert "nextError" not in doc


def test_a_long_polling_next_wakes_on_a_push(srv: Server) -> None:
    push_n(srv, "an-wait", 1)
    first = pop(srv, "/queue/an-wait")
    later = threading.Timer(0.5, push_n, (srv, "an-wait", 2))
    later.start()
    try:
        started = time.monotonic()
        resp = ack_next(srv, first, queue="an-wait", batch=5, wait=True, timeout=20_000)
        waited = time.monotonic() - started
    finally:
        later.join()
    assert resp.status_code == 200, resp.text
    assert len(resp.json()["messages"]) >= 1
    assert waited < 15  # woken by the push, not by the end of its timeout


@pytest.mark.parametrize(
    "bad",
    [
        [1],
        {"queue": "bad name"},
        {"queue": "an-bad", "batch": "10"},
        {"queue": "an-bad", "batch": 0},
        {"queue": "an-bad", "wait": "yes"},
        {"queue": "an-bad", "timeout": -1},
        {"queue": "an-bad", "consumerGroup": 5},
        {"queue": "an-bad", "subscriptionMode": "some"},
        {"queue": "an-bad", "limit": 10},
        {"partition": "p"},
        {"queue": "an-bad", "namespace": "n"},
    ],
)
def test_a_bad_next_is_400_and_applies_no_ack(srv: Server, bad: Any) -> None:
    (sent,) = push_n(srv, "an-bad", 1)
    (message,) = pop(srv, "/queue/an-bad")
    acks = [{"transactionId": sent, "status": "completed", "leaseId": message["leaseId"]}]
    resp = requests.post(
        f"{srv.url}{API}/ack/batch", json={"acknowledgments": acks, "next": bad}, timeout=10
    )
    assert resp.status_code == 400, resp.text
    assert resp.json()["error"]
    assert status_of(srv, sent) == "processing"


def test_acks_of_unknown_messages_are_404_and_pop_nothing(srv: Server) -> None:
    sent = push_n(srv, "an-unknown", 2)
    acks = [{"transactionId": "no-such-message", "status": "completed"}]
    resp = requests.post(
        f"{srv.url}{API}/ack/batch",
        json={"acknowledgments": acks, "next": {"queue": "an-unknown", "batch": 2}},
        timeout=10,
    )
    assert resp.status_code == 404, resp.text
    assert [m["transactionId"] for m in pop(srv, "/queue/an-unknown", batch=2)] == sent


def test_prometheus_counts_the_messages_a_next_pop_took(srv: Server) -> None:
    def popped() -> float:
        text = requests.get(f"{srv.url}/metrics/prometheus", timeout=10).text
        lines = [ln for ln in text.splitlines() if ln.startswith("queen_messages_total{")]
        return sum(float(ln.split()[-1]) for ln in lines if 'operation="popped"' in ln)

    push_n(srv, "an-metrics", 5)
    first = pop(srv, "/queue/an-metrics", batch=2)
    before = popped()
    resp = ack_next(srv, first, queue="an-metrics", batch=10)
    assert len(resp.json()["messages"]) == 3
    assert popped() == before + 3
