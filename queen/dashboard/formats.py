"""Dashboard event shapes (API.md "WebSocket Support"), built from API and store records."""

from __future__ import annotations

import datetime as dt
import operator
from collections.abc import Iterable, Iterator, Mapping, Sequence
from typing import Any, NamedTuple

import orjson

from queen.models import AckResult, Popped, PushResult, iso
from queen.store.dashboard import MessagePlace, PartitionDepth
from queen.wakeup import DEFAULT_PARTITION

# What the API publishes: one call per request, with the request's records.
PUSHED = "message.pushed"  # (items, push results)
PROCESSING = "message.processing"  # (popped messages,)
ACKED = "message.acked"  # (acks, ack results): becomes message.completed / message.failed

COMPLETED = "message.completed"
FAILED = "message.failed"
FAILED_STATUSES = frozenset({"retry_scheduled", "dead_letter", "failed"})


class Event(NamedTuple):
    """One event for clients; queue is None for events every subscriber gets."""

    name: str
    data: dict[str, Any]
    queue: str | None


def now_iso() -> str:
    """Return the current time as ISO-8601 UTC with milliseconds."""
    return iso(dt.datetime.now(dt.UTC)) or ""


def iso_of(seconds: float) -> str:
    """Format a time.time() value as ISO-8601 UTC with milliseconds."""
    return iso(dt.datetime.fromtimestamp(seconds, dt.UTC)) or ""


def encode(name: str, data: Mapping[str, Any], timestamp: str) -> str:
    """Serialise one event as the text frame clients receive."""
    return encode_json(name, data, timestamp).decode()


def encode_json(name: str, data: Mapping[str, Any], timestamp: str) -> bytes:
    """Serialise one event as the UTF-8 JSON of the text frame clients receive."""
    return orjson.dumps({"event": name, "data": data, "timestamp": timestamp})


def pushed(items: Sequence[Mapping[str, Any]], results: Iterable[PushResult]) -> Iterator[Event]:
    """Yield message.pushed for each item that was stored (not duplicates or rejects)."""
    for r in results:
        if r.status != "queued":
            continue
        item = items[r.position - 1]
        queue = item["queue"]
        data = {
            "queue": queue,
            "partition": item.get("partition") or DEFAULT_PARTITION,
            "transactionId": r.transaction_id,
        }
        yield Event(PUSHED, data, queue)


def processing(messages: Iterable[Popped], worker_id: str) -> Iterator[Event]:
    """Yield message.processing for each message handed to a consumer."""
    for m in messages:
        data = {
            "queue": m.queue,
            "partition": m.partition,
            "transactionId": m.transaction_id,
            "workerId": worker_id,
        }
        yield Event(PROCESSING, data, m.queue)


def acked(
    acks: Sequence[Mapping[str, Any]],
    results: Iterable[AckResult],
    places: Mapping[str, MessagePlace],
) -> Iterator[Event]:
    """Yield message.completed / message.failed per acknowledgment that found its message."""
    for r in results:
        data: dict[str, Any] = {"transactionId": r.transaction_id}
        if r.status == "completed":
            name = COMPLETED
        elif r.status in FAILED_STATUSES:
            error = acks[r.position - 1].get("error")
            name = FAILED
            data.update(error=error, status=r.status)
            if r.status == "retry_scheduled":
                data["retryCount"] = r.retry_count
        else:
            continue
        place = places.get(r.transaction_id)
        if place is not None:
            data["queue"], data["partition"] = place.queue, place.partition
        yield Event(name, data, place.queue if place else None)


def expand(
    kind: str,
    records: Sequence[Any],
    places: Mapping[str, MessagePlace],
    worker_id: str,
) -> Iterator[Event]:
    """Turn one publication into its client events."""
    if kind == PUSHED:
        return pushed(records[0], records[1])
    if kind == PROCESSING:
        return processing(records[0], worker_id)
    if kind == ACKED:
        return acked(records[0], records[1], places)
    raise ValueError(f"unknown publication {kind!r}")


