"""Consumer groups: list, describe, seek, delete (over the pool).

Backlogs are counted, never estimated, but only up to a cap of messages per (group,
partition) and a budget per request, shared among its pairs (queen.backlog): a
request reads at most max(budget, pairs x 10) index entries however long the backlog.
Past its cap a count is a lower bound and says so (`capped`).
"""

from __future__ import annotations

import datetime as dt

from queen.errors import NotFound
from queen.store import lifecycle
from queen.store.db import Database

LIST_CAP = 1_000  # messages counted per partition and group in a listing, at most
LIST_BUDGET = 50_000  # ... in all, shared among its (group, partition) pairs
DETAIL_CAP = 10_000  # the same for the description of one group
DETAIL_BUDGET = 200_000


class ConsumerGroups:
    """What the consumer-group routes ask of the store."""

    def __init__(self, db: Database) -> None:
        self.db = db

    def summaries(
        self, queue: str | None = None, group: str | None = None
    ) -> list[lifecycle.GroupSummary]:
        """One summary per (group, queue), of one queue or every queue."""
        with self.db.connection() as conn:
            return lifecycle.group_summaries(conn, queue, group, LIST_CAP, LIST_BUDGET)

    def partitions(self, group: str, queue: str | None = None) -> list[lifecycle.GroupPartition]:
        """The group in every partition of its queues (or of queue); [] when unknown there."""
        with self.db.connection() as conn:
            return lifecycle.group_partitions(conn, group, queue, DETAIL_CAP, DETAIL_BUDGET)

    def seek(
        self, queue: str, group: str, to: lifecycle.SeekTarget, at: dt.datetime | None = None
    ) -> int:
        """Move group's cursors on queue; return the partitions moved.

        Raise NotFound for an unknown queue, and for a named group that has not read the
        queue yet (a seek never creates a group; its first pop does). Queue mode is
        always there.
        """
        with self.db.connection() as conn, conn.transaction():
            if group != lifecycle.QUEUE_MODE and queue not in lifecycle.group_queues(conn, group):
                (known,) = conn.execute(self.db.queries["queue_exists"], {"name": queue})
                if known[0]:
                    raise NotFound(f"consumer group {group!r} not found on queue {queue!r}")
                raise NotFound(f"queue {queue!r} not found")
            moved = lifecycle.seek(conn, queue, group, to, at)
        if moved is None:
            raise NotFound(f"queue {queue!r} not found")
        return int(moved)

    def subscribe(
        self, queue: str, group: str, mode: str | None, since: dt.datetime | None
    ) -> bool:
        """Subscribe group to queue as its first pop would; True when it was not there yet
        (a subscription already there is kept). Raise NotFound for an unknown queue."""
        params = {"queue": queue, "group": group, "mode": mode, "since": since}
        rows = self.db.fetch("group_subscribe", params)
        if not rows:
            raise NotFound(f"queue {queue!r} not found")
        return bool(rows[0][0])

    def delete(self, group: str, queue: str | None = None) -> dict[str, int]:
        """Forget group on queue (None: on every queue); {queue: cursors dropped}, {} when
        the group was not there."""
        with self.db.connection() as conn, conn.transaction():
            queues = [q for q in lifecycle.group_queues(conn, group) if queue in (None, q)]
            return {q: lifecycle.delete_group(conn, q, group) for q in queues}
