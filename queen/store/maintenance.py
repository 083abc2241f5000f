"""The maintenance process's one database session: the leader lock and the time-driven work.

Leadership and work share one dedicated connection (outside any pool). The leader lock
is a session advisory lock, so it lives exactly as long as that connection: a leader
that loses the connection has lost the lock too, and cannot act on a lock it no longer
holds, because every statement it runs goes through the same, now broken, connection.
The session also LISTENs on the notification channel, to learn of pushes into delayed
or windowed queues while it sleeps.

Every statement is bounded (a row or lease limit) and skips rows others hold
(SKIP LOCKED), so two sessions running the same work at once — a leader that has not
yet noticed it lost its connection and its successor — never do it twice.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import logging
import time
from collections.abc import Mapping
from typing import Any

import psycopg
from psycopg import sql

from queen.errors import Unavailable
from queen.store.bounds import DEADLINE_MARGIN_S, WATCHDOG, bounded_conninfo, call_deadline_s
from queen.store.db import QUERIES, RETRYABLE, returns_rows, translate_errors
from queen.store.migrate import migration_files, refuse_earlier
from queen.wakeup import CHANNEL

log = logging.getLogger(__name__)

LEADER_LOCK = 0x5155_4545_4E01  # pg_advisory_lock key of the maintenance leader
# The server ends a maintenance session idle this long (idle_session_timeout, PostgreSQL
# 14+), which frees the leader lock of a leader it cannot hear from (a frozen network
# path that still acknowledges TCP). The session runs a statement at least every
# HEARTBEAT_S, so a reachable one never idles that long.
IDLE_SESSION_S = 10
HEARTBEAT_S = 3.0


@dataclasses.dataclass(frozen=True, slots=True)
class LeaseExpiry:
    leases: int
    messages: int
    next_expiry_in: float | None  # seconds until the next lease expires; None: no lease


@dataclasses.dataclass(frozen=True, slots=True)
class DueScan:
    woken: int
    next_due_in: float | None  # seconds until the next partition becomes due; None: none
    scanned_at: dt.datetime  # pass back as `since` to the next scan


@dataclasses.dataclass(frozen=True, slots=True)
class TimedQueue:
    name: str
    delay_s: int  # delayedProcessing
    window_s: int  # windowBuffer

    @property
    def soonest_s(self) -> int:
        """Return the earliest a message pushed now can become due, in seconds."""
        return min(s for s in (self.delay_s, self.window_s) if s > 0)


@dataclasses.dataclass(frozen=True, slots=True)
class VacuumCandidate:
    name: str  # schema-qualified
    bytes: int
    autovacuum: bool  # the server's autovacuum setting


def table_statement(command: str, name: str) -> sql.Composed:
    """A utility statement on a schema-qualified table: ("VACUUM (SKIP_LOCKED)", "queen.partitions")."""
    return sql.SQL(command + " {}").format(sql.Identifier(*name.split(".")))


def vacuum_apart(dsn: str, name: str, application_name: str) -> None:
    """VACUUM one (large) table on a connection of its own, with no statement timeout."""
    try:
        with psycopg.connect(
            bounded_conninfo(dsn), autocommit=True, application_name=application_name
        ) as conn:
            conn.execute("SET statement_timeout = 0")
            conn.execute(table_statement("VACUUM (SKIP_LOCKED)", name))
    except psycopg.Error as exc:
        log.warning("vacuum of %s failed: %s", name, exc)


class MaintenanceSession:
    """One dedicated connection running the maintenance statements; not thread-safe."""

    def __init__(
        self,
        dsn: str,
        *,
        application_name: str = "queen-maintenance",
        statement_timeout_ms: int = 60000,
        lock_timeout_ms: int = 1000,
    ) -> None:
        self.dsn = dsn
        self.application_name = application_name
        self._statement_timeout_ms = statement_timeout_ms
        self._lock_timeout_ms = lock_timeout_ms
        self._conn: psycopg.Connection[Any] | None = None
        self._last_call = 0.0  # time.monotonic() when the session's last statement ended
        # Every call ends within this bound, or the session is severed (the leader steps
        # down): see "Maintenance fencing" in docs/DECISIONS.md.
        self._deadline_s = call_deadline_s(statement_timeout_ms)

    # -- connection ----------------------------------------------------------------

    @property
    def connected(self) -> bool:
        """Tell whether the session is open and has not broken."""
        return self._conn is not None and not self._conn.closed and not self._conn.broken

    def connect(self) -> None:
        """Open the session (closing any previous one); raise Unavailable on failure."""
        self.close()
        with translate_errors():
            conn = psycopg.connect(
                bounded_conninfo(self.dsn), autocommit=True, application_name=self.application_name
            )
            try:
                conn.execute(
                    QUERIES["maintenance_setup"],
                    {
                        "statement_ms": str(self._statement_timeout_ms),
                        "lock_ms": str(self._lock_timeout_ms),
                    },
                )
                if conn.info.server_version >= 140000:
                    conn.execute(
                        "SELECT set_config('idle_session_timeout', %s, false)",
                        (f"{IDLE_SESSION_S}s",),
                    )
            except BaseException:
                conn.close()
                raise
        self._conn = conn
        self._last_call = time.monotonic()

    def check_schema(self) -> None:
        """Raise EarlierDatabase for a database made by an earlier build (changing nothing)."""
        if self._conn is None:
            raise Unavailable("maintenance session is not connected")
        with translate_errors(), WATCHDOG.guard(self._conn, self._deadline_s):
            refuse_earlier(self._conn, [path.name for path in migration_files()])

    def close(self) -> None:
        """Close the session; a lock it held is released by the server."""
        conn, self._conn = self._conn, None
        if conn is not None and not conn.closed:
            try:
                conn.close()
            except psycopg.Error as exc:
                log.debug("closing the maintenance session: %s", exc)

    def _rows(
        self,
        name: str,
        params: Mapping[str, Any] | None = None,
        deadline_s: float | None = None,
    ) -> list[tuple[Any, ...]]:
        if self._conn is None:
            raise Unavailable("maintenance session is not connected")
        with translate_errors(), WATCHDOG.guard(self._conn, deadline_s or self._deadline_s):
            try:
                cur = self._conn.execute(QUERIES[name], params)
                return cur.fetchall() if returns_rows(cur) else []
            except RETRYABLE as exc:
                raise Unavailable(f"{name}: {type(exc).__name__}, retry") from exc
            finally:
                self._last_call = time.monotonic()

    def _utility(self, statement: sql.Composed) -> None:
        """Run a statement that is not a named query (ANALYZE, VACUUM) on the session."""
        if self._conn is None:
            raise Unavailable("maintenance session is not connected")
        with translate_errors(), WATCHDOG.guard(self._conn, self._deadline_s):
            try:
                self._conn.execute(statement)
            finally:
                self._last_call = time.monotonic()

    def _value(self, name: str, params: Mapping[str, Any] | None = None) -> Any:
        (row,) = self._rows(name, params)
        return row[0]

    # -- leadership ----------------------------------------------------------------

    def try_lead(self) -> bool:
        """Take the leader lock if nobody holds it; True when this session is the leader."""
        return bool(self._value("maintenance_try_lead", {"key": LEADER_LOCK}))

    def leader(self) -> str | None:
        """Return the application_name of the session that leads now, if any."""
        rows = self._rows("maintenance_leader", {"key": LEADER_LOCK})
        return str(rows[0][0]) if rows else None

    def listen(self, on: bool = True) -> None:
        """Receive the push notifications (payload 'queue/partition/namespace/task'), or stop."""
        if self._conn is None:
            raise Unavailable("maintenance session is not connected")
        statement = sql.SQL("LISTEN {}" if on else "UNLISTEN {}")
        with translate_errors(), WATCHDOG.guard(self._conn, self._deadline_s):
            self._conn.execute(statement.format(sql.Identifier(CHANNEL)))

    def wait(self, timeout_s: float) -> list[str]:
        """Sleep up to timeout_s, returning as soon as notifications arrive (their payloads).

        First a heartbeat when the session ran nothing for HEARTBEAT_S: it keeps the
        session (and a leader's lock) alive, and a leader that cannot reach the database
        learns it within the statement's deadline.
        """
        if self._conn is None:
            raise Unavailable("maintenance session is not connected")
        if time.monotonic() - self._last_call >= HEARTBEAT_S:
            self._rows("ping", deadline_s=IDLE_SESSION_S)
        timeout_s = max(0.0, min(timeout_s, HEARTBEAT_S))
        with translate_errors(), WATCHDOG.guard(self._conn, timeout_s + DEADLINE_MARGIN_S):
            return [n.payload for n in self._conn.notifies(timeout=timeout_s, stop_after=1)]

    # -- work ------------------------------------------------------------------------

    def expire_leases(self, limit: int) -> LeaseExpiry:
        (row,) = self._rows("maintenance_expire_leases", {"limit": limit})
        return LeaseExpiry(*row)

    def wake_due(self, since: dt.datetime | None) -> DueScan:
        since = since or dt.datetime.min.replace(tzinfo=dt.UTC)
        (row,) = self._rows("maintenance_wake_due", {"since": since})
        return DueScan(*row)

    def timed_queues(self) -> dict[str, TimedQueue]:
        return {r[0]: TimedQueue(*r) for r in self._rows("maintenance_timed_queues")}

    def expire_ttl(self, limit: int) -> int:
        """Dead-letter up to limit messages past their queue's ttl (every group's)."""
        return int(self._value("maintenance_expire_ttl", {"limit": limit}))

    def retention(self, limit: int) -> int:
        """Delete up to limit messages past their queue's retention."""
        return int(self._value("maintenance_retention", {"limit": limit}))

    def cleanup_partitions(self, idle_s: int, limit: int) -> int:
        params = {"idle_s": idle_s, "limit": limit}
        return int(self._value("maintenance_cleanup_partitions", params))

    def analyze(self, min_changes: int = 1000) -> list[str]:
        """ANALYZE the message tables that changed by a tenth; return their names.

        This machine's kind of server may run without autovacuum, and a table that
        starts empty and fills up is otherwise planned as if it were still empty.
        """
        return list(self._value("maintenance_analyze", {"min_changes": min_changes}))

    def vacuum_candidates(
        self, min_dead: int, dead_ratio: float, quiet_s: float
    ) -> list[VacuumCandidate]:
        """Return the tables that need a VACUUM, smallest first."""
        params = {"min_dead": min_dead, "dead_ratio": dead_ratio, "quiet_s": quiet_s}
        return [
            VacuumCandidate(r[0], int(r[1]), bool(r[2]))
            for r in self._rows("maintenance_vacuum_candidates", params)
        ]

    def vacuum(self, name: str) -> None:
        """VACUUM one table of schema queen, skipping it if someone holds it."""
        self._utility(table_statement("VACUUM (SKIP_LOCKED)", name))

    def prune_metrics(self, days: int, limit: int) -> int:
        """Delete up to limit rows of per-minute activity older than days."""
        return int(self._value("maintenance_prune_metrics", {"days": days, "limit": limit}))

    def refresh_counts(self, partitions: int, step: int, settle_s: float, lag: int) -> int:
        """Bring the count rollup up to date by a bounded step; return how many
        partitions are still behind. A partition refreshed less than settle_s ago waits
        unless more than lag messages arrived or were passed since."""
        params = {"partitions": partitions, "step": step, "settle": settle_s, "lag": lag}
        return int(self._value("maintenance_refresh_counts", params))
