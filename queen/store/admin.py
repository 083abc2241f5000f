"""Message management: browse, inspect, delete, retry, dead-letter, clear."""

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


WALK_SKEW = 10  # a walk reads this many times what an even spread over time would need
MERGE_BUDGET = 50_000  # rows a merge may read before a (riskier) walk is considered


def choose_listing(
    partitions: int, matching: int, held: int, walked: int, wanted: int, rare: bool = False
) -> str:
    """Pick how to read the newest `wanted` qualifying messages of some partitions.

    Counts come from partition_stats: `matching` messages qualify, the partitions hold
    `held` in all, the global newest-first index holds `walked`. Estimated rows read:
    - walk the global index: wanted x walked / matching, times WALK_SKEW, because recent
      messages are rarely spread evenly (a busy queue fills the newest end of the index);
      not for the rare statuses (`rare`: failed, dead_letter), whose own small index holds
      nothing but them;
    - merge: each partition's newest qualifying messages from its own index,
      partitions x wanted x held / matching;
    - gather every qualifying message and sort: matching.
    The cheapest wins, except that a merge within MERGE_BUDGET rows is preferred to a
    walk of the global index: its cost is bounded, a walk's depends on what else arrived
    lately. The planner cannot make this choice: it assumes messages spread evenly over
    partitions, which is badly wrong for a small queue in a large table.
    """
    if partitions == 1:
        return "read_messages_of_partition"
    share = matching / max(walked, 1)
    costs = {
        "read_messages": wanted / max(share, 1e-12) * (1 if rare else WALK_SKEW),
        "read_messages_merged": partitions * wanted * held / max(matching, 1),
        "read_messages_gathered": float(matching),
    }
    if not rare and costs["read_messages_merged"] <= MERGE_BUDGET:
        del costs["read_messages"]
    return min(costs, key=lambda name: costs[name])


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
        )

    def page(self, where: MessageFilter, limit: int, offset: int) -> list[StoredMessage]:
        """Return one page of matching messages, newest first (created_at, then seq)."""
        with self.reads.session() as session:
            params: dict[str, Any] = {
                "any": where.any_partition,
                "partitions": [],
                "partition": None,
                "status": where.status,
                "limit": limit,
                "offset": offset,
                "wanted": limit + offset,
            }
            query = "read_messages"
            if not where.any_partition:
                (found,) = session.rows("read_partition_ids", where._asdict())
                if not found["matching"]:
                    return []
                params["partitions"] = found["ids"]
                query = choose_listing(
                    len(found["ids"]),
                    found["matching"],
                    found["held"],
                    found["walked"],
                    limit + offset,
                    rare=where.status in RETRYABLE,
                )
                if query == "read_messages_of_partition":
                    params["partition"] = found["ids"][0]
            rows = session.rows(query, params, raw_json=True)
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

    def delete(self, transaction_id: str) -> str:
        """Delete a message; return the status it had."""
        ((status,),) = self.db.fetch("delete_message", {"transaction_id": transaction_id})
        if status is None:
            raise NotFound(f"message {transaction_id!r} not found")
        return str(status)

    def _move(self, transaction_id: str, allowed: tuple[str, ...], to: str, action: str) -> None:
        params = {"transaction_id": transaction_id, "from": list(allowed), "to": to}
        ((status,),) = self.db.fetch("set_message_status", params)
        if status is None:
            raise NotFound(f"message {transaction_id!r} not found")
        if status not in allowed:
            raise Conflict(
                f"message {transaction_id!r} is {status}: only {' or '.join(allowed)}"
                f" messages can be {action}"
            )

    def retry(self, transaction_id: str) -> None:
        """Make a failed or dead-lettered message pending again, with retryCount 0."""
        self._move(transaction_id, RETRYABLE, "pending", "retried")

    def dead_letter(self, transaction_id: str) -> None:
        """Move a pending or failed message to the dead letter queue."""
        self._move(transaction_id, DEAD_LETTERABLE, "dead_letter", "moved to the DLQ")

    def clear(self, queue: str, partition: str | None) -> int:
        """Delete every message of a queue (or of one partition); return how many."""
        ((cleared,),) = self.db.fetch("clear_messages", {"queue": queue, "partition": partition})
        if cleared is None:
            what = (
                f"partition {partition!r} of queue {queue!r}" if partition else f"queue {queue!r}"
            )
            raise NotFound(f"{what} not found")
        return int(cleared)
