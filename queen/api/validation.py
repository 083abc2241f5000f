"""Parse and check request input; raise InvalidInput with a message a client can act on."""

from __future__ import annotations

import datetime as dt
import re
import uuid
from collections.abc import Mapping
from typing import Any, Literal, overload

import orjson

from queen.errors import InvalidInput, PayloadTooLarge
from queen.models import OPTIONS_BY_NAME

NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._:@-]{0,127}")  # matched whole (fullmatch)
NAME_RULE = "1-128 characters: letters, digits and . _ : @ - (not first)"
MAX_TRANSACTION_ID = 255
MAX_ERROR_TEXT = 10_000
MAX_INT = 2**31 - 1
INTEGER = re.compile(r"-?[0-9]{1,10}")  # matched whole; ASCII digits only
SUBSCRIPTION_MODES = ("all", "new")
TRUE = {"true", "1", "yes"}
FALSE = {"false", "0", "no"}


def parse_json_object(body: bytes) -> dict[str, Any]:
    """Decode a request body that must be a JSON object."""
    if not body:
        raise InvalidInput("request body is required")
    try:
        doc = orjson.loads(body)
    except orjson.JSONDecodeError as exc:
        raise InvalidInput(f"malformed JSON: {exc}") from exc
    if not isinstance(doc, dict):
        raise InvalidInput("request body must be a JSON object")
    return doc


@overload
def name(value: Any, field: str, *, required: Literal[True] = True) -> str: ...
@overload
def name(value: Any, field: str, *, required: bool) -> str | None: ...
def name(value: Any, field: str, *, required: bool = True) -> str | None:
    """Check a queue, partition, namespace or task name."""
    if value is None and not required:
        return None
    if not isinstance(value, str):
        raise InvalidInput(f"{field} must be a string")
    if not NAME.fullmatch(value):
        raise InvalidInput(f"invalid {field} {value[:64]!r}: {NAME_RULE}")
    return value


def _items(doc: Mapping[str, Any], key: str, max_items: int) -> list[Any]:
    items = doc.get(key)
    if not isinstance(items, list):
        raise InvalidInput(f"{key} must be an array")
    if not items:
        raise InvalidInput(f"{key} must not be empty")
    if len(items) > max_items:
        raise PayloadTooLarge(f"at most {max_items} {key} per request, got {len(items)}")
    return items


def _transaction_id_problem(value: Any) -> str | None:
    """Say what is wrong with a transactionId ("must be ..."), or None when it is valid."""
    if not isinstance(value, str) or not value:
        return "must be a non-empty string"
    if len(value) > MAX_TRANSACTION_ID:
        return f"is longer than {MAX_TRANSACTION_ID} characters"
    if "\x00" in value:
        return "must not contain NUL"
    return None


def _has_nul(value: Any) -> bool:
    if isinstance(value, str):
        return "\x00" in value
    if isinstance(value, dict):
        return any("\x00" in k or _has_nul(v) for k, v in value.items())
    if isinstance(value, list):
        return any(_has_nul(v) for v in value)
    return False


def push_items(doc: Mapping[str, Any], raw: bytes, max_items: int) -> list[dict[str, Any]]:
    """Check a push body: {"items": [{"queue", "partition"?, "payload", "transactionId"?}]}.

    Error messages name the field (items[i].queue); they are only formatted for an
    error, and the names of a batch, which mostly repeat, are each checked once.
    """
    items = _items(doc, "items", max_items)
    may_hold_nul = b"\\u0000" in raw  # PostgreSQL jsonb cannot store NUL
    valid_names: set[str] = set()
    for i, item in enumerate(items):
        if not isinstance(item, dict):
            raise InvalidInput(f"items[{i}] must be an object")
        queue = item.get("queue")
        if not (type(queue) is str and queue in valid_names):  # unhashable values get here too
            valid_names.add(name(queue, f"items[{i}].queue"))
        partition = item.get("partition")
        if partition is not None and not (type(partition) is str and partition in valid_names):
            valid_names.add(name(partition, f"items[{i}].partition"))
        if "payload" not in item:
            raise InvalidInput(f"items[{i}].payload is required")
        txid = item.get("transactionId")
        if txid is not None and (problem := _transaction_id_problem(txid)):
            raise InvalidInput(f"items[{i}].transactionId {problem}")
        if may_hold_nul and _has_nul(item["payload"]):
            raise InvalidInput(f"items[{i}].payload must not contain NUL characters (\\u0000)")
    return items


