"""Consumer groups of the cursor store: list, describe, seek, delete (over the pool).

Backlogs are counted, never estimated, but only up to a cap of messages per partition
(queen.cursor_backlog): a request reads at most partitions x cap index entries, however
long the backlog. Past the cap a count is a lower bound and says so (`capped`).
"""

from __future__ import annotations

import datetime as dt

from queen.store import cursors
from queen.store.db import Database

LIST_CAP = 1_000  # messages counted per partition and group in a listing
DETAIL_CAP = 10_000  # ... in the description of one group


class ConsumerGroups:
    """What the consumer-group routes ask of the cursor store."""

    def __init__(self, db: Database) -> None:
        self.db = db

    def summaries(
        self, queue: str | None = None, group: str | None = None
    ) -> list[cursors.GroupSummary]:
        """One summary per (group, queue), of one queue or every queue."""
        with self.db.connection() as conn:
            return cursors.group_summaries(conn, queue, group, LIST_CAP)

    def partitions(self, group: str, queue: str | None = None) -> list[cursors.GroupPartition]:
        """The group in every partition of its queues (or of queue); [] when unknown there."""
        with self.db.connection() as conn:
            return cursors.group_partitions(conn, group, queue, DETAIL_CAP)

    def seek(
        self, queue: str, group: str, to: cursors.SeekTarget, at: dt.datetime | None = None
    ) -> int | None:
        """Move group's cursors on queue; the partitions moved, None for an unknown queue.

        A group that has not read the queue yet joins it there (mode 'all', then moved).
        """
        with self.db.connection() as conn, conn.transaction():
            return cursors.seek(conn, queue, group, to, at)

    def delete(self, group: str, queue: str | None = None) -> dict[str, int]:
        """Forget group on queue (None: on every queue); {queue: cursors dropped}, {} when
        the group was not there."""
        with self.db.connection() as conn, conn.transaction():
            queues = [q for q in cursors.group_queues(conn, group) if queue in (None, q)]
            return {q: cursors.delete_group(conn, q, group) for q in queues}
