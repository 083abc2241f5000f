"""Metrics are per host, not per worker: every gunicorn worker reports the same totals."""

from __future__ import annotations

import os
import re
import signal
import time
from typing import Any

import requests
from psycopg import sql
from psycopg.conninfo import conninfo_to_dict

from tests.conftest import Server, _admin


def fresh(url: str) -> requests.Response:
    """GET on a new connection, so the kernel may hand it to any worker."""
    return requests.get(url, headers={"Connection": "close"}, timeout=10)


def sample(text: str, name: str) -> float:
    match = re.search(rf"^{re.escape(name)} ([0-9.e+]+)$", text, re.MULTILINE)
    assert match, f"{name} not in scrape"
    return float(match.group(1))


def metrics_by_pid(url: str, wanted: int = 2, tries: int = 200) -> dict[int, dict[str, Any]]:
    seen: dict[int, dict[str, Any]] = {}
    for _ in range(tries):
        doc = fresh(url + "/metrics").json()
        seen[doc["process"]["pid"]] = doc
        if len(seen) >= wanted:
            break
    return seen


def test_totals_and_prometheus_agree_across_workers(db_dsn):
    srv = Server(db_dsn, workers=2).start()
    try:
        for i in range(7):
            pushed = requests.post(srv.url + "/api/v1/push", json={"items": [
                {"queue": "counted", "partition": f"p{i % 2}", "payload": {"i": i, "j": j}}
                for j in range(3)]}, timeout=10)
            assert pushed.status_code == 201

        seen = metrics_by_pid(srv.url)
        assert len(seen) == 2, "both workers should have answered"
        for doc in seen.values():
            assert doc["messages"]["pushed"] == 21
            assert doc["requests"]["total"] >= 7
            fused = doc["fusion"]["push"]  # every push request was served by some call
            assert fused["requests"] == 7 and 1 <= fused["calls"] <= 7
            database = doc["database"]  # each call one statement, committed
            assert database["statements"] >= fused["calls"]
            assert database["commits"] >= fused["calls"]
            assert database["perMessage"] == {"statements": None, "commits": None}  # no ack

        for _ in range(6):
            text = fresh(srv.url + "/metrics/prometheus").text
            assert sample(text, 'queen_messages_total{operation="pushed"}') == 21
            assert sample(text, 'queen_queue_messages{queue="counted",status="pending"}') == 21
            assert sample(text, 'queen_queue_partitions{queue="counted"}') == 2
            assert sample(text, 'queen_fused_call_requests_sum{kind="push"}') == 7
            calls = sample(text, 'queen_fused_call_requests_count{kind="push"}')
            # (each call tries push_new; the two that made a partition then push)
            assert sample(text, 'queen_db_statements_total{query="push_new"}') == calls
            assert sample(text, 'queen_db_commits_total{query="push_new"}') == calls
            assert sample(text, 'queen_db_statements_total{query="push"}') == 2
            assert sample(text, 'queen_db_commits_total{query="push"}') == 2
            assert sample(text, 'queen_fused_call_requests_bucket{kind="push",le="+Inf"}') >= 1
            assert sample(text, 'queen_http_requests_total{method="POST",route="/api/v1/push",'
                                'status="201"}') == 7
            assert sample(text, 'queen_http_request_duration_seconds_count{method="POST",'
                                'route="/api/v1/push"}') == 7
            assert sample(text, 'queen_db_pool_connections{state="size"}') >= 1
            assert sample(text, "queen_database_up") == 1

        # A worker that dies takes its live gauges along, never the counts.
        victim = next(iter(seen))
        os.kill(victim, signal.SIGKILL)
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            pids = set(metrics_by_pid(srv.url, tries=20))
            if victim not in pids and len(pids) == 2:
                break
            time.sleep(0.2)
        for doc in metrics_by_pid(srv.url).values():
            assert doc["messages"]["pushed"] == 21
        health = fresh(srv.url + "/health").json()
        assert health["stats"]["messages"] == 21
    finally:
        srv.stop()


def test_a_long_poll_that_waits_is_counted_as_parked(db_dsn):
    """queen_long_polls_parked_total counts the long polls that found nothing at once and
    waited; one that found a message at once, or did not ask to wait, is not counted."""
    srv = Server(db_dsn).start()
    try:
        pop = srv.url + "/api/v1/pop/queue/parked"
        pushed = requests.post(srv.url + "/api/v1/push", json={"items": [
            {"queue": "parked", "payload": {"i": 1}}]}, timeout=10)
        assert pushed.status_code == 201
        assert requests.get(pop + "?wait=true&timeout=5000", timeout=10).status_code == 200
        assert requests.get(pop + "?wait=false", timeout=10).status_code == 204
        for _ in range(2):  # nothing left: both wait out their timeout
            assert requests.get(pop + "?wait=true&timeout=200", timeout=10).status_code == 204
        text = fresh(srv.url + "/metrics/prometheus").text
        assert sample(text, "queen_long_polls_parked_total") == 2
        # The push sent its wake-up transaction (notifying no one: no poll was listed).
        assert sample(text, 'queen_db_statements_total{query="notify_sent"}') == 1
        assert fresh(srv.url + "/metrics").json()["longPolls"] == {
            "parked": 2, "wakeupCalls": 1}
    finally:
        srv.stop()


def test_health_answers_503_with_a_reason_when_the_database_is_gone(db_dsn, server_dsn):
    srv = Server(db_dsn, DB_TIMEOUT="1000").start()  # ms to wait for a connection
    try:
        assert fresh(srv.url + "/health").json()["status"] == "healthy"
        name = conninfo_to_dict(db_dsn)["dbname"]
        _admin(server_dsn, sql.SQL("DROP DATABASE {} WITH (FORCE)").format(sql.Identifier(name)))
        resp = fresh(srv.url + "/health")
        assert resp.status_code == 503
        doc = resp.json()
        assert doc["status"] == "unhealthy" and doc["reason"]
        assert "stats" in doc
        listing = fresh(srv.url + "/api/v1/analytics/queues")
        assert listing.status_code == 503 and listing.json()["error"]
    finally:
        srv.stop()
