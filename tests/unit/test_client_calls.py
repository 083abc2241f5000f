"""The client's requests, error mapping and retry timing, without a server."""

from __future__ import annotations

import time
import uuid

import httpx
import pytest

from queen.client import calls, errors
from queen.client.models import AckResult, Message, uuid7
from queen.client.transport import RetryPolicy, Transport, base_urls, headers

MESSAGE = Message.from_json({
    "id": "m1", "transactionId": "t1", "queue": "q", "partition": "Default", "data": {"a": 1},
    "retryCount": 2, "leaseId": "l1", "consumerGroup": "g", "createdAt": "2026-01-01T00:00:00Z",
    "options": {"leaseTime": 7, "retryLimit": 3},
})


def test_uuid7_is_version_7_and_sorts_by_creation():
    ids = [uuid7() for _ in range(1000)]
    assert all(uuid.UUID(i).version == 7 for i in ids)
    assert len(set(ids)) == len(ids)
    assert [i[:13] for i in ids] == sorted(i[:13] for i in ids)  # the millisecond part


def test_push_items_get_transaction_ids_unless_given():
    items = calls.push_items("q", [{"a": 1}, {"b": 2}], partition="p")
    assert [i["queue"] for i in items] == ["q", "q"]
    assert all(i["partition"] == "p" and uuid.UUID(i["transactionId"]) for i in items)
    one = calls.push_items("q", {"single": True}, transaction_ids=["mine"])
    assert one == [{"queue": "q", "payload": {"single": True}, "transactionId": "mine"}]
    with pytest.raises(ValueError):
        calls.push_items("q", [1, 2], transaction_ids=["only-one"])


def test_pop_is_never_resent_and_waits_longer_than_its_timeout():
    call = calls.pop("orders", "eu", batch=5, wait=True, timeout=30, group="g",
                     subscription="new")
    assert call.path == "/api/v1/pop/queue/orders/partition/eu"
    assert call.params == {"batch": 5, "wait": "true", "timeout": 30000,
                           "consumerGroup": "g", "subscriptionMode": "new"}
    assert call.resend is False
    assert call.timeout > 30
    assert calls.pop("q", subscription="2026-01-01T00:00:00Z").params == {
        "batch": 1, "subscriptionFrom": "2026-01-01T00:00:00Z"}


def test_acks_carry_lease_group_and_error():
    assert calls.ack_item(MESSAGE) == {"status": "completed", "transactionId": "t1",
                                       "leaseId": "l1", "consumerGroup": "g"}
    assert calls.ack_item("t2", "boom") == {"status": "failed", "transactionId": "t2",
                                            "error": "boom"}
    items = calls.ack_items([MESSAGE, ("t3", "bad"), ("t4", None)])
    assert [i["status"] for i in items] == ["completed", "failed", "completed"]


def test_extend_rounds_seconds_up_and_needs_a_lease():
    call = calls.extend(MESSAGE, 0.2)
    assert call.path == "/api/v1/lease/l1/extend" and call.json == {"seconds": 1}
    assert calls.extend("l2").json is None
    with pytest.raises(ValueError):
        calls.extend(Message.from_json({"id": "x", "transactionId": "y", "queue": "q",
                                        "partition": "p"}))


def test_configure_maps_snake_case_options():
    call = calls.configure("q", lease_time=60, dlq_after_max_retries=False, ttl=5)
    assert call.json == {"queue": "q", "options": {"leaseTime": 60, "dlqAfterMaxRetries": False,
                                                   "ttl": 5}}


def test_error_statuses_map_to_the_tree():
    assert isinstance(errors.error_for(404, {"error": "gone"}), errors.NotFound)
    assert errors.error_for(404, {"error": "gone"}).message == "gone"
    assert isinstance(errors.error_for(503, None), errors.Unavailable)
    assert isinstance(errors.error_for(503, None), errors.ServerError)
    assert isinstance(errors.error_for(500, "x"), errors.ServerError)
    assert type(errors.error_for(418, None)) is errors.APIError
    limited = errors.error_for(429, {}, retry_after=2.0)
    assert isinstance(limited, errors.RateLimited) and limited.retry_after == 2.0
    for status, cls in [(400, errors.BadRequest), (401, errors.Unauthorized),
                        (403, errors.Forbidden), (409, errors.Conflict)]:
        assert isinstance(errors.error_for(status, {}), cls)
        assert isinstance(errors.error_for(status, {}), errors.QueenError)


