"""The console's routes (rates, leases, nodes) on the real app and a real database."""

from __future__ import annotations

import orjson
import pytest
from falcon import testing

from queen.app import create_app
from queen.config import Settings
from queen.models import PopRoute


@pytest.fixture
def client(store) -> testing.TestClient:
    settings = Settings.from_env({}, database_url=store.db.dsn)
    return testing.TestClient(create_app(settings, store=store))


def push(store, *items):
    return store.messages.push(orjson.dumps({"items": list(items)}), list(items))


def test_rates_count_what_came_in_and_went_out_per_queue(client, store):
    push(store, *({"queue": "busy", "payload": i} for i in range(6)))
    store.queues.configure("idle", None, None, {})
    popped = store.messages.pop(PopRoute(queue="busy", partition="Default"), 2, "w")
    for m in popped:
        resp = client.simulate_post(
            "/api/v1/ack", json={"transactionId": m.transaction_id, "status": "completed"}
        )
        assert resp.status_code == 200, resp.text
    queues = {q["queue"]: q for q in client.simulate_get("/api/v1/analytics/rates").json["queues"]}
    assert set(queues) == {"busy", "idle"}
    busy, idle = queues["busy"], queues["idle"]
    assert len(busy["minutes"]) == 60
    assert sum(m["incoming"] for m in busy["minutes"]) == 6
    assert sum(m["outgoing"] for m in busy["minutes"]) == 2
    assert busy["now"]["incomingPerSecond"] > busy["now"]["outgoingPerSecond"] > 0
    assert idle["now"]["incomingPerSecond"] == 0 and len(idle["minutes"]) == 60
    only = client.simulate_get("/api/v1/analytics/rates", params={"queue": "idle"}).json
    assert [q["queue"] for q in only["queues"]] == ["idle"]
    none = client.simulate_get("/api/v1/analytics/rates", params={"queue": "absent"}).json
    assert none == {"at": None, "queues": []}


def test_leases_list_who_holds_each_partition(client, store):
    push(
        store,
        {"queue": "held", "partition": "a", "payload": 1},
        {"queue": "held", "partition": "b", "payload": 2},
    )
    store.messages.pop(PopRoute(queue="held", partition="a"), 1, "host-x-1")
    store.messages.pop(PopRoute(queue="held", partition="b", consumer_group="g"), 1, "host-y-2")
    doc = client.simulate_get("/api/v1/leases").json
    got = {
        (x["partition"], x["consumerGroup"], x["workerId"], x["messages"]) for x in doc["leases"]
    }
    assert got == {("a", None, "host-x-1", 1), ("b", "g", "host-y-2", 1)}
    assert doc["truncated"] is False
    assert all(x["leasedAt"] < x["expiresAt"] for x in doc["leases"])
    one = client.simulate_get("/api/v1/leases", params={"limit": "1"}).json
    assert len(one["leases"]) == 1 and one["truncated"] is True


def test_nodes_name_this_worker_and_the_database_sessions(client):
    doc = client.simulate_get("/api/v1/system/nodes").json
    (host,) = doc["hosts"]
    (worker,) = host["workers"]
    assert worker["pid"] > 0 and worker["rssBytes"] > 0 and worker["pool"]["max"] >= 1
    assert doc["maintenanceLeader"] is None  # no maintenance process here
    assert doc["database"]["maxConnections"] > 0
    assert sum(s["connections"] for s in doc["database"]["sessions"]) >= 1


@pytest.mark.parametrize(
    ("path", "params"),
    [
        ("/api/v1/analytics/rates", {"queue": "x" * 300}),
        ("/api/v1/leases", {"limit": "0"}),
        ("/api/v1/leases", {"limit": "1001"}),
        ("/api/v1/leases", {"limit": "many"}),
        ("/api/v1/leases", {"queue": "\u0000"}),
    ],
)
def test_bad_input_is_a_json_400(client, path, params):
    resp = client.simulate_get(path, params=params)
    assert resp.status_code == 400, resp.text
    assert set(resp.json) == {"error"}


