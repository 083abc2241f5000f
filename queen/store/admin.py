"""Message management: browse, inspect, delete, retry, dead-letter, clear.

Statuses are queue mode's, derived from its cursor, lease and records (docs/STORAGE.md).
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import uuid
from collections.abc import Mapping
from typing import Any, NamedTuple

import orjson

from queen import crypto
from queen.errors import Conflict, NotFound
from queen.models import options_from_row
from queen.store.db import Database
from queen.store.reads import Reads

RETRYABLE = ("failed", "dead_letter")
DEAD_LETTERABLE = ("pending", "failed")


class MessageFilter(NamedTuple):
    """Which messages a listing covers (None: any)."""

    queue: str | None = None
    partition: str | None = None
    namespace: str | None = None
    task: str | None = None
    status: str | None = None

    @property
    def any_partition(self) -> bool:
        return all(v is None for v in (self.queue, self.partition, self.namespace, self.task))


@dataclasses.dataclass(frozen=True, slots=True)
class StoredMessage:
    """A message as stored, payload decrypted (JSON text); options only for a single get."""

    id: uuid.UUID
    transaction_id: str
    queue: str
    partition: str
    namespace: str | None
    task: str | None
    payload: str
    status: str
    worker_id: str | None
    created_at: dt.datetime
    locked_at: dt.datetime | None
    completed_at: dt.datetime | None
    failed_at: dt.datetime | None
    error_message: str | None
    retry_count: int
    lease_expires_at: dt.datetime | None
    options: dict[str, Any] | None = None
    producer: str | None = None  # the pushing token's name; only for a single get
    partition_id: uuid.UUID | None = None


@dataclasses.dataclass(frozen=True, slots=True)
class DeadLetter:
    """A dead-lettered message, for one group (queue mode: QUEUE_MODE), payload decrypted."""

    id: uuid.UUID
    transaction_id: str
    queue: str
    partition: str
    partition_id: uuid.UUID
    consumer_group: str
    payload: str
    error: str | None
    retry_count: int
    failed_at: dt.datetime
    created_at: dt.datetime


@dataclasses.dataclass(frozen=True, slots=True)
class RelatedMessage:
    transaction_id: str
    id: uuid.UUID
    status: str
    created_at: dt.datetime
    payload: str


class Admin:
    """Operator actions on single messages and whole queues."""

    def __init__(self, db: Database, reads: Reads, encryption_key: str = "") -> None:
        self.db = db
        self.reads = reads
        self._key = crypto.load_key(encryption_key) if encryption_key else None

    def _payload(self, row: Mapping[str, Any]) -> str:
        """Return the payload as JSON text, decrypted when the key is known.

        Without the key an encrypted payload is shown as its envelope: browsing must not
        fail because of one message.
        """
        if not row["encrypted"] or self._key is None:
            return str(row["payload"])
        return crypto.decrypt(self._key, orjson.loads(row["payload"])).decode()

    def _message(self, row: dict[str, Any], with_options: bool = False) -> StoredMessage:
        return StoredMessage(
            id=row["id"],
            transaction_id=row["transaction_id"],
            queue=row["queue"],
            partition=row["partition"],
            namespace=row["namespace"],
            task=row["task"],
            payload=self._payload(row),
            status=row["status"],
            worker_id=row["worker_id"],
            created_at=row["created_at"],
            locked_at=row["locked_at"],
            completed_at=row["completed_at"],
            failed_at=row["failed_at"],
            error_message=row["error_message"],
            retry_count=row["retry_count"],
            lease_expires_at=row["lease_expires_at"],
            options=options_from_row(row) if with_options else None,
            producer=row.get("producer"),
            partition_id=row.get("partition_id"),
        )

    def page(self, where: MessageFilter, limit: int, offset: int) -> list[StoredMessage]:
        """Return one page of matching messages, newest first (by id: push order)."""
        with self.reads.session() as session:
            (found,) = session.rows("read_page_partitions", where._asdict())
            if not found["ids"]:
                return []
            params = {
                "partitions": found["ids"],
                "status": where.status,
                "limit": limit,
                "offset": offset,
            }
            rows = session.rows("read_page", params, raw_json=True)
        return [self._message(row) for row in rows]

    def get(self, transaction_id: str) -> StoredMessage:
        rows = self.reads.rows("read_message", {"transaction_id": transaction_id}, raw_json=True)
        if not rows:
            raise NotFound(f"message {transaction_id!r} not found")
        return self._message(rows[0], with_options=True)

    def related(self, transaction_id: str, limit: int) -> list[RelatedMessage]:
        """Return up to limit messages of the same partition nearest in time (within 1 h)."""
        params = {"transaction_id": transaction_id, "limit": limit}
        rows = self.reads.rows("read_related", params, raw_json=True)
        if not rows:
            raise NotFound(f"message {transaction_id!r} not found")
        return [
            RelatedMessage(
                row["transaction_id"],
                row["id"],
                row["status"],
                row["created_at"],
                self._payload(row),
            )
            for row in rows
            if row["transaction_id"] is not None
        ]

    def _value(self, name: str, params: dict[str, Any]) -> Any:
        """Run one action (one statement, its own transaction); its one value, None: no row.

        Actions may touch a whole queue: they keep the longer statement timeout."""
        rows = self.db.fetch(name, params, patient=True)
        return rows[0][0] if rows else None

    def delete(self, transaction_id: str) -> str:
        """Delete a message; return queue mode's status it had."""
        status = self._value("delete_message", {"transaction_id": transaction_id})
        if status is None:
            raise NotFound(f"message {transaction_id!r} not found")
        return str(status)

    def _act(self, name: str, transaction_id: str, allowed: tuple[str, ...], action: str) -> None:
        status = self._value(name, {"transaction_id": transaction_id})
        if status is None:
            raise NotFound(f"message {transaction_id!r} not found")
        if status not in allowed:
            raise Conflict(
                f"message {transaction_id!r} is {status}: only {' or '.join(allowed)}"
                f" messages can be {action}"
            )

    def retry(self, transaction_id: str) -> None:
        """Deliver a failed or dead-lettered message to queue mode again, retryCount 0.

        It is delivered next, in its place (queue mode's cursor steps back before it);
        past 1,000 done messages after it, it is written again at the tail instead (a new
        id, the same transactionId, payload and createdAt). Other groups keep it done.
        """
        self._act("retry_message", transaction_id, RETRYABLE, "retried")

    def dead_letter(self, transaction_id: str) -> None:
        """Move a pending or failed message to queue mode's dead letter queue."""
        self._act("dead_letter_message", transaction_id, DEAD_LETTERABLE, "moved to the DLQ")

    def dead_letters(
        self, queue: str | None, group: str | None, limit: int, offset: int
    ) -> tuple[int, list[DeadLetter]]:
        """Return how many messages are dead-lettered (of queue and group; None: any) and
        one page of them, most recently dead-lettered first."""
        params = {"queue": queue, "group": group, "limit": limit, "offset": offset}
        with self.reads.session() as session:
            (count,) = session.rows("read_dead_letter_count", params)
            rows = session.rows("read_dead_letters", params, raw_json=True) if count["total"] else []
        page = [
            DeadLetter(
                id=row["id"],
                transaction_id=row["transaction_id"],
                queue=row["queue"],
                partition=row["partition"],
                partition_id=row["partition_id"],
                consumer_group=row["consumer_group"],
                payload=self._payload(row),
                error=row["error"],
                retry_count=row["retry_count"],
                failed_at=row["failed_at"],
                created_at=row["created_at"],
            )
            for row in rows
        ]
        return int(count["total"]), page

    def delete_queue(self, queue: str) -> int:
        """Delete a queue with its messages, partitions and consumer groups; return how
        many messages went with it."""
        deleted = self._value("delete_queue", {"queue": queue})
        if deleted is None:
            raise NotFound(f"queue {queue!r} not found")
        return int(deleted)

    def clear(self, queue: str, partition: str | None) -> int:
        """Delete every message of a queue (or of one partition); return how many."""
        cleared = self._value("clear_messages", {"queue": queue, "partition": partition})
        if cleared is None:
            what = (
                f"partition {partition!r} of queue {queue!r}" if partition else f"queue {queue!r}"
            )
            raise NotFound(f"{what} not found")
        return int(cleared)