def test_backoff_grows_to_its_cap_with_jitter():
    policy = RetryPolicy(base_delay=0.1, max_delay=1.0)
    for round_no, cap in [(0, 0.1), (1, 0.2), (3, 0.8), (10, 1.0)]:
        pauses = [policy.pause(round_no) for _ in range(200)]
        assert all(cap / 2 <= p <= cap for p in pauses)
        assert len(set(pauses)) > 1


def test_urls_and_token_come_from_arguments_or_the_environment(monkeypatch):
    monkeypatch.setenv("QUEEN_URL", "http://a:1/, http://b:2")
    monkeypatch.setenv("QUEEN_TOKEN", "secret")
    assert base_urls(None) == ["http://a:1", "http://b:2"]
    assert base_urls(["http://c:3/"]) == ["http://c:3"]
    assert headers(None)["Authorization"] == "Bearer secret"
    assert headers("other")["Authorization"] == "Bearer other"
    monkeypatch.delenv("QUEEN_TOKEN")
    assert "Authorization" not in headers(None)


def test_a_409_is_typed_by_its_reason():
    for reason, cls in [("not_leased", errors.NotLeased), ("lease_expired", errors.LeaseExpired),
                        ("leased_by_other", errors.LeasedByOther),
                        ("already_completed", errors.AlreadyAcknowledged),
                        ("already_failed", errors.AlreadyAcknowledged)]:
        error = errors.error_for(409, {"error": "no", "reason": reason})
        assert type(error) is cls and isinstance(error, errors.Conflict)
        assert error.reason == reason
    assert type(errors.error_for(409, {"error": "no"})) is errors.Conflict
    assert errors.error_for(409, {"error": "no"}).reason is None
    assert type(errors.error_for(409, {"reason": "unheard_of"})) is errors.Conflict


def test_an_ack_result_says_whether_it_applied():
    done = AckResult.from_json({"transactionId": "t", "status": "completed"})
    again = AckResult.from_json(
        {"transactionId": "t", "status": "completed", "reason": "already_completed"})
    assert (done.applied, done.reason) == (True, None)
    assert (again.applied, again.reason) == (False, "already_completed")


def test_a_transaction_is_sent_again_after_a_lost_answer():
    assert calls.transaction([{"type": "ack", "transactionId": "t"}]).resend is True


def _flaky_server(unavailable_for_s: float) -> tuple[httpx.Client, list[float]]:
    """An HTTP client whose server answers 503 (Retry-After 0.2) for a while, then 201."""
    started = time.monotonic()
    seen: list[float] = []

    def handle(request: httpx.Request) -> httpx.Response:
        seen.append(time.monotonic() - started)
        if seen[-1] < unavailable_for_s:
            return httpx.Response(503, headers={"Retry-After": "0.2"},
                                  json={"error": "database unavailable"})
        return httpx.Response(201, json={"messages": [
            {"transactionId": "t", "status": "queued", "id": "i"}]})

    return httpx.Client(transport=httpx.MockTransport(handle)), seen


def test_a_503_is_retried_for_the_policy_s_patience_at_the_server_s_pace():
    client, seen = _flaky_server(1.0)
    quick = RetryPolicy(rounds=2, base_delay=0.01, max_delay=0.02, patience=10)
    transport = Transport("http://queen", policy=quick, client=client)
    (result,) = transport.send(calls.push([{"queue": "q", "payload": 1}]))
    assert result.status == "queued" and seen[-1] >= 1.0
    past_rounds = [b - a for a, b in zip(seen[1:], seen[2:], strict=False)]
    assert past_rounds and min(past_rounds) >= 0.2  # Retry-After, once the rounds are spent


def test_without_patience_a_503_gives_up_after_the_rounds():
    client, seen = _flaky_server(60.0)
    transport = Transport("http://queen", client=client,
                          policy=RetryPolicy(rounds=2, base_delay=0.01, patience=0))
    with pytest.raises(errors.Unavailable) as raised:
        transport.send(calls.push([{"queue": "q", "payload": 1}]))
    assert len(seen) == 2 and raised.value.retry_after == 0.2
