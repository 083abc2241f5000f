"""Per-process LISTEN connection and the registry of parked long polls.

PostgreSQL triggers send `pg_notify('queen', 'queue/partition/namespace/task')` when a
partition gets work. The listener (one dedicated autocommit connection per process,
outside the pool) wakes one parked poll whose route matches each notification: a
partition is leased to one consumer at a time, so one waiter per notification is what
there is work for. Notifications are hints: woken polls re-check the database, a slow
fallback wakes one waiter per route now and then, and after a reconnect every waiter
is woken once, so a lost notification costs latency, never a message.
"""

from __future__ import annotations

import contextlib
import itertools
import logging
import threading
import time
from collections.abc import Iterator

import psycopg

from queen.models import PopRoute

log = logging.getLogger(__name__)

CHANNEL = "queen"
KEEPALIVE = 5.0  # seconds between keepalive queries on an idle listener
MAX_BACKOFF = 5.0  # seconds, between reconnect attempts

RouteKey = tuple[str, str | None, str | None]


def route_key(route: PopRoute) -> RouteKey:
    """Index a waiter by what it asks for."""
    if route.kind == "partition":
        return ("p", route.queue, route.partition)
    if route.kind == "queue":
        return ("q", route.queue, None)
    return ("f", route.namespace, route.task)


def keys_for(payload: str) -> list[RouteKey]:
    """Return the route keys a notification 'queue/partition/namespace/task' can serve."""
    queue, partition, namespace, task = (payload.split("/") + ["", "", "", ""])[:4]
    ns, tk = namespace or None, task or None
    return [
        ("p", queue, partition),
        ("q", queue, None),
        ("f", None, None),
        ("f", ns, None),
        ("f", None, tk),
        ("f", ns, tk),
    ]


class Waiter:
    """One parked poll: an event plus the order it arrived in (oldest is woken first)."""

    __slots__ = ("event", "key", "order", "woken")

    def __init__(self, key: RouteKey, order: int) -> None:
        self.event = threading.Event()
        self.key = key
        self.order = order
        self.woken = False

    def wake(self) -> None:
        self.woken = True
        self.event.set()

    def wait(self, timeout_s: float) -> bool:
        """Sleep until woken or timeout; consume the wake-up."""
        woken = self.event.wait(timeout_s)
        self.event.clear()
        self.woken = False
        return woken


class Events:
    """Waiter registry plus the listener that feeds it."""

    def __init__(self, dsn: str | None = None, fallback_s: float = 2.0) -> None:
        self.dsn = dsn
        self.fallback_s = fallback_s
        self._waiters: dict[RouteKey, dict[int, Waiter]] = {}
        self._lock = threading.Lock()
        self._order = itertools.count()
        self._running = False
        self._shutting_down = False
        self._conn: psycopg.Connection[object] | None = None
        self.connected = threading.Event()
        self.reconnects = 0

    # -- waiters -----------------------------------------------------------------

    @property
    def shutting_down(self) -> bool:
        return self._shutting_down

    @property
    def waiting(self) -> int:
        with self._lock:
            return sum(len(group) for group in self._waiters.values())

    @contextlib.contextmanager
    def subscribe(self, route: PopRoute) -> Iterator[Waiter]:
        """Register a waiter for route; on exit, pass on a wake-up it did not use."""
        waiter = Waiter(route_key(route), next(self._order))
        with self._lock:
            self._waiters.setdefault(waiter.key, {})[waiter.order] = waiter
        try:
            yield waiter
        finally:
            with self._lock:
                group = self._waiters.get(waiter.key)
                if group is not None:
                    group.pop(waiter.order, None)
                    if not group:
                        del self._waiters[waiter.key]
            if waiter.woken and not self._shutting_down:
                self._wake_one([waiter.key])

    def notify(self, payload: str) -> None:
        """Dispatch one notification payload (called by the listener)."""
        self._wake_one(keys_for(payload))

    def _wake_one(self, keys: list[RouteKey]) -> None:
        with self._lock:
            candidates = [
                w for key in keys for w in self._waiters.get(key, {}).values() if not w.woken
            ]
            if candidates:
                min(candidates, key=lambda w: w.order).wake()

    def wake_all(self) -> None:
        with self._lock:
            for group in self._waiters.values():
                for waiter in group.values():
                    waiter.wake()

    def wake_one_per_route(self) -> None:
        """The fallback: let one waiter of every route re-check the database."""
        with self._lock:
            for group in self._waiters.values():
                if group:
                    min(group.values(), key=lambda w: w.order).wake()

    def shutdown(self) -> None:
        """Stop listening and release every parked poll (they answer 204)."""
        self._shutting_down = True
        self._running = False
        self.wake_all()
        conn = self._conn
        if conn is not None:
            with contextlib.suppress(Exception):
                conn.cancel_safe(timeout=1.0)

    # -- listener ----------------------------------------------------------------

    def start(self) -> threading.Thread:
        """Run the listener (and the fallback timer) in a daemon thread or greenlet."""
        self._running = True
        thread = threading.Thread(target=self._run, name="queen-listener", daemon=True)
        thread.start()
        fallback = threading.Thread(target=self._fallback, name="queen-fallback", daemon=True)
        fallback.start()
        return thread

    def _fallback(self) -> None:
        while self._running:
            time.sleep(self.fallback_s)
            self.wake_one_per_route()

    def _run(self) -> None:
        backoff = 0.1
        first = True
        while self._running:
            try:
                with psycopg.connect(
                    self.dsn or "",
                    autocommit=True,
                    application_name="queen-listener",
                    keepalives=1,
                    keepalives_idle=10,
                    keepalives_interval=5,
                    keepalives_count=3,
                ) as conn:
                    self._conn = conn
                    conn.execute(f"LISTEN {CHANNEL}")
                    self.connected.set()
                    if not first:
                        self.reconnects += 1
                        self.wake_all()  # notifications may have been missed meanwhile
                    first = False
                    backoff = 0.1
                    self._listen(conn)
            except Exception as exc:  # noqa: BLE001 - any failure means: reconnect
                self.connected.clear()
                if not self._running:
                    break
                log.warning("listener lost its connection (%s); retrying in %.1fs", exc, backoff)
                time.sleep(backoff)
                backoff = min(backoff * 2, MAX_BACKOFF)
            finally:
                self._conn = None

    def _listen(self, conn: psycopg.Connection[object]) -> None:
        while self._running:
            for note in conn.notifies(timeout=KEEPALIVE):
                self.notify(note.payload)
            if self._running:
                conn.execute("SELECT 1")  # keepalive: notices a dead server
