"""Transactions: acks and pushes that commit together or not at all.

One connection, one PostgreSQL transaction: the acknowledgments first (all in one call),
then the pushes (all items in one call). Any operation that cannot be applied raises
OperationFailed naming it, and the transaction rolls back. Long polls are woken for the
pushed partitions once the transaction committed (after_push, as for plain pushes),
never for one that rolled back.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Sequence
from typing import Any

import orjson

from queen import crypto
from queen.errors import (
    Conflict,
    InvalidInput,
    NotFound,
    OperationFailed,
    QueenError,
    QueueFull,
    Unavailable,
)
from queen.store import lifecycle
from queen.store.db import RETRIES_ON_DEADLOCK, RETRYABLE, Database
from queen.store.polling import Wakeups
from queen.store.queues import Queues

log = logging.getLogger(__name__)

# What an acknowledgment that did not apply means for its transaction.
REFUSALS: dict[str, tuple[type[QueenError], str]] = {
    "not_found": (NotFound, "message {txid!r} not found"),
    "lease_expired": (
        Conflict,
        "message {txid!r} is not leased to group {group!r} under this lease (lease_expired)",
    ),
}
ALREADY: tuple[type[QueenError], str] = (
    Conflict,
    "message {txid!r} was already acknowledged by group {group!r} ({status})",
)


@dataclasses.dataclass(frozen=True, slots=True)
class AckOperation:
    index: int  # position among the request's operations
    ack: dict[str, Any]  # {transactionId, status, error, consumerGroup, leaseId}


@dataclasses.dataclass(frozen=True, slots=True)
class PushOperation:
    index: int
    items: list[dict[str, Any]]  # validated push items


Operation = AckOperation | PushOperation
Result = lifecycle.CheckedAck | list[lifecycle.PushOutcome]


class Transactions:
    """Apply a request's operations atomically."""

    def __init__(self, db: Database, queues: Queues, encryption_key: str = "") -> None:
        self.db = db
        self.queues = queues
        self._key = crypto.load_key(encryption_key) if encryption_key else None
        self.after_push = Wakeups(db).pushed  # wakes long polls once pushes committed

    def commit(self, operations: Sequence[Operation], producer: str | None = None) -> list[Result]:
        """Apply every operation or none; one result per operation, in order.

        Raises OperationFailed for the first operation that cannot be applied. A deadlock
        (two transactions locking the same partitions in opposite orders) is retried.
        """
        acks = [op for op in operations if isinstance(op, AckOperation)]
        pushes = [op for op in operations if isinstance(op, PushOperation)]
        items = [item for op in pushes for item in self._sealed(op)]
        for attempt in range(RETRIES_ON_DEADLOCK):
            try:
                results = self._apply(operations, acks, pushes, items, producer)
            except RETRYABLE as exc:
                if attempt == RETRIES_ON_DEADLOCK - 1:
                    raise Unavailable("database busy (deadlock), retry") from exc
                log.warning("retrying a transaction after %s", type(exc).__name__)
                continue
            if items:
                self.after_push(items)
            return results
        raise AssertionError("unreachable")

    def _apply(
        self,
        operations: Sequence[Operation],
        acks: list[AckOperation],
        pushes: list[PushOperation],
        items: list[dict[str, Any]],
        producer: str | None,
    ) -> list[Result]:
        results: dict[int, Result] = {}
        with self.db.connection() as conn, conn.transaction():
            if acks:
                checked = lifecycle.ack_checked(conn, [op.ack for op in acks])
                for ack, outcome in zip(acks, checked, strict=True):
                    _refuse_unapplied(ack.index, outcome)
                    results[ack.index] = outcome
            if items:
                outcomes = iter(lifecycle.push_api(conn, items, producer))
                for push in pushes:
                    mine = [next(outcomes) for _ in push.items]
                    _refuse_rejected(push.index, mine)
                    results[push.index] = mine
        return [results[op.index] for op in operations]

    def queues_of(self, transaction_ids: list[str]) -> set[str]:
        """Return the queues of these messages (unknown ones are left out)."""
        with self.db.connection() as conn:
            return set(lifecycle.queues_of(conn, transaction_ids).values())

    def _sealed(self, push: PushOperation) -> list[dict[str, Any]]:
        """Encrypt the payloads bound for encrypted queues (as queen.store.messages does).

        Only this sets `encrypted`: a client's own marker is dropped.
        """
        encrypted = self.queues.any_encrypted()
        sealed = []
        for item in push.items:
            clean = {k: v for k, v in item.items() if k != "encrypted"}
            flags = self.queues.flags(item["queue"]) if encrypted else None
            if flags is not None and flags.encrypted:
                if self._key is None:
                    raise OperationFailed(
                        push.index,
                        InvalidInput,
                        f"operations[{push.index}]: queue {item['queue']!r} is encrypted"
                        " but QUEEN_ENCRYPTION_KEY is not set",
                    )
                clean["payload"] = crypto.encrypt(self._key, orjson.dumps(item["payload"]))
                clean["encrypted"] = True
            sealed.append(clean)
        return sealed


def _refuse_unapplied(index: int, outcome: lifecycle.CheckedAck) -> None:
    """Raise OperationFailed for an acknowledgment that changed nothing."""
    if outcome.applied:
        return
    reason, text = REFUSALS.get(outcome.status, ALREADY)
    message = f"operations[{index}]: " + text.format(
        txid=outcome.transaction_id, group=outcome.consumer_group, status=outcome.status
    )
    raise OperationFailed(index, reason, message)


def _refuse_rejected(index: int, outcomes: list[lifecycle.PushOutcome]) -> None:
    """Raise OperationFailed when a push's item was rejected (its queue is full)."""
    for position, outcome in enumerate(outcomes):
        if outcome.status == "rejected":
            raise OperationFailed(
                index, QueueFull, f"operations[{index}].items[{position}]: queue is full (maxSize)"
            )