def acknowledgments(doc: Mapping[str, Any], max_items: int) -> list[dict[str, Any]]:
    """Check an ack batch: {"acknowledgments": [{"transactionId", "status", "error"?,
    "consumerGroup"?, "leaseId"?, "partitionId"?}], "consumerGroup"?}.

    The body's consumerGroup is that of the items that name none (an item's own wins).
    """
    items = _items(doc, "acknowledgments", max_items)
    acks = [_acknowledgment(item, i) for i, item in enumerate(items)]
    group = doc.get("consumerGroup")
    if group is not None:
        group = name(group, "consumerGroup")
        for ack in acks:
            ack.setdefault("consumerGroup", group)
    return acks


NEXT_FIELDS = (
    "queue", "partition", "namespace", "task", "consumerGroup", "subscriptionMode",
    "subscriptionFrom", "batch", "wait", "timeout",
)


def next_pop(doc: Mapping[str, Any]) -> dict[str, str] | None:
    """Read an ack batch's "next": the pop to run once its acks are applied, named as the
    pop routes' query parameters (queue and partition as in their paths); None without one.

    Returns those fields as query parameters are (text), for the pop's own checks.
    """
    pop = doc.get("next")
    if pop is None:
        return None
    if not isinstance(pop, dict):
        raise InvalidInput("next must be an object (the pop to run after the acks)")
    unknown = sorted(set(pop) - set(NEXT_FIELDS))
    if unknown:
        fields = ", ".join(NEXT_FIELDS)
        raise InvalidInput(f"next: unknown field {unknown[0][:64]!r} (fields: {fields})")
    params: dict[str, str] = {}
    for key, value in pop.items():
        if value is None:
            continue
        if key in ("batch", "timeout"):
            if type(value) is not int:
                raise InvalidInput(f"next.{key} must be an integer")
            params[key] = str(value)
        elif key == "wait":
            if type(value) is not bool:
                raise InvalidInput("next.wait must be true or false")
            params[key] = "true" if value else "false"
        elif not isinstance(value, str):
            raise InvalidInput(f"next.{key} must be a string")
        else:
            params[key] = value
    if "partition" in params and "queue" not in params:
        raise InvalidInput("next.partition needs next.queue")
    if "queue" in params and ("namespace" in params or "task" in params):
        raise InvalidInput("next: give a queue, or namespace / task, not both")
    return params


def acknowledgment(item: Any) -> dict[str, Any]:
    """Check one ack: {"transactionId", "status": "completed"|"failed", "error"?,
    "consumerGroup"?, "leaseId"?, "partitionId"?}."""
    return _acknowledgment(item, None)


def _acknowledgment(item: Any, index: int | None) -> dict[str, Any]:
    """Check one ack, the body's own or acknowledgments[index] of a batch.

    consumerGroup null (or absent) is queue mode.
    """
    if not isinstance(item, dict):
        raise InvalidInput(f"{_ack_where(index)} must be an object")
    txid = item.get("transactionId")
    if problem := _transaction_id_problem(txid):
        raise InvalidInput(f"{_ack_where(index)}.transactionId {problem}")
    status = item.get("status")
    if status not in ("completed", "failed"):
        raise InvalidInput(f"{_ack_where(index)}.status must be 'completed' or 'failed'")
    error = item.get("error")
    if error is not None:
        if not isinstance(error, str):
            raise InvalidInput(f"{_ack_where(index)}.error must be a string")
        error = error.replace("\x00", "")[:MAX_ERROR_TEXT]
    ack = {"transactionId": txid, "status": status, "error": error}
    group = item.get("consumerGroup")
    if group is not None:
        ack["consumerGroup"] = name(group, f"{_ack_where(index)}.consumerGroup")
    lease = item.get("leaseId")
    if lease is not None:
        ack["leaseId"] = str(_uuid(lease, f"{_ack_where(index)}.leaseId"))
    partition_id(item.get("partitionId"), f"{_ack_where(index)}.partitionId")
    return ack


