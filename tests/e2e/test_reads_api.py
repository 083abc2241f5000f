"""Analytics, resources and message management over HTTP against a real gunicorn.

One server and database serve the whole module; each test works on its own queues. The
last tests start a server of their own on a fresh database.
"""

from __future__ import annotations

import datetime as dt
import os
import time
import uuid
from collections.abc import Iterator
from typing import Any

import psycopg
import pytest
import requests

from queen.store import lifecycle
from tests.conftest import Server, cloned_database

KEY = "00112233445566778899aabbccddeeff00112233445566778899aabbccddeeff"
STATS = ("pending", "processing", "completed", "failed", "deadLetter", "total")


class Api:
    """A tiny client: JSON in, (status, JSON) out."""

    def __init__(self, url: str) -> None:
        self.url = url
        self.http = requests.Session()

    def call(self, method: str, path: str, body: Any = None, **params: Any) -> tuple[int, Any]:
        resp = self.http.request(method, self.url + path, json=body, params=params, timeout=30)
        if resp.status_code == 204:
            return 204, None
        assert resp.headers["content-type"].startswith("application/json"), resp.text
        return resp.status_code, resp.json()

    def get(self, path: str, **params: Any) -> Any:
        status, doc = self.call("GET", path, **params)
        assert status == 200, doc
        return doc

    def push(self, queue: str, partition: str, payloads: list[Any]) -> list[str]:
        items = [{"queue": queue, "partition": partition, "payload": p} for p in payloads]
        status, doc = self.call("POST", "/api/v1/push", {"items": items})
        assert status == 201, doc
        return [m["transactionId"] for m in doc["messages"]]

    def pop(self, queue: str, partition: str, batch: int) -> list[dict[str, Any]]:
        status, doc = self.call("GET", f"/api/v1/pop/queue/{queue}/partition/{partition}",
                                batch=batch)
        return doc["messages"] if status == 200 else []

    def ack(self, txid: str, status: str) -> None:
        code, doc = self.call("POST", "/api/v1/ack",
                              {"transactionId": txid, "status": status, "error": "boom"})
        assert code == 200, doc

    def configure(self, queue: str, **options: Any) -> None:
        extra = {k: options.pop(k) for k in ("namespace", "task") if k in options}
        status, doc = self.call("POST", "/api/v1/configure",
                                {"queue": queue, **extra, "options": options})
        assert status == 200, doc


@pytest.fixture(scope="module")
def api(server_dsn: str, template_db: str) -> Iterator[Api]:
    with cloned_database(server_dsn, template_db) as dsn:
        srv = Server(dsn, QUEEN_ENCRYPTION_KEY=KEY).start()
        try:
            yield Api(srv.url)
        finally:
            srv.stop()


def unique(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:8]}"


def counts(pending=0, processing=0, completed=0, failed=0, dead_letter=0) -> dict[str, int]:
    values = (pending, processing, completed, failed, dead_letter)
    return dict(zip(STATS, (*values, sum(values)), strict=True))


# -- counts -------------------------------------------------------------------------------


def make_history(api: Api) -> tuple[str, str, str]:
    """Queue with partitions a, b: push 5 (3 to a), pop a's 3, complete 2, fail 1 (final),
    then pop 1 of b's 2 and leave it processing."""
    queue, ns, task = unique("counted"), unique("ns"), unique("task")
    api.configure(queue, namespace=ns, task=task, retryLimit=0, dlqAfterMaxRetries=False)
    api.push(queue, "a", [{"n": i} for i in range(3)])
    api.push(queue, "b", [{"n": i} for i in range(3, 5)])
    popped = api.pop(queue, "a", 3)
    assert len(popped) == 3
    api.ack(popped[0]["transactionId"], "completed")
    api.ack(popped[1]["transactionId"], "completed")
    api.ack(popped[2]["transactionId"], "failed")
    assert len(api.pop(queue, "b", 1)) == 1
    return queue, ns, task


A = counts(completed=2, failed=1)
B = counts(pending=1, processing=1)
TOTAL = counts(pending=1, processing=1, completed=2, failed=1)


