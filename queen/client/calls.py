"""Each API operation as a Call: the request to send and how to read its answer.

Both faces of the client (queen.client.sync, queen.client.aio) send these; nothing here
does I/O.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import math
import re
from collections.abc import Callable, Iterable, Sequence
from typing import Any, Generic, TypeVar
from urllib.parse import quote

from queen.client import tracing
from queen.client.models import AckResult, Message, PushResult, uuid7

T = TypeVar("T")
API = "/api/v1"
DEFAULT_TIMEOUT = 10.0  # seconds for any request but a long poll
LONG_POLL_MARGIN = 10.0  # seconds a long poll's answer may take beyond its timeout
SUBSCRIPTION_MODES = ("all", "new")

MessageOrId = Message | str
AckItem = MessageOrId | tuple[MessageOrId, str | None]


@dataclasses.dataclass(frozen=True)
class Call(Generic[T]):
    """One request, and how to turn its JSON answer (None for 204) into a result.

    resend: the request may be sent again after its answer was lost (it cannot take
    effect twice). Requests are always sent again after a connection refused before
    sending or a 503, whatever resend says.
    """

    method: str
    path: str
    parse: Callable[[Any], T]
    params: dict[str, Any] | None = None
    json: Any = None
    resend: bool = True
    timeout: float = DEFAULT_TIMEOUT


def segment(name: str) -> str:
    return quote(name, safe="")


def payload_list(payloads: Any) -> list[Any]:
    """A list or tuple is many payloads; anything else is one."""
    return list(payloads) if isinstance(payloads, list | tuple) else [payloads]


def push_items(
    queue: str,
    payloads: Any,
    partition: str | None = None,
    transaction_ids: Sequence[str] | None = None,
) -> list[dict[str, Any]]:
    """Items of a push body; each gets a new UUIDv7 transactionId unless one is given."""
    data = payload_list(payloads)
    if transaction_ids is not None and len(transaction_ids) != len(data):
        raise ValueError("transaction_ids must have one id per payload")
    ids = transaction_ids if transaction_ids is not None else [uuid7() for _ in data]
    items: list[dict[str, Any]] = []
    parent = tracing.traceparent()  # (None without OpenTelemetry)
    for payload, txid in zip(data, ids, strict=True):
        item = {"queue": queue, "payload": payload, "transactionId": txid}
        if partition is not None:
            item["partition"] = partition
        if parent is not None:
            item["traceId"] = parent
        items.append(item)
    return items


def push_results(doc: Any) -> list[PushResult]:
    return [PushResult.from_json(m) for m in doc["messages"]]


def push(items: list[dict[str, Any]]) -> Call[list[PushResult]]:
    """POST /push. Sent again after a lost answer: the transactionIds make it idempotent."""
    return Call("POST", f"{API}/push", push_results, json={"items": items})


def messages_of(doc: Any) -> list[Message]:
    return [] if doc is None else [Message.from_json(m) for m in doc["messages"]]


def subscription_params(subscription: str | dt.datetime | None) -> dict[str, str]:
    """subscription: 'all' | 'new' | a start time (datetime or ISO string)."""
    if subscription is None:
        return {}
    if isinstance(subscription, dt.datetime):
        return {"subscriptionFrom": subscription.isoformat()}
    if subscription in SUBSCRIPTION_MODES:
        return {"subscriptionMode": subscription}
    return {"subscriptionFrom": subscription}


def pop(
    queue: str,
    partition: str | None = None,
    batch: int = 1,
    wait: bool = False,
    timeout: float = 30.0,
    group: str | None = None,
    subscription: str | dt.datetime | None = None,
) -> Call[list[Message]]:
    """GET /pop/queue/:queue[/partition/:partition]; timeout in seconds (long poll).

    Never sent again after a lost answer: the lost pop may have leased messages, which
    stay leased (invisible) until their lease expires.
    """
    path = f"{API}/pop/queue/{segment(queue)}"
    if partition is not None:
        path += f"/partition/{segment(partition)}"
    params = pop_fields(batch, wait, timeout, group, subscription)
    if wait:
        params["wait"] = "true"
    return Call(
        "GET", path, messages_of, params=params, resend=False, timeout=pop_limit(wait, timeout)
    )


def pop_fields(
    batch: int,
    wait: bool,
    timeout: float,
    group: str | None,
    subscription: str | dt.datetime | None,
) -> dict[str, Any]:
    """A pop's fields but its queue and partition, as JSON (an ack batch's next)."""
    fields: dict[str, Any] = {"batch": batch}
    if wait:
        fields.update(wait=True, timeout=int(timeout * 1000))
    if group is not None:
        fields["consumerGroup"] = group
    fields.update(subscription_params(subscription))
    return fields


def pop_limit(wait: bool, timeout: float) -> float:
    """Seconds a pop's answer may take (a long poll's timeout and a margin)."""
    return DEFAULT_TIMEOUT + (timeout + LONG_POLL_MARGIN if wait else 0.0)


def ack_item(
    target: MessageOrId, error: str | None = None, group: str | None = None
) -> dict[str, Any]:
    """One acknowledgment: completed, or failed with error when one is given."""
    item: dict[str, Any] = {"status": "completed" if error is None else "failed"}
    if isinstance(target, Message):
        item["transactionId"] = target.transaction_id
        if target.lease_id is not None:
            item["leaseId"] = target.lease_id
        group = group if group is not None else target.group
    else:
        item["transactionId"] = target
    if error is not None:
        item["error"] = error
    if group is not None:
        item["consumerGroup"] = group
    return item


def ack_items(acks: Iterable[AckItem], error: str | None = None) -> list[dict[str, Any]]:
    """Items of a batch ack: messages or ids (error applies), or (message, error) pairs."""
    items = []
    for a in acks:
        if isinstance(a, tuple):
            items.append(ack_item(a[0], a[1]))
        else:
            items.append(ack_item(a, error))
    return items


def ack(item: dict[str, Any]) -> Call[AckResult]:
    return Call("POST", f"{API}/ack", AckResult.from_json, json=item)


def ack_results(doc: Any) -> list[AckResult]:
    return [AckResult.from_json(r) for r in doc["results"]]


def ack_many(items: list[dict[str, Any]]) -> Call[list[AckResult]]:
    return Call("POST", f"{API}/ack/batch", ack_results, json={"acknowledgments": items})


def acks_and_messages(doc: Any) -> tuple[list[AckResult], list[Message]]:
    return ack_results(doc), messages_of(doc)


def ack_and_pop(
    items: list[dict[str, Any]],
    queue: str,
    partition: str | None = None,
    batch: int = 1,
    wait: bool = False,
    timeout: float = 30.0,
    group: str | None = None,
    subscription: str | dt.datetime | None = None,
) -> Call[tuple[list[AckResult], list[Message]]]:
    """POST /ack/batch with next: the acks, then a pop as calls.pop sends it, in one request.

    Never sent again after a lost answer (its pop may have leased messages). A pop that
    failed once the acks were applied answers no messages (nextError says why).
    """
    then = {"queue": queue, **pop_fields(batch, wait, timeout, group, subscription)}
    if partition is not None:
        then["partition"] = partition
    body = {"acknowledgments": items, "next": then}
    limit = pop_limit(wait, timeout)
    return Call(
        "POST", f"{API}/ack/batch", acks_and_messages, json=body, resend=False, timeout=limit
    )


def lease_of(target: Message | str) -> str:
    lease = target.lease_id if isinstance(target, Message) else target
    if not lease:
        raise ValueError("this message carries no leaseId")
    return lease


def extend(target: Message | str, seconds: float | None = None) -> Call[str]:
    """POST /lease/:leaseId/extend; returns the new leaseExpiresAt (seconds rounded up)."""
    body = None if seconds is None else {"seconds": max(1, math.ceil(seconds))}
    path = f"{API}/lease/{segment(lease_of(target))}/extend"
    return Call("POST", path, lambda doc: str(doc["leaseExpiresAt"]), json=body)


def camel(name: str) -> str:
    """lease_time -> leaseTime."""
    return re.sub(r"_([a-z])", lambda m: m.group(1).upper(), name)


def configure(
    queue: str, namespace: str | None = None, task: str | None = None, **options: Any
) -> Call[dict[str, Any]]:
    """POST /configure; snake_case options become the API's camelCase ones."""
    body: dict[str, Any] = {"queue": queue, "options": {camel(k): v for k, v in options.items()}}
    if namespace is not None:
        body["namespace"] = namespace
    if task is not None:
        body["task"] = task
    return Call("POST", f"{API}/configure", lambda doc: doc["options"], json=body)


