"""Cluster-wide dashboard events: the batches and presence notes workers exchange.

Every worker with something to show sends one NOTIFY on the dashboard channel per
flush period (QUEEN_DASHBOARD_FLUSH_INTERVAL): counts of its message events per queue and kind, a bounded sample of the
events themselves and how many were left out. Every worker's LISTEN connection receives
every batch (its own too) and its hub forwards them to its sockets, so a dashboard sees
the events of every worker and host, each once. Workers with open sockets announce it
with a presence note every few seconds; a worker publishes only while a note is fresh.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any, NamedTuple

import orjson

from queen.dashboard.formats import Event, now_iso

FLUSH_INTERVAL_S = 1.0  # default seconds between batches of one worker (each costs a NOTIFY)
PRESENCE_INTERVAL_S = 5.0  # seconds between presence notes of a worker with sockets open
PRESENCE_TTL_S = 3 * PRESENCE_INTERVAL_S  # a worker stops publishing this long after the last
PAYLOAD_LIMIT = 7900  # bytes: PostgreSQL refuses NOTIFY payloads of 8000 bytes and more
COUNTS_LIMIT = 3000  # bytes of the payload the counts may take; the rest go under "" (other)
OTHER = ""  # the counts key of queues left out (and of acks whose queue was not looked up)

Counts = dict[str, dict[str, int]]  # queue -> event name -> events


class Batch(NamedTuple):
    """One worker's flush, as received."""

    worker: str
    events: list[tuple[Event, str]]  # (event, its timestamp)
    counts: Counts
    dropped: int  # events counted but not in the sample


def presence(worker_id: str) -> str:
    """Encode the note a worker with open sockets sends (payload of one NOTIFY)."""
    return orjson.dumps({"type": "presence", "worker": worker_id}).decode()


def encode_batch(
    worker_id: str, sample: Iterable[tuple[Event, str]], counts: Counts, total: int, lost: int = 0
) -> str:
    """Encode a flush within PAYLOAD_LIMIT, taking events from sample until one does not fit.

    sample may be lazy: what is not taken is never built. total is the number of events
    counted; those not listed, plus `lost` ones never counted, make `dropped`.
    """
    head = {"type": "batch", "worker": worker_id, "counts": bounded_counts(counts)}
    prefix = orjson.dumps(head)[:-1] + b',"events":['
    parts: list[bytes] = []
    size = len(prefix) + 40  # the closing part and the dropped count
    for event, timestamp in sample:
        part = orjson.dumps([event.name, event.data, timestamp, event.queue])
        if size + len(part) + 1 > PAYLOAD_LIMIT:
            break
        parts.append(part)
        size += len(part) + 1
    left_out = lost + max(0, total - len(parts))
    tail = b'],"dropped":' + str(left_out).encode() + b"}"
    return (prefix + b",".join(parts) + tail).decode()


def bounded_counts(counts: Counts) -> Counts:
    """Keep the busiest queues within COUNTS_LIMIT bytes; fold the rest into OTHER."""
    if len(orjson.dumps(counts)) <= COUNTS_LIMIT:
        return counts
    busiest = sorted(counts.items(), key=lambda kv: -sum(kv[1].values()))
    kept: Counts = {}
    other: dict[str, int] = dict(counts.get(OTHER, {}))
    size = 64
    for queue, by_name in busiest:
        if queue == OTHER:
            continue
        entry = len(orjson.dumps({queue: by_name}))
        if size + entry <= COUNTS_LIMIT:
            kept[queue] = by_name
            size += entry
        else:
            for name, n in by_name.items():
                other[name] = other.get(name, 0) + n
    if other:
        kept[OTHER] = other
    return kept


def decode(payload: str) -> Batch | str | None:
    """Parse a dashboard notification: a Batch, a presence note's worker id, or None."""
    try:
        doc = orjson.loads(payload)
    except orjson.JSONDecodeError:
        return None
    if not isinstance(doc, dict):
        return None
    worker = str(doc.get("worker", ""))
    if doc.get("type") == "presence":
        return worker
    if doc.get("type") != "batch":
        return None
    events = [
        (Event(name, data, queue), timestamp)
        for name, data, timestamp, queue in doc.get("events", ())
    ]
    counts = doc.get("counts")
    return Batch(worker, events, counts if isinstance(counts, dict) else {}, int(doc["dropped"]))


def summary(batch: Batch) -> dict[str, Any]:
    """Shape a batch's totals as the data of an events.summary event."""
    totals: dict[str, int] = {}
    for by_name in batch.counts.values():
        for name, n in by_name.items():
            totals[name] = totals.get(name, 0) + n
    return {
        "workerId": batch.worker,
        "counts": batch.counts,
        "totals": totals,
        "dropped": batch.dropped,
    }


def batch_frame(batch: Batch, wants: Callable[[str | None], bool]) -> bytes:
    """Encode a batch as the JSON of one events.batch frame, keeping the events `wants` accepts."""
    events = [
        {"event": event.name, "data": event.data, "timestamp": timestamp}
        for event, timestamp in batch.events
        if wants(event.queue)
    ]
    data = {**summary(batch), "events": events}
    timestamp = batch.events[-1][1] if batch.events else now_iso()
    return orjson.dumps({"event": "events.batch", "data": data, "timestamp": timestamp})
