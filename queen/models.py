"""Records and shapes shared by the store, the API and the workers (no SQL, no HTTP)."""

from __future__ import annotations

import dataclasses
import datetime as dt
import uuid
from typing import Any, NamedTuple


class QueueOption(NamedTuple):
    """One queue option: its API name, its column, its type and default."""

    name: str
    column: str
    type: type
    default: Any


QUEUE_OPTIONS: tuple[QueueOption, ...] = (
    QueueOption("leaseTime", "lease_time", int, 300),
    QueueOption("retryLimit", "retry_limit", int, 3),
    QueueOption("priority", "priority", int, 0),
    QueueOption("maxSize", "max_size", int, 0),
    QueueOption("ttl", "ttl", int, 0),
    QueueOption("dlqAfterMaxRetries", "dlq_after_max_retries", bool, True),
    QueueOption("delayedProcessing", "delayed_processing", int, 0),
    QueueOption("windowBuffer", "window_buffer", int, 0),
    QueueOption("retentionSeconds", "retention_seconds", int, 0),
    QueueOption("completedRetentionSeconds", "completed_retention_seconds", int, 0),
    QueueOption("retentionEnabled", "retention_enabled", bool, False),
    QueueOption("encryptionEnabled", "encryption_enabled", bool, False),
    QueueOption("maxWaitTimeSeconds", "max_wait_time_seconds", int, 0),
    QueueOption("retryDelay", "retry_delay", int, 0),  # milliseconds
)
OPTIONS_BY_NAME = {option.name: option for option in QUEUE_OPTIONS}


def options_from_row(row: dict[str, Any]) -> dict[str, Any]:
    """Return the API options of a queue row (a dict with the option columns)."""
    return {option.name: row[option.column] for option in QUEUE_OPTIONS}


class Popped(NamedTuple):
    """A message handed to a consumer under a lease (the row type queen.popped).

    A NamedTuple rather than a frozen dataclass: pops build one per message, and a
    tuple is made from a row in one step, where a frozen dataclass sets each field.
    """

    id: str  # the API id (a UUID), as answers carry it
    transaction_id: str
    queue: str
    partition: str
    payload: str  # JSON text, decrypted
    encrypted: bool
    retry_count: int
    priority: int
    created_at: dt.datetime
    locked_at: dt.datetime
    lease_id: uuid.UUID
    lease_expires_at: dt.datetime
    lease_time: int
    retry_limit: int
    trace_id: str | None = None  # the producer's W3C traceparent, when it sent one
    partition_id: uuid.UUID | None = None  # the partition's id (partitionId)


class PushResult(NamedTuple):
    position: int  # 1-based position in the request
    id: str | None  # the API id (a UUID), as answers carry it
    transaction_id: str | None
    status: str  # queued | duplicate | rejected


class AckResult(NamedTuple):
    position: int  # 1-based position in the request
    transaction_id: str
    # completed | retry_scheduled | dead_letter | failed, or a refusal: not_found |
    # not_leased | lease_expired | leased_by_other
    status: str
    retry_count: int | None
    # now when it applied; else when the message's acknowledgment was recorded, if known
    acknowledged_at: dt.datetime | None
    # None: it applied; else why nothing changed (already_completed, already_failed, or
    # the refusal)
    reason: str | None = None


@dataclasses.dataclass(frozen=True, slots=True)
class PopRoute:
    """What a pop asks for: one partition, any partition of a queue, or a filter.

    consumer_group (None: queue mode) and its subscription (subscription_mode all / new,
    subscription_from), applied at the group's first pop of a queue.
    """

    queue: str | None = None
    partition: str | None = None
    namespace: str | None = None
    task: str | None = None
    consumer_group: str | None = None
    subscription_mode: str | None = None
    subscription_from: dt.datetime | None = None

    @property
    def kind(self) -> str:
        if self.partition is not None:
            return "partition"
        return "queue" if self.queue is not None else "filter"


def iso(ts: dt.datetime | None) -> str | None:
    """Format a timestamp as ISO-8601 UTC with milliseconds: 2025-10-08T05:12:33.893Z."""
    if ts is None:
        return None
    if ts.tzinfo is not dt.UTC:  # sessions run in UTC, so rows already are (db.py)
        offset = ts.utcoffset()
        ts = ts.replace(tzinfo=dt.UTC) if offset is None else ts.astimezone(dt.UTC)
    # isoformat() without timespec is the fastest form: 2025-10-08T05:12:33.893123+00:00,
    # no fraction at all when microsecond is 0. Slicing truncates to milliseconds.
    text = ts.isoformat()
    return text[:23] + "Z" if ts.microsecond else text[:19] + ".000Z"
