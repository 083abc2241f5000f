"""Failed acks and expired leases: retries, then dead letter or failed, in partition order."""

from __future__ import annotations

import time
from typing import Any

import pytest

from queen.store import Store
from tests import storage
from tests.integration.helpers import ack, data, pop, push, rows, scalar


def _status(store: Store, txid: str) -> tuple[str, int, str | None]:
    (row,) = rows(
        store.db.dsn,
        f"SELECT status, retry_count, error FROM ({storage.MESSAGE_VIEW}) v"
        " WHERE transaction_id = %s",
        (txid,),
    )
    return row  # type: ignore[return-value]


@pytest.mark.parametrize("retry_limit", [0, 1, 3])
def test_failed_acks_retry_then_dead_letter(store: Store, retry_limit: int) -> None:
    store.queues.configure("r", None, None, {"retry_limit": retry_limit})
    push(store, [{"queue": "r", "payload": "x", "transactionId": "m1"}])
    delivered = []
    for attempt in range(retry_limit + 1):
        (m,) = pop(store, "r", "Default")
        delivered.append(m.retry_count)
        assert (m.retry_limit, m.transaction_id) == (retry_limit, "m1")
        result = ack(store, "m1", "failed", f"boom {attempt}")
        if attempt < retry_limit:
            assert (result.status, result.retry_count) == ("retry_scheduled", attempt + 1)
        else:
            assert result.status == "dead_letter"
    assert delivered == list(range(retry_limit + 1))
    assert _status(store, "m1") == ("dead_letter", retry_limit, f"boom {retry_limit}")
    assert pop(store, "r", "Default") == []
    assert pop(store, "r") == []
    # Acking a dead letter again changes nothing.
    assert ack(store, "m1", "failed").status == "dead_letter"
    assert ack(store, "m1", "completed").status == "dead_letter"
    assert _status(store, "m1")[0] == "dead_letter"


def test_past_the_limit_without_dlq_the_message_fails(store: Store) -> None:
    store.queues.configure("r", None, None, {"retry_limit": 1, "dlq_after_max_retries": False})
    push(store, [{"queue": "r", "payload": "x", "transactionId": "m1"}])
    (m,) = pop(store, "r")
    assert ack(store, "m1", "failed", "one").status == "retry_scheduled"
    (m,) = pop(store, "r")
    assert m.retry_count == 1
    assert ack(store, "m1", "failed", "two").status == "failed"
    assert _status(store, "m1") == ("failed", 1, "two")
    assert pop(store, "r") == []


def test_a_retried_message_keeps_its_place_at_the_head(store: Store) -> None:
    push(store, [{"queue": "r", "payload": n, "transactionId": f"m{n}"} for n in range(3)])
    (first,) = pop(store, "r")
    assert data(first) == 0
    assert ack(store, "m0", "failed").status == "retry_scheduled"
    batch = pop(store, "r", batch=3)
    assert [data(m) for m in batch] == [0, 1, 2]
    assert [m.retry_count for m in batch] == [1, 0, 0]


def test_partial_failure_in_a_batch_frees_the_partition_when_all_are_acked(store: Store) -> None:
    push(store, [{"queue": "r", "payload": n, "transactionId": f"m{n}"} for n in range(3)])
    batch = pop(store, "r", batch=3)
    assert len(batch) == 3
    assert ack(store, "m0", "completed").status == "completed"
    assert pop(store, "r") == []  # still leased: m1 and m2 are in flight
    assert ack(store, "m1", "failed").status == "retry_scheduled"
    assert pop(store, "r") == []
    assert ack(store, "m2", "completed").status == "completed"
    (again,) = pop(store, "r")
    assert (data(again), again.retry_count) == (1, 1)


def _lease(store: Store) -> tuple[Any, ...]:
    (row,) = rows(store.db.dsn, storage.PARTITION_LEASES, ("r",))
    return row


def _ack_all(store: Store, txids: list[str]) -> list[str]:
    acks = [{"transactionId": t, "status": "completed", "error": None} for t in txids]
    return [r.status for r in store.messages.ack(acks)]


