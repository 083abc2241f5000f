"""POST /transaction: acks and pushes, applied together or not at all.

Body: {"operations": [{"type": "ack", "transactionId", "status", "error"?,
"consumerGroup"?, "leaseId"?, "partitionId"?} | {"type": "push", "items": [...]}, ...]}.
At most max_batch operations, and at most max_batch acks and push items together (the
limits of one push or one ack batch). 200 {"committed": true, "success": true, "results":
[one per operation]}; with "alreadyApplied": true when an earlier sending of the same
transaction committed it (nothing changed now).
An operation that cannot be applied fails the whole request, naming it:
{"error": "operations[i]...", "operation": i} with 400 (invalid), 404 (unknown
message), 409 (an ack's "reason": not_leased, lease_expired, leased_by_other,
already_completed, already_failed), 413 (too many) or 429 (queue full).
"""

from __future__ import annotations

import uuid
from typing import Any

import falcon

from queen.api import auth, read_body, send_json, validation
from queen.api.groups import group_name
from queen.auth import Permission
from queen.dashboard import formats
from queen.dashboard.hub import SILENT, Publisher
from queen.errors import (
    Conflict,
    InvalidInput,
    NotFound,
    OperationFailed,
    PayloadTooLarge,
    QueenError,
    QueueFull,
)
from queen.store import Store
from queen.store.lifecycle import QUEUE_MODE, CheckedAck, PushOutcome
from queen.store.transactions import AckOperation, Operation, PushOperation, Result

# The HTTP status of a failed operation, by the error it is (as queen.app maps them).
STATUS_OF: dict[type[QueenError], int] = {
    InvalidInput: 400,
    NotFound: 404,
    Conflict: 409,
    PayloadTooLarge: 413,
    QueueFull: 429,
}


ACK_FIELDS = ("transactionId", "status", "error")


def _where(index: int, message: str) -> str:
    """Put an operation's place in front of a validation message ("body.x ..." / "items[..")."""
    rest = message.removeprefix("body")
    return f"operations[{index}]{rest if rest[:1] in ('.', '[') else ': ' + rest}"


def _ack(op: dict[str, Any], index: int) -> AckOperation:
    try:
        # The plain fields as an ack checks them; group and lease are checked here.
        ack = validation.acknowledgment({k: op.get(k) for k in ACK_FIELDS})
    except InvalidInput as exc:
        raise OperationFailed(index, InvalidInput, _where(index, exc.message)) from None
    group = op.get("consumerGroup")
    if group is not None:
        try:
            ack["consumerGroup"] = group_name(group, "consumerGroup")
        except InvalidInput as exc:
            raise OperationFailed(index, InvalidInput, _where(index, exc.message)) from None
    lease = op.get("leaseId")
    if lease is not None:
        ack["leaseId"] = _lease_id(lease, index)
    try:
        validation.partition_id(op.get("partitionId"), "partitionId")
    except InvalidInput as exc:
        raise OperationFailed(index, InvalidInput, _where(index, exc.message)) from None
    return AckOperation(index, ack)


def _lease_id(value: Any, index: int) -> str:
    try:
        return str(uuid.UUID(value))
    except (TypeError, ValueError, AttributeError):
        raise OperationFailed(
            index, InvalidInput, f"operations[{index}].leaseId must be a UUID"
        ) from None


def _push(op: dict[str, Any], index: int, raw: bytes, max_items: int) -> PushOperation:
    try:
        items = validation.push_items({"items": op.get("items")}, raw, max_items)
    except (InvalidInput, PayloadTooLarge) as exc:
        raise OperationFailed(index, type(exc), _where(index, exc.message)) from None
    return PushOperation(index, items)


