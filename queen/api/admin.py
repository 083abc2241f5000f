"""Message management (API.md section 6): list, get, delete, retry, DLQ, related, clear;
the dead letters (GET /dlq)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import falcon
import orjson

from queen.analytics import STATUSES
from queen.api import auth, send_json, validation
from queen.api.groups import group_name
from queen.errors import InvalidInput, NotFound
from queen.models import iso
from queen.store import Store
from queen.store.admin import DeadLetter, MessageFilter, RelatedMessage, StoredMessage
from queen.store.lifecycle import QUEUE_MODE

DEFAULT_LIMIT = 100
MAX_LIMIT = 1000


def transaction_id(value: str) -> str:
    """Check a transactionId taken from the path."""
    if not value or len(value) > validation.MAX_TRANSACTION_ID or "\x00" in value:
        raise InvalidInput("invalid transactionId")
    return value


def status_param(params: Mapping[str, Any]) -> str | None:
    raw = params.get("status")
    if raw is None or raw == "":
        return None
    if raw not in STATUSES:
        raise InvalidInput(f"status must be one of {', '.join(STATUSES)}")
    return str(raw)


def message_json(m: StoredMessage) -> dict[str, Any]:
    """Shape a stored message as API.md 6.1 (plus its queue options for a single get)."""
    doc: dict[str, Any] = {
        "id": m.id,
        "transactionId": m.transaction_id,
        "queuePath": f"{m.queue}/{m.partition}",
        "queue": m.queue,
        "partition": m.partition,
        "partitionId": m.partition_id,
        "namespace": m.namespace,
        "task": m.task,
        "payload": orjson.Fragment(m.payload),
        "status": m.status,
        "workerId": m.worker_id,
        "createdAt": iso(m.created_at),
        "lockedAt": iso(m.locked_at),
        "completedAt": iso(m.completed_at),
        "failedAt": iso(m.failed_at),
        "errorMessage": m.error_message,
        "retryCount": m.retry_count,
        "leaseExpiresAt": iso(m.lease_expires_at),
    }
    if m.options is not None:
        doc["options"] = m.options
    return doc


def related_json(m: RelatedMessage) -> dict[str, Any]:
    return {
        "id": m.id,
        "transactionId": m.transaction_id,
        "status": m.status,
        "createdAt": iso(m.created_at),
        "payload": orjson.Fragment(m.payload),
    }


class MessagesResource:
    """GET /messages: one page, newest first."""

    def __init__(self, store: Store) -> None:
        self.store = store

    def on_get(self, req: falcon.Request, resp: falcon.Response) -> None:
        params = req.params
        where = MessageFilter(
            queue=validation.name(params.get("queue"), "queue", required=False),
            partition=validation.name(params.get("partition"), "partition", required=False),
            namespace=validation.name(params.get("namespace"), "namespace", required=False),
            task=validation.name(params.get("task"), "task", required=False),
            status=status_param(params),
        )
        limit = validation.int_param(params, "limit", DEFAULT_LIMIT, 1, MAX_LIMIT)
        offset = validation.int_param(params, "offset", 0, 0, validation.MAX_INT)
        page = self.store.admin.page(where, limit + 1, offset)
        if not page and where.queue is not None and not self.store.queues.exists(where.queue):
            raise NotFound(f"queue {where.queue!r} not found")  # a typo, not an empty queue
        send_json(
            resp,
            {
                "messages": [message_json(m) for m in page[:limit]],
                "limit": limit,
                "offset": offset,
                "hasMore": len(page) > limit,
            },
        )


class MessageResource:
    """GET and DELETE /messages/{transaction_id}"""

    def __init__(self, store: Store) -> None:
        self.store = store

    def on_get(self, req: falcon.Request, resp: falcon.Response, txid: str) -> None:
        message = self.store.admin.get(transaction_id(txid))
        auth.check_queue(req, message.queue)
        send_json(resp, {**message_json(message), "producer": message.producer})

    def on_delete(self, req: falcon.Request, resp: falcon.Response, txid: str) -> None:
        txid = transaction_id(txid)
        auth.check_messages(req, self.store, [txid])
        self.store.admin.delete(txid)
        send_json(resp, {"deleted": True, "transactionId": txid})


class MessageRetryResource:
    """POST /messages/{transaction_id}/retry: failed or dead_letter -> pending (409 otherwise)."""

    def __init__(self, store: Store) -> None:
        self.store = store

    def on_post(self, req: falcon.Request, resp: falcon.Response, txid: str) -> None:
        txid = transaction_id(txid)
        auth.check_messages(req, self.store, [txid])
        self.store.admin.retry(txid)
        send_json(resp, {"retried": True, "transactionId": txid})


class MessageDeadLetterResource:
    """POST /messages/{transaction_id}/dlq: pending or failed -> dead_letter (409 otherwise)."""

    def __init__(self, store: Store) -> None:
        self.store = store

    def on_post(self, req: falcon.Request, resp: falcon.Response, txid: str) -> None:
        txid = transaction_id(txid)
        auth.check_messages(req, self.store, [txid])
        self.store.admin.dead_letter(txid)
        send_json(resp, {"movedToDLQ": True, "transactionId": txid})


class RelatedMessagesResource:
    """GET /messages/{transaction_id}/related: same partition, within 1 h, nearest first."""

    def __init__(self, store: Store) -> None:
        self.store = store

    def on_get(self, req: falcon.Request, resp: falcon.Response, txid: str) -> None:
        limit = validation.int_param(req.params, "limit", DEFAULT_LIMIT, 1, MAX_LIMIT)
        txid = transaction_id(txid)
        auth.check_messages(req, self.store, [txid])
        related = self.store.admin.related(txid, limit)
        send_json(resp, {"messages": [related_json(m) for m in related]})


class InPartition:
    """/messages/{partitionId}/{transactionId}[/...]: a message route of the original
    Queen's clients, which name a message by its partition's id too. The message's own
    route (resource) answers, once the message is known to be in that partition."""

    def __init__(self, store: Store, resource: object) -> None:
        self.store = store
        for method in ("get", "post", "delete"):
            responder = getattr(resource, f"on_{method}", None)
            if responder is not None:
                setattr(self, f"on_{method}", self._scoped(responder))

    def _scoped(self, responder: Any) -> Any:
        def on_request(
            req: falcon.Request, resp: falcon.Response, txid: str, scoped: str
        ) -> None:
            partition = validation.partition_id(txid, "partitionId")
            message = self.store.admin.get(transaction_id(scoped))
            if message.partition_id != partition:
                raise NotFound(f"message {scoped!r} not found in partition {txid!r}")
            responder(req, resp, scoped)

        return on_request


class DeadLettersResource:
    """GET /dlq?queue=&consumerGroup=&limit=&offset=: dead-lettered messages, most
    recently dead-lettered first, with how many there are in all."""

    def __init__(self, store: Store) -> None:
        self.store = store

    def on_get(self, req: falcon.Request, resp: falcon.Response) -> None:
        params = req.params
        queue = validation.name(params.get("queue"), "queue", required=False)
        raw_group = params.get("consumerGroup") or None
        group = None if raw_group is None else group_name(raw_group, "consumerGroup")
        limit = validation.int_param(params, "limit", DEFAULT_LIMIT, 1, MAX_LIMIT)
        offset = validation.int_param(params, "offset", 0, 0, validation.MAX_INT)
        if queue is not None:
            auth.check_queue(req, queue)
        else:
            auth.check_all_queues(req)
        total, page = self.store.admin.dead_letters(queue, group, limit, offset)
        if not total and queue is not None and not self.store.queues.exists(queue):
            raise NotFound(f"queue {queue!r} not found")
        send_json(
            resp,
            {
                "messages": [dead_letter_json(m) for m in page],
                "total": total,
                "limit": limit,
                "offset": offset,
            },
        )


def dead_letter_json(m: DeadLetter) -> dict[str, Any]:
    return {
        "id": m.id,
        "transactionId": m.transaction_id,
        "queue": m.queue,
        "partition": m.partition,
        "partitionId": m.partition_id,
        "consumerGroup": None if m.consumer_group == QUEUE_MODE else m.consumer_group,
        "data": orjson.Fragment(m.payload),
        "errorMessage": m.error,
        "retryCount": m.retry_count,
        "dlqTimestamp": iso(m.failed_at),
        "createdAt": iso(m.created_at),
    }


class ClearQueueResource:
    """DELETE /queues/{queue}/clear?partition="""

    def __init__(self, store: Store) -> None:
        self.store = store

    def on_delete(self, req: falcon.Request, resp: falcon.Response, queue: str) -> None:
        name = validation.name(queue, "queue")
        assert name is not None
        partition = validation.name(req.params.get("partition"), "partition", required=False)
        count = self.store.admin.clear(name, partition)
        send_json(
            resp,
            {"cleared": True, "count": count, "queue": name, "partition": partition or "all"},
        )