def test_analytics_counts_are_what_happened(api):
    before = api.get("/api/v1/resources/overview")
    queue, ns, task = make_history(api)

    one = api.get(f"/api/v1/analytics/queue/{queue}")
    assert one["queue"] == queue and one["namespace"] == ns and one["task"] == task
    assert one["totals"] == TOTAL
    assert one["partitions"] == [{"name": "a", "stats": A}, {"name": "b", "stats": B}]

    for path, params in [
        ("/api/v1/analytics/queues", {"namespace": ns}),
        ("/api/v1/analytics/queues", {"task": task}),
        ("/api/v1/analytics/queue-stats", {"queue": queue}),
        ("/api/v1/analytics/queue-stats", {"namespace": ns, "task": task}),
    ]:
        (found,) = api.get(path, **params)["queues"]
        assert found == {"queue": queue, "namespace": ns, "task": task,
                         "partitions": one["partitions"], "totals": TOTAL}

    for params in ({"namespace": ns}, {"task": task}):
        filtered = api.get("/api/v1/analytics", **params)
        assert filtered["totals"] == TOTAL
        assert [q["queue"] for q in filtered["queues"]] == [queue]
    assert api.get("/api/v1/analytics", namespace=ns)["namespace"] == ns

    (depth,) = api.get("/api/v1/analytics/queue-depths", queue=queue)["depths"]
    assert (depth["queue"], depth["depth"], depth["processing"]) == (queue, 1, 1)
    assert depth["partitions"] == [{"name": "a", "depth": 0, "processing": 0},
                                   {"name": "b", "depth": 1, "processing": 1}]
    everything = api.get("/api/v1/analytics/queue-depths")["depths"]
    assert queue in {d["queue"] for d in everything}

    after = api.get("/api/v1/resources/overview")
    assert after["queues"] - before["queues"] == 1
    assert after["partitions"] - before["partitions"] == 2
    assert after["namespaces"] - before["namespaces"] == 1
    assert after["tasks"] - before["tasks"] == 1
    assert {k: after["messages"][k] - before["messages"][k] for k in STATS} == TOTAL
    dt.datetime.fromisoformat(after["timestamp"].replace("Z", "+00:00"))


def test_throughput_counts_this_hour(api):
    queue, _, _ = make_history(api)
    minutes = api.get("/api/v1/analytics/throughput", queue=queue)["throughput"]
    assert len(minutes) == 60
    stamps = [dt.datetime.fromisoformat(m["timestamp"].replace("Z", "+00:00")) for m in minutes]
    assert all(a - b == dt.timedelta(minutes=1) for a, b in zip(stamps, stamps[1:], strict=False))
    assert stamps[0] <= dt.datetime.now(dt.UTC)

    def total(key: str) -> int:
        return sum(m[key]["messagesPerMinute"] for m in minutes)

    assert (total("incoming"), total("processing"), total("completed"), total("failed")) == (
        5, 4, 2, 1)
    assert total("deadLetter") == 0
    assert sum(m["lag"]["sampleCount"] for m in minutes) == 2
    busy = [m for m in minutes if m["completed"]["messagesPerMinute"]]
    assert all(m["lag"]["avgMilliseconds"] >= 0 for m in busy)
    for m in minutes:
        assert m["incoming"]["messagesPerSecond"] == round(m["incoming"]["messagesPerMinute"] / 60, 2)
    assert len(api.get("/api/v1/analytics/throughput")["throughput"]) == 60


