"""The fault suite's checker sorts ids correctly (tests/faults/checker.py)."""

from __future__ import annotations

from tests.faults.checker import Acked, Delivery, Pushed, check


def _pushed(partition: str, n: int) -> list[Pushed]:
    return [Pushed(f"{partition}.{i}", partition, i) for i in range(n)]


def _delivered(mid: str, at: float, retry: int = 0) -> Delivery:
    return Delivery(mid, mid.split(".")[0], at, retry)


def test_a_clean_run_has_nothing_to_report() -> None:
    pushed = _pushed("a", 3)
    deliveries = [_delivered(p.id, i) for i, p in enumerate(pushed)]
    acks = [Acked(p.id, i + 0.5) for i, p in enumerate(pushed)]
    verdict = check([p.id for p in pushed], pushed, deliveries, acks)
    assert verdict.ok
    assert verdict.summary() == {
        "acknowledged": 3, "delivered": 3, "lost": 0, "duplicated": 0, "unexpected": 0,
        "order_violations": 0, "unfinished": 0, "redelivered": 0, "first_seen_retried": 0,
        "stale": 0,
    }


def test_an_acknowledged_push_never_delivered_is_lost() -> None:
    pushed = _pushed("a", 2)
    verdict = check([], pushed, [_delivered("a.0", 1)], [Acked("a.0", 2)])
    assert verdict.lost == ["a.1"] and not verdict.ok


def test_an_unacknowledged_push_never_delivered_is_not_lost() -> None:
    verdict = check(["a.0"], [], [], [])
    assert verdict.ok and verdict.lost == []


def test_a_redelivery_after_a_confirmed_ack_is_a_duplicate() -> None:
    pushed = _pushed("a", 1)
    deliveries = [_delivered("a.0", 1), _delivered("a.0", 3, retry=1)]
    verdict = check([], pushed, deliveries, [Acked("a.0", 2)])
    assert verdict.duplicated == ["a.0"] and not verdict.ok
    assert verdict.duplicated_acked_before(2.5) == ["a.0"]
    assert verdict.duplicated_acked_before(1.5) == []  # acked after: may be forgotten


def test_a_redelivery_of_what_was_never_acked_is_allowed_and_counted() -> None:
    pushed = _pushed("a", 1)
    deliveries = [_delivered("a.0", 1), _delivered("a.0", 5, retry=1)]  # lease expired
    verdict = check([], pushed, deliveries, [Acked("a.0", 6)])
    assert verdict.ok and verdict.redelivered == 1 and verdict.duplicated == []


def test_a_delivery_of_something_never_pushed_is_unexpected() -> None:
    verdict = check(["a.0"], [], [_delivered("a.0", 1), _delivered("zz.9", 2)], [])
    assert verdict.unexpected == ["zz.9"] and not verdict.ok


def test_a_push_whose_answer_was_lost_may_be_delivered() -> None:
    verdict = check(["a.0"], [], [_delivered("a.0", 1)], [Acked("a.0", 2)])
    assert verdict.ok and verdict.unexpected == []


def test_first_deliveries_out_of_push_order_within_a_partition_are_violations() -> None:
    pushed = _pushed("a", 3) + _pushed("b", 2)
    deliveries = [
        _delivered("a.0", 1), _delivered("a.2", 2), _delivered("a.1", 3),  # a.1 after a.2
        _delivered("b.1", 1.5), _delivered("b.0", 0.5),  # other partitions interleave freely
    ]
    acks = [Acked(d.id, 10) for d in deliveries]
    verdict = check([], pushed, deliveries, acks)
    assert verdict.order_violations == [("a", "a.2", "a.1")]


def test_redelivery_at_the_head_is_not_an_order_violation() -> None:
    pushed = _pushed("a", 3)
    deliveries = [
        _delivered("a.0", 1), _delivered("a.1", 1.1), _delivered("a.2", 1.2),  # one batch
        _delivered("a.1", 5, retry=1), _delivered("a.2", 5.1, retry=1),  # lease expired
    ]
    acks = [Acked("a.0", 2), Acked("a.1", 6), Acked("a.2", 6)]
    verdict = check([], pushed, deliveries, acks)
    assert verdict.ok and verdict.redelivered == 2


def test_unfinished_and_first_seen_retried_are_reported() -> None:
    pushed = _pushed("a", 2)
    deliveries = [_delivered("a.0", 1, retry=1), _delivered("a.1", 2)]
    verdict = check([], pushed, deliveries, [Acked("a.0", 3)])
    assert verdict.unfinished == ["a.1"] and verdict.first_seen_retried == 1


def test_a_delivery_received_after_its_lease_expired_is_stale_not_a_duplicate() -> None:
    pushed = _pushed("a", 2)
    deliveries = [
        Delivery("a.0", "a", 4.0, 1),  # the redelivery, acked at 4.5
        Delivery("a.0", "a", 5.0, 0, lease_expires=3.0),  # the first claim's late answer
        Delivery("a.1", "a", 4.2, 0),
    ]
    verdict = check([], pushed, deliveries, [Acked("a.0", 4.5), Acked("a.1", 4.6)])
    assert verdict.ok and verdict.stale == 1 and verdict.duplicated == []