def operations(doc: dict[str, Any], raw: bytes, max_items: int) -> list[Operation]:
    """Check a transaction body; raise OperationFailed naming the first bad operation."""
    ops = doc.get("operations")
    if not isinstance(ops, list) or not ops:
        raise InvalidInput("operations must be a non-empty array")
    if len(ops) > max_items:
        raise PayloadTooLarge(f"at most {max_items} operations per transaction, got {len(ops)}")
    parsed: list[Operation] = []
    acked: dict[tuple[str, str], int] = {}
    size = 0
    for index, op in enumerate(ops):
        kind = op.get("type") if isinstance(op, dict) else None
        if kind == "ack":
            ack = _ack(op, index)
            key = (ack.ack["transactionId"], ack.ack.get("consumerGroup") or QUEUE_MODE)
            if key in acked:
                raise OperationFailed(
                    index,
                    InvalidInput,
                    f"operations[{index}] acknowledges the message of operations[{acked[key]}]"
                    " again",
                )
            acked[key] = index
            parsed.append(ack)
            size += 1
        elif kind == "push":
            push = _push(op, index, raw, max_items)
            parsed.append(push)
            size += len(push.items)
        else:
            raise OperationFailed(
                index,
                InvalidInput,
                f"operations[{index}] must be an object with type 'ack' or 'push'",
            )
        if size > max_items:
            raise PayloadTooLarge(
                f"at most {max_items} acknowledgments and push items per transaction"
            )
    return parsed


def authorize(req: falcon.Request, store: Store, ops: list[Operation]) -> None:
    """Each operation needs its own right: push ops push, ack ops consume, on their queues."""
    principal = auth.principal_of(req)
    if principal is None:
        return
    acks = [op for op in ops if isinstance(op, AckOperation)]
    pushes = [op for op in ops if isinstance(op, PushOperation)]
    for needed, present in ((Permission.PUSH, pushes), (Permission.CONSUME, acks)):
        if present and not principal.may(needed):
            raise auth.forbidden(
                f"role {principal.role} may not {needed.value} in a transaction"
                f" (operations[{present[0].index}])"
            )
    if principal.scoped:
        auth.check_queues(req, (item["queue"] for op in pushes for item in op.items))
        if acks:
            txids = [op.ack["transactionId"] for op in acks]
            auth.check_queues(req, store.transactions.queues_of(txids))


def result_json(result: Result) -> dict[str, Any]:
    if isinstance(result, CheckedAck):
        doc: dict[str, Any] = {
            "type": "ack",
            "transactionId": result.transaction_id,
            "consumerGroup": result.consumer_group,
            "status": result.status,
        }
        if result.status == "retry_scheduled":
            doc["retryCount"] = result.retry_count
        if result.reason is not None:
            doc["reason"] = result.reason
        return doc
    return {"type": "push", "messages": [push_json(r) for r in result]}


def push_json(r: PushOutcome) -> dict[str, Any]:
    return {"id": r.id, "transactionId": r.transaction_id, "status": r.status}


class TransactionResource:
    """POST /transaction"""

    def __init__(self, store: Store, max_batch: int, hub: Publisher = SILENT) -> None:
        self.store = store
        self.max_batch = max_batch
        self.hub = hub

    def on_post(self, req: falcon.Request, resp: falcon.Response) -> None:
        raw = read_body(req)
        try:
            ops = operations(validation.parse_json_object(raw), raw, self.max_batch)
            authorize(req, self.store, ops)
            principal = auth.principal_of(req)
            producer = principal.name if principal is not None else None
            results, already_applied = self.store.transactions.commit(ops, producer)
        except OperationFailed as exc:
            doc: dict[str, Any] = {"error": exc.message, "operation": exc.index}
            if exc.code is not None:
                doc["reason"] = exc.code
            send_json(resp, doc, STATUS_OF.get(exc.reason, 400))
            return
        # (success: the same, for clients of the original Queen, which read that.)
        answer: dict[str, Any] = {"committed": True, "success": True}
        if already_applied:
            answer["alreadyApplied"] = True
        else:
            self._publish(ops, results)
            pushed = [r for res in results if isinstance(res, list) for r in res]
            req.context.messages = ("pushed", sum(r.status == "queued" for r in pushed))
        answer["results"] = [result_json(r) for r in results]
        send_json(resp, answer)

    def _publish(self, ops: list[Operation], results: list[Result]) -> None:
        """Tell dashboards what the transaction did, as a push and an ack batch would."""
        items = [item for op in ops if isinstance(op, PushOperation) for item in op.items]
        if items:
            pushed = [r for res in results if isinstance(res, list) for r in res]
            self.hub.publish(formats.PUSHED, items, pushed)
        acks = [op.ack for op in ops if isinstance(op, AckOperation)]
        if acks:
            acked = [r for r in results if isinstance(r, CheckedAck)]
            self.hub.publish(formats.ACKED, acks, acked)