def test_queue_lag_follows_the_documented_formulas(api):
    queue, few = unique("lagging"), unique("few")
    api.push(queue, "p", [{"n": i} for i in range(6)])
    api.push(few, "p", [{"n": i} for i in range(4)])
    time.sleep(0.05)
    for q in (queue, few):
        for m in api.pop(q, "p", 10):
            api.ack(m["transactionId"], "completed")
    api.push(queue, "p", [{"n": i} for i in range(3)])
    api.push(queue, "idle", [{"n": 0}])

    doc = api.get("/api/v1/analytics/queue-lag", queue=queue)
    (found,) = doc["queues"]
    totals = found["totals"]
    assert (totals["pendingCount"], totals["processingCount"], totals["totalBacklog"]) == (4, 0, 4)
    assert totals["completedMessages"] == 6
    assert totals["avgProcessingTimeSeconds"] >= 0.04
    assert totals["estimatedLagSeconds"] == pytest.approx(4 * totals["avgProcessingTimeSeconds"], abs=0.01)
    assert totals["medianLagSeconds"] == pytest.approx(4 * totals["medianProcessingTimeSeconds"], abs=0.01)
    assert totals["p95LagSeconds"] == pytest.approx(4 * totals["p95ProcessingTimeSeconds"], abs=0.01)
    assert totals["p95ProcessingTimeSeconds"] >= totals["medianProcessingTimeSeconds"] > 0
    assert totals["estimatedLag"].endswith("s")
    by_name = {p["name"]: p["stats"] for p in found["partitions"]}
    assert by_name["p"]["completedMessages"] == 6 and by_name["p"]["totalBacklog"] == 3
    assert by_name["idle"]["completedMessages"] == 0  # estimated with the queue's times
    assert by_name["idle"]["avgProcessingTimeSeconds"] == totals["avgProcessingTimeSeconds"]

    assert api.get("/api/v1/analytics/queue-lag", queue=few)["queues"] == []  # 4 < 5
    listed = {q["queue"] for q in api.get("/api/v1/analytics/queue-lag")["queues"]}
    assert queue in listed and few not in listed


# -- resources ------------------------------------------------------------------------------


def test_resources_describe_queues_and_partitions(api):
    queue, ns, task = make_history(api)
    (summary,) = api.get("/api/v1/resources/queues", namespace=ns)["queues"]
    assert summary["name"] == queue and summary["partitions"] == 2
    assert summary["messages"]["total"] == 5
    assert (summary["messages"]["pending"], summary["messages"]["processing"]) == (1, 1)
    uuid.UUID(summary["id"])

    detail = api.get(f"/api/v1/resources/queues/{queue}")
    assert detail["id"] == summary["id"] and detail["namespace"] == ns
    assert detail["options"]["retryLimit"] == 0
    assert detail["totals"]["total"] == 5 and detail["totals"]["failed"] == 1
    a, b = detail["partitions"]
    assert (a["name"], b["name"]) == ("a", "b")
    assert a["stats"] == {"total": 3, "pending": 0, "processing": 0, "completed": 2,
                          "failed": 1, "deadLetter": 0}
    assert a["options"]["leaseTime"] == 300 and a["priority"] == 0
    assert a["oldestMessage"] <= a["newestMessage"]
    assert b["oldestMessage"] is not None

    parts = api.get("/api/v1/resources/partitions", queue=queue)["partitions"]
    assert [(p["name"], p["depth"], p["processing"], p["total"]) for p in parts] == [
        ("a", 0, 0, 3), ("b", 1, 1, 2)]
    assert parts[0]["queue"] == queue and parts[0]["namespace"] == ns
    deep = api.get("/api/v1/resources/partitions", queue=queue, minDepth=1)["partitions"]
    assert [p["name"] for p in deep] == ["b"]
    assert api.get("/api/v1/resources/partitions", queue=queue, minDepth=2)["partitions"] == []

    (space,) = [n for n in api.get("/api/v1/resources/namespaces")["namespaces"]
                if n["namespace"] == ns]
    assert (space["queues"], space["partitions"]) == (1, 2)
    assert (space["messages"]["total"], space["messages"]["pending"]) == (5, 1)
    (work,) = [t for t in api.get("/api/v1/resources/tasks")["tasks"] if t["task"] == task]
    assert (work["queues"], work["partitions"], work["messages"]["total"]) == (1, 2, 5)


# -- messages -------------------------------------------------------------------------------


