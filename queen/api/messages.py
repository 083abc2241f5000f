"""Push, pop and ack (API.md sections 1-3)."""

from __future__ import annotations

import datetime as dt
import functools
from collections.abc import Callable, Mapping
from typing import Any, NamedTuple

import falcon
import orjson

from queen.api import auth, read_body, send_json, validation
from queen.dashboard import formats
from queen.dashboard.hub import SILENT, Publisher
from queen.errors import NotFound, QueenError, QueueFull
from queen.models import AckResult, Popped, PopRoute, PushResult, iso
from queen.polling import ClaimedBody, LongPoller, client_gone_check
from queen.store import Store


class PushResource:
    def __init__(self, store: Store, max_batch: int, hub: Publisher = SILENT) -> None:
        self.store = store
        self.max_batch = max_batch
        self.hub = hub

    def on_post(self, req: falcon.Request, resp: falcon.Response) -> None:
        raw = read_body(req)
        items = validation.push_items(validation.parse_json_object(raw), raw, self.max_batch)
        principal = auth.principal_of(req)
        if principal is not None:
            auth.check_queues(req, (item["queue"] for item in items))
        producer = principal.name if principal is not None else None
        results = self.store.messages.push(raw, items, producer)
        self.hub.publish(formats.PUSHED, items, results)
        statuses = [r.status for r in results]
        if statuses.count("rejected") == len(statuses):
            raise QueueFull("queue is full (maxSize): every item was rejected")
        req.context.messages = ("pushed", statuses.count("queued"))
        send_json(resp, {"messages": push_json(results, items)}, 201)


