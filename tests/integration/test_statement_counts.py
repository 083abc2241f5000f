"""The workers' own count of the statements and commits they send PostgreSQL (the
/metrics figures that show fusion sharing them), on a real PostgreSQL."""

from __future__ import annotations

from typing import Any

import pytest

from queen.models import PopRoute
from queen.store import Store
from tests.integration.helpers import push
from tests.integration.test_fusion import fstore, fused, pusher  # noqa: F401 - fixture

Seen = list[tuple[str, bool, bool]]


def counting(store: Store) -> Seen:
    seen: Seen = []
    store.db.observe = lambda query, ran, committed: seen.append((query, ran, committed))
    return seen


def test_a_named_call_is_one_statement_and_its_commit(store: Any) -> None:
    seen = counting(store)
    store.db.fetch("ping")
    assert seen == [("ping", True, True)]


def test_a_transaction_block_commits_once_at_its_end(store: Any) -> None:
    seen = counting(store)
    with store.db.connection() as conn, conn.transaction():
        conn.execute("SELECT 1")
        with conn.transaction():  # a savepoint: no commit of its own
            conn.execute("SELECT 2")
        assert seen == [("other", True, False), ("other", True, False)]
    assert seen[-1] == ("transaction", False, True)


def test_failed_and_rolled_back_work_commits_nothing(store: Any) -> None:
    seen = counting(store)
    with pytest.raises(Exception), store.db.connection() as conn:  # noqa: B017, PT011
        conn.execute("SELECT 1 / 0")
    with pytest.raises(RuntimeError), store.db.connection() as conn, conn.transaction():
        conn.execute("SELECT 1")
        raise RuntimeError("rolled back")
    assert seen == [("other", True, False), ("other", True, False)]


def test_fused_pushes_share_one_statement_and_commit(fstore: Store) -> None:  # noqa: F811
    push(fstore, [{"queue": "s", "payload": "first"}])
    seen = counting(fstore)
    requests = [[{"queue": "s", "payload": n}] for n in range(5)]
    first, *rest = (pusher(fstore, items) for items in requests)
    fused(fstore.messages._push_fusers[None], first, rest)
    pushes = [s for s in seen if s[0].startswith("push")]
    # the held first request alone, then the four that queued behind it together
    assert pushes == [("push_new", True, True)] * 2


def acks(popped: list[Any], status: str = "completed") -> list[dict[str, Any]]:
    return [{"transactionId": m.transaction_id, "status": status, "error": None,
             "leaseId": str(m.lease_id)} for m in popped]


def test_an_ack_of_a_whole_lease_is_one_statement_and_any_other_goes_item_by_item(
    store: Any,
) -> None:
    push(store, [{"queue": "w", "partition": p, "payload": n} for p in "abc" for n in range(2)])
    a, b, c = (store.messages.pop(PopRoute(queue="w", partition=p), 2, "w") for p in "abc")
    seen = counting(store)
    assert [r.status for r in store.messages.ack(acks(a))] == ["completed"] * 2
    assert [s[0] for s in seen] == ["ack_lease"]  # one request naming its lease
    del seen[:]
    unnamed = [{**ack, "leaseId": None} for ack in acks(c)]
    assert [r.status for r in store.messages.ack(unnamed)] == ["completed"] * 2
    assert [s[0] for s in seen] == ["ack"]  # no leaseId: found by its messages
    del seen[:]
    assert [r.status for r in store.messages.ack(acks(b[:1]))] == ["completed"]  # half of it
    assert [s[0] for s in seen] == ["ack_lease", "ack"]
    del seen[:]
    assert [r.status for r in store.messages.ack(acks(b[1:], "failed"))] == ["retry_scheduled"]
    assert [s[0] for s in seen] == ["ack"]


def test_fused_acks_end_the_whole_leases_at_once_and_decide_the_rest_item_by_item(
    fstore: Store,  # noqa: F811
) -> None:
    push(fstore, [{"queue": "m", "partition": f"p{n % 3}", "payload": n} for n in range(6)])
    a, b, c = (fstore.messages.pop(PopRoute(queue="m", partition=f"p{n}"), 2, "w")
               for n in range(3))
    requests = [
        acks(a),  # a whole lease
        acks(b[:1]),  # half of one
        [*acks(c[:1], "failed"), *acks(c[1:])],  # a failure among them
        acks(b[1:]) + [{"transactionId": "nope", "status": "completed", "error": None}],
    ]
    seen = counting(fstore)
    first, *rest = (lambda r=r: fstore.messages.ack(r) for r in requests)
    outcomes = fused(fstore.messages._acks, first, rest)
    assert [[(r.position, r.transaction_id, r.status, r.reason) for r in results]
            for results in outcomes] == [
        [(1, a[0].transaction_id, "completed", None), (2, a[1].transaction_id, "completed", None)],
        [(1, b[0].transaction_id, "completed", None)],
        [(1, c[0].transaction_id, "retry_scheduled", None),
         (2, c[1].transaction_id, "completed", None)],
        [(1, b[1].transaction_id, "completed", None), (2, "nope", "not_found", "not_found")],
    ]
    assert all(r.acknowledged_at is not None for r in outcomes[0])
    # The first call held alone, then the three behind it: whole leases first, then the rest.
    assert [s[0] for s in seen if s[0].startswith("ack")] == ["ack_lease", "ack_whole", "ack"]
    # a's lease ended with its cursor past it, c's first message is back for a retry.
    assert fstore.messages.pop(PopRoute(queue="m", partition="p0"), 2, "w") == []
    (retried,) = fstore.messages.pop(PopRoute(queue="m", partition="p2"), 2, "w")
    assert retried.transaction_id == c[0].transaction_id and retried.retry_count == 1


def test_a_push_is_one_statement_unless_it_names_transaction_ids_or_a_new_partition(
    store: Any,
) -> None:
    seen = counting(store)
    push(store, [{"queue": "n", "partition": "a", "payload": 1}])  # the queue made
    push(store, [{"queue": "n", "partition": "a", "payload": 2}])
    push(store, [{"queue": "n", "partition": "b", "payload": 3}])  # a partition made
    push(store, [{"queue": "n", "partition": "b", "payload": 4, "transactionId": "t4"}])
    push(store, [{"queue": "n", "partition": p, "payload": 5} for p in "ab"])  # two of them
    assert [s[0] for s in seen if s[0].startswith("push")] == [
        "push_new", "push", "push_new", "push_new", "push", "push", "push_new"]
