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
    push(store, {"queue": "held", "partition": "a", "payload": 1},
         {"queue": "held", "partition": "b", "payload": 2})
    store.messages.pop(PopRoute(queue="held", partition="a"), 1, "host-x-1")
    store.messages.pop(PopRoute(queue="held", partition="b", consumer_group="g"), 1, "host-y-2")
    doc = client.simulate_get("/api/v1/leases").json
    got = {(x["partition"], x["consumerGroup"], x["workerId"], x["messages"])
           for x in doc["leases"]}
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
