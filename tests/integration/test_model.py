"""The store against a model of its rules, over random pushes, pops, acks and expiries.

One partition, one group: every pop must return the oldest messages not done yet, in
order, with the retry counts the model expects; every ack the status it expects.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field
from typing import Any

import psycopg
import pytest

from queen.store import lifecycle
from tests.integration.helpers import conn, expire_leases_now, make_queue

__all__ = ["conn"]  # the fixture

RETRY_LIMIT = 2


@dataclass
class Model:
    """What the rules say: messages in order, done ones, retries, the live lease."""

    ids: list[str] = field(default_factory=list)
    done: set[str] = field(default_factory=set)
    retries: dict[str, int] = field(default_factory=dict)
    lease: list[str] = field(default_factory=list)
    acked: set[str] = field(default_factory=set)

    def pop(self, batch: int) -> list[tuple[str, int]]:
        if self.lease:
            return []
        self.lease = [t for t in self.ids if t not in self.done][:batch]
        self.acked = set()
        return [(t, self.retries.get(t, 0)) for t in self.lease]

    def fail(self, txid: str) -> str:
        tries = self.retries.get(txid, 0)
        if tries + 1 <= RETRY_LIMIT:
            self.retries[txid] = tries + 1
            return "retry_scheduled"
        self.done.add(txid)
        return "dead_letter"

    def ack(self, txid: str, completed: bool) -> str:
        self.acked.add(txid)
        status = "completed" if completed else self.fail(txid)
        if completed:
            self.done.add(txid)
        if self.acked >= set(self.lease):
            self.lease = []
        return status

    def expire(self) -> None:
        for txid in self.lease:
            if txid not in self.acked:
                self.fail(txid)
        self.lease = []


@pytest.mark.parametrize("seed", range(4))
def test_random_lifecycles_follow_the_rules(conn: psycopg.Connection[Any], seed: int) -> None:
    rng = random.Random(seed)
    make_queue(conn, "q", retry_limit=RETRY_LIMIT)
    model = Model()
    leased: list[lifecycle.Delivery] = []
    for step in range(120):
        op = rng.choice(["push", "pop", "pop", "ack", "ack", "expire"])
        if op == "push":
            txids = [f"m{len(model.ids) + i}" for i in range(rng.randint(1, 4))]
            lifecycle.push(conn, [{"queue": "q", "payload": {}, "transactionId": t} for t in txids])
            model.ids += txids
        elif op == "pop":
            batch = rng.randint(1, 5)
            got = lifecycle.pop(conn, "q", batch=batch)
            assert [(d.transaction_id, d.retry_count) for d in got] == model.pop(batch), step
            leased = got or leased
        elif op == "ack" and model.lease:
            open_ = [d for d in leased if d.transaction_id not in model.acked]
            for d in rng.sample(open_, rng.randint(1, len(open_))):
                completed = rng.random() < 0.6
                (outcome,) = lifecycle.ack(conn, [{
                    "transactionId": d.transaction_id, "leaseId": str(d.lease_id),
                    "status": "completed" if completed else "failed", "error": "e"}])
                assert outcome.status == model.ack(d.transaction_id, completed), step
        elif op == "expire" and model.lease:
            expire_leases_now(conn)
            assert lifecycle.expire_leases(conn) == 1
            model.expire()
    # Drain: everything not done comes out, oldest first.
    while True:
        model.expire()
        expire_leases_now(conn)
        lifecycle.expire_leases(conn)
        got = lifecycle.pop(conn, "q", batch=1000)
        assert [(d.transaction_id, d.retry_count) for d in got] == model.pop(1000)
        if not got:
            break
        for d in got:
            lifecycle.ack(conn, [{"transactionId": d.transaction_id, "status": "completed",
                                "leaseId": str(d.lease_id)}])
            model.ack(d.transaction_id, True)
    assert model.done == set(model.ids)