def test_message_pages_are_disjoint_complete_and_newest_first(api):
    queue, ns = unique("paged"), unique("ns")
    api.configure(queue, namespace=ns)
    pushed = api.push(queue, "x", [{"n": i} for i in range(10)])
    pushed += api.push(queue, "y", [{"n": i} for i in range(10, 20)])
    pushed += api.push(queue, "x", [{"n": i} for i in range(20, 25)])

    pages, offset = [], 0
    while True:
        doc = api.get("/api/v1/messages", queue=queue, limit=10, offset=offset)
        assert (doc["limit"], doc["offset"]) == (10, offset)
        pages.append([m["transactionId"] for m in doc["messages"]])
        if not doc["hasMore"]:
            break
        offset += 10
    assert [len(p) for p in pages] == [10, 10, 5]
    listed = [txid for page in pages for txid in page]
    assert listed == list(reversed(pushed))  # disjoint, complete, newest first

    first = api.get("/api/v1/messages", queue=queue, limit=1)["messages"][0]
    assert first["transactionId"] == pushed[-1]
    assert first["queuePath"] == f"{queue}/x" and first["namespace"] == ns
    assert first["payload"] == {"n": 24} and first["status"] == "pending"
    assert first["retryCount"] == 0 and first["lockedAt"] is None

    assert len(api.get("/api/v1/messages", queue=queue, partition="y")["messages"]) == 10
    assert len(api.get("/api/v1/messages", namespace=ns)["messages"]) == 25
    assert len(api.get("/api/v1/messages", namespace=ns, partition="x")["messages"]) == 15
    status, doc = api.call("GET", "/api/v1/messages", queue=unique("nothing"))
    assert status == 404 and "not found" in doc["error"]  # a typo, not an empty queue
    assert api.get("/api/v1/messages", queue=queue, offset=25)["messages"] == []

    popped = api.pop(queue, "y", 3)
    api.ack(popped[0]["transactionId"], "completed")
    processing = api.get("/api/v1/messages", queue=queue, status="processing")["messages"]
    assert {m["transactionId"] for m in processing} == {m["transactionId"] for m in popped[1:]}
    assert all(m["workerId"] and m["leaseExpiresAt"] for m in processing)
    (done,) = api.get("/api/v1/messages", queue=queue, status="completed")["messages"]
    assert done["completedAt"] is not None
    assert len(api.get("/api/v1/messages", queue=queue, status="pending")["messages"]) == 22
    everything = api.get("/api/v1/messages", limit=1000)["messages"]
    assert set(pushed) <= {m["transactionId"] for m in everything}


def test_get_retry_dead_letter_delete_one_message(api):
    queue = unique("single")
    api.configure(queue, retryLimit=0, dlqAfterMaxRetries=False, leaseTime=600)
    first, second, third = api.push(queue, "z", [{"n": 1}, {"n": 2}, {"n": 3}])

    got = api.get(f"/api/v1/messages/{first}")
    assert got["transactionId"] == first and got["payload"] == {"n": 1}
    assert got["options"]["leaseTime"] == 600 and got["options"]["retryLimit"] == 0

    status, doc = api.call("POST", f"/api/v1/messages/{first}/retry")
    assert status == 409 and "pending" in doc["error"]
    status, doc = api.call("POST", f"/api/v1/messages/{first}/dlq")
    assert (status, doc) == (200, {"movedToDLQ": True, "transactionId": first})
    assert api.get(f"/api/v1/messages/{first}")["status"] == "dead_letter"
    status, doc = api.call("POST", f"/api/v1/messages/{first}/dlq")
    assert status == 409 and "error" in doc
    status, doc = api.call("POST", f"/api/v1/messages/{first}/retry")
    assert (status, doc) == (200, {"retried": True, "transactionId": first})
    assert api.get(f"/api/v1/messages/{first}")["status"] == "pending"

    (m,) = api.pop(queue, "z", 1)
    assert m["transactionId"] == first  # a retried message keeps its place
    api.ack(first, "failed")
    failed = api.get(f"/api/v1/messages/{first}")
    assert (failed["status"], failed["errorMessage"]) == ("failed", "boom")
    assert api.call("POST", f"/api/v1/messages/{first}/retry")[0] == 200
    retried = api.get(f"/api/v1/messages/{first}")
    assert (retried["status"], retried["retryCount"]) == ("pending", 0)

    (m,) = api.pop(queue, "z", 1)
    api.ack(m["transactionId"], "completed")
    status, doc = api.call("POST", f"/api/v1/messages/{first}/retry")
    assert status == 409 and "completed" in doc["error"]
    assert api.call("POST", f"/api/v1/messages/{first}/dlq")[0] == 409

    related = api.get(f"/api/v1/messages/{second}/related")["messages"]
    assert [r["transactionId"] for r in related] == [first, third]
    assert related[0]["payload"] == {"n": 1} and related[0]["status"] == "completed"

    # Deleting the only message of a lease frees the partition at once.
    (leased,) = api.pop(queue, "z", 1)
    assert leased["transactionId"] == second
    assert api.pop(queue, "z", 1) == []
    assert api.call("DELETE", f"/api/v1/messages/{second}") == (
        200, {"deleted": True, "transactionId": second})
    assert api.call("GET", f"/api/v1/messages/{second}")[0] == 404
    assert [m["transactionId"] for m in api.pop(queue, "z", 1)] == [third]
    assert api.get(f"/api/v1/analytics/queue/{queue}")["totals"] == counts(
        processing=1, completed=1)


