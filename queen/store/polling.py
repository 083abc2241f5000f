"""What long polling asks of the database besides the pop itself."""

from __future__ import annotations

import uuid
from collections.abc import Iterable

from queen.store.db import Database


class Polling:
    """The fallback re-check of parked polls, and giving back claims nobody received."""

    def __init__(self, db: Database) -> None:
        self.db = db

    def ready_partitions(
        self,
        queues: Iterable[str],
        partitions: Iterable[tuple[str, str]],
        filters: Iterable[tuple[str | None, str | None]],
        limit: int,
    ) -> list[str]:
        """Return wake payloads of free partitions with pending work for these routes.

        queues: routes by queue; partitions: (queue, partition) routes; filters:
        (namespace, task) routes, None matching anything.
        """
        pairs = list(partitions)
        filter_list = list(filters)
        params = {
            "queues": list(queues),
            "partition_queues": [q for q, _ in pairs],
            "partitions": [p for _, p in pairs],
            "namespaces": [ns for ns, _ in filter_list],
            "tasks": [task for _, task in filter_list],
            "limit": limit,
        }
        return [row[0] for row in self.db.fetch("ready_partitions", params)]

    def unclaim(self, lease_id: uuid.UUID, transaction_ids: list[str]) -> int:
        """Return claimed messages to pending without counting a retry; how many went back."""
        rows = self.db.fetch("unclaim", {"lease": lease_id, "transaction_ids": transaction_ids})
        return int(rows[0][0]) if rows else 0
