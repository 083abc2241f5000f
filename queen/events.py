"""Per-process LISTEN connection and the registry of parked long polls.

PostgreSQL notifies when a partition may have work for a consumer (the protocol:
queen.wakeup). The listener (one dedicated autocommit connection per process, outside
the pool) hands each notification to the registry, which wakes ONE parked poll whose
route matches in each consumer group parked here (queue mode is a group of its own):
within a group a partition is leased to one consumer at a time, so one waiter per
notification is what there is work for, while every group reads every message. The
oldest armed waiter of a group goes first. A partition one group's ack (or give-back)
freed concerns that group alone: its notification names the group ('.../group') and
wakes a poll of it only.

A waiter is armed from the moment it subscribes, before its first database check, and
again before every re-check, so a notification that arrives while it queries is never
lost: it simply re-checks once more. A woken waiter that leaves without re-checking
(deadline, client gone, or it was woken while its own query already found messages)
passes its wake-up on to the next matching waiter.

A partition this process's own ack freed wakes a poll parked here, if one matches, with
no notification at all (the other processes' polls would find it taken); only when none
does is it notified. A poll woken so that leaves it unused, with no other poll here to
take it, has it notified then.

Notifications are hints. A slow fallback asks the database which free partitions have
pending work for the routes parked here (one query per period, whatever the number of
waiters) and dispatches the oldest answers like notifications, a bounded number per
period; whenever the listener (re)connects, every waiter is woken once. A lost notification
therefore costs latency, never a message.
"""

from __future__ import annotations

import contextlib
import itertools
import logging
import random
import threading
import time
from collections.abc import Callable, Iterator

import psycopg
from psycopg import sql

from queen.models import PopRoute
from queen.store.bounds import WATCHDOG, bounded_conninfo
from queen.store.dashboard import DASHBOARD_CHANNEL
from queen.store.lifecycle import QUEUE_MODE
from queen.wakeup import (
    BY_FILTER,
    BY_PARTITION,
    BY_QUEUE,
    CHANNEL,
    RouteKey,
    Wake,
    keys_for,
    parse,
    route_key,
)

log = logging.getLogger(__name__)

APPLICATION_NAME = "queen-listener"
KEEPALIVE = 5.0  # seconds between keepalive queries on an idle listener
MIN_BACKOFF = 0.1  # seconds before the first reconnect attempt
MAX_BACKOFF = 5.0  # seconds, between reconnect attempts
# Most waiters one fallback period wakes in this process: the fallback is a safety net
# for lost notifications, not a delivery path, and must not add a herd of re-checks to a
# burst that notifications are already serving (oldest ready partitions go first).
FALLBACK_BUDGET = 100
ANY_GROUP = object()  # (a wake-up for every group, not one)
PRESENCE_REFRESH_S = 10.0  # seconds between calls of while_waiting while polls are parked

Group = str | None  # a waiter's consumer group (None: queue mode)
# (queues, (queue, partition) pairs, (namespace, task) filters, limit) -> wake payloads
ReadyCheck = Callable[
    [list[str], list[tuple[str, str]], list[tuple[str | None, str | None]], int], list[str]
]


def group_of(wake: Wake) -> Group | object:
    """The consumer group a notification is for: the group it names (queue mode's is
    None), or ANY_GROUP for a push's."""
    if wake.group is None:
        return ANY_GROUP
    return None if wake.group == QUEUE_MODE else wake.group


class Waiter:
    """One parked poll's place in the registry."""

    __slots__ = (
        "_events", "armed_at", "event", "group", "hint", "key", "local", "wake_keys", "woken",
    )

    def __init__(self, events: Events, key: RouteKey, group: Group = None) -> None:
        self._events = events
        self.key = key
        self.group = group
        self.event = threading.Event()
        self.armed_at = 0  # registry sequence number of the last arming (oldest goes first)
        self.woken = False  # woken and not yet back to checking the database
        self.wake_keys: tuple[RouteKey, ...] = (key,)  # what the last wake-up was for
        self.hint: str | None = None  # its notification payload (None: just re-check)
        self.local = False  # woken for this process's own ack, with no notification sent

    def wait(self, timeout_s: float) -> bool:
        """Sleep until woken or timeout_s passed; True when woken (the waiter is re-armed)."""
        self.event.wait(timeout_s)
        return self._events._rearm(self)

    def forward(self) -> None:
        """Leave without using the last wake-up: hand it to another waiter."""
        self._events._forward(self)