def test_clear_a_partition_then_the_queue(api):
    queue = unique("cleared")
    api.push(queue, "a", [{"n": i} for i in range(4)])
    api.push(queue, "b", [{"n": i} for i in range(3)])
    assert len(api.pop(queue, "a", 2)) == 2

    assert api.call("DELETE", f"/api/v1/queues/{queue}/clear", partition="a") == (
        200, {"cleared": True, "count": 4, "queue": queue, "partition": "a"})
    api.push(queue, "a", [{"n": 9}])
    assert len(api.pop(queue, "a", 1)) == 1  # the lease ended with the clear
    assert api.get(f"/api/v1/analytics/queue/{queue}")["totals"] == counts(pending=3, processing=1)
    assert api.call("DELETE", f"/api/v1/queues/{queue}/clear") == (
        200, {"cleared": True, "count": 4, "queue": queue, "partition": "all"})
    assert api.get(f"/api/v1/analytics/queue/{queue}")["totals"] == counts()
    assert api.get("/api/v1/messages", queue=queue)["messages"] == []


def test_encrypted_payloads_are_shown_decrypted(api):
    queue = unique("secret")
    api.configure(queue, encryptionEnabled=True)
    (a, b) = api.push(queue, "p", [{"card": "4242"}, ["x", 1]])
    assert api.get(f"/api/v1/messages/{a}")["payload"] == {"card": "4242"}
    listed = api.get("/api/v1/messages", queue=queue)["messages"]
    assert [m["payload"] for m in listed] == [["x", 1], {"card": "4242"}]
    assert api.get(f"/api/v1/messages/{a}/related")["messages"][0]["payload"] == ["x", 1]
    assert b


# -- errors --------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("path", "params"),
    [
        ("/api/v1/messages", {"limit": 0}),
        ("/api/v1/messages", {"limit": 1001}),
        ("/api/v1/messages", {"limit": "ten"}),
        ("/api/v1/messages", {"offset": -1}),
        ("/api/v1/messages", {"status": "lost"}),
        ("/api/v1/messages", {"queue": "bad name"}),
        ("/api/v1/messages", {"partition": "-x"}),
        ("/api/v1/analytics/queues", {"namespace": "a/b"}),
        ("/api/v1/analytics/queue-stats", {"queue": "x" * 200}),
        ("/api/v1/analytics/queue-lag", {"task": "bad task"}),
        ("/api/v1/analytics/throughput", {"queue": "!"}),
        ("/api/v1/analytics", {"namespace": " "}),
        ("/api/v1/resources/partitions", {"minDepth": -1}),
        ("/api/v1/resources/partitions", {"minDepth": "deep"}),
        ("/api/v1/resources/queues", {"task": "bad task"}),
        ("/api/v1/analytics/queue/bad%20name", {}),
        ("/api/v1/resources/queues/bad%20name", {}),
        ("/api/v1/messages/some-id/related", {"limit": 0}),
    ],
)
def test_bad_parameters_answer_400(api, path, params):
    status, doc = api.call("GET", path, **params)
    assert status == 400, doc
    assert isinstance(doc["error"], str) and doc["error"]


