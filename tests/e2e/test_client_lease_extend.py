"""POST /api/v1/lease/:leaseId/extend against a real gunicorn: renewal keeps messages leased."""

from __future__ import annotations

import time
import uuid

API = "/api/v1"
LEASE_TIME = 2  # seconds: a renewal may come 1.5 s late on a loaded machine and still hold


def _pop_one(server, http, queue: str) -> dict | None:
    resp = http.get(f"{server.url}{API}/pop/queue/{queue}")
    if resp.status_code == 204:
        return None
    assert resp.status_code == 200
    (message,) = resp.json()["messages"]
    return message


def _setup(server, http, queue: str) -> dict:
    http.post(f"{server.url}{API}/configure",
              json={"queue": queue, "options": {"leaseTime": LEASE_TIME}}).raise_for_status()
    http.post(f"{server.url}{API}/push",
              json={"items": [{"queue": queue, "payload": {"n": 1}}]}).raise_for_status()
    message = _pop_one(server, http, queue)
    assert message is not None
    return message


def test_a_renewed_lease_outlives_lease_time_and_its_message_is_not_redelivered(server, http):
    message = _setup(server, http, "renewed")
    lease = message["leaseId"]
    for _ in range(6):  # 6 x 0.5 s: one and a half times the queue's leaseTime
        time.sleep(LEASE_TIME / 4)
        resp = http.post(f"{server.url}{API}/lease/{lease}/extend", json={"seconds": LEASE_TIME})
        assert resp.status_code == 200, resp.text
        assert resp.json()["leaseId"] == lease
        assert resp.json()["leaseExpiresAt"] > message["leaseExpiresAt"]
        assert _pop_one(server, http, "renewed") is None
    acked = http.post(f"{server.url}{API}/ack",
                      json={"transactionId": message["transactionId"], "status": "completed"})
    assert acked.json()["status"] == "completed"
    stored = http.get(f"{server.url}{API}/messages/{message['transactionId']}").json()
    assert stored["retryCount"] == 0


def test_extend_without_seconds_uses_the_queue_lease_time(server, http):
    message = _setup(server, http, "defaulted")
    resp = http.post(f"{server.url}{API}/lease/{message['leaseId']}/extend")
    assert resp.status_code == 200
    assert resp.json()["leaseExpiresAt"] >= message["leaseExpiresAt"]


def test_an_expired_lease_cannot_be_extended(server, http):
    message = _setup(server, http, "expired")
    time.sleep(LEASE_TIME + 0.5)
    resp = http.post(f"{server.url}{API}/lease/{message['leaseId']}/extend", json={"seconds": 30})
    assert resp.status_code == 404
    assert "error" in resp.json()
    again = _pop_one(server, http, "expired")  # redelivered, as without renewal
    assert again is not None and again["transactionId"] == message["transactionId"]


def test_an_ended_or_unknown_lease_is_not_found(server, http):
    message = _setup(server, http, "ended")
    http.post(f"{server.url}{API}/ack",
              json={"transactionId": message["transactionId"], "status": "completed"})
    ended = http.post(f"{server.url}{API}/lease/{message['leaseId']}/extend")
    assert ended.status_code == 404
    unknown = http.post(f"{server.url}{API}/lease/{uuid.uuid4()}/extend", json={"seconds": 5})
    assert unknown.status_code == 404


def test_bad_input_is_400(server, http):
    message = _setup(server, http, "bad")
    url = f"{server.url}{API}/lease/{message['leaseId']}/extend"
    assert http.post(f"{server.url}{API}/lease/not-a-uuid/extend").status_code == 400
    for body in ({"seconds": 0}, {"seconds": "5"}, {"seconds": True}, {"seconds": 1.5}, [1]):
        resp = http.post(url, json=body)
        assert resp.status_code == 400, body
        assert "error" in resp.json()
    json_type = {"Content-Type": "application/json"}
    assert http.post(url, data=b"{not json", headers=json_type).status_code == 400
