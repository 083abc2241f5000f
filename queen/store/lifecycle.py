"""Immutable messages, one cursor and lease per (partition, consumer group), on a connection.

What transactions, consumer groups and tests call on a connection of their own
(queen.store.messages is the API's hot path over the same SQL). Every function runs one
statement on the connection it is given, so that a caller can hold several in one
transaction (`with conn.transaction(): ...`); on an autocommit connection each one
commits by itself. Items are validated (and sealed, for encrypted
queues) by the caller, as for queen.store.messages. docs/STORAGE.md describes the model.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import uuid
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, Literal

import orjson
import psycopg
from psycopg.rows import tuple_row

from queen.store.db import translate_errors
from queen.store.sqlfile import load_queries

QUEUE_MODE = "__queue__"  # the built-in group of pops without consumerGroup

QUERIES = load_queries(Path(__file__).with_name("lifecycle.sql"))

SubscriptionMode = Literal["all", "new"]
SeekTarget = Literal["beginning", "end", "time"]


@dataclasses.dataclass(frozen=True, slots=True)
class PushOutcome:
    """What a push did with one item."""

    position: int  # 1-based position in the request
    id: int | uuid.UUID | None  # the message's number (push) or API id (push_api)
    transaction_id: str | None
    status: str  # queued | duplicate | rejected


@dataclasses.dataclass(frozen=True, slots=True)
class Delivery:
    """One message of a pop, under the lease of its partition for its group."""

    id: int
    transaction_id: str
    queue: str
    partition: str
    consumer_group: str
    payload: Any
    encrypted: bool
    producer: str | None
    trace_id: str | None
    retry_count: int
    created_at: dt.datetime
    lease_id: uuid.UUID
    lease_expires_at: dt.datetime


@dataclasses.dataclass(frozen=True, slots=True)
class AckOutcome:
    """What an acknowledgment did."""

    position: int  # 1-based position in the request
    transaction_id: str
    consumer_group: str
    # completed | retry_scheduled | dead_letter | failed, or a refusal: not_found |
    # not_leased | lease_expired | leased_by_other
    status: str
    retry_count: int | None


@dataclasses.dataclass(frozen=True, slots=True)
class GroupInfo:
    """A consumer group reading a queue."""

    consumer_group: str
    queue: str
    subscription_mode: str  # all | new | from
    partitions: int  # partitions it has a cursor in
    pending: int  # messages it has not acked yet (leased ones included)
    lag_seconds: float  # age of the oldest of them


@dataclasses.dataclass(frozen=True, slots=True)
class CheckedAck:
    """What an acknowledgment did, and whether it changed anything (see ack_checked)."""

    position: int  # 1-based position in the request
    transaction_id: str
    consumer_group: str
    status: str  # as AckOutcome.status
    retry_count: int | None
    applied: bool  # False: it only reported what was already so
    reason: str | None  # why nothing changed (queen.ack_reason); None when it applied


@dataclasses.dataclass(frozen=True, slots=True)
class GroupSummary:
    """A consumer group on one queue, its backlog counted up to a cap per partition."""

    consumer_group: str
    queue: str
    subscription_mode: str  # all | new | from
    subscription_from: dt.datetime | None
    joined_at: dt.datetime  # the group's first pop (or seek) of the queue
    partitions: int  # partitions it has a cursor in
    leased: int  # partitions it holds a live lease on
    pending: int  # messages it has not acked (leased ones included), at most cap a partition
    capped: bool  # some partition's count stopped at the cap: pending is a lower bound
    lag_seconds: float  # age of its oldest unacked message (0: none)


@dataclasses.dataclass(frozen=True, slots=True)
class GroupPartition:
    """A consumer group in one partition: cursor, bounded backlog and lease."""

    consumer_group: str
    queue: str
    subscription_mode: str
    subscription_from: dt.datetime | None
    joined_at: dt.datetime
    partition: str | None  # None: the queue has no partition yet
    cursor_id: int | None  # None: no cursor in this partition yet (not popped since it came)
    pending: int
    capped: bool
    lag_seconds: float
    lease_id: uuid.UUID | None  # a live lease only
    leased_by: str | None
    lease_expires_at: dt.datetime | None
    lease_size: int | None
    updated_at: dt.datetime | None  # when the cursor row last changed


Connection = psycopg.Connection[Any]


def _rows(conn: Connection, name: str, params: Mapping[str, Any]) -> list[tuple[Any, ...]]:
    with translate_errors(), conn.cursor(row_factory=tuple_row) as cur:
        cur.execute(QUERIES[name], params)  # type: ignore[arg-type]
        return cur.fetchall()


def _scalar(conn: Connection, name: str, params: Mapping[str, Any]) -> Any:
    (row,) = _rows(conn, name, params)
    return row[0]


def push(
    conn: Connection, items: Sequence[Mapping[str, Any]], producer: str | None = None
) -> list[PushOutcome]:
    """Store items ({queue, partition?, payload, transactionId?, traceId?}); one outcome each."""
    params = {"items": orjson.dumps(list(items)).decode(), "producer": producer}
    return [PushOutcome(*row) for row in _rows(conn, "push_rows", params)]


def push_api(
    conn: Connection, items: Sequence[Mapping[str, Any]], producer: str | None = None
) -> list[PushOutcome]:
    """push(), each outcome's id the message's API id (a UUID) instead of its number."""
    params = {"items": orjson.dumps(list(items)).decode(), "producer": producer}
    return [PushOutcome(*row) for row in _rows(conn, "push", params)]


def pop(
    conn: Connection,
    queue: str,
    *,
    partition: str | None = None,
    group: str = QUEUE_MODE,
    batch: int = 1,
    worker: str = "",
    mode: SubscriptionMode | None = None,
    since: dt.datetime | None = None,
) -> list[Delivery]:
    """Lease a partition of queue for group and return up to batch messages, in order.

    mode / since (subscriptionMode / subscriptionFrom) apply at the group's first pop of
    the queue and are ignored afterwards.
    """
    params = {
        "queue": queue, "partition": partition, "group": group, "batch": batch,
        "worker": worker, "mode": mode, "since": since,
    }
    name = "pop_queue" if partition is None else "pop_partition"
    return [Delivery(*row) for row in _rows(conn, name, params)]


def ack(conn: Connection, acks: Sequence[Mapping[str, Any]]) -> list[AckOutcome]:
    """Apply acknowledgments ({transactionId, status, error?, consumerGroup?, leaseId?})."""
    params = {"acks": orjson.dumps(list(acks), default=str).decode()}
    return [AckOutcome(*row) for row in _rows(conn, "ack_rows", params)]


def ack_checked(conn: Connection, acks: Sequence[Mapping[str, Any]]) -> list[CheckedAck]:
    """Apply acknowledgments as ack does; each outcome also says whether it applied."""
    params = {"acks": orjson.dumps(list(acks), default=str).decode()}
    return [CheckedAck(*row) for row in _rows(conn, "ack_checked", params)]


def applied_before(
    conn: Connection, acks: Sequence[Mapping[str, Any]], pushed: Sequence[str]
) -> bool:
    """Tell whether these acknowledgments, and pushes of these transactionIds, were all
    applied before by one transaction (queen.ack_applied_before)."""
    params = {
        "txids": [a["transactionId"] for a in acks],
        "groups": [a.get("consumerGroup") for a in acks],
        "pushed": list(pushed),
    }
    return bool(_scalar(conn, "ack_applied_before", params))


def queues_of(conn: Connection, transaction_ids: Sequence[str]) -> dict[str, str]:
    """Return {transactionId: queue} of the stored messages among transaction_ids."""
    rows = _rows(conn, "locate", {"transaction_ids": list(transaction_ids)})
    return {txid: queue for txid, queue in rows}


def extend(conn: Connection, lease_id: uuid.UUID, seconds: int) -> dt.datetime | None:
    """Extend a live lease to seconds from now; its new expiry, None when it has ended."""
    return _scalar(conn, "extend_lease", {"lease": lease_id, "seconds": seconds})  # type: ignore[no-any-return]


def expire_leases(conn: Connection, limit: int = 1000) -> int:
    """End up to limit expired leases; return how many."""
    return int(_scalar(conn, "expire_leases", {"limit": limit}))


def groups(conn: Connection, queue: str | None = None) -> list[GroupInfo]:
    """List the consumer groups of queue (or of every queue), queue mode included."""
    return [GroupInfo(*row) for row in _rows(conn, "consumer_groups", {"queue": queue})]


def group_summaries(
    conn: Connection,
    queue: str | None = None,
    group: str | None = None,
    cap: int = 1000,
    budget: int = 50_000,
) -> list[GroupSummary]:
    """List groups per queue (None: every queue, every group), pending counted up to cap
    messages a partition and budget in all (at least 10 a partition)."""
    params = {"queue": queue, "group": group, "cap": cap, "budget": budget}
    return [GroupSummary(*row) for row in _rows(conn, "group_summaries", params)]


def group_partitions(
    conn: Connection,
    group: str,
    queue: str | None = None,
    cap: int = 10_000,
    budget: int = 200_000,
) -> list[GroupPartition]:
    """Describe group in every partition of its queues (or of queue), pending counted up
    to cap messages a partition and budget in all (at least 10 a partition)."""
    params = {"queue": queue, "group": group, "cap": cap, "budget": budget}
    return [GroupPartition(*row) for row in _rows(conn, "group_partitions", params)]


def seek(
    conn: Connection, queue: str, group: str, to: SeekTarget, at: dt.datetime | None = None
) -> int | None:
    """Move group's cursors on queue; the partitions moved, None when queue is unknown."""
    if (to == "time") != (at is not None):
        raise ValueError("a seek to a time takes the time, and only that one")
    return _scalar(conn, "seek", {"queue": queue, "group": group, "to": to, "at": at})  # type: ignore[no-any-return]


def group_queues(conn: Connection, group: str) -> list[str]:
    """Return the queues group has joined (first pop or seek), by name."""
    return [row[0] for row in _rows(conn, "group_queues", {"group": group})]


def delete_group(conn: Connection, queue: str, group: str) -> int:
    """Forget group on queue (it starts over at its next pop); the cursors dropped."""
    return int(_scalar(conn, "delete_group", {"queue": queue, "group": group}))


def retention(conn: Connection, limit: int = 10000) -> int:
    """Delete up to limit messages past their queue's retention; return how many."""
    return int(_scalar(conn, "retention", {"limit": limit}))


def analyze(conn: Connection, min_changes: int = 1000) -> list[str]:
    """ANALYZE the store's tables changed by more than a tenth; return their names."""
    return list(_scalar(conn, "analyze_tables", {"min_changes": min_changes}))