def partition_id(value: Any, field: str) -> uuid.UUID | None:
    """Check a message's partitionId, which clients of the original Queen send with it.

    A transactionId is unique in the whole server, so it alone names the message: the
    partition's id is checked for form only (docs/DECISIONS.md).
    """
    return None if value is None else _uuid(value, field)


def _uuid(value: Any, field: str) -> uuid.UUID:
    if isinstance(value, str):
        try:
            return uuid.UUID(value)
        except ValueError:
            pass
    raise InvalidInput(f"{field} must be a UUID")


def subscription(params: Mapping[str, Any]) -> tuple[str | None, str | None, dt.datetime | None]:
    """Read consumerGroup, subscriptionMode (all | new) and subscriptionFrom (ISO-8601)."""
    group = name(_single(params, "consumerGroup") or None, "consumerGroup", required=False)
    mode = _single(params, "subscriptionMode") or None
    since_text = _single(params, "subscriptionFrom") or None
    if mode is not None and mode not in SUBSCRIPTION_MODES:
        raise InvalidInput("subscriptionMode must be 'all' or 'new'")
    since = None
    if since_text is not None:
        if mode is not None:
            raise InvalidInput("give subscriptionMode or subscriptionFrom, not both")
        since = _timestamp(since_text, "subscriptionFrom")
    return group, mode, since


def _timestamp(text: str, field: str) -> dt.datetime:
    """Read an ISO-8601 time (2025-10-08T05:12:33Z); one without an offset is UTC."""
    try:
        value = dt.datetime.fromisoformat(text)
    except ValueError:
        raise InvalidInput(f"{field} must be an ISO-8601 time, like 2025-10-08T05:12:33Z") from None
    if value.tzinfo is None:
        value = value.replace(tzinfo=dt.UTC)
    if not dt.datetime(1970, 1, 1, tzinfo=dt.UTC) <= value <= dt.datetime(9999, 1, 1, tzinfo=dt.UTC):
        raise InvalidInput(f"{field} is out of range")
    return value


def _ack_where(index: int | None) -> str:
    """Name an acknowledgment in an error message (formatted only for errors)."""
    return "body" if index is None else f"acknowledgments[{index}]"


def queue_options(value: Any) -> dict[str, Any]:
    """Check configure options; return {column: value} for the options given."""
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise InvalidInput("options must be an object")
    columns: dict[str, Any] = {}
    for key, raw in value.items():
        option = OPTIONS_BY_NAME.get(key)
        if option is None:
            raise InvalidInput(f"unknown option {key!r}")
        if option.type is bool:
            if not isinstance(raw, bool):
                raise InvalidInput(f"option {key} must be a boolean")
        else:
            if isinstance(raw, bool) or not isinstance(raw, int):
                raise InvalidInput(f"option {key} must be an integer")
            low = -MAX_INT if key == "priority" else 0
            if not low <= raw <= MAX_INT:
                raise InvalidInput(f"option {key} must be between {low} and {MAX_INT}")
            if key == "leaseTime" and raw < 1:
                raise InvalidInput("option leaseTime must be at least 1 second")
        columns[option.column] = raw
    return columns


def _single(params: Mapping[str, Any], key: str) -> str | None:
    """Return a query parameter given at most once (Falcon lists repeated ones)."""
    raw = params.get(key)
    if raw is not None and not isinstance(raw, str):
        raise InvalidInput(f"{key} must be given once")
    return raw


def int_param(params: Mapping[str, Any], key: str, default: int, low: int, high: int) -> int:
    """Read an integer query parameter within [low, high]."""
    raw = _single(params, key)
    if raw is None or raw == "":
        return default
    if not INTEGER.fullmatch(raw):
        raise InvalidInput(f"{key} must be an integer")
    value = int(raw)
    if not low <= value <= high:
        raise InvalidInput(f"{key} must be between {low} and {high}")
    return value


def bool_param(params: Mapping[str, Any], key: str, default: bool = False) -> bool:
    """Read a boolean query parameter (true/false/1/0/yes/no)."""
    raw = _single(params, key)
    if raw is None or raw == "":
        return default
    lowered = raw.lower()
    if lowered in TRUE:
        return True
    if lowered in FALSE:
        return False
    raise InvalidInput(f"{key} must be true or false")
