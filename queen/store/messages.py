"""Push, pop and ack: the hot paths, one database call each."""

from __future__ import annotations

import dataclasses
from typing import Any

import orjson
from psycopg.rows import class_row

from queen import crypto
from queen.errors import InvalidInput
from queen.models import AckResult, Popped, PopRoute, PushResult
from queen.store.db import Database
from queen.store.polling import PushWakeups
from queen.store.queues import Queues

POP_QUERIES = {"partition": "pop_partition", "queue": "pop_queue", "filter": "pop_filtered"}


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

    def push(self, body: bytes | str, items: list[dict[str, Any]]) -> list[PushResult]:
        """Store validated items; body is the raw request ({"items": [...]}) they came from."""
        secret = self._secret_items(items) if self.queues.any_encrypted() else None
        if secret is not None or _claims_encrypted(body, items):
            body = self._seal(items, secret)
        rows = self.db.fetch("push", {"body": body if isinstance(body, str) else body.decode()})
        self.after_push(items)
        return [PushResult(*row) for row in rows]

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

    def pop(self, route: PopRoute, batch: int, worker: str) -> list[Popped]:
        """Claim up to batch messages for route; an empty list when none is available."""
        params = {
            "batch": batch,
            "worker": worker,
            "queue": route.queue,
            "partition": route.partition,
            "namespace": route.namespace,
            "task": route.task,
        }
        rows = self.db.fetch(POP_QUERIES[route.kind], params, class_row(Popped), raw_json=True)
        return [self._decrypt(row) if row.encrypted else row for row in rows]

    def _decrypt(self, message: Popped) -> Popped:
        if self._key is None:
            raise InvalidInput("message is encrypted but QUEEN_ENCRYPTION_KEY is not set")
        plain = crypto.decrypt(self._key, orjson.loads(message.payload))
        return dataclasses.replace(message, payload=plain.decode())

    def ack(self, acks: list[dict[str, Any]]) -> list[AckResult]:
        """Apply validated acknowledgments; one result per item, in order."""
        rows = self.db.fetch("ack", {"acks": orjson.dumps(acks).decode()})
        return [AckResult(*row) for row in rows]
