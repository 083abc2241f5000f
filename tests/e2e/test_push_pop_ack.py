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


def test_a_made_transaction_id_sent_back_is_a_duplicate_and_a_forged_one_a_400(server, http):
    # A push naming no transactionId gets one made of the message's partition and id
    # (stored nowhere). Sent back as a client's own it is that message's duplicate; one of
    # that form naming no stored message is refused whole, nothing stored.
    url = f"{server.url}/api/v1/push"
    (made,) = http.post(url, json={"items": [{"queue": "made", "payload": 1}]}).json()["messages"]
    again = http.post(url, json={"items": [
        {"queue": "made", "payload": 2, "transactionId": made["transactionId"]}]})
    assert again.status_code == 201
    assert again.json()["messages"] == [
        {"id": made["id"], "transactionId": made["transactionId"], "status": "duplicate"}]
    forged = made["transactionId"][:-12] + "ffffffffffff"
    refused = http.post(url, json={"items": [
        {"queue": "made", "payload": 3}, {"queue": "made", "payload": 4, "transactionId": forged}]})
    assert refused.status_code == 400
    assert "has the form" in refused.json()["error"]
    # Popped and acked by its transactionId alone (no leaseId: found by its partition's
    # and its own id).
    (message,) = http.get(f"{server.url}/api/v1/pop/queue/made?batch=10").json()["messages"]
    assert (message["transactionId"], message["data"]) == (made["transactionId"], 1)
    acked = http.post(f"{server.url}/api/v1/ack",
                      json={"transactionId": made["transactionId"], "status": "completed"})
    assert acked.json()["status"] == "completed"
    assert http.get(f"{server.url}/api/v1/pop/queue/made").status_code == 204
