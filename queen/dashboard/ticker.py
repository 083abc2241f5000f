"""Periodic, cluster-wide dashboard events computed from one database snapshot per period."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

from queen.dashboard import formats
from queen.dashboard.formats import Event
from queen.errors import QueenError
from queen.store.dashboard import Dashboard, PartitionDepth

log = logging.getLogger(__name__)

PartitionKey = tuple[str, str | None]


class Ticker:
    """Turn depth snapshots into queue.depth, partition.depth, queue.created and system.stats.

    - queue.depth: every queue, every period.
    - partition.depth: the partitions whose counts changed since the previous snapshot
      (all of them on the first one), so thousands of idle partitions cost nothing.
    - queue.created: queues that appeared since the previous snapshot.
    """

    def __init__(self, store: Dashboard, clock: Callable[[], float] = time.monotonic) -> None:
        self.store = store
        self.clock = clock
        self.failing = False
        self.reset()

    def reset(self) -> None:
        """Forget what was seen (nobody is watching; the next snapshot is a fresh start)."""
        self._rows: list[PartitionDepth] | None = None
        self._taken_at = float("-inf")
        self._timestamp = ""
        self._queue_events: list[Event] = []
        self._partitions: dict[PartitionKey, PartitionDepth] | None = None
        self._queues: set[str] | None = None

    def depth_events(self) -> list[Event]:
        """Take a snapshot and return its events ([] when the database did not answer)."""
        try:
            rows = self.store.depths()
        except QueenError as exc:
            self._warn(exc)
            return []
        self.failing = False
        self._rows, self._taken_at, self._timestamp = rows, self.clock(), formats.now_iso()
        self._queue_events = formats.queue_depths(rows)
        return self._created(rows) + self._queue_events + self._changed(rows)

    def _created(self, rows: list[PartitionDepth]) -> list[Event]:
        previous, self._queues = self._queues, {row.queue for row in rows}
        if previous is None:
            return []
        events: dict[str, Event] = {}
        for row in rows:
            if row.queue not in previous and row.queue not in events:
                events[row.queue] = formats.queue_created(row)
        return list(events.values())

    def _changed(self, rows: list[PartitionDepth]) -> list[Event]:
        previous = self._partitions
        self._partitions = {(r.queue, r.partition): r for r in rows if r.partition is not None}
        return [
            formats.partition_depth(row)
            for key, row in self._partitions.items()
            if previous is None or previous.get(key) != row
        ]

    def stats_event(self, connections: int, dropped: int) -> Event | None:
        """Return system.stats from the last snapshot plus last minute's activity."""
        if self._rows is None:
            return None
        try:
            recent = self.store.recent()
        except QueenError as exc:
            self._warn(exc)
            return None
        return formats.system_stats(
            self._rows, recent.created, recent.completed, connections, dropped
        )

    def replay(self, max_age_s: float) -> tuple[list[Event], str]:
        """Return the last queue.depth events and their timestamp, if not older than max_age_s."""
        if self.clock() - self._taken_at > max_age_s:
            return [], ""
        return self._queue_events, self._timestamp

    def _warn(self, exc: QueenError) -> None:
        if not self.failing:
            log.warning("dashboard snapshot failed: %s (%r)", exc.message, exc.__cause__)
        self.failing = True
