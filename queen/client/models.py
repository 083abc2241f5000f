"""Records the client returns, built from the API's JSON (no I/O here)."""

from __future__ import annotations

import dataclasses
import os
import threading
import time
import uuid
from typing import Any


@dataclasses.dataclass(frozen=True)
class Message:
    """A popped message, leased to this consumer until it is acked or the lease expires."""

    id: str
    transaction_id: str
    queue: str
    partition: str
    data: Any
    retry_count: int
    lease_id: str | None
    group: str | None
    created_at: str | None
    lease_expires_at: str | None = None
    priority: int = 0
    lease_time: int | None = None  # seconds, the queue's leaseTime
    retry_limit: int | None = None
    trace_parent: str | None = None  # the producer's W3C traceparent, when it sent one

    @classmethod
    def from_json(cls, doc: dict[str, Any]) -> Message:
        options = doc.get("options") or {}
        return cls(
            id=doc["id"],
            transaction_id=doc["transactionId"],
            queue=doc["queue"],
            partition=doc["partition"],
            data=doc.get("data"),
            retry_count=doc.get("retryCount", 0),
            lease_id=doc.get("leaseId"),
            group=doc.get("consumerGroup"),
            created_at=doc.get("createdAt"),
            lease_expires_at=doc.get("leaseExpiresAt"),
            priority=doc.get("priority", 0),
            lease_time=options.get("leaseTime"),
            retry_limit=options.get("retryLimit"),
            trace_parent=doc.get("traceId"),
        )

    def as_json(self) -> dict[str, Any]:
        """The message as the API shapes it (camelCase), for NDJSON output."""
        return {
            "id": self.id,
            "transactionId": self.transaction_id,
            "queue": self.queue,
            "partition": self.partition,
            "data": self.data,
            "retryCount": self.retry_count,
            "leaseId": self.lease_id,
            "consumerGroup": self.group,
            "createdAt": self.created_at,
        }


@dataclasses.dataclass(frozen=True)
class PushResult:
    """The outcome of one pushed item: queued, duplicate (already stored) or rejected."""

    id: str | None
    transaction_id: str | None
    status: str
    error: str | None = None

    @classmethod
    def from_json(cls, doc: dict[str, Any]) -> PushResult:
        return cls(doc.get("id"), doc.get("transactionId"), doc["status"], doc.get("error"))


@dataclasses.dataclass(frozen=True)
class AckResult:
    """The outcome of one acknowledgment (completed, retry_scheduled, dead_letter, ...).

    reason: None when it applied; else why nothing changed: already_completed or
    already_failed (acknowledged before: status says how), or, in a batch, a refusal
    (not_found, not_leased, lease_expired, leased_by_other).
    """

    transaction_id: str
    status: str
    retry_count: int | None = None
    reason: str | None = None

    @property
    def applied(self) -> bool:
        """Whether this acknowledgment changed something."""
        return self.reason is None

    @classmethod
    def from_json(cls, doc: dict[str, Any]) -> AckResult:
        return cls(doc["transactionId"], doc["status"], doc.get("retryCount"), doc.get("reason"))


_last_ms = 0
_uuid_lock = threading.Lock()


def uuid7() -> str:
    """Return a new UUIDv7 (RFC 9562): milliseconds since the epoch, then random bits.

    Within a process the timestamps never go back, so ids sort in creation order per ms.
    """
    global _last_ms
    with _uuid_lock:
        ms = max(time.time_ns() // 1_000_000, _last_ms)
        _last_ms = ms
    rand = int.from_bytes(os.urandom(10), "big")
    value = (ms & (2**48 - 1)) << 80 | 0x7 << 76 | (rand >> 62 & 0xFFF) << 64
    value |= 0b10 << 62 | rand & (2**62 - 1)
    return str(uuid.UUID(int=value))
