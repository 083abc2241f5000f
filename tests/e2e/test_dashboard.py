"""The dashboard WebSocket and page against a real gunicorn (gevent-websocket worker)."""

from __future__ import annotations

import json
import re
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import websocket

from tests.conftest import Server

ISO_MS = re.compile(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z$")
Event = dict[str, Any]


@pytest.fixture
def dash(db_dsn: str) -> Iterator[Server]:
    """A one-worker server whose periodic dashboard events come fast."""
    srv = Server(
        db_dsn,
        QUEEN_DASHBOARD_DEPTH_INTERVAL="0.3",
        QUEEN_DASHBOARD_STATS_INTERVAL="0.5",
        QUEEN_DASHBOARD_FLUSH_INTERVAL="0.25",
    ).start()
    yield srv
    srv.stop()


def connect(server: Server) -> websocket.WebSocket:
    ws = websocket.create_connection(f"ws://127.0.0.1:{server.port}/ws/dashboard", timeout=5)
    wait_for(ws, lambda e: e["event"] == "client.connected")  # now this client is listening
    return ws


def frames(ws: websocket.WebSocket, seconds: float) -> Iterator[str]:
    """Yield text frames until `seconds` have passed."""
    deadline = time.monotonic() + seconds
    while (remaining := deadline - time.monotonic()) > 0:
        ws.settimeout(remaining)
        try:
            yield ws.recv()
        except websocket.WebSocketTimeoutException:
            return


def events(ws: websocket.WebSocket, seconds: float) -> Iterator[Event]:
    for frame in frames(ws, seconds):
        if frame != "pong":
            yield json.loads(frame)


def wait_for(ws: websocket.WebSocket, match: Callable[[Event], bool], seconds: float = 5) -> Event:
    for event in events(ws, seconds):
        if match(event):
            return event
    raise AssertionError("expected event did not arrive")


def collect(ws: websocket.WebSocket, name: str, count: int, seconds: float = 5) -> list[Event]:
    found: list[Event] = []
    for event in events(ws, seconds):
        if event["event"] == name:
            found.append(event)
            if len(found) == count:
                return found
    raise AssertionError(f"got {len(found)} of {count} {name} events")


def push(server: Server, http: Any, *items: dict[str, Any]) -> list[str]:
    resp = http.post(f"{server.url}/api/v1/push", json={"items": list(items)})
    assert resp.status_code == 201, resp.text
    return [m["transactionId"] for m in resp.json()["messages"]]


def test_connected_is_the_first_event(dash):
    ws = websocket.create_connection(f"ws://127.0.0.1:{dash.port}/ws/dashboard", timeout=5)
    first = json.loads(ws.recv())
    assert first["event"] == "connected"
    assert first["data"]["version"] == "v2"
    assert re.fullmatch(r"[0-9a-f-]{36}", first["data"]["connectionId"])
    assert ISO_MS.match(first["timestamp"])
    joined = wait_for(ws, lambda e: e["event"] == "client.connected")
    assert joined["data"] == {"clientId": first["data"]["connectionId"]}
    ws.close()


def test_ping_answers_pong(dash):
    ws = connect(dash)
    ws.send("ping")
    assert "pong" in frames(ws, 5)
    ws.send(json.dumps({"type": "nonsense"}))
    assert wait_for(ws, lambda e: e["event"] == "error")["data"]["error"]
    ws.close()


def test_push_pop_ack_publish_message_events(dash, http):
    ws = connect(dash)
    first, second = push(
        dash, http,
        {"queue": "emails", "partition": "urgent", "payload": 1},
        {"queue": "emails", "partition": "urgent", "payload": 2},
    )
    pushed = collect(ws, "message.pushed", 2)
    assert [e["data"] for e in pushed] == [
        {"queue": "emails", "partition": "urgent", "transactionId": first},
        {"queue": "emails", "partition": "urgent", "transactionId": second},
    ]
    assert all(ISO_MS.match(e["timestamp"]) for e in pushed)

    popped = http.get(f"{dash.url}/api/v1/pop/queue/emails?batch=2")
    assert popped.status_code == 200
    processing = collect(ws, "message.processing", 2)
    assert [e["data"]["transactionId"] for e in processing] == [first, second]
    assert all(e["data"]["queue"] == "emails" and e["data"]["partition"] == "urgent"
               for e in processing)
    assert all(e["data"]["workerId"] for e in processing)

    ack = http.post(f"{dash.url}/api/v1/ack/batch", json={"acknowledgments": [
        {"transactionId": first, "status": "completed"},
        {"transactionId": second, "status": "failed", "error": "smtp down"},
    ]})
    assert ack.status_code == 200
    completed = wait_for(ws, lambda e: e["event"] == "message.completed")
    assert completed["data"]["transactionId"] == first
    assert completed["data"]["queue"] == "emails"
    failed = wait_for(ws, lambda e: e["event"] == "message.failed")
    assert failed["data"]["transactionId"] == second
    assert failed["data"]["error"] == "smtp down"
    assert failed["data"]["status"] == "retry_scheduled"
    assert failed["data"]["retryCount"] == 1

    http.get(f"{dash.url}/api/v1/pop/queue/emails")  # the retry comes back
    http.post(f"{dash.url}/api/v1/ack", json={"transactionId": second, "status": "completed"})
    done = wait_for(ws, lambda e: e["event"] == "message.completed")
    assert done["data"]["transactionId"] == second
    ws.close()


def test_a_plain_socket_gets_each_event_of_a_batch_as_its_own_frame(dash, http):
    ws = connect(dash)
    items = [{"queue": "frames", "partition": f"p{i % 3}", "payload": i} for i in range(40)]
    ids = push(dash, http, *items)  # one request: one publication, one batch

    def next_frame() -> str:
        frame = ws.recv_frame()  # the wire's own frames, not reassembled messages
        assert frame.opcode == websocket.ABNF.OPCODE_TEXT and frame.fin
        return frame.data.decode()

    first = next_frame()
    while not first.startswith('{"event":"message.pushed"'):
        first = next_frame()
    stamp = json.loads(first)["timestamp"]
    assert ISO_MS.match(stamp)
    texts = [first] + [next_frame() for _ in ids[1:]]
    assert texts == [
        json.dumps({"event": "message.pushed",
                    "data": {"queue": "frames", "partition": item["partition"],
                             "transactionId": txid},
                    "timestamp": stamp}, separators=(",", ":"))
        for item, txid in zip(items, ids, strict=True)
    ]
    summary = json.loads(next_frame())  # the batch's last frame
    assert summary["event"] == "events.summary"
    assert summary["data"]["counts"] == {"frames": {"message.pushed": 40}}
    assert summary["data"]["dropped"] == 0
    ws.close()


def test_subscribe_filters_queue_events(dash, http):
    ws = connect(dash)
    ws.send(json.dumps({"type": "subscribe", "queues": ["payments"]}))
    assert wait_for(ws, lambda e: e["event"] == "subscribed")["data"] == {"queues": ["payments"]}
    push(dash, http, {"queue": "emails", "payload": 1})
    (wanted,) = push(dash, http, {"queue": "payments", "payload": 2})
    scoped = [e for e in events(ws, 1.5) if "queue" in e["data"]]
    assert {e["data"]["queue"] for e in scoped} == {"payments"}
    assert any(e["event"] == "message.pushed" and e["data"]["transactionId"] == wanted
               for e in scoped)
    assert any(e["event"] == "queue.depth" for e in scoped)

    ws.send(json.dumps({"type": "subscribe", "queues": []}))  # empty: every queue again
    wait_for(ws, lambda e: e["event"] == "subscribed")
    push(dash, http, {"queue": "emails", "payload": 3})
    assert wait_for(ws, lambda e: e["event"] == "message.pushed")["data"]["queue"] == "emails"
    ws.close()


def test_depth_and_stats_events_carry_current_counts(dash, http):
    push(
        dash, http,
        {"queue": "orders", "payload": 1},
        {"queue": "orders", "partition": "eu", "payload": 2},
        {"queue": "orders", "partition": "eu", "payload": 3},
    )
    assert http.get(f"{dash.url}/api/v1/pop/queue/orders/partition/eu").status_code == 200
    ws = connect(dash)
    depth = wait_for(ws, lambda e: e["event"] == "queue.depth" and e["data"]["queue"] == "orders")
    data = depth["data"]
    assert (data["totalDepth"], data["totalProcessing"]) == (2, 1)
    assert data["namespace"] is None and data["task"] is None
    assert data["partitions"]["Default"] == {
        "depth": 1, "processing": 0, "completed": 0, "failed": 0, "deadLetter": 0}
    assert data["partitions"]["eu"]["depth"] == 1
    assert data["partitions"]["eu"]["processing"] == 1
    eu = wait_for(ws, lambda e: e["event"] == "partition.depth" and e["data"]["partition"] == "eu")
    assert eu["data"]["queue"] == "orders"
    assert (eu["data"]["depth"], eu["data"]["processing"], eu["data"]["total"]) == (1, 1, 2)
    stats = wait_for(ws, lambda e: e["event"] == "system.stats")["data"]
    assert (stats["pending"], stats["processing"], stats["connections"]) == (2, 1, 1)
    assert {"recentCreated", "recentCompleted"} <= stats.keys()

    # Numbers follow the database: a new push shows up in the next snapshot.
    push(dash, http, {"queue": "orders", "payload": 4})
    wait_for(ws, lambda e: e["event"] == "queue.depth" and e["data"]["totalDepth"] == 3)
    ws.close()


def test_queue_created_when_a_queue_appears(dash, http):
    ws = connect(dash)
    wait_for(ws, lambda e: e["event"] == "system.stats")  # a snapshot was taken
    push(dash, http, {"queue": "fresh", "partition": "p1", "payload": 1})
    created = wait_for(ws, lambda e: e["event"] == "queue.created")
    assert created["data"]["queue"] == "fresh"
    assert created["data"]["partition"] == "p1"
    ws.close()


def test_disconnects_are_announced_and_harmless(dash, http):
    watcher = connect(dash)
    leaver = websocket.create_connection(f"ws://127.0.0.1:{dash.port}/ws/dashboard", timeout=5)
    leaver_id = json.loads(leaver.recv())["data"]["connectionId"]
    leaver.sock.close()  # vanish without a close frame
    gone = wait_for(watcher, lambda e: e["event"] == "client.disconnected")
    assert gone["data"] == {"clientId": leaver_id}

    polite = connect(dash)
    polite.close()
    wait_for(watcher, lambda e: e["event"] == "client.disconnected")

    push(dash, http, {"queue": "after", "payload": 1})
    assert wait_for(watcher, lambda e: e["event"] == "message.pushed")["data"]["queue"] == "after"
    stats = wait_for(watcher, lambda e: e["event"] == "system.stats")
    assert stats["data"]["connections"] == 1
    watcher.close()
    assert http.get(f"{dash.url}/health").status_code == 200
    assert http.get(f"{dash.url}/api/v1/pop/queue/after").status_code == 200


def test_dashboard_page_and_assets_are_served(server, http):
    for path in ("/", "/dashboard", "/dashboard/"):
        page = http.get(f"{server.url}{path}")
        assert page.status_code == 200
        assert page.headers["Content-Type"].startswith("text/html")
        assert "/dashboard/static/app.js" in page.text
    assert http.head(f"{server.url}/").status_code == 200
    script = http.get(f"{server.url}/dashboard/static/app.js")
    assert script.status_code == 200
    assert "javascript" in script.headers["Content-Type"]
    assert http.get(f"{server.url}/dashboard/static/style.css").status_code == 200
    plain = http.get(f"{server.url}/ws/dashboard")
    assert plain.status_code == 426
    assert "error" in plain.json()


def test_chart_reads_analytics_throughput(server, http):
    push(server, http, {"queue": "t", "payload": 1})
    resp = http.get(f"{server.url}/api/v1/analytics/throughput?queue=t")
    assert resp.status_code == 200
    minutes = resp.json()["throughput"]
    assert len(minutes) == 60
    assert ISO_MS.match(minutes[0]["timestamp"])
    assert minutes[0]["incoming"]["messagesPerMinute"] == 1
    script = http.get(f"{server.url}/dashboard/static/app.js").text
    assert "/api/v1/analytics/throughput" in script
