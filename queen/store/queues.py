"""Queue configuration and the per-process cache of queue flags."""

from __future__ import annotations

import threading
import time
from typing import Any, NamedTuple

from psycopg.rows import dict_row

from queen.models import QUEUE_OPTIONS
from queen.store.db import Database

FLAGS_TTL = 2.0  # seconds a cached view of queue flags is trusted


class QueueFlags(NamedTuple):
    encrypted: bool
    max_wait_s: int  # 0 = no cap


class Queues:
    """Create and configure queues."""

    def __init__(self, db: Database) -> None:
        self.db = db
        self._flags: dict[str, QueueFlags] = {}
        self._flags_at = float("-inf")
        self._flags_lock = threading.Lock()

    def configure(
        self, name: str, namespace: str | None, task: str | None, options: dict[str, Any]
    ) -> dict[str, Any]:
        """Create the queue if needed, set the given options, return its row."""
        params: dict[str, Any] = {option.column: None for option in QUEUE_OPTIONS}
        params.update(name=name, namespace=namespace, task=task, **options)
        with self.db.connection() as conn, conn.transaction():
            conn.execute(self.db.queries["create_queue"], {"name": name})
            cur = conn.cursor(row_factory=dict_row)
            cur.execute(self.db.queries["configure_queue"], params)
            row = cur.fetchone()
        assert row is not None
        self._flags_at = float("-inf")  # this process sees its own change at once
        return row

    def exists(self, name: str) -> bool:
        """Tell whether the queue exists (read now, not from the flags' cache)."""
        return bool(self.db.fetch("queue_exists", {"name": name})[0][0])

    def flags(self, name: str) -> QueueFlags | None:
        """Return the cached flags of a queue (refreshed every FLAGS_TTL seconds)."""
        if time.monotonic() - self._flags_at > FLAGS_TTL:
            with self._flags_lock:
                if time.monotonic() - self._flags_at > FLAGS_TTL:
                    rows = self.db.fetch("queue_flags")
                    self._flags = {r[0]: QueueFlags(r[1], r[2]) for r in rows}
                    self._flags_at = time.monotonic()
        return self._flags.get(name)

    def any_encrypted(self) -> bool:
        """Tell whether some queue stores encrypted payloads (cheap: uses the cache)."""
        self.flags("")
        return any(flag.encrypted for flag in self._flags.values())
