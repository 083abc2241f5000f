"""Message management and read queries on the cursor store (QUEEN_STORAGE=cursors).

The read families (Analytics, Dashboard) run unchanged over CURSOR_READ_QUERIES: the
queries of queries.sql that the cursor store answers otherwise, under the same names
and with the same columns. Statuses are queue mode's, derived from its cursor, lease and
records (docs/STORAGE.md); counts come from the rollup maintenance keeps plus bounded
walks past its watermarks, never a count over the message table.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from queen.errors import Conflict, NotFound
from queen.store.admin import DEAD_LETTERABLE, RETRYABLE, Admin, MessageFilter, StoredMessage
from queen.store.db import QUERIES, Database
from queen.store.reads import Reads
from queen.store.sqlfile import load_queries

OWN_QUERIES = load_queries(Path(__file__).with_name("cursor_reads.sql"))
CURSOR_READ_QUERIES = {**QUERIES, **OWN_QUERIES}


def cursor_reads(db: Database) -> Reads:
    """Read sessions that answer the read queries from the cursor store."""
    return Reads(db, queries=CURSOR_READ_QUERIES)


class CursorAdmin(Admin):
    """Operator actions on the cursor store: browse, inspect, delete, retry, DLQ, clear."""

    def _value(self, name: str, params: dict[str, Any]) -> Any:
        """Run one of the cursor store's actions (one statement, its own transaction)."""
        with self.db.connection() as conn:
            row = conn.execute(OWN_QUERIES[name], params).fetchone()  # type: ignore[arg-type]
        return row[0] if row else None

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

    def delete(self, transaction_id: str) -> str:
        """Delete a message; return queue mode's status it had."""
        status = self._value("cursor_delete_message", {"transaction_id": transaction_id})
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

        It is written again at the tail of its partition (a new id, the same
        transactionId, payload and createdAt); groups that had it done keep it done.
        """
        self._act("cursor_retry_message", transaction_id, RETRYABLE, "retried")

    def dead_letter(self, transaction_id: str) -> None:
        """Move a pending or failed message to queue mode's dead letter queue."""
        self._act(
            "cursor_dead_letter_message", transaction_id, DEAD_LETTERABLE, "moved to the DLQ"
        )

    def clear(self, queue: str, partition: str | None) -> int:
        """Delete every message of a queue (or of one partition); return how many."""
        cleared = self._value("cursor_clear", {"queue": queue, "partition": partition})
        if cleared is None:
            what = (
                f"partition {partition!r} of queue {queue!r}" if partition else f"queue {queue!r}"
            )
            raise NotFound(f"{what} not found")
        return int(cleared)