def subscribe(
    group: str, queue: str, subscription: str | dt.datetime | None = None
) -> Call[dict[str, Any]]:
    """PUT /consumer-groups/:group: subscribe group to queue as its first pop would."""
    body: dict[str, Any] = {"queue": queue, **subscription_params(subscription)}
    return Call("PUT", f"{API}/consumer-groups/{segment(group)}", lambda doc: doc, json=body)


def transaction(operations: list[dict[str, Any]]) -> Call[list[Any]]:
    """POST /transaction: all operations or none. Sent again after a lost answer: one
    that committed before is answered as already applied (its pushes name their
    transactionIds, as push_items gives them)."""
    return Call(
        "POST",
        f"{API}/transaction",
        lambda doc: list(doc["results"]),
        json={"operations": operations},
    )


def get(path: str, key: str | None = None, **params: Any) -> Call[Any]:
    """A GET of the API (None-valued params left out); key picks one field of the answer."""
    given = {k: v for k, v in params.items() if v is not None}
    return Call(
        "GET",
        f"{API}{path}",
        (lambda doc: doc[key]) if key else (lambda doc: doc),
        params=given or None,
    )


def post(path: str, body: Any = None, **params: Any) -> Call[Any]:
    given = {k: v for k, v in params.items() if v is not None}
    return Call("POST", f"{API}{path}", lambda doc: doc, json=body, params=given or None)


def delete(path: str, **params: Any) -> Call[Any]:
    given = {k: v for k, v in params.items() if v is not None}
    return Call("DELETE", f"{API}{path}", lambda doc: doc, params=given or None)


def messages(
    queue: str | None = None,
    partition: str | None = None,
    status: str | None = None,
    limit: int = 100,
    offset: int = 0,
) -> Call[list[dict[str, Any]]]:
    return get(
        "/messages",
        "messages",
        queue=queue,
        partition=partition,
        status=status,
        limit=limit,
        offset=offset,
    )


def stats(queue: str | None = None) -> Call[Any]:
    """GET /analytics/queue/:queue (one queue) or /analytics/queues (a list)."""
    if queue is None:
        return get("/analytics/queues", "queues")
    return get(f"/analytics/queue/{segment(queue)}")


def seek(group: str, queue: str, to: str | dt.datetime) -> Call[Any]:
    """POST /consumer-groups/:group/seek; to: 'beginning' | 'end' | a time."""
    when = to.isoformat() if isinstance(to, dt.datetime) else to
    return post(f"/consumer-groups/{segment(group)}/seek", {"queue": queue, "to": when})
