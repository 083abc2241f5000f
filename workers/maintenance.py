"""The maintenance process: time-driven work, done by one leader among any number of these.

Run it as `queen maintenance` or `python -m queen.workers.maintenance` (in a checkout also
`python -m workers.maintenance`; flags: `--help`).
Every process connects and tries the leader lock (a PostgreSQL session advisory lock);
the one that gets it works, the others retry every QUEEN_LEADER_POLL seconds. When the
leader dies its session ends, the lock is free and a standby takes over; a leader whose
connection breaks steps down and becomes a standby (see queen.store.maintenance).

The leader runs a small scheduler over one connection. Each task runs when due and says
when it wants to run next:

- timed: learn which queues are delayed or windowed (and listen to pushes while any are);
- leases: end expired partition leases; next run when the next lease expires;
- due: wake long polls the moment delayed/windowed messages become poppable or a
  retryDelay ends; next run when the next one becomes due, or sooner when a push into
  such a queue arrives (the session LISTENs to the push notifications while it sleeps);
- ttl: messages past their queue's ttl go to the dead letter queue, per group from its
  cursor (queue mode's too when nobody popped; pops apply the ttl as well);
- counts: move the count rollup and the per-minute activity over what arrived and was
  consumed since its last step;
- analyze: ANALYZE the message tables that changed by a tenth (new tables have no
  statistics where autovacuum is off);
- vacuum: VACUUM the small tables rewritten by every batch when they fill with dead row
  versions (autovacuum comes by once a minute at best), and large ones too when
  autovacuum is off;
- retention: delete messages past their queue's retention (docs/STORAGE.md);
- cleanup: remove partitions without messages or live leases, idle for
  QUEEN_PARTITION_CLEANUP;
- prune: drop per-minute activity older than METRICS_RETENTION_DAYS.

A run is one bounded statement (QUEEN_MAINTENANCE_BATCH rows, LEASE_BATCH leases); a
task that filled its batch runs again MORE_DELAY later, after the other due tasks, so a
backlog is worked off in short steps and the timing-sensitive tasks (leases, due) stay
punctual.
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime as dt
import logging
import os
import signal
import socket
import sys
import threading
import time
from collections.abc import Callable

from queen import logs
from queen.config import Settings, add_flags
from queen.errors import Unavailable
from queen.store.maintenance import DueScan, MaintenanceSession, TimedQueue, vacuum_apart
from queen.store.migrate import EarlierDatabase
from queen.wakeup import parse

log = logging.getLogger("queen.maintenance")

LEASE_BATCH = 100  # leases ended per statement (their acks wait while it runs)
PRUNE_EVERY = 300.0  # seconds between metric pruning runs
COUNT_PARTITIONS = 200  # partitions whose count rows one counts step refreshes
# Messages a counts step walks per partition and watermark, at most; a window no wider
# in ids is walked whole, without a walk to find where the step ends (under a steady load,
# a partition's window between two refreshes, its ids shared with the others).
COUNT_STEP = 20_000
# A partition refreshed less than COUNT_SETTLE_S ago waits for a later step unless more
# than COUNT_LAG messages arrived or were passed since: a refresh costs about as much for
# one message as for dozens, and reads count what lies past the watermarks themselves.
COUNT_SETTLE_S = 5.0
COUNT_LAG = 1000
MORE_DELAY = 0.02  # seconds before the next batch of a task that filled its batch
MIN_DELAY = 0.05  # seconds: the soonest the lease task looks again at a lease it skipped
DUE_MARGIN = 0.002  # seconds past a due time before the scan that wakes it
MAX_SLEEP = 0.5  # seconds: the loop looks at the stop flag at least this often
SUMMARY_EVERY = 60.0  # seconds between summary log lines
MAX_BACKOFF = 5.0  # seconds between reconnect attempts
MAX_BACKOFF_TASK = 60.0  # seconds, the longest a failing task waits before trying again
# VACUUM a table once it holds this many dead row versions, and this share of its live
# ones, and no vacuum (ours or autovacuum's) has run on it for VACUUM_QUIET_S seconds.
VACUUM_MIN_DEAD = 1000
VACUUM_DEAD_RATIO = 0.2
VACUUM_QUIET_S = 10.0
VACUUM_INLINE_BYTES = 64 * 1024 * 1024  # larger tables are vacuumed on a thread of their own

FLAGS = (  # Settings fields the command line can override
    "maintenance_interval_s",
    "retention_interval_s",
    "metrics_interval_s",
    "leader_poll_s",
    "partition_cleanup_s",
    "metrics_retention_days",
    "maintenance_batch",
)


@dataclasses.dataclass
class Task:
    """One kind of work: run() does a bounded step and returns the seconds until it wants
    to run again (None: after `every`)."""

    name: str
    run: Callable[[], float | None]
    every: float
    punctual: bool = False  # runs before the others when due
    next_at: float = 0.0
    failures: int = 0


class Maintenance:
    """Stand by or lead; when leading, run the tasks until stopped or the connection breaks."""

    def __init__(
        self,
        settings: Settings,
        session: MaintenanceSession | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.settings = settings
        self.name = f"queen-maintenance-{socket.gethostname()}-{os.getpid()}"
        self.session = session or MaintenanceSession(settings.dsn, application_name=self.name)
        self.clock = clock
        self.leading = False
        self.stopping = False
        self.totals: dict[str, int] = {}
        self._since_scan: dt.datetime | None = None  # DueScan.scanned_at of the last scan
        self._timed: dict[str, TimedQueue] = {}
        self._listening = False
        self._big_vacuum: threading.Thread | None = None
        self.tasks = self._make_tasks()

    def _make_tasks(self) -> list[Task]:
        s = self.settings
        cycle = s.maintenance_interval_s
        return [
            Task("timed", self._watch_timed_queues, cycle, punctual=True),
            Task("leases", self._expire_leases, cycle, punctual=True),
            Task("due", self._wake_due, cycle, punctual=True),
            Task("ttl", self._expire_ttl, cycle),
            Task("counts", self._counts, cycle),
            Task("analyze", self._analyze, cycle),
            Task("vacuum", self._vacuum, cycle),
            Task("retention", self._retention, s.retention_interval_s),
            Task("cleanup", self._cleanup, s.retention_interval_s),
            Task("prune", self._prune_metrics, max(PRUNE_EVERY, cycle)),
        ]

    # -- lifecycle -------------------------------------------------------------------

    def stop(self, *_: object) -> None:
        self.stopping = True

    def run(self) -> int:
        """Run until stop() (SIGTERM, SIGINT); return the exit code.

        A database made by an earlier build raises EarlierDatabase (nothing is done there).
        """
        backoff = 0.1
        try:
            while not self.stopping:
                try:
                    self.session.connect()
                    self.session.check_schema()
                    backoff = 0.1
                    self._stand_by_or_lead()
                except Unavailable as exc:
                    if self.leading:
                        log.warning("%s: lost the database (%s); stepping down", self.name, exc)
                    else:
                        log.warning("%s: database unavailable (%s)", self.name, exc)
                    self.leading = False
                    self.session.close()
                    self._sleep(backoff)
                    backoff = min(backoff * 2, MAX_BACKOFF)
        finally:
            self.session.close()
        log.info("%s: stopped", self.name)
        return 0

    def _stand_by_or_lead(self) -> None:
        announced = False
        while not self.stopping:
            if self.session.try_lead():
                self._lead()
                return
            if not announced:
                log.info("%s: standing by (leader: %s)", self.name, self.session.leader())
                announced = True
            deadline = self.clock() + self.settings.leader_poll_s
            while not self.stopping and self.clock() < deadline:
                self.session.wait(min(MAX_SLEEP, deadline - self.clock()))

    def _sleep(self, seconds: float) -> None:
        deadline = self.clock() + seconds
        while not self.stopping and self.clock() < deadline:
            time.sleep(min(MAX_SLEEP, max(0.0, deadline - self.clock())))

    # -- leading ---------------------------------------------------------------------

    def _lead(self) -> None:
        self.leading = True
        log.info("%s: leading", self.name)
        self._listening = False  # a new session listens to nothing yet
        self._since_scan = None  # the first scan wakes everything due now
        now = self.clock()
        for each in self.tasks:
            each.next_at = now
        summary_at = now + SUMMARY_EVERY
        while not self.stopping:
            task = self._next_task(self.clock())
            if task is not None:
                self._run_task(task)
                continue
            if self.clock() >= summary_at:
                self._log_summary()
                summary_at = self.clock() + SUMMARY_EVERY
            wake_at = min(t.next_at for t in self.tasks)
            payloads = self.session.wait(min(MAX_SLEEP, max(0.0, wake_at - self.clock())))
            self._on_pushes(payloads)

    def _next_task(self, now: float) -> Task | None:
        """Return the due task to run now: punctual ones first, then the longest waiting."""
        due = [t for t in self.tasks if t.next_at <= now]
        if not due:
            return None
        return min(due, key=lambda t: (not t.punctual, t.next_at))

    def _run_task(self, task: Task) -> None:
        """Run one step of task and schedule its next; a failing task backs off."""
        try:
            delay = task.run()
        except Unavailable as exc:
            if not self.session.connected:
                raise
            log.warning("%s failed (%s); retrying", task.name, exc)
            self._back_off(task)
            return
        except Exception:
            if not self.session.connected:
                raise Unavailable("maintenance session broke") from None
            log.exception("%s failed; retrying", task.name)
            self._back_off(task)
            return
        task.failures = 0
        wait = task.every if delay is None else min(max(delay, 0.0), task.every)
        task.next_at = self.clock() + wait

    def _back_off(self, task: Task) -> None:
        task.failures += 1
        task.next_at = self.clock() + min(task.every * 2**task.failures, MAX_BACKOFF_TASK)

    def _on_pushes(self, payloads: list[str]) -> None:
        """Schedule a due scan for when messages just pushed into timed queues can be due."""
        if not payloads or not self._timed:
            return
        due = next(t for t in self.tasks if t.name == "due")
        for payload in payloads:
            timed = self._timed.get(parse(payload).queue)
            if timed is not None:
                due.next_at = min(due.next_at, self.clock() + timed.soonest_s + DUE_MARGIN)

    def _count(self, name: str, n: int) -> None:
        if n:
            self.totals[name] = self.totals.get(name, 0) + n
            log.debug("%s: %d", name, n)

    def _log_summary(self) -> None:
        if self.totals:
            log.info(
                "%s: last %.0fs: %s",
                self.name,
                SUMMARY_EVERY,
                ", ".join(f"{k} {v}" for k, v in sorted(self.totals.items())),
            )
            self.totals = {}

    def _batch(self, step: Callable[[], int], name: str, limit: int) -> float | None:
        """Run one bounded step; ask to run again soon when it filled its batch."""
        n = step()
        self._count(name, n)
        return MORE_DELAY if n >= limit else None

    # -- tasks -----------------------------------------------------------------------

    def _expire_leases(self) -> float | None:
        result = self.session.expire_leases(LEASE_BATCH)
        self._count("leases expired", result.leases)
        self._count("messages released", result.messages)
        if result.leases >= LEASE_BATCH:
            return MORE_DELAY
        if result.next_expiry_in is None:
            return None
        return max(result.next_expiry_in + DUE_MARGIN, MIN_DELAY)

    def _wake_due(self) -> float | None:
        scan: DueScan = self.session.wake_due(self._since_scan)
        self._since_scan = scan.scanned_at
        self._count("partitions woken", scan.woken)
        if scan.next_due_in is None:
            return None
        return max(scan.next_due_in + DUE_MARGIN, 0.0)

    def _watch_timed_queues(self) -> float | None:
        """Know the delayed/windowed queues; listen to pushes only while there are some.

        Pushes notify only while some poll is parked, so the due scan also runs at least
        twice within the shortest delay or window: it then learns of every message before
        the message becomes due, notified or not.
        """
        self._timed = self.session.timed_queues()
        if bool(self._timed) != self._listening:
            self.session.listen(bool(self._timed))
            self._listening = bool(self._timed)
        due = next(t for t in self.tasks if t.name == "due")
        cycle = self.settings.maintenance_interval_s
        soonest = min((t.soonest_s for t in self._timed.values()), default=2 * cycle)
        due.every = min(cycle, soonest / 2)
        due.next_at = min(due.next_at, self.clock() + due.every)
        return None

    def _expire_ttl(self) -> float | None:
        limit = self.settings.maintenance_batch
        return self._batch(lambda: self.session.expire_ttl(limit), "ttl expired", limit)

    def _counts(self) -> float | None:
        behind = self.session.refresh_counts(
            COUNT_PARTITIONS, COUNT_STEP, COUNT_SETTLE_S, COUNT_LAG
        )
        self._count("partitions behind in counts", behind)
        return MORE_DELAY if behind else None

    def _analyze(self) -> float | None:
        for name in self.session.analyze():
            log.info("analyzed queen.%s (changed by a tenth)", name)
            self._count("tables analyzed", 1)
        return None

    def _vacuum(self) -> float | None:
        """VACUUM the tables that churn when nothing else has lately.

        Small tables (consumer rows, partitions, counts: rewritten by every batch) are
        vacuumed here, since autovacuum comes by at most once a minute, and the tables of
        names once rows were added (their new pages all-visible, for index-only reads;
        autovacuum never comes for a few inserts). A large one
        (messages) is left to autovacuum and its per-table settings, unless autovacuum is off: then it
        is vacuumed on a thread and connection of its own, one at a time, so the
        timing-sensitive tasks keep running meanwhile.
        """
        for table in self.session.vacuum_candidates(
            VACUUM_MIN_DEAD, VACUUM_DEAD_RATIO, VACUUM_QUIET_S
        ):
            if table.bytes <= VACUUM_INLINE_BYTES:
                self.session.vacuum(table.name)
                self._count("tables vacuumed", 1)
            elif not table.autovacuum and (
                self._big_vacuum is None or not self._big_vacuum.is_alive()
            ):
                self._big_vacuum = threading.Thread(
                    target=vacuum_apart,
                    args=(self.session.dsn, table.name, "queen-maintenance-vacuum"),
                    name=f"vacuum {table.name}",
                    daemon=True,
                )
                self._big_vacuum.start()
                self._count("tables vacuumed", 1)
        return None

    def _retention(self) -> float | None:
        limit = self.settings.maintenance_batch
        return self._batch(lambda: self.session.retention(limit), "messages deleted", limit)

    def _cleanup(self) -> float | None:
        limit = self.settings.maintenance_batch
        idle_s = self.settings.partition_cleanup_s
        return self._batch(
            lambda: self.session.cleanup_partitions(idle_s, limit), "partitions removed", limit
        )

    def _prune_metrics(self) -> float | None:
        limit = self.settings.maintenance_batch
        days = self.settings.metrics_retention_days
        return self._batch(
            lambda: self.session.prune_metrics(days, limit), "metric rows pruned", limit
        )


# -- command line --------------------------------------------------------------------


def build_parser() -> argparse.ArgumentParser:
    """Flags for the maintenance settings; each defaults from its environment variable."""
    parser = argparse.ArgumentParser(
        prog="queen maintenance",
        description="Run the maintenance process (one leader among any number).",
    )
    add_flags(parser, FLAGS)
    return parser


def main(argv: list[str] | None = None) -> int:
    """Parse flags (none: environment only), then run until SIGTERM/SIGINT."""
    args = build_parser().parse_args([] if argv is None else argv)
    logs.setup("maintenance")
    settings = Settings.from_env(**vars(args))
    maintenance = Maintenance(settings)
    signal.signal(signal.SIGTERM, maintenance.stop)
    signal.signal(signal.SIGINT, maintenance.stop)
    try:
        return maintenance.run()
    except EarlierDatabase as exc:
        log.error("%s", exc.message)
        return 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