def test_a_lease_ends_when_one_ack_takes_all_of_it_or_the_last_of_it(store: Store) -> None:
    """The ack ends a lease without walking it when it took every message the claim
    leased; otherwise the walk decides (earlier acks, repeats, messages of another lease)."""
    push(store, [{"queue": "r", "payload": n, "transactionId": f"m{n}"} for n in range(6)])
    pop(store, "r", batch=3)
    assert _lease(store) == (True, 3)
    assert _ack_all(store, ["m2", "m0", "m1"]) == ["completed"] * 3  # all of it at once
    assert _lease(store) == (False, None)

    pop(store, "r", batch=3)  # m3, m4, m5
    assert _ack_all(store, ["m3"]) == ["completed"]
    assert _lease(store) == (True, 3)
    # m3 again and m0 (done, of an ended lease) do not count: this ack took one of three
    assert _ack_all(store, ["m3", "m4", "m0"]) == ["completed"] * 3
    assert _lease(store) == (True, 3)  # m5 is still in flight
    assert _ack_all(store, ["m5", "m4"]) == ["completed"] * 2  # the walk finds none left
    assert _lease(store) == (False, None)


def test_ack_of_unknown_and_mixed_batches(store: Store) -> None:
    push(store, [{"queue": "r", "payload": 1, "transactionId": "known"}])
    pop(store, "r")
    results = store.messages.ack(
        [
            {"transactionId": "nope", "status": "completed", "error": None},
            {"transactionId": "known", "status": "completed", "error": None},
        ]
    )
    assert [(r.transaction_id, r.status) for r in results] == [
        ("nope", "not_found"),
        ("known", "completed"),
    ]


# -- lease expiry -----------------------------------------------------------------


def test_expired_lease_is_taken_over_with_retry_count_plus_one(store: Store) -> None:
    store.queues.configure("lease", None, None, {"lease_time": 1, "retry_limit": 1})
    push(
        store,
        [
            {"queue": "lease", "partition": "p", "payload": n, "transactionId": f"m{n}"}
            for n in range(2)
        ],
    )

    first = pop(store, "lease", "p", batch=2, worker="a")
    assert [(data(m), m.retry_count) for m in first] == [(0, 0), (1, 0)]
    assert pop(store, "lease", "p", worker="b") == []  # leased
    assert pop(store, "lease", worker="b") == []
    time.sleep(1.1)

    second = pop(store, "lease", "p", batch=2, worker="b")
    assert [(data(m), m.retry_count) for m in second] == [(0, 1), (1, 1)]
    assert second[0].lease_id != first[0].lease_id
    assert scalar(store.db.dsn, storage.PARTITION_LEASED_BY, ("p",)) == "b"
    time.sleep(1.1)

    # Past the retry limit (1): the next pop finds the lease expired again and
    # dead-letters both instead of delivering them a third time.
    assert pop(store, "lease", batch=2, worker="c") == []
    assert _status(store, "m0") == ("dead_letter", 1, "lease expired")
    assert _status(store, "m1") == ("dead_letter", 1, "lease expired")
    assert scalar(store.db.dsn, storage.LEASED_PARTITIONS) == 0


def test_expired_lease_is_taken_over_by_pop_queue(store: Store) -> None:
    store.queues.configure("lease", None, None, {"lease_time": 1})
    push(store, [{"queue": "lease", "partition": "p", "payload": "x", "transactionId": "m"}])
    (m,) = pop(store, "lease", worker="a")
    assert pop(store, "lease", worker="b") == []
    time.sleep(1.1)
    (again,) = pop(store, "lease", worker="b")
    assert (again.transaction_id, again.retry_count) == ("m", 1)
    # The first consumer's late ack still completes the message (at-least-once).
    assert ack(store, "m", "completed").status == "completed"
    assert pop(store, "lease") == []


def test_acked_messages_are_not_redelivered_after_expiry(store: Store) -> None:
    store.queues.configure("lease", None, None, {"lease_time": 1})
    push(store, [{"queue": "lease", "payload": n, "transactionId": f"m{n}"} for n in range(3)])
    batch = pop(store, "lease", batch=3)
    assert len(batch) == 3
    ack(store, "m0", "completed")
    time.sleep(1.1)
    again = pop(store, "lease", batch=3)
    assert [(data(m), m.retry_count) for m in again] == [(1, 1), (2, 1)]