def test_the_page_starts_loading_not_empty(client):
    page = client.simulate_get("/dashboard").text
    assert 'data-session="checking"' in page  # nothing but "Loading…" until the token is taken
    assert "Loading queues…" in page and 'class="value loading"' in page
    assert "No queues yet" not in page and ">–<" not in page


def put_alert(client, name, **body):
    return client.simulate_put(f"/api/v1/alerts/{name}", json=body)


def test_alerts_fire_on_depth_lag_and_dead_letters_and_reach_prometheus(client, store):
    push(store, *({"queue": "watched", "payload": i} for i in range(3)))
    assert put_alert(client, "deep", queue="watched", kind="depth", threshold=2).status_code == 200
    assert (
        put_alert(client, "calm", queue="watched", kind="depth", threshold=3).json["firing"]
        is False
    )
    assert put_alert(client, "old", queue="watched", kind="lag", threshold=0).status_code == 200
    assert (
        put_alert(
            client, "dead", queue="watched", kind="dead_letters", threshold=0, windowMinutes=10
        ).status_code
        == 200
    )
    assert put_alert(client, "gone", queue="nowhere", kind="depth", threshold=0).status_code == 200
    alerts = {a["name"]: a for a in client.simulate_get("/api/v1/alerts").json["alerts"]}
    assert (alerts["deep"]["value"], alerts["deep"]["firing"]) == (3, True)
    assert alerts["calm"]["firing"] is False
    assert alerts["old"]["value"] > 0 and alerts["old"]["firing"] is True
    assert (alerts["dead"]["value"], alerts["dead"]["firing"]) == (0, False)
    assert (alerts["gone"]["value"], alerts["gone"]["firing"]) == (None, False)

    configured = {"queue": "watched", "options": {"retryLimit": 0}}
    assert client.simulate_post("/api/v1/configure", json=configured).status_code == 200
    (m,) = store.messages.pop(PopRoute(queue="watched", partition="Default"), 1, "w")
    resp = client.simulate_post(
        "/api/v1/ack", json={"transactionId": m.transaction_id, "status": "failed", "error": "x"}
    )
    assert resp.status_code == 200, resp.text
    dead = {a["name"]: a for a in client.simulate_get("/api/v1/alerts").json["alerts"]}["dead"]
    assert (dead["value"], dead["firing"]) == (1, True)

    text = client.simulate_get("/metrics/prometheus").text
    assert 'queen_alert_firing{alert="dead",kind="dead_letters",queue="watched"} 1.0' in text
    assert 'queen_alert_value{alert="deep",kind="depth",queue="watched"} 2.0' in text  # one left
    assert 'queen_alert_firing{alert="deep",kind="depth",queue="watched"} 0.0' in text
    assert 'queen_alert_threshold{alert="old",kind="lag",queue="watched"} 0.0' in text

    assert client.simulate_delete("/api/v1/alerts/deep").json == {"name": "deep", "deleted": True}
    assert client.simulate_delete("/api/v1/alerts/deep").status_code == 404
    assert "deep" not in {a["name"] for a in client.simulate_get("/api/v1/alerts").json["alerts"]}


@pytest.mark.parametrize(
    "body",
    [
        {"kind": "depth", "threshold": 1},
        {"queue": "q", "kind": "size", "threshold": 1},
        {"queue": "q", "kind": "depth"},
        {"queue": "q", "kind": "depth", "threshold": -1},
        {"queue": "q", "kind": "depth", "threshold": True},
        {"queue": "q", "kind": "depth", "threshold": "5"},
        {"queue": "q", "kind": "dead_letters", "threshold": 1, "windowMinutes": 0},
        {"queue": "q", "kind": "dead_letters", "threshold": 1, "windowMinutes": 1.5},
    ],
)
def test_a_bad_alert_is_a_json_400(client, body):
    resp = put_alert(client, "a", **body)
    assert resp.status_code == 400, resp.text
    assert set(resp.json) == {"error"}
