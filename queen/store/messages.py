"""Push, pop and ack: the hot paths, one database call each."""

from __future__ import annotations

import functools
import uuid
from typing import Any

import orjson
from psycopg import Cursor
from psycopg.rows import RowMaker

from queen import crypto
from queen.errors import InvalidInput
from queen.models import AckResult, Popped, PopRoute, PushResult
from queen.store.db import LARGE_CALL_BYTES, Database
from queen.store.giveback import GiveBacks
from queen.store.polling import PushWakeups
from queen.store.queues import Queues

POP_QUERIES = {"partition": "pop_partition", "queue": "pop_queue", "filter": "pop_filtered"}

POPPED_COLUMNS = list(Popped._fields)


# Row factories for the hot paths. psycopg calls the row maker they return once per row;
# tuple.__new__ builds a NamedTuple record in C, where NamedTuple._make runs Python code
# and psycopg's class_row also builds a dict of column names per row. tuple.__new__ does
# not count the values, so the factories check the columns, once per query.
# (They read the result's own column count and names: cursor.description builds a Column
# object per column, about 11 us for a pop's 14.)
def _records(record: type[Any], cursor: Cursor[Any]) -> RowMaker[Any]:
    """Make record from each row's values, which are its fields in order."""
    result = cursor.pgresult
    width = result.nfields if result is not None else 0
    if width != len(record._fields):
        raise TypeError(f"{record.__name__} takes {len(record._fields)} values, not {width}")
    return functools.partial(tuple.__new__, record)


def _push_results(cursor: Cursor[Any]) -> RowMaker[PushResult]:
    """Make a PushResult from each row of push (its SELECT list is in field order)."""
    return _records(PushResult, cursor)


def _ack_results(cursor: Cursor[Any]) -> RowMaker[AckResult]:
    """Make an AckResult from each row of ack (its SELECT list is in field order)."""
    return _records(AckResult, cursor)


def _popped(cursor: Cursor[Any]) -> RowMaker[Popped]:
    """Make a Popped from each row of a pop; columns are matched by name once per query."""
    result = cursor.pgresult
    names = (
        [] if result is None else [(result.fname(i) or b"").decode() for i in range(result.nfields)]
    )
    if names == POPPED_COLUMNS:
        return _records(Popped, cursor)
    return lambda values: Popped(**dict(zip(names, values, strict=True)))


def _large_payload(rows: list[Popped]) -> bool:
    """Tell whether a popped message is over LARGE_CALL_BYTES (its connection is then retired)."""
    return any(len(row.payload) > LARGE_CALL_BYTES for row in rows)


def _claims_encrypted(body: bytes | str, items: list[dict[str, Any]]) -> bool:
    """Tell whether a client sent the store's own `encrypted` marker (it must not count)."""
    marker = b'"encrypted"' if isinstance(body, bytes) else '"encrypted"'
    return marker in body and any("encrypted" in item for item in items)  # type: ignore[operator]


class Messages:
    """The message lifecycle: push, pop (claim under a lease) and ack."""

    def __init__(self, db: Database, queues: Queues, encryption_key: str = "") -> None:
        self.db = db
        self.queues = queues
        self._key = crypto.load_key(encryption_key) if encryption_key else None
        # Wakes long polls once a push committed (the session defers it: see db.py).
        self.after_push = PushWakeups(db).pushed
        self.give_backs = GiveBacks(db)

    def push(
        self, body: bytes | str, items: list[dict[str, Any]], producer: str | None = None
    ) -> list[PushResult]:
        """Store validated items; body is the raw request ({"items": [...]}) they came from.

        producer: the name of the token that pushed them, kept on each message.
        """
        secret = self._secret_items(items) if self.queues.any_encrypted() else None
        if secret is not None or _claims_encrypted(body, items):
            body = self._seal(items, secret)
        params = {"body": body if isinstance(body, str) else body.decode(), "producer": producer}
        results = self.db.fetch("push", params, _push_results)
        self.after_push(items)
        return results

    def _secret_items(self, items: list[dict[str, Any]]) -> list[bool] | None:
        """Tell which items go to encrypted queues (None when none does)."""
        secret = [bool((f := self.queues.flags(i["queue"])) and f.encrypted) for i in items]
        return secret if any(secret) else None

    def _seal(self, items: list[dict[str, Any]], secret: list[bool] | None) -> bytes:
        """Rebuild the body: encrypt what goes to encrypted queues; only this sets `encrypted`."""
        if secret is not None and self._key is None:
            raise InvalidInput("queue is encrypted but QUEEN_ENCRYPTION_KEY is not set")
        sealed = []
        for item, is_secret in zip(items, secret or [False] * len(items), strict=True):
            clean = {k: v for k, v in item.items() if k != "encrypted"}
            if is_secret:
                assert self._key is not None
                clean["payload"] = crypto.encrypt(self._key, orjson.dumps(item["payload"]))
                clean["encrypted"] = True
            sealed.append(clean)
        return orjson.dumps({"items": sealed})

    def pop(
        self, route: PopRoute, batch: int, worker: str, prefer: str | None = None
    ) -> list[Popped]:
        """Claim up to batch messages for route; an empty list when none is available.

        prefer: for a route by queue, a partition of it to try first (in the same call).
        The lease id is drawn here, so that a claim whose answer is lost with the
        connection can be given back without counting a retry (GiveBacks).
        """
        lease = uuid.uuid4()
        query = POP_QUERIES[route.kind]
        partition = route.partition
        if prefer is not None and route.kind == "queue":
            query, partition = "pop_queue_preferring", prefer
        params = {
            "batch": batch,
            "worker": worker,
            "queue": route.queue,
            "partition": partition,
            "namespace": route.namespace,
            "task": route.task,
            "lease": lease,
        }
        lost = functools.partial(self.give_backs.add, lease)
        rows = self.db.fetch(
            query, params, _popped, raw_json=True, on_lost=lost, large=_large_payload
        )
        return [self._decrypt(row) if row.encrypted else row for row in rows]

    def _decrypt(self, message: Popped) -> Popped:
        if self._key is None:
            raise InvalidInput("message is encrypted but QUEEN_ENCRYPTION_KEY is not set")
        plain = crypto.decrypt(self._key, orjson.loads(message.payload))
        return message._replace(payload=plain.decode())

    def ack(self, acks: list[dict[str, Any]]) -> list[AckResult]:
        """Apply validated acknowledgments; one result per item, in order."""
        return self.db.fetch("ack", {"acks": orjson.dumps(acks).decode()}, _ack_results)
