"""The core lifecycle over HTTP against a real gunicorn."""

from __future__ import annotations


def test_push_pop_ack_round_trip(server, http):
    pushed = http.post(f"{server.url}/api/v1/push", json={"items": [
        {"queue": "emails", "partition": "urgent", "payload": {"to": "a@b.c"}},
    ]})
    assert pushed.status_code == 201
    (item,) = pushed.json()["messages"]
    assert item["status"] == "queued"

    popped = http.get(f"{server.url}/api/v1/pop/queue/emails/partition/urgent")
    assert popped.status_code == 200
    (message,) = popped.json()["messages"]
    assert message["transactionId"] == item["transactionId"]
    assert message["data"] == {"to": "a@b.c"}

    acked = http.post(f"{server.url}/api/v1/ack",
                      json={"transactionId": item["transactionId"], "status": "completed"})
    assert acked.status_code == 200
    assert acked.json()["status"] == "completed"
    assert http.get(f"{server.url}/api/v1/pop/queue/emails").status_code == 204
