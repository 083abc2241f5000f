"""Client-side bounds on every database connection: connect, idle, unacknowledged, busy.

A psycopg connection has no client-side timeout by default: with the network gone, a
query waits for the kernel's retransmission timeout (minutes). CONNECTION_BOUNDS go
into the conninfo of the pool, the listener and the maintenance sessions (a value the
DSN sets wins). TCP options cannot catch a peer that still acknowledges packets but
never answers (a stalled proxy): for that, a Watchdog severs the socket of a call that
outlived its deadline, which fails the call at once (the connection is then broken and
discarded).
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import os
import socket
import threading
import time
from collections.abc import Iterator
from typing import Any

import psycopg
from psycopg.conninfo import conninfo_to_dict, make_conninfo

log = logging.getLogger(__name__)

# Idle: a dead peer is noticed after idle + interval * count seconds (11 s). Busy: data
# unacknowledged for tcp_user_timeout ends the connection. Both stay below the server's
# own keepalive bound on maintenance sessions (queries.sql maintenance_setup: 19 s), so a
# leader cut off from the database notices before the server frees its lock.
CONNECTION_BOUNDS = {
    "connect_timeout": "5",  # seconds
    "keepalives": "1",
    "keepalives_idle": "5",  # seconds
    "keepalives_interval": "2",  # seconds
    "keepalives_count": "3",
    "tcp_user_timeout": "10000",  # ms
}
ENVIRONMENT = {"connect_timeout": "PGCONNECT_TIMEOUT"}  # libpq reads these if the DSN does not
DEADLINE_MARGIN_S = 2.0  # seconds a call may run past its statement_timeout before it is cut
WATCH_PERIOD_S = 0.5  # seconds between looks at the calls in flight


def bounded_conninfo(dsn: str) -> str:
    """Return dsn with CONNECTION_BOUNDS added where neither it nor libpq's environment sets them."""
    given = conninfo_to_dict(dsn)
    extra = {
        key: value
        for key, value in CONNECTION_BOUNDS.items()
        if key not in given and not os.environ.get(ENVIRONMENT.get(key, ""))
    }
    return make_conninfo(dsn, **extra)


def call_deadline_s(statement_timeout_ms: int) -> float | None:
    """Return how long a call may take on a connection with this statement_timeout (None: unbounded)."""
    return statement_timeout_ms / 1000 + DEADLINE_MARGIN_S if statement_timeout_ms > 0 else None


def sever(conn: psycopg.Connection[Any]) -> None:
    """Shut the connection's socket down: whoever waits on it gets an error at once."""
    with contextlib.suppress(OSError, psycopg.Error):
        fd = conn.pgconn.socket
        with socket.socket(fileno=os.dup(fd)) as sock:
            sock.shutdown(socket.SHUT_RDWR)


@dataclasses.dataclass(slots=True)
class Deadline:
    """One guarded call's bound; passed turns True when the watchdog severed its connection."""

    seconds: float
    passed: bool = False


class Watchdog:
    """Sever the connections whose call outlived its deadline; one per process."""

    def __init__(self, period_s: float = WATCH_PERIOD_S) -> None:
        self.period_s = period_s
        self.severed = 0
        self._due: dict[int, tuple[float, psycopg.Connection[Any], Deadline]] = {}
        self._lock = threading.Lock()
        self._pid = 0  # the process the watching thread runs in

    @contextlib.contextmanager
    def guard(
        self, conn: psycopg.Connection[Any], seconds: float | None
    ) -> Iterator[Deadline | None]:
        """Bound what runs inside to seconds (None: no bound); yield the Deadline watched."""
        if seconds is None:
            yield None
            return
        self._ensure_watching()
        key = id(conn)
        deadline = Deadline(seconds)
        self._due[key] = (time.monotonic() + seconds, conn, deadline)
        try:
            yield deadline
        finally:
            self._due.pop(key, None)

    def _ensure_watching(self) -> None:
        if self._pid == os.getpid():
            return
        with self._lock:
            if self._pid != os.getpid():
                self._pid = os.getpid()
                threading.Thread(target=self._watch, name="queen-db-watchdog", daemon=True).start()

    def _watch(self) -> None:
        while True:
            time.sleep(self.period_s)
            self.sever_overdue(time.monotonic())

    def sever_overdue(self, now: float) -> int:
        """Sever every connection past its deadline; return how many."""
        overdue = [key for key, (at, _, _) in list(self._due.items()) if at <= now]
        for key in overdue:
            entry = self._due.pop(key, None)
            if entry is not None:
                _, conn, deadline = entry
                log.warning(
                    "a database call ran past its %.1fs deadline; closing its connection",
                    deadline.seconds,
                )
                deadline.passed = True
                sever(conn)
                self.severed += 1
        return len(overdue)


WATCHDOG = Watchdog()