def test_unknown_ids_and_queues_answer_404(api):
    missing = str(uuid.uuid4())
    for method, path in [
        ("GET", f"/api/v1/messages/{missing}"),
        ("DELETE", f"/api/v1/messages/{missing}"),
        ("POST", f"/api/v1/messages/{missing}/retry"),
        ("POST", f"/api/v1/messages/{missing}/dlq"),
        ("GET", f"/api/v1/messages/{missing}/related"),
        ("GET", "/api/v1/analytics/queue/no-such-queue"),
        ("GET", "/api/v1/resources/queues/no-such-queue"),
        ("DELETE", "/api/v1/queues/no-such-queue/clear"),
    ]:
        status, doc = api.call(method, path)
        assert status == 404, (method, path, doc)
        assert doc["error"]
    queue = unique("known")
    api.push(queue, "p", [1])
    status, doc = api.call("DELETE", f"/api/v1/queues/{queue}/clear", partition="nope")
    assert status == 404 and "nope" in doc["error"]


def test_a_configured_queue_without_partitions_is_listed(api):
    queue = unique("empty")
    api.configure(queue, priority=7)
    assert api.get(f"/api/v1/analytics/queue/{queue}") == {
        "queue": queue, "namespace": None, "task": None, "totals": counts(), "partitions": []}
    detail = api.get(f"/api/v1/resources/queues/{queue}")
    assert detail["partitions"] == [] and detail["options"]["priority"] == 7
    assert api.get("/api/v1/resources/partitions", queue=queue)["partitions"] == []


# -- health and metrics ------------------------------------------------------------------------


def test_health_and_json_metrics(api):
    api.push(unique("metered"), "p", [1, 2, 3])
    health = api.get("/health")
    assert health["status"] == "healthy" and health["uptime"].endswith("s")
    stats = health["stats"]
    assert stats["requests"] > 0 and stats["messages"] >= 3
    float(stats["requestsPerSecond"]), float(stats["messagesPerSecond"])
    assert set(stats["pool"]) == {"total", "idle", "waiting"}

    doc = api.get("/metrics")
    assert doc["uptime"] > 0
    assert doc["requests"]["total"] >= stats["requests"] and doc["requests"]["rate"] > 0
    assert doc["messages"]["total"] == doc["messages"]["pushed"] >= 3
    assert doc["database"]["poolSize"] >= 1 and doc["database"]["maxPoolSize"] >= 1
    assert doc["memory"]["rss"] > 1_000_000 and doc["memory"]["maxRss"] >= doc["memory"]["rss"] // 2
    assert doc["cpu"]["user"] > 0
    assert doc["process"]["pid"] > 0

    text = requests.get(api.url + "/metrics/prometheus", timeout=10)
    assert text.status_code == 200 and text.headers["content-type"].startswith("text/plain")
    for name in ("queen_http_requests_total", "queen_http_request_duration_seconds_bucket",
                 'queen_messages_total{operation="pushed"}', "queen_db_pool_connections",
                 "queen_queue_messages", "queen_database_up 1.0"):
        assert name in text.text, name
    assert 'route="/api/v1/push"' in text.text
    assert os.environ.get("PROMETHEUS_MULTIPROC_DIR") is None  # the server made its own


Conn = psycopg.Connection[Any]


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
    lifecycle.push(conn, [{"queue": queue, "partition": "a", "payload": {"n": i},
                         "transactionId": f"{queue}-a{i}"} for i in range(3)])
    lifecycle.push(conn, [{"queue": queue, "partition": "b", "payload": {"n": i},
                         "transactionId": f"{queue}-b{i}"} for i in range(2)])
    got = lifecycle.pop(conn, queue, partition="a", batch=3, worker="w")
    lifecycle.ack(conn, [{"transactionId": d.transaction_id, "status": s, "error": "boom"}
                       for d, s in zip(got, ("completed", "completed", "failed"), strict=True)])
    assert len(lifecycle.pop(conn, queue, partition="b", batch=1, worker="w")) == 1
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
    again = lifecycle.pop(conn, queue, partition="a", batch=10)
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
