"""The API's hot path on the cursor store: push, pop, ack, lease renewal, long-poll support.

The same methods as queen.store.messages, polling and leases (Store picks these under
QUEEN_STORAGE=cursors), over the functions of sql/functions/cursor_*.sql; the model is
in docs/STORAGE.md. Message ids in answers are UUIDs derived from the bigint id and
created_at (queen.cursor_message_uuid, in sql/functions/cursor_reads.sql).

A pop names its lease id itself. When the database connection breaks during a pop, the
pop may have committed and its answer be lost: as on the row store, GiveBacks gives
that lease back in the background without counting an attempt
(queen.cursor_give_back_claim), instead of letting it expire into a retry.
"""

from __future__ import annotations

import datetime as dt
import functools
import os
import time
import uuid
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

import orjson
import psycopg

from queen.models import AckResult, Popped, PopRoute, PushResult
from queen.store.cursors import QUEUE_MODE
from queen.store.db import Database
from queen.store.giveback import GiveBacks
from queen.store.messages import (
    Messages,
    _ack_results,
    _claims_encrypted,
    _large_payload,
    _popped,
    _push_results,
)
from queen.store.polling import Polling, ready_params
from queen.store.queues import Queues
from queen.store.sqlfile import load_queries

QUERIES = load_queries(Path(__file__).with_name("cursor_messages.sql"))

AfterExecute = Callable[[psycopg.Connection[Any]], None]


def new_lease_id() -> uuid.UUID:
    """Return a time-ordered lease id (UUIDv7: 48 bits of milliseconds, then random bits)."""
    millis = time.time_ns() // 1_000_000
    value = (millis & (2**48 - 1)) << 80 | int.from_bytes(os.urandom(10), "big")
    value = (value & ~(0xF << 76)) | (0x7 << 76)  # version 7
    value = (value & ~(0x3 << 62)) | (0x2 << 62)  # variant 10
    return uuid.UUID(int=value)


def message_uuid(message_id: int, created_at: dt.datetime) -> uuid.UUID:
    """The API id of a stored message, as queen.cursor_message_uuid makes it."""
    millis = int(created_at.timestamp() * 1000) & (2**48 - 1)
    high = (message_id >> 62) & 0xFFF  # rand_a: the id's bits above the low 62
    return uuid.UUID(
        int=millis << 80 | 0x7 << 76 | high << 64 | 0x2 << 62 | (message_id & (2**62 - 1))
    )


def message_id_of(api_id: uuid.UUID) -> int:
    """The bigint id inside an API id (queen.cursor_message_id)."""
    return ((api_id.int >> 64) & 0xFFF) << 62 | (api_id.int & (2**62 - 1))


class CursorMessages(Messages):
    """The message lifecycle on the cursor store: push, pop (a partition lease per group), ack."""

    def __init__(self, db: Database, queues: Queues, encryption_key: str = "") -> None:
        super().__init__(db, queues, encryption_key)
        self.give_backs = GiveBacks(db, statement=QUERIES["cursor_give_back_claim"])
        # Called with the pop's connection once its statement ran (tests break it there).
        self.after_pop_statement: AfterExecute | None = None

    def push(
        self, body: bytes | str, items: list[dict[str, Any]], producer: str | None = None
    ) -> list[PushResult]:
        """Store validated items; body is the raw request ({"items": [...]}) they came from."""
        secret = self._secret_items(items) if self.queues.any_encrypted() else None
        if secret is not None or _claims_encrypted(body, items):
            body = self._seal(items, secret)
        params = {"body": body if isinstance(body, str) else body.decode(), "producer": producer}
        results = self.db.run(QUERIES["cursor_api_push"], params, _push_results, name="push")
        self.after_push(items)
        return results

    def pop(
        self, route: PopRoute, batch: int, worker: str, prefer: str | None = None
    ) -> list[Popped]:
        """Lease a partition for route's group and return up to batch of its messages.

        prefer: for a route by queue, a partition of it to try first (in the same call).
        """
        lease = new_lease_id()
        params = {
            "kind": route.kind,
            "queue": route.queue,
            "partition": route.partition,
            "namespace": route.namespace,
            "task": route.task,
            "group": route.consumer_group or QUEUE_MODE,
            "mode": route.subscription_mode,
            "since": route.subscription_from,
            "batch": batch,
            "worker": worker,
            "lease": lease,
            "prefer": prefer if route.kind == "queue" else None,
        }
        rows = self.db.run(
            QUERIES["cursor_api_pop"], params, _popped, raw_json=True, name="pop",
            after_execute=self.after_pop_statement,
            on_lost=functools.partial(self.give_backs.add, lease), large=_large_payload,
        )
        return [self._decrypt(row) if row.encrypted else row for row in rows]

    def ack(self, acks: list[dict[str, Any]]) -> list[AckResult]:
        """Apply validated acknowledgments; one result per item, in order."""
        params = {"acks": orjson.dumps(acks).decode()}
        return self.db.run(QUERIES["cursor_api_ack"], params, _ack_results, name="ack")


def unclaim(db: Database, lease_id: uuid.UUID) -> int:
    """End a lease without counting an attempt; the messages it gave back."""
    rows = db.run(QUERIES["cursor_unclaim"], {"lease": lease_id}, name="unclaim")
    return int(rows[0][0] or 0) if rows else 0


class CursorPolling(Polling):
    """The long-poll fallback and giving back undelivered pops, on the cursor store."""

    def ready_partitions(
        self,
        queues: Iterable[str],
        partitions: Iterable[tuple[str, str]],
        filters: Iterable[tuple[str | None, str | None]],
        limit: int,
    ) -> list[str]:
        """Return wake payloads of partitions with work for these routes (a hint)."""
        params = ready_params(queues, partitions, filters, limit)
        rows = self.db.run(QUERIES["cursor_ready_partitions"], params, name="ready_partitions")
        return [row[0] for row in rows]

    def unclaim(self, lease_id: uuid.UUID, transaction_ids: list[str]) -> int:
        """Give back a pop's lease (the whole batch of a response) without counting a retry."""
        return unclaim(self.db, lease_id)


class CursorLeases:
    """Renew partition leases of the cursor store."""

    def __init__(self, db: Database) -> None:
        self.db = db

    def extend(self, lease_id: uuid.UUID, seconds: int | None) -> dt.datetime | None:
        """Move a live lease's expiry to now + seconds (None: the queue's leaseTime).

        Return the new expiry, or None when the lease is unknown, ended or expired.
        """
        params = {"lease": lease_id, "seconds": seconds}
        ((expires,),) = self.db.run(QUERIES["cursor_api_extend"], params, name="extend")
        return expires  # type: ignore[no-any-return]

    def queue_of(self, lease_id: uuid.UUID) -> str | None:
        """Return the queue the lease is on, or None when no partition holds it."""
        ((queue,),) = self.db.run(QUERIES["cursor_lease_queue"], {"lease": lease_id})
        return queue  # type: ignore[no-any-return]
