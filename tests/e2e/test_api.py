"""API.md sections 1-4 and /health over HTTP against a real gunicorn.

One server and one database serve the whole module (tests use their own queue names);
bad input of every kind must get a clean JSON 4xx and leave the database untouched.
"""

from __future__ import annotations

import datetime as dt
import email.utils
import re
import threading
import time
import uuid
from collections.abc import Iterator
from typing import Any

import psycopg
import pytest
import requests

from tests import storage
from tests.conftest import Server, cloned_database
from tests.e2e.test_maintenance import NO_FALLBACK, ON_TIME, Maintainer, leader, wait_for

ISO = re.compile(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z$")
CORS = {
    "Access-Control-Allow-Origin": "*",
    "Access-Control-Allow-Methods": "GET, POST, PUT, DELETE, OPTIONS",
    "Access-Control-Allow-Headers": "Content-Type, Authorization",
    "Access-Control-Max-Age": "86400",
}
JSON = {"Content-Type": "application/json"}
DEFAULT_OPTIONS = {
    "leaseTime": 300,
    "retryLimit": 3,
    "priority": 0,
    "maxSize": 0,
    "ttl": 0,
    "dlqAfterMaxRetries": True,
    "delayedProcessing": 0,
    "windowBuffer": 0,
    "retentionSeconds": 0,
    "completedRetentionSeconds": 0,
    "retentionEnabled": False,
    "encryptionEnabled": False,
    "maxWaitTimeSeconds": 0,
    "retryDelay": 0,
}


@pytest.fixture(scope="module")
def api_db(server_dsn: str, template_db: str) -> Iterator[str]:
    with cloned_database(server_dsn, template_db, "queen_api") as dsn:
        yield dsn


@pytest.fixture(scope="module")
def api(api_db: str) -> Iterator[Server]:
    srv = Server(api_db).start()
    yield srv
    srv.stop()


@pytest.fixture
def url(api: Server) -> str:
    return f"{api.url}/api/v1"


def q(prefix: str = "q") -> str:
    """A queue name no other test uses."""
    return f"{prefix}-{uuid.uuid4().hex[:10]}"


def db_state(dsn: str) -> tuple[int, int, int]:
    with psycopg.connect(dsn) as conn:
        row = conn.execute(
            f"SELECT (SELECT count(*) FROM {storage.MESSAGES}), (SELECT count(*) FROM queen.queues),"
            " (SELECT count(*) FROM queen.partitions)"
        ).fetchone()
    assert row is not None
    return row


def assert_cors(r: requests.Response) -> None:
    for header, value in CORS.items():
        assert r.headers.get(header) == value, (header, r.status_code, r.url)


def assert_json_error(r: requests.Response, status: int) -> str:
    assert r.status_code == status, (r.status_code, r.text[:300])
    assert r.headers["Content-Type"].startswith("application/json")
    doc = r.json()
    assert isinstance(doc, dict) and set(doc) >= {"error"}, doc
    assert isinstance(doc["error"], str) and doc["error"]
    assert "Traceback" not in r.text
    assert_cors(r)
    return doc["error"]


def push(url: str, items: list[dict[str, Any]]) -> requests.Response:
    return requests.post(f"{url}/push", json={"items": items}, timeout=10)


# -- 1. push -----------------------------------------------------------------------


def test_push_answers_201_with_one_result_per_item(url: str) -> None:
    name = q()
    r = push(
        url,
        [
            {"queue": name, "payload": {"a": 1}},
            {"queue": name, "partition": "urgent", "payload": "text", "transactionId": "tx-push-1"},
            {"queue": name, "payload": [1, 2], "transactionId": "tx-push-1"},
        ],
    )
    assert r.status_code == 201
    assert_cors(r)
    messages = r.json()["messages"]
    assert [m["status"] for m in messages] == ["queued", "queued", "duplicate"]
    assert messages[1]["transactionId"] == messages[2]["transactionId"] == "tx-push-1"
    assert messages[1]["id"] == messages[2]["id"]
    uuid.UUID(messages[0]["id"])
    assert messages[0]["transactionId"]  # generated
    again = push(url, [{"queue": name, "payload": 1, "transactionId": "tx-push-1"}])
    assert again.status_code == 201
    assert again.json()["messages"] == [
        {"id": messages[1]["id"], "transactionId": "tx-push-1", "status": "duplicate"}
    ]


def test_push_limit_of_1000_items(url: str, api_db: str) -> None:
    name = q()
    ok = push(url, [{"queue": name, "payload": n} for n in range(1000)])
    assert ok.status_code == 201
    assert len(ok.json()["messages"]) == 1000
    before = db_state(api_db)
    too_many = push(url, [{"queue": q(), "payload": n} for n in range(1001)])
    assert_json_error(too_many, 413)
    assert db_state(api_db) == before


def test_push_with_a_chunked_body(url: str) -> None:
    name = q()
    body = b'{"items": [{"queue": "%s", "payload": {"chunked": true}}]}' % name.encode()

    def chunks() -> Iterator[bytes]:
        yield body[:10]
        yield body[10:]

    r = requests.post(
        f"{url}/push", data=chunks(), headers={"Content-Type": "application/json"}, timeout=10
    )
    assert r.request.headers.get("Transfer-Encoding") == "chunked"
    assert r.status_code == 201, r.text
    assert _pop_one(url, name)["data"] == {"chunked": True}


def test_push_over_max_size_is_rejected_per_item_then_429(url: str, api_db: str) -> None:
    name = q()
    requests.post(f"{url}/configure", json={"queue": name, "options": {"maxSize": 2}}, timeout=10)
    r = push(url, [{"queue": name, "payload": n, "transactionId": f"{name}-{n}"} for n in range(3)])
    assert r.status_code == 201
    messages = r.json()["messages"]
    assert [m["status"] for m in messages] == ["queued", "queued", "rejected"]
    assert messages[2]["transactionId"] == f"{name}-2"
    assert messages[2]["error"]
    before = db_state(api_db)
    full = push(url, [{"queue": name, "payload": "more"}])
    assert "full" in assert_json_error(full, 429)
    assert db_state(api_db) == before


# -- 2. pop ------------------------------------------------------------------------


def _popped_shape(m: dict[str, Any], queue: str, partition: str) -> None:
    assert set(m) >= {
        "id",
        "transactionId",
        "queue",
        "partition",
        "data",
        "retryCount",
        "priority",
        "createdAt",
        "lockedAt",
        "options",
    }
    assert (m["queue"], m["partition"]) == (queue, partition)
    uuid.UUID(m["id"])
    assert ISO.match(m["createdAt"]) and ISO.match(m["lockedAt"])
    assert m["options"] == {"leaseTime": 300, "retryLimit": 3}
    assert m["retryCount"] == 0 and m["priority"] == 0


def test_pop_from_a_partition_with_batch(url: str) -> None:
    name = q()
    push(url, [{"queue": name, "partition": "p1", "payload": {"n": n}} for n in range(5)])
    r = requests.get(f"{url}/pop/queue/{name}/partition/p1", params={"batch": 3}, timeout=10)
    assert r.status_code == 200
    assert_cors(r)
    messages = r.json()["messages"]
    assert [m["data"] for m in messages] == [{"n": 0}, {"n": 1}, {"n": 2}]
    for m in messages:
        _popped_shape(m, name, "p1")


def test_pop_from_any_partition_of_a_queue(url: str) -> None:
    name = q()
    push(url, [{"queue": name, "payload": n} for n in range(3)])
    r = requests.get(f"{url}/pop/queue/{name}", params={"batch": 10}, timeout=10)
    assert r.status_code == 200
    messages = r.json()["messages"]
    assert [m["data"] for m in messages] == [0, 1, 2]
    _popped_shape(messages[0], name, "Default")


def test_pop_with_namespace_and_task_filters(url: str) -> None:
    a, b = q("ns"), q("task")
    ns, task = q("namespace"), q("taskname")
    assert (
        requests.post(
            f"{url}/configure", json={"queue": a, "namespace": ns}, timeout=10
        ).status_code
        == 200
    )
    assert (
        requests.post(f"{url}/configure", json={"queue": b, "task": task}, timeout=10).status_code
        == 200
    )
    push(url, [{"queue": a, "payload": "by-namespace"}, {"queue": b, "payload": "by-task"}])
    r = requests.get(f"{url}/pop", params={"namespace": ns, "batch": 5}, timeout=10)
    assert r.status_code == 200
    assert [(m["queue"], m["data"]) for m in r.json()["messages"]] == [(a, "by-namespace")]
    r = requests.get(f"{url}/pop", params={"task": task}, timeout=10)
    assert r.status_code == 200
    assert [(m["queue"], m["data"]) for m in r.json()["messages"]] == [(b, "by-task")]
    empty = requests.get(f"{url}/pop", params={"task": task}, timeout=10)
    assert empty.status_code == 204


@pytest.mark.parametrize(
    "path",
    [
        "/pop/queue/{q}",
        "/pop/queue/{q}/partition/Default",
        "/pop/queue/{q}/partition/other",
        "/pop?namespace={q}",
        "/pop?task={q}",
    ],
)
def test_empty_pop_is_204_without_body(url: str, path: str) -> None:
    name = q()
    r = requests.get(url + path.format(q=name), timeout=10)  # the queue does not even exist
    assert r.status_code == 204
    assert r.content == b""
    assert_cors(r)


def test_pop_with_short_wait_times_out_with_204(url: str) -> None:
    r = requests.get(f"{url}/pop/queue/{q()}", params={"wait": "true", "timeout": 200}, timeout=10)
    assert r.status_code == 204
    assert r.elapsed.total_seconds() >= 0.15


def test_client_supplied_encrypted_flag_is_ignored(url: str) -> None:
    name = q()
    r = push(url, [{"queue": name, "payload": {"plain": True}, "encrypted": True}])
    assert r.status_code == 201
    popped = requests.get(f"{url}/pop/queue/{name}", timeout=10)
    assert popped.status_code == 200
    assert popped.json()["messages"][0]["data"] == {"plain": True}


# -- 3. ack ------------------------------------------------------------------------


def _pop_one(url: str, queue: str) -> dict[str, Any]:
    r = requests.get(f"{url}/pop/queue/{queue}", timeout=10)
    assert r.status_code == 200, r.text
    (m,) = r.json()["messages"]
    return m


def test_ack_completed(url: str) -> None:
    name = q()
    push(url, [{"queue": name, "payload": 1, "transactionId": f"{name}-a"}])
    m = _pop_one(url, name)
    r = requests.post(
        f"{url}/ack", json={"transactionId": m["transactionId"], "status": "completed"}, timeout=10
    )
    assert r.status_code == 200
    assert_cors(r)
    doc = r.json()
    assert doc["transactionId"] == f"{name}-a"
    assert doc["status"] == "completed"
    assert ISO.match(doc["acknowledgedAt"])
    assert requests.get(f"{url}/pop/queue/{name}", timeout=10).status_code == 204


def test_ack_failed_retries_then_dead_letter(url: str) -> None:
    name = q()
    requests.post(
        f"{url}/configure", json={"queue": name, "options": {"retryLimit": 1}}, timeout=10
    )
    push(url, [{"queue": name, "payload": 1, "transactionId": f"{name}-f"}])
    m = _pop_one(url, name)
    assert m["retryCount"] == 0
    r = requests.post(
        f"{url}/ack",
        json={"transactionId": m["transactionId"], "status": "failed", "error": "boom"},
        timeout=10,
    )
    assert r.status_code == 200
    assert (r.json()["status"], r.json()["retryCount"]) == ("retry_scheduled", 1)
    m = _pop_one(url, name)
    assert m["retryCount"] == 1
    r = requests.post(
        f"{url}/ack", json={"transactionId": m["transactionId"], "status": "failed"}, timeout=10
    )
    assert r.json()["status"] == "dead_letter"
    assert "retryCount" not in r.json()
    assert requests.get(f"{url}/pop/queue/{name}", timeout=10).status_code == 204


def test_ack_failed_without_dlq_ends_failed(url: str) -> None:
    name = q()
    requests.post(
        f"{url}/configure",
        json={"queue": name, "options": {"retryLimit": 0, "dlqAfterMaxRetries": False}},
        timeout=10,
    )
    push(url, [{"queue": name, "payload": 1}])
    m = _pop_one(url, name)
    r = requests.post(
        f"{url}/ack", json={"transactionId": m["transactionId"], "status": "failed"}, timeout=10
    )
    assert r.json()["status"] == "failed"


def test_ack_unknown_transaction_is_404(url: str) -> None:
    r = requests.post(
        f"{url}/ack",
        json={"transactionId": f"nope-{uuid.uuid4()}", "status": "completed"},
        timeout=10,
    )
    assert "not found" in assert_json_error(r, 404)
    r = requests.post(
        f"{url}/ack/batch",
        json={"acknowledgments": [{"transactionId": "nope-1", "status": "completed"}]},
        timeout=10,
    )
    assert_json_error(r, 404)


def test_ack_batch(url: str) -> None:
    name = q()
    requests.post(
        f"{url}/configure", json={"queue": name, "options": {"retryLimit": 0}}, timeout=10
    )
    push(
        url,
        [
            {"queue": name, "partition": f"p{n}", "payload": n, "transactionId": f"{name}-{n}"}
            for n in range(3)
        ],
    )
    for _ in range(3):
        _pop_one(url, name)
    r = requests.post(
        f"{url}/ack/batch",
        json={
            "acknowledgments": [
                {"transactionId": f"{name}-0", "status": "completed"},
                {"transactionId": f"{name}-1", "status": "failed", "error": "bad"},
                {"transactionId": "unknown-" + name, "status": "completed"},
                {"transactionId": f"{name}-2", "status": "completed"},
            ]
        },
        timeout=10,
    )
    assert r.status_code == 200
    assert_cors(r)
    doc = r.json()
    assert doc["processed"] == 3
    assert doc["results"] == [
        {"transactionId": f"{name}-0", "status": "completed", "success": True},
        {"transactionId": f"{name}-1", "status": "dead_letter", "success": True},
        {"transactionId": "unknown-" + name, "status": "not_found", "success": False,
         "reason": "not_found"},
        {"transactionId": f"{name}-2", "status": "completed", "success": True},
    ]


def test_ack_batch_reports_retry_scheduled(url: str) -> None:
    name = q()
    push(url, [{"queue": name, "payload": 1, "transactionId": f"{name}-r"}])
    _pop_one(url, name)
    r = requests.post(
        f"{url}/ack/batch",
        json={"acknowledgments": [{"transactionId": f"{name}-r", "status": "failed"}]},
        timeout=10,
    )
    assert r.json()["results"] == [
        {"transactionId": f"{name}-r", "status": "retry_scheduled", "success": True,
         "retryCount": 1}
    ]


# -- 4. configure ------------------------------------------------------------------


def test_configure_returns_every_option_with_defaults(url: str) -> None:
    name = q()
    r = requests.post(f"{url}/configure", json={"queue": name}, timeout=10)
    assert r.status_code == 200
    assert_cors(r)
    doc = r.json()
    assert doc["queue"] == name and doc["configured"] is True
    assert doc["options"] == DEFAULT_OPTIONS
    assert doc["namespace"] is None and doc["task"] is None


def test_configure_sets_options_and_labels_and_keeps_them(url: str) -> None:
    name = q()
    r = requests.post(
        f"{url}/configure",
        json={
            "queue": name,
            "partition": "critical",  # deprecated, accepted and ignored
            "namespace": "billing",
            "task": "invoices",
            "options": {
                "leaseTime": 600,
                "retryLimit": 5,
                "priority": 10,
                "dlqAfterMaxRetries": False,
            },
        },
        timeout=10,
    )
    assert r.status_code == 200
    doc = r.json()
    assert (doc["namespace"], doc["task"]) == ("billing", "invoices")
    assert doc["options"] == {
        **DEFAULT_OPTIONS,
        "leaseTime": 600,
        "retryLimit": 5,
        "priority": 10,
        "dlqAfterMaxRetries": False,
    }
    # A later configure changes only what it names.
    r = requests.post(f"{url}/configure", json={"queue": name, "options": {"ttl": 60}}, timeout=10)
    doc = r.json()
    assert (doc["namespace"], doc["task"]) == ("billing", "invoices")
    assert doc["options"] == {
        **DEFAULT_OPTIONS,
        "leaseTime": 600,
        "retryLimit": 5,
        "priority": 10,
        "dlqAfterMaxRetries": False,
        "ttl": 60,
    }
    push(url, [{"queue": name, "payload": 1}])
    m = _pop_one(url, name)
    assert m["options"] == {"leaseTime": 600, "retryLimit": 5}
    assert m["priority"] == 10


# -- health, CORS, routing ---------------------------------------------------------


def test_health(api: Server) -> None:
    r = requests.get(f"{api.url}/health", timeout=10)
    assert r.status_code == 200
    assert_cors(r)
    doc = r.json()
    assert doc["status"] == "healthy"
    assert re.match(r"^\d+s$", doc["uptime"])
    assert set(doc["stats"]["pool"]) == {"total", "idle", "waiting"}


def test_every_response_has_one_date_header_of_now(api: Server) -> None:
    with requests.Session() as session:  # one keep-alive connection, several responses
        for path in ("/health", "/api/v1/pop/queue/no-such-queue", "/api/v1/nothing"):
            before = dt.datetime.now(dt.UTC).replace(microsecond=0)
            r = session.get(api.url + path, timeout=10)
            after = dt.datetime.now(dt.UTC)
            dates = r.raw.headers.getlist("Date")
            assert len(dates) == 1, (path, dates)
            assert re.fullmatch(r"\w{3}, \d\d \w{3} \d{4} \d\d:\d\d:\d\d GMT", dates[0])
            assert before <= email.utils.parsedate_to_datetime(dates[0]) <= after, (path, dates)


@pytest.mark.parametrize(
    "path",
    [
        "/api/v1/push",
        "/api/v1/pop/queue/x",
        "/api/v1/ack",
        "/api/v1/configure",
        "/health",
        "/api/v1/does-not-exist",
    ],
)
def test_options_preflight(api: Server, path: str) -> None:
    r = requests.options(
        api.url + path,
        headers={
            "Origin": "http://example.com",
            "Access-Control-Request-Method": "POST",
            "Access-Control-Request-Headers": "Content-Type",
        },
        timeout=10,
    )
    assert r.status_code in (200, 204)
    assert_cors(r)


@pytest.mark.parametrize(
    "path",
    ["/api/v1/nothing", "/api/v2/push", "/api/v1/pop/queue/a/partition/b/c", "/x"],
)
def test_unknown_route_is_json_404(api: Server, path: str) -> None:
    assert_json_error(requests.get(api.url + path, timeout=10), 404)
    assert_json_error(requests.post(api.url + path, json={}, timeout=10), 404)


@pytest.mark.parametrize(
    ("method", "path"),
    [
        ("GET", "/api/v1/push"),
        ("PUT", "/api/v1/push"),
        ("DELETE", "/api/v1/ack"),
        ("GET", "/api/v1/ack/batch"),
        ("POST", "/api/v1/pop/queue/x"),
        ("DELETE", "/api/v1/pop"),
        ("GET", "/api/v1/configure"),
        ("POST", "/health"),
    ],
)
def test_wrong_method_is_json_405(api: Server, method: str, path: str) -> None:
    r = requests.request(method, api.url + path, json={}, timeout=10)
    assert_json_error(r, 405)


# -- bad input: clean 4xx, nothing stored ------------------------------------------

NAME_TOO_LONG = "x" * 129
BAD_PUSH_BODIES: list[tuple[str, bytes | str | Any, int]] = [
    ("empty body", b"", 400),
    ("malformed", b'{"items": [', 400),
    ("trailing garbage", b'{"items": []} x', 400),
    ("not utf-8", b'{"items": [{"queue": "q\xff", "payload": 1}]}', 400),
    ("array body", [], 400),
    ("string body", "items", 400),
    ("number body", 5, 400),
    ("null body", None, 400),
    ("no items", {}, 400),
    ("items not a list", {"items": {"queue": "q", "payload": 1}}, 400),
    ("items empty", {"items": []}, 400),
    ("item not an object", {"items": ["q"]}, 400),
    ("missing queue", {"items": [{"payload": 1}]}, 400),
    ("missing payload", {"items": [{"queue": "q-ok"}]}, 400),
    ("queue is a number", {"items": [{"queue": 7, "payload": 1}]}, 400),
    ("queue is null", {"items": [{"queue": None, "payload": 1}]}, 400),
    ("partition is a list", {"items": [{"queue": "q-ok", "partition": ["a"], "payload": 1}]}, 400),
    (
        "transactionId is a number",
        {"items": [{"queue": "q-ok", "payload": 1, "transactionId": 12}]},
        400,
    ),
    ("transactionId empty", {"items": [{"queue": "q-ok", "payload": 1, "transactionId": ""}]}, 400),
    ("queue with slash", {"items": [{"queue": "a/b", "payload": 1}]}, 400),
    ("queue with space", {"items": [{"queue": "a b", "payload": 1}]}, 400),
    ("queue empty", {"items": [{"queue": "", "payload": 1}]}, 400),
    ("queue too long", {"items": [{"queue": NAME_TOO_LONG, "payload": 1}]}, 400),
    ("queue unicode", {"items": [{"queue": "caf\u00e9", "payload": 1}]}, 400),
    ("queue trailing newline", {"items": [{"queue": "q-ok\n", "payload": 1}]}, 400),
    ("partition with slash", {"items": [{"queue": "q-ok", "partition": "a/b", "payload": 1}]}, 400),
    ("NUL in payload", {"items": [{"queue": "q-ok", "payload": {"a": "x\u0000y"}}]}, 400),
    ("NUL in payload key", {"items": [{"queue": "q-ok", "payload": {"a\u0000": 1}}]}, 400),
    (
        "NUL in transactionId",
        {"items": [{"queue": "q-ok", "payload": 1, "transactionId": "t\u0000"}]},
        400,
    ),
    ("NUL in another field", {"items": [{"queue": "q-ok", "payload": 1, "meta": "\u0000"}]}, 400),
    ("lone surrogate", b'{"items": [{"queue": "q-ok", "payload": "\\ud800"}]}', 400),
    ("second item bad", {"items": [{"queue": "q-ok", "payload": 1}, {"queue": "a b"}]}, 400),
    ("1001 items", {"items": [{"queue": "q-ok", "payload": n} for n in range(1001)]}, 413),
]


@pytest.mark.parametrize(
    ("body", "status"),
    [(b, s) for _, b, s in BAD_PUSH_BODIES],
    ids=[n for n, _, _ in BAD_PUSH_BODIES],
)
def test_bad_push_is_refused_and_stores_nothing(
    url: str, api_db: str, body: Any, status: int
) -> None:
    before = db_state(api_db)
    if isinstance(body, bytes):
        r = requests.post(
            f"{url}/push", data=body, headers={"Content-Type": "application/json"}, timeout=10
        )
    else:
        r = requests.post(f"{url}/push", json=body, timeout=10)
    assert_json_error(r, status)
    assert db_state(api_db) == before


BAD_POPS = [
    "/pop/queue/{q}?batch=0",
    "/pop/queue/{q}?batch=abc",
    "/pop/queue/{q}?batch=1001",
    "/pop/queue/{q}?batch=-1",
    "/pop/queue/{q}?batch=1.5",
    "/pop/queue/{q}?batch=1&batch=2",
    "/pop/queue/{q}?timeout=-1",
    "/pop/queue/{q}?timeout=soon",
    "/pop/queue/{q}?wait=maybe",
    "/pop/queue/{q}/partition/Default?batch=0",
    "/pop?namespace={q}&batch=abc",
    "/pop?namespace=a%20b",
    "/pop?task=" + NAME_TOO_LONG,
    "/pop/queue/a%20b",
    "/pop/queue/caf%C3%A9",
    "/pop/queue/" + NAME_TOO_LONG,
    "/pop/queue/{q}/partition/a%20b",
    "/pop/queue/%00",
]


@pytest.mark.parametrize("path", BAD_POPS)
def test_bad_pop_is_refused_and_claims_nothing(url: str, api_db: str, path: str) -> None:
    name = q()
    push(url, [{"queue": name, "payload": 1}])
    before = db_state(api_db)
    assert_json_error(requests.get(url + path.format(q=name), timeout=10), 400)
    assert db_state(api_db) == before
    # Nothing was claimed: the message is still there for a good pop.
    assert requests.get(f"{url}/pop/queue/{name}", timeout=10).status_code == 200


BAD_ACKS: list[tuple[str, str, Any, int]] = [
    ("ack", "malformed", b"{", 400),
    ("ack", "array", [], 400),
    ("ack", "no transactionId", {"status": "completed"}, 400),
    ("ack", "transactionId number", {"transactionId": 5, "status": "completed"}, 400),
    ("ack", "NUL transactionId", {"transactionId": "a\u0000", "status": "completed"}, 400),
    ("ack", "no status", {"transactionId": "{tx}"}, 400),
    ("ack", "bad status", {"transactionId": "{tx}", "status": "done"}, 400),
    ("ack", "error not a string", {"transactionId": "{tx}", "status": "failed", "error": 1}, 400),
    ("ack/batch", "no list", {"acknowledgments": "x"}, 400),
    ("ack/batch", "empty list", {"acknowledgments": []}, 400),
    (
        "ack/batch",
        "bad entry",
        {
            "acknowledgments": [
                {"transactionId": "{tx}", "status": "completed"},
                {"transactionId": "{tx}"},
            ]
        },
        400,
    ),
    (
        "ack/batch",
        "1001 entries",
        {"acknowledgments": [{"transactionId": "{tx}", "status": "completed"}] * 1001},
        413,
    ),
]


def _fill(value: Any, placeholder: str, text: str) -> Any:
    """Replace placeholder by text in every string of a JSON document."""
    if isinstance(value, str):
        return value.replace(placeholder, text)
    if isinstance(value, list):
        return [_fill(v, placeholder, text) for v in value]
    if isinstance(value, dict):
        return {k: _fill(v, placeholder, text) for k, v in value.items()}
    return value


@pytest.mark.parametrize(
    ("path", "body", "status"),
    [(p, b, s) for p, _, b, s in BAD_ACKS],
    ids=[f"{p}-{n}" for p, n, _, _ in BAD_ACKS],
)
def test_bad_ack_is_refused_and_changes_nothing(
    url: str, api_db: str, path: str, body: Any, status: int
) -> None:
    name = q()
    push(url, [{"queue": name, "payload": 1, "transactionId": f"{name}-tx"}])
    _pop_one(url, name)
    if isinstance(body, bytes):
        r = requests.post(f"{url}/{path}", data=body, headers=JSON, timeout=10)
    else:
        r = requests.post(f"{url}/{path}", json=_fill(body, "{tx}", f"{name}-tx"), timeout=10)
    assert_json_error(r, status)
    with psycopg.connect(api_db) as conn:
        row = conn.execute(
            storage.MESSAGE_STATUS, (f"{name}-tx",)
        ).fetchone()
    assert row == ("processing",)


BAD_CONFIGURE: list[tuple[str, Any]] = [
    ("malformed", b"{"),
    ("array", ["q"]),
    ("no queue", {"options": {"leaseTime": 5}}),
    ("queue not a string", {"queue": 5}),
    ("queue with slash", {"queue": "a/b"}),
    ("queue unicode", {"queue": "\u961f\u5217"}),
    ("queue too long", {"queue": NAME_TOO_LONG}),
    ("options not an object", {"queue": "{q}", "options": [1]}),
    ("unknown option", {"queue": "{q}", "options": {"leaseTimeout": 5}}),
    ("option as string", {"queue": "{q}", "options": {"leaseTime": "5"}}),
    ("option as float", {"queue": "{q}", "options": {"retryLimit": 1.5}}),
    ("boolean as number", {"queue": "{q}", "options": {"dlqAfterMaxRetries": 1}}),
    ("zero lease", {"queue": "{q}", "options": {"leaseTime": 0}}),
    ("negative size", {"queue": "{q}", "options": {"maxSize": -1}}),
    ("too big", {"queue": "{q}", "options": {"ttl": 2**31}}),
    ("bad namespace", {"queue": "{q}", "namespace": "a b"}),
    ("task not a string", {"queue": "{q}", "task": 5}),
    ("NUL in namespace", {"queue": "{q}", "namespace": "a\u0000"}),
]


@pytest.mark.parametrize("body", [b for _, b in BAD_CONFIGURE], ids=[n for n, _ in BAD_CONFIGURE])
def test_bad_configure_is_refused_and_creates_nothing(url: str, api_db: str, body: Any) -> None:
    before = db_state(api_db)
    if isinstance(body, bytes):
        r = requests.post(f"{url}/configure", data=body, headers=JSON, timeout=10)
    else:
        r = requests.post(f"{url}/configure", json=_fill(body, "{q}", q()), timeout=10)
    assert_json_error(r, 400)
    assert db_state(api_db) == before


def test_bad_configure_of_an_existing_queue_changes_nothing(url: str) -> None:
    name = q()
    requests.post(
        f"{url}/configure", json={"queue": name, "options": {"leaseTime": 42}}, timeout=10
    )
    r = requests.post(
        f"{url}/configure",
        json={"queue": name, "options": {"retryLimit": 9, "leaseTime": 0}},
        timeout=10,
    )
    assert_json_error(r, 400)
    r = requests.post(f"{url}/configure", json={"queue": name}, timeout=10)
    assert r.json()["options"]["leaseTime"] == 42
    assert r.json()["options"]["retryLimit"] == 3


API = "/api/v1"


@pytest.fixture
def srv(db_dsn: str) -> Iterator[Server]:
    """One gunicorn."""
    server = Server(db_dsn).start()
    yield server
    server.stop()


def push_items(srv: Server, items: list[dict[str, Any]]) -> list[dict[str, Any]]:
    resp = requests.post(f"{srv.url}{API}/push", json={"items": items}, timeout=10)
    assert resp.status_code == 201, resp.text
    return resp.json()["messages"]  # type: ignore[no-any-return]


def push_n(srv: Server, queue: str, n: int, partition: str = "p") -> list[str]:
    """Push n messages {"n": i} in one request; return their transactionIds in order."""
    items = [{"queue": queue, "partition": partition, "payload": {"n": i}} for i in range(n)]
    return [m["transactionId"] for m in push_items(srv, items)]


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
    (stored,) = push_items(srv, [{"queue": "ids", "payload": {"a": 1}}])
    (duplicate,) = push_items(srv, [{"queue": "ids", "payload": {}, "transactionId": stored["transactionId"]}])
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
    assert "error" in refused.json() and refused.json()["reason"] == "leased_by_other"
    batch = requests.post(f"{srv.url}{API}/ack/batch", timeout=10, json={"acknowledgments": [
        {"transactionId": m["transactionId"], "status": "completed", "leaseId": m["leaseId"],
         "consumerGroup": "g"} for m in old]})
    assert batch.status_code == 200
    assert [r["status"] for r in batch.json()["results"]] == ["leased_by_other"] * 2

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
    (message,) = push_items(srv, [{"queue": "q", "payload": {}}])
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
        push_items(srv, [{"queue": "crowd", "partition": f"p{p}", "payload": {"p": p, "i": i}}
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