def tally(
    counts: dict[str, dict[str, int]],
    kind: str,
    records: Sequence[Any],
    places: Mapping[str, MessagePlace],
    other: str = "",
) -> None:
    """Count one publication's events per queue and name without building them.

    Acknowledgments whose message was not located count under `other`. This runs on the
    request path for every publication past the sample: a request's records are of one
    queue as a rule, counted in one pass of C loops (map, count) rather than per record.
    """
    if kind == PUSHED:
        items, results = records
        queues = set(map(_ITEM_QUEUE, items))
        if len(queues) == 1:
            queued = list(map(_STATUS, results)).count("queued")
            if queued:
                _add(counts, queues.pop(), PUSHED, queued)
            return
        for r in results:
            if r.status == "queued":
                _add(counts, items[r.position - 1]["queue"], PUSHED)
    elif kind == PROCESSING:
        messages = records[0]
        queues = set(map(_QUEUE, messages))
        if len(queues) == 1:
            _add(counts, queues.pop(), PROCESSING, len(messages))
            return
        for m in messages:
            _add(counts, m.queue, PROCESSING)
    elif not places:
        statuses = list(map(_STATUS, records[1]))
        completed = statuses.count("completed")
        failed = sum(statuses.count(s) for s in FAILED_STATUSES)
        if completed:
            _add(counts, other, COMPLETED, completed)
        if failed:
            _add(counts, other, FAILED, failed)
    else:
        for r in records[1]:
            name = _ack_event(r.status)
            if name is not None:
                place = places.get(r.transaction_id)
                _add(counts, place.queue if place is not None else other, name)


_ITEM_QUEUE = operator.itemgetter("queue")
_QUEUE = operator.attrgetter("queue")
_STATUS = operator.attrgetter("status")


def _add(counts: dict[str, dict[str, int]], queue: str, name: str, n: int = 1) -> None:
    by_name = counts.get(queue)
    if by_name is None:
        by_name = counts[queue] = {}
    by_name[name] = by_name.get(name, 0) + n


def _ack_event(status: str) -> str | None:
    if status == "completed":
        return COMPLETED
    return FAILED if status in FAILED_STATUSES else None


def acked_ids(kind: str, records: Sequence[Any]) -> list[str]:
    """Return the transactionIds an ack publication needs located (none for others)."""
    if kind != ACKED:
        return []
    return [r.transaction_id for r in records[1] if r.status != "not_found"]


def partition_counts(row: PartitionDepth) -> dict[str, int]:
    return {
        "depth": row.pending,
        "processing": row.processing,
        "completed": row.completed,
        "failed": row.failed,
        "deadLetter": row.dead_letter,
    }


def queue_depths(rows: Iterable[PartitionDepth]) -> list[Event]:
    """Group a depth snapshot into one queue.depth event per queue."""
    queues: dict[str, dict[str, Any]] = {}
    for row in rows:
        doc = queues.get(row.queue)
        if doc is None:
            doc = queues[row.queue] = {
                "queue": row.queue,
                "namespace": row.namespace,
                "task": row.task,
                "totalDepth": 0,
                "totalProcessing": 0,
                "totalCompleted": 0,
                "totalFailed": 0,
                "totalDeadLetter": 0,
                "partitions": {},
            }
        if row.partition is None:
            continue
        doc["partitions"][row.partition] = partition_counts(row)
        doc["totalDepth"] += row.pending
        doc["totalProcessing"] += row.processing
        doc["totalCompleted"] += row.completed
        doc["totalFailed"] += row.failed
        doc["totalDeadLetter"] += row.dead_letter
    return [Event("queue.depth", doc, name) for name, doc in queues.items()]


def partition_depth(row: PartitionDepth) -> Event:
    """Shape one partition's counts as a partition.depth event."""
    counts = partition_counts(row)
    data = {"queue": row.queue, "partition": row.partition, **counts}
    data["total"] = sum(counts.values())
    return Event("partition.depth", data, row.queue)


def queue_created(row: PartitionDepth) -> Event:
    data = {
        "queue": row.queue,
        "partition": row.partition,
        "namespace": row.namespace,
        "task": row.task,
    }
    return Event("queue.created", data, row.queue)


def system_stats(
    rows: Iterable[PartitionDepth], created: int, completed: int, connections: int, dropped: int
) -> Event:
    """Shape cluster totals (from a depth snapshot) and this process's connections."""
    rows = list(rows)
    data = {
        "pending": sum(r.pending for r in rows),
        "processing": sum(r.processing for r in rows),
        "recentCreated": created,
        "recentCompleted": completed,
        "connections": connections,
        "queues": len({r.queue for r in rows}),
        "partitions": sum(1 for r in rows if r.partition is not None),
        "droppedEvents": dropped,
    }
    return Event("system.stats", data, None)