def push_json(results: list[PushResult], items: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Shape push results as API.md 1.1 (a rejected item echoes the transactionId it sent)."""
    messages: list[dict[str, Any]] = [
        {"id": r.id, "transactionId": r.transaction_id, "status": r.status} for r in results
    ]
    # Only a full queue (maxSize) rejects: look at the results again only then.
    if any(r.status == "rejected" for r in results):
        for entry, r in zip(messages, results, strict=True):
            if r.status == "rejected":
                entry["error"] = "queue is full (maxSize)"
                entry["transactionId"] = items[r.position - 1].get("transactionId")
    return messages


def message_json(m: Popped, stamp: Callable[[dt.datetime], str | None] = iso) -> dict[str, Any]:
    """Shape a popped message as API.md 2.1; stamp formats its timestamps."""
    return {
        "id": m.id,
        "transactionId": m.transaction_id,
        "queue": m.queue,
        "partition": m.partition,
        "partitionId": m.partition_id,
        "data": orjson.Fragment(m.payload),
        "retryCount": m.retry_count,
        "priority": m.priority,
        "createdAt": stamp(m.created_at),
        "lockedAt": stamp(m.locked_at),
        "leaseId": m.lease_id,
        "leaseExpiresAt": stamp(m.lease_expires_at),
        "options": {"leaseTime": m.lease_time, "retryLimit": m.retry_limit},
    }


def messages_json(messages: list[Popped], group: str | None = None) -> list[dict[str, Any]]:
    """Shape a pop's messages, formatting each distinct timestamp once.

    A claim's messages share lockedAt and leaseExpiresAt, and messages pushed in one
    batch share createdAt, so most timestamps repeat within a response. Each message
    shows the pop's consumerGroup, null in queue mode.
    """
    stamp = functools.cache(iso)  # this response's own cache
    shaped = [message_json(m, stamp) for m in messages]
    for entry, m in zip(shaped, messages, strict=True):  # (set on each, not copied)
        entry["consumerGroup"] = group
        if m.trace_id is not None:  # the producer's trace, for its consumer to continue
            entry["traceId"] = m.trace_id
    return shaped


class PopRequest(NamedTuple):
    """A checked pop: what to claim, how many, and how long to wait for them."""

    route: PopRoute
    batch: int
    wait: bool
    timeout_ms: int


class PopResource:
    """The three pop routes; which one is decided by the URL fields present."""

    def __init__(
        self,
        poller: LongPoller,
        max_batch: int,
        default_timeout_ms: int,
        max_timeout_ms: int,
        hub: Publisher = SILENT,
    ) -> None:
        self.poller = poller
        self.hub = hub
        self.max_batch = max_batch
        self.default_timeout_ms = default_timeout_ms
        self.max_timeout_ms = max_timeout_ms

    def on_get(
        self,
        req: falcon.Request,
        resp: falcon.Response,
        queue: str | None = None,
        partition: str | None = None,
    ) -> None:
        pop = self.request(req.params, queue, partition)
        messages = self.take(req, pop)
        if not messages:
            resp.status = falcon.HTTP_204
            if self.poller.shutting_down:
                resp.set_header("Connection", "close")  # lets the worker exit promptly
            return
        self.answer(req, resp, pop, messages, {})

    def request(
        self, params: Mapping[str, Any], queue: str | None, partition: str | None
    ) -> PopRequest:
        """Check a pop's fields (the query parameters; queue and partition of the path)."""
        group, mode, since = validation.subscription(params)
        if queue is None:
            route = PopRoute(
                namespace=validation.name(params.get("namespace"), "namespace", required=False),
                task=validation.name(params.get("task"), "task", required=False),
                consumer_group=group, subscription_mode=mode, subscription_from=since,
            )
        else:
            route = PopRoute(
                queue=validation.name(queue, "queue"),
                partition=validation.name(partition, "partition", required=False),
                consumer_group=group, subscription_mode=mode, subscription_from=since,
            )
        batch = validation.int_param(params, "batch", 1, 1, self.max_batch)
        wait = validation.bool_param(params, "wait")
        timeout_ms = validation.int_param(params, "timeout", self.default_timeout_ms, 0, 2**31 - 1)
        return PopRequest(route, batch, wait, min(timeout_ms, self.max_timeout_ms))

    def take(self, req: falcon.Request, pop: PopRequest) -> list[Popped]:
        """Claim pop's messages ([] when none came in time)."""
        return self.poller.pop(
            pop.route,
            pop.batch,
            wait=pop.wait,
            timeout_s=pop.timeout_ms / 1000,
            client_gone=client_gone_check(req.env),
        )

    def answer(
        self,
        req: falcon.Request,
        resp: falcon.Response,
        pop: PopRequest,
        messages: list[Popped],
        doc: dict[str, Any],
    ) -> None:
        """Answer 200 with doc and the claimed messages; they go back to pending unless
        the whole response reaches the server's socket."""
        try:
            shaped = messages_json(messages, pop.route.consumer_group)
            body = orjson.dumps({**doc, "messages": shaped})
        except Exception:
            self.poller.release(messages)
            raise
        if messages:
            self.hub.publish(formats.PROCESSING, messages)
            req.context.popped = len(messages)
        elif self.poller.shutting_down:
            resp.set_header("Connection", "close")  # lets the worker exit promptly
        resp.status = falcon.HTTP_200
        resp.content_type = falcon.MEDIA_JSON
        resp.set_stream(
            ClaimedBody(
                body,
                on_undelivered=lambda: self.poller.release(messages),
                on_delivered=lambda: self.poller.delivered(messages),
            ),
            len(body),
        )


# The reason of an ack that found its message already as it asked (an ack sent again).
ALREADY = {"completed": "already_completed", "failed": "already_failed"}


def ack_json(r: AckResult, wanted: str) -> dict[str, Any]:
    """Shape an ack result as API.md 3.2: a reason when nothing changed, and then, for a
    message acknowledged before, when that was (when known).

    success: the message is now as the ack (wanted: its status) asked, by this ack or by
    an earlier sending of it; false for every ack refused or that found the message
    acknowledged otherwise. (Clients of the original Queen read it.)
    """
    doc: dict[str, Any] = {
        "transactionId": r.transaction_id,
        "status": r.status,
        "success": r.reason is None or r.reason == ALREADY[wanted],
    }
    if r.status == "retry_scheduled":
        doc["retryCount"] = r.retry_count
    if r.reason is not None:
        doc["reason"] = r.reason
        if r.acknowledged_at is not None:
            doc["acknowledgedAt"] = iso(r.acknowledged_at)
    return doc


# Why a single ack was refused (409), by its reason; nothing changed.
REFUSED = {
    "not_leased": "message {txid!r} is not leased (to this group): nothing changed",
    "lease_expired": (
        "message {txid!r} is no longer under this lease (it expired or ended before the"
        " message was done): nothing changed"
    ),
    "leased_by_other": (
        "message {txid!r} is leased to another consumer (this lease ended and the message"
        " was delivered again): nothing changed"
    ),
}


class AckResource:
    def __init__(self, store: Store, hub: Publisher = SILENT) -> None:
        self.store = store
        self.hub = hub

    def on_post(self, req: falcon.Request, resp: falcon.Response) -> None:
        doc = validation.parse_json_object(read_body(req))
        ack = validation.acknowledgment(doc)
        auth.check_messages(req, self.store, [ack["transactionId"]])
        (result,) = self.store.messages.ack([ack])
        if result.reason is not None:
            self._unchanged(resp, result, ack["status"])
            return
        self.hub.publish(formats.ACKED, [ack], [result])
        req.context.messages = ("acked", 1)
        doc = {**ack_json(result, ack["status"]), "acknowledgedAt": iso(result.acknowledged_at)}
        send_json(resp, doc)

    def _unchanged(self, resp: falcon.Response, result: AckResult, wanted: str) -> None:
        """Answer an ack that changed nothing: 200 for a message acknowledged before (an
        ack sent again after its answer was lost), 404 or 409 with its reason otherwise."""
        if result.status == "not_found":
            raise NotFound(f"message {result.transaction_id!r} not found")
        text = REFUSED.get(result.reason or "")
        if text is None:
            doc = {**ack_json(result, wanted), "acknowledgedAt": iso(result.acknowledged_at)}
            send_json(resp, doc)
            return
        doc = {
            "error": text.format(txid=result.transaction_id),
            "transactionId": result.transaction_id,
            "reason": result.reason,
        }
        send_json(resp, doc, 409)


class AckBatchResource:
    """POST /ack/batch; with "next", the acks are applied, then the pop it names runs
    (long polling if asked) and its messages come in the same answer."""

    def __init__(
        self, store: Store, max_batch: int, hub: Publisher = SILENT, pop: PopResource | None = None
    ) -> None:
        self.store = store
        self.max_batch = max_batch
        self.hub = hub
        self.pop = pop

    def on_post(self, req: falcon.Request, resp: falcon.Response) -> None:
        doc = validation.parse_json_object(read_body(req))
        acks = validation.acknowledgments(doc, self.max_batch)
        then = self._next(req, doc)
        auth.check_messages(req, self.store, [a["transactionId"] for a in acks])
        results = self.store.messages.ack(acks)
        self.hub.publish(formats.ACKED, acks, results)
        found = [r for r in results if r.status != "not_found"]
        if not found:
            raise NotFound("none of these messages exist")
        req.context.messages = ("acked", len(found))
        # (The call's time: that of an ack that applied, the first one as a rule.)
        now = next((r.acknowledged_at for r in results if r.reason is None), None)
        answer = {
            "processed": len(found),
            "acknowledgedAt": iso(now),
            "results": [ack_json(r, a["status"]) for r, a in zip(results, acks, strict=True)],
        }
        if then is None or self.pop is None:
            send_json(resp, answer)
            return
        try:
            messages = self.pop.take(req, then)
        except QueenError as exc:  # the acks stand: say why no messages came
            answer["nextError"] = exc.message
            messages = []
        self.pop.answer(req, resp, then, messages, answer)

    def _next(self, req: falcon.Request, doc: dict[str, Any]) -> PopRequest | None:
        """The body's next pop, checked (and allowed to this request's token) before any ack."""
        params = validation.next_pop(doc)
        if params is None or self.pop is None:
            return None
        pop = self.pop.request(params, params.get("queue"), params.get("partition"))
        if pop.route.queue is not None:
            auth.check_queue(req, pop.route.queue)
        else:
            auth.check_all_queues(req)
        return pop
