"""Transactions: acks and pushes that commit together or not at all.

One connection, one PostgreSQL transaction: the acknowledgments first (all in one call),
then the pushes (all items in one call). Any operation that cannot be applied raises
OperationFailed naming it, and the transaction rolls back. Long polls are woken for the
pushed partitions once the transaction committed (after_push, as for plain pushes),
never for one that rolled back.

A transaction sent again after its answer was lost finds its acknowledgments done: when
they and its pushes were all applied by one earlier transaction
(queen.ack_applied_before, asked only then), it is answered as already applied
instead of refused.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Sequence
from typing import Any, NamedTuple

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

# What an acknowledgment that did not apply means for its transaction, by its reason.
REFUSALS: dict[str, tuple[type[QueenError], str]] = {
    "not_found": (NotFound, "message {txid!r} not found"),
    "not_leased": (Conflict, "message {txid!r} is not leased to group {group!r} (not_leased)"),
    "lease_expired": (
        Conflict,
        "message {txid!r} is no longer under this lease for group {group!r} (lease_expired)",
    ),
    "leased_by_other": (
        Conflict,
        "message {txid!r} is leased to another consumer of group {group!r} (leased_by_other)",
    ),
}
ALREADY: tuple[type[QueenError], str] = (
    Conflict,
    "message {txid!r} was already acknowledged by group {group!r}, not by this"
    " transaction ({status}: {reason})",
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


class Committed(NamedTuple):
    """A transaction's results, one per operation, in order."""

    results: list[Result]
    already_applied: bool  # an earlier sending of it committed it; this one changed nothing


class _AppliedBefore(Exception):
    """Roll back: the transaction was applied before (its results say what is so)."""

    def __init__(self, results: list[Result]) -> None:
        super().__init__()
        self.results = results


class Transactions:
    """Apply a request's operations atomically."""

    def __init__(self, db: Database, queues: Queues, encryption_key: str = "") -> None:
        self.db = db
        self.queues = queues
        self._key = crypto.load_key(encryption_key) if encryption_key else None
        self.after_push = Wakeups(db).pushed  # wakes long polls once pushes committed

    def commit(self, operations: Sequence[Operation], producer: str | None = None) -> Committed:
        """Apply every operation or none; one result per operation, in order.

        Raises OperationFailed for the first operation that cannot be applied, unless
        the whole transaction was applied before (Committed.already_applied). A deadlock
        (two transactions locking the same partitions in opposite orders) is retried.
        """
        acks = [op for op in operations if isinstance(op, AckOperation)]
        pushes = [op for op in operations if isinstance(op, PushOperation)]
        items = [item for op in pushes for item in self._sealed(op)]
        for attempt in range(RETRIES_ON_DEADLOCK):
            try:
                results = self._apply(operations, acks, pushes, items, producer)
            except _AppliedBefore as before:
                return Committed(before.results, already_applied=True)
            except RETRYABLE as exc:
                if attempt == RETRIES_ON_DEADLOCK - 1:
                    raise Unavailable("database busy (deadlock), retry") from exc
                log.warning("retrying a transaction after %s", type(exc).__name__)
                continue
            if items:
                self.after_push(items)
            return Committed(results, already_applied=False)
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
                if not all(outcome.applied for outcome in checked):
                    self._applied_before(conn, operations, acks, checked, items, producer)
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

    def _applied_before(
        self,
        conn: lifecycle.Connection,
        operations: Sequence[Operation],
        acks: list[AckOperation],
        checked: list[lifecycle.CheckedAck],
        items: list[dict[str, Any]],
        producer: str | None,
    ) -> None:
        """Raise _AppliedBefore when one earlier transaction applied every operation.

        Only pushes whose items all name their transactionId can be recognised. Their
        results are the pushes' own answer now (each item a duplicate, nothing stored).
        """
        if any(o.status == "not_found" for o in checked):
            return
        pushed = [item.get("transactionId") for item in items]
        if None in pushed or not lifecycle.applied_before(
            conn, [op.ack for op in acks], [str(txid) for txid in pushed]
        ):
            return
        results: dict[int, Result] = {ack.index: o for ack, o in zip(acks, checked, strict=True)}
        if items:
            outcomes = iter(lifecycle.push_api(conn, items, producer))
            for op in operations:
                if isinstance(op, PushOperation):
                    results[op.index] = [next(outcomes) for _ in op.items]
        raise _AppliedBefore([results[op.index] for op in operations])

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
    error, text = REFUSALS.get(outcome.status, ALREADY)
    message = f"operations[{index}]: " + text.format(
        txid=outcome.transaction_id,
        group=outcome.consumer_group,
        status=outcome.status,
        reason=outcome.reason,
    )
    raise OperationFailed(index, error, message, outcome.reason)


def _refuse_rejected(index: int, outcomes: list[lifecycle.PushOutcome]) -> None:
    """Raise OperationFailed when a push's item was rejected (its queue is full)."""
    for position, outcome in enumerate(outcomes):
        if outcome.status == "rejected":
            raise OperationFailed(
                index, QueueFull, f"operations[{index}].items[{position}]: queue is full (maxSize)"
            )
