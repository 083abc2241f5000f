"""Sort every message id of a fault run into lost, duplicated, unexpected and out of order.

Like the checker of Jepsen's RabbitMQ test, it reads what the clients saw, never the
database: a producer records each id it tried to push (`attempted`) and each id a push
answer acknowledged (`acknowledged`, with its partition and its place in the partition);
consumers record each delivery and each ack the server confirmed. After a full drain:

- lost: acknowledged, never delivered;
- duplicated: delivered again after an ack of it was confirmed (at-least-once allows a
  redelivery only of what was not acked: an expired lease, a give-back);
- unexpected: delivered, never attempted;
- order violations: within a partition the first deliveries must follow push order;
- unfinished: delivered, never acked by the end of the drain.
Redeliveries before any confirmed ack are counted, not faulted, and so are first
deliveries already carrying a retry (a claim that counted an attempt nobody saw). A
delivery received after its lease expired (stale) is counted and left out of the
duplicate and order checks: the partition may have moved on while it was in transit.
"""

from __future__ import annotations

import dataclasses
from collections import defaultdict
from collections.abc import Iterable


@dataclasses.dataclass(frozen=True)
class Pushed:
    id: str
    partition: str
    seq: int  # its place among the pushes of its partition (one producer per partition)


@dataclasses.dataclass(frozen=True)
class Delivery:
    id: str
    partition: str
    at: float  # when the consumer received it, wall-clock seconds
    retry_count: int
    lease_expires: float = float("inf")  # leaseExpiresAt, same clock

    @property
    def stale(self) -> bool:
        """Received after its lease expired: the message may be someone else's by then."""
        return self.at > self.lease_expires


@dataclasses.dataclass(frozen=True)
class Acked:
    id: str
    at: float


@dataclasses.dataclass
class Verdict:
    acknowledged: int = 0
    delivered: int = 0
    lost: list[str] = dataclasses.field(default_factory=list)
    duplicated: list[str] = dataclasses.field(default_factory=list)
    unexpected: list[str] = dataclasses.field(default_factory=list)
    order_violations: list[tuple[str, str, str]] = dataclasses.field(default_factory=list)
    unfinished: list[str] = dataclasses.field(default_factory=list)
    redelivered: int = 0
    first_seen_retried: int = 0
    stale: int = 0
    acked_at: dict[str, float] = dataclasses.field(default_factory=dict)  # of the duplicated

    def duplicated_acked_before(self, moment: float) -> list[str]:
        """Return the duplicated ids whose first confirmed ack came before moment."""
        return [mid for mid in self.duplicated if self.acked_at[mid] < moment]

    @property
    def ok(self) -> bool:
        """The guarantees: nothing lost, duplicated after an ack, made up or reordered."""
        return not (self.lost or self.duplicated or self.unexpected or self.order_violations)

    def summary(self) -> dict[str, int]:
        return {
            "acknowledged": self.acknowledged,
            "delivered": self.delivered,
            "lost": len(self.lost),
            "duplicated": len(self.duplicated),
            "unexpected": len(self.unexpected),
            "order_violations": len(self.order_violations),
            "unfinished": len(self.unfinished),
            "redelivered": self.redelivered,
            "first_seen_retried": self.first_seen_retried,
            "stale": self.stale,
        }


def check(
    attempted: Iterable[str],
    acknowledged: Iterable[Pushed],
    deliveries: Iterable[Delivery],
    acks: Iterable[Acked],
) -> Verdict:
    """Sort the ids of one run (see the module docstring)."""
    tried = set(attempted)
    pushed = {p.id: p for p in acknowledged}
    tried |= set(pushed)
    by_id: dict[str, list[Delivery]] = defaultdict(list)
    for delivery in sorted(deliveries, key=lambda d: d.at):
        by_id[delivery.id].append(delivery)
    first_ack: dict[str, float] = {}
    for ack in acks:
        first_ack[ack.id] = min(ack.at, first_ack.get(ack.id, ack.at))

    verdict = Verdict(acknowledged=len(pushed), delivered=len(by_id))
    verdict.lost = sorted(set(pushed) - set(by_id))
    verdict.unexpected = sorted(set(by_id) - tried)
    verdict.unfinished = sorted(set(by_id) - set(first_ack))
    for mid, seen in by_id.items():
        verdict.redelivered += len(seen) - 1
        verdict.first_seen_retried += seen[0].retry_count > 0
        verdict.stale += sum(d.stale for d in seen)
        acked_at = first_ack.get(mid)
        if acked_at is not None and any(d.at > acked_at and not d.stale for d in seen):
            verdict.duplicated.append(mid)
            verdict.acked_at[mid] = acked_at
    verdict.duplicated.sort()
    verdict.order_violations = _order_violations(by_id, pushed)
    return verdict


def _order_violations(
    by_id: dict[str, list[Delivery]], pushed: dict[str, Pushed]
) -> list[tuple[str, str, str]]:
    """Return (partition, earlier id, later id) for each first delivery that went backwards."""
    firsts: dict[str, list[tuple[float, int, str]]] = defaultdict(list)
    for mid, seen in by_id.items():
        fresh = [d for d in seen if not d.stale]
        if mid in pushed and fresh:
            firsts[pushed[mid].partition].append((fresh[0].at, pushed[mid].seq, mid))
    violations = []
    for partition, ordered in firsts.items():
        ordered.sort()
        highest_seq, highest_id = -1, ""
        for _, seq, mid in ordered:
            if seq < highest_seq:
                violations.append((partition, highest_id, mid))
            else:
                highest_seq, highest_id = seq, mid
    return sorted(violations)