class Events:
    """Waiter registry plus the listener and fallback that feed it."""

    def __init__(
        self,
        dsn: str | None = None,
        fallback_s: float = 2.0,
        ready: ReadyCheck | None = None,
    ) -> None:
        self.dsn = dsn
        self.fallback_s = fallback_s
        self._ready = ready
        # Called every PRESENCE_REFRESH_S while polls are parked, and on every connection
        # of the listener (LongPoller keeps this worker listed in queen.waiting_workers
        # with it).
        self.while_waiting: Callable[[], None] | None = None
        # Receives every notification on the dashboard channel (the dashboard hub's batches).
        self.on_dashboard: Callable[[str], None] | None = None
        # Notifies an own ack's wake-up that a poll woken for it here left unused, when no
        # other poll here takes it (the store's wake-up sender).
        self.notify_unused: Callable[[str], None] | None = None
        # per route, then per consumer group, oldest first
        self._armed: dict[RouteKey, dict[Group, dict[Waiter, None]]] = {}
        self._registered = 0
        self._lock = threading.Lock()
        self._seq = itertools.count()
        self._running = False
        self._shutting_down = False
        self.connected = threading.Event()
        self.reconnects = 0
        self.notifications = 0  # received from PostgreSQL
        self.wakeups = 0  # waiters woken, for any reason

    # -- waiters -----------------------------------------------------------------

    @property
    def shutting_down(self) -> bool:
        return self._shutting_down

    @property
    def waiting(self) -> int:
        """Return the number of polls subscribed in this process."""
        return self._registered

    @contextlib.contextmanager
    def subscribe(self, route: PopRoute) -> Iterator[Waiter]:
        """Register an armed waiter for route; on exit, pass on a wake-up it did not use."""
        waiter = Waiter(self, route_key(route), route.consumer_group)
        with self._lock:
            self._arm(waiter)
            self._registered += 1
        try:
            yield waiter
        finally:
            with self._lock:
                self._disarm(waiter)
                self._registered -= 1
                unused, waiter.woken = waiter.woken, False
            if unused and not self._shutting_down:
                self._pass_on(waiter)

    def _arm(self, waiter: Waiter) -> None:
        waiter.armed_at = next(self._seq)
        self._armed.setdefault(waiter.key, {}).setdefault(waiter.group, {})[waiter] = None

    def _disarm(self, waiter: Waiter) -> None:
        groups = self._armed.get(waiter.key)
        if groups is None:
            return
        armed = groups.get(waiter.group)
        if armed is not None:
            armed.pop(waiter, None)
            if not armed:
                del groups[waiter.group]
                if not groups:
                    del self._armed[waiter.key]

    def _armed_waiters(self) -> list[Waiter]:
        """Every armed waiter (the caller holds the lock)."""
        return [w for groups in self._armed.values() for armed in groups.values() for w in armed]

    def _rearm(self, waiter: Waiter) -> bool:
        with self._lock:
            if not waiter.woken:
                return False
            waiter.woken = False
            waiter.event.clear()
            if not self._shutting_down:
                self._arm(waiter)
            return True

    def _forward(self, waiter: Waiter) -> None:
        with self._lock:
            self._disarm(waiter)
            waiter.woken = False
        if not self._shutting_down:
            self._pass_on(waiter)

    def _pass_on(self, waiter: Waiter) -> None:
        """Hand a wake-up a waiter left unused to the next waiter of its group here; one of
        an own ack's that none takes is notified, for the other processes' polls."""
        taken = self._wake_each_group(waiter.wake_keys, waiter.hint, waiter.group,
                                      local=waiter.local)
        if not taken and waiter.local and waiter.hint and self.notify_unused is not None:
            self.notify_unused(waiter.hint)

    def _wake(
        self, waiter: Waiter, keys: tuple[RouteKey, ...], hint: str | None, local: bool = False
    ) -> None:
        """Wake an armed waiter (the caller holds the lock)."""
        self._disarm(waiter)
        waiter.woken = True
        waiter.wake_keys = keys
        waiter.hint = hint
        waiter.local = local
        waiter.event.set()
        self.wakeups += 1

    def notify(self, payload: str) -> bool:
        """Dispatch one notification payload to each consumer group parked for it (or to
        the one group it names); True when it woke a waiter."""
        wake = parse(payload)
        return self._wake_each_group(keys_for(wake), payload, group_of(wake))

    def wake_here(self, payload: str) -> bool:
        """Wake a poll parked here for a wake-up of this process's own ack (a payload naming
        its group); True when one was woken, and no notification is needed."""
        wake = parse(payload)
        only = group_of(wake)
        if only is ANY_GROUP:
            return False
        return self._wake_each_group(keys_for(wake), payload, only, local=True)

    def _wake_each_group(
        self,
        keys: tuple[RouteKey, ...],
        hint: str | None,
        only: Group | object = ANY_GROUP,
        local: bool = False,
    ) -> bool:
        """Wake the oldest waiter matching keys in each group (only: in that group alone)."""
        with self._lock:
            oldest: dict[Group, Waiter] = {}
            for key in keys:
                for group, armed in self._armed.get(key, {}).items():
                    if only is not ANY_GROUP and group != only:
                        continue
                    first = next(iter(armed))
                    known = oldest.get(group)
                    if known is None or first.armed_at < known.armed_at:
                        oldest[group] = first
            for waiter in oldest.values():
                self._wake(waiter, keys, hint, local)
            return bool(oldest)

    def wake_all(self) -> int:
        """Wake every armed waiter once (after a reconnect, or to shut down)."""
        with self._lock:
            waiters = self._armed_waiters()
            for waiter in waiters:
                self._wake(waiter, (waiter.key,), None)
            return len(waiters)

    def wake_one_per_route(self) -> int:
        """Let the oldest waiter of every route and group re-check (the fallback without a
        ready check)."""
        with self._lock:
            oldest = [
                next(iter(armed)) for groups in self._armed.values() for armed in groups.values()
            ]
            for waiter in oldest:
                self._wake(waiter, (waiter.key,), None)
            return len(oldest)

    def recheck(self) -> int:
        """The fallback: wake waiters for the work the database says is ready for them."""
        with self._lock:
            keys = list(self._armed)
            armed = sum(len(a) for groups in self._armed.values() for a in groups.values())
        if not keys:
            return 0
        if self._ready is None:
            return self.wake_one_per_route()
        queues = [k[1] for k in keys if k[0] == BY_QUEUE and k[1] is not None]
        partitions = [(k[1], k[2]) for k in keys if k[0] == BY_PARTITION and k[1] and k[2]]
        filters = [(k[1], k[2]) for k in keys if k[0] == BY_FILTER]
        try:
            payloads = self._ready(queues, partitions, filters, min(armed, FALLBACK_BUDGET))
        except Exception as exc:  # noqa: BLE001 - the next period tries again
            log.warning("long-poll fallback re-check failed: %s", exc)
            return 0
        return sum(self.notify(payload) for payload in payloads)

    def shutdown(self) -> None:
        """Stop listening and release every parked poll (they answer 204 at once)."""
        self._shutting_down = True
        self._running = False
        self.wake_all()

    # -- listener ----------------------------------------------------------------

    def start(self) -> threading.Thread:
        """Run the listener and the fallback in daemon threads (greenlets under gevent)."""
        self._running = True
        listener = threading.Thread(target=self._run, name=APPLICATION_NAME, daemon=True)
        listener.start()
        fallback = threading.Thread(target=self._fallback, name="queen-fallback", daemon=True)
        fallback.start()
        presence = threading.Thread(target=self._presence, name="queen-presence", daemon=True)
        presence.start()
        return listener

    def _presence(self) -> None:
        while self._running:
            time.sleep(PRESENCE_REFRESH_S)
            if self._running:
                self._relist()

    def _relist(self) -> None:
        hook = self.while_waiting
        if self._registered and hook is not None:
            hook()

    def _list_again(self) -> None:
        hook = self.while_waiting
        if hook is not None:
            hook()

    def _fallback(self) -> None:
        while self._running:
            time.sleep(self.fallback_s * random.uniform(0.8, 1.2))  # workers drift apart
            if self._running:
                self.recheck()

    def _run(self) -> None:
        backoff = MIN_BACKOFF
        connections = 0
        while self._running:
            try:
                with self._connect() as conn:
                    conn.execute(sql.SQL("LISTEN {}").format(sql.Identifier(CHANNEL)))
                    conn.execute(sql.SQL("LISTEN {}").format(sql.Identifier(DASHBOARD_CHANNEL)))
                    self.connected.set()
                    self.reconnects = connections
                    connections += 1
                    # A new session may face a server that crashed and restarted, with
                    # queen.waiting_workers (unlogged) emptied: list this worker again at
                    # once, polls parked or not (the next poll would trust the listing it
                    # remembers), or pushes send no wake-ups until the listing lapses.
                    self._list_again()
                    # Polls parked before this moment may have missed notifications.
                    woken = self.wake_all()
                    if woken:
                        log.info("listener connected; woke %d parked polls", woken)
                    backoff = MIN_BACKOFF
                    self._listen(conn)
            except Exception as exc:  # noqa: BLE001 - any failure means: reconnect
                self.connected.clear()
                if not self._running:
                    break
                log.warning("listener lost its connection (%s); retrying in %.1fs", exc, backoff)
                time.sleep(backoff * random.uniform(0.5, 1.0))
                backoff = min(backoff * 2, MAX_BACKOFF)
        self.connected.clear()

    def _to_dashboard(self, payload: str) -> None:
        hook = self.on_dashboard
        if hook is None:
            return
        try:
            hook(payload)
        except Exception:  # noqa: BLE001 - a dashboard bug must not stop the wake-ups
            log.exception("dashboard notification handler failed")

    def _connect(self) -> psycopg.Connection[object]:
        return psycopg.connect(
            bounded_conninfo(self.dsn or ""), autocommit=True, application_name=APPLICATION_NAME
        )

    def _listen(self, conn: psycopg.Connection[object]) -> None:
        while self._running:
            for note in conn.notifies(timeout=KEEPALIVE):
                if note.channel == DASHBOARD_CHANNEL:
                    self._to_dashboard(note.payload)
                    continue
                self.notifications += 1
                self.notify(note.payload)
            if self._running:  # keepalive: notices a dead server, a killed backend, a stall
                with WATCHDOG.guard(conn, KEEPALIVE):
                    conn.execute("SELECT 1")
