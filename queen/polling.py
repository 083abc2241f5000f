"""Pop with optional long polling: claim now, or park until a notification or the timeout.

A parked poll holds no database connection: it sleeps on the events registry and
claims only when woken. Nothing is claimed for a request that can no longer be
answered: not while the server shuts down, not when the client has already closed
its connection, and a claim whose response could not be handed to the server is given
back (without counting a retry) by `ClaimedBody`.
"""

from __future__ import annotations

import logging
import socket
import threading
import time
import uuid
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any

from queen.errors import QueenError, Unavailable
from queen.events import Events
from queen.models import Popped, PopRoute
from queen.store import Store
from queen.wakeup import parse

log = logging.getLogger(__name__)

# Read one byte without consuming it and without waiting (Linux, BSD, macOS).
_PEEK_FLAGS = socket.MSG_PEEK | getattr(socket, "MSG_DONTWAIT", 0)
# Where the WSGI server puts the client connection (queen.server.worker; gunicorn's own handler).
SOCKET_KEYS = ("gunicorn.socket", "gunicorn.sock")
LISTED_S = 30  # seconds a listing in queen.waiting_workers lasts (refreshed every 10 s)
RELIST_S = 10  # a poll lists its worker again first when less than this is left


def _still_there() -> bool:
    return False


class LongPoller:
    """Serve pops for the API: immediate, or parked on the events registry."""

    def __init__(
        self,
        store: Store,
        events: Events | None,
        worker_id: str,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.store = store
        self.events = events
        self.worker_id = worker_id
        self.clock = clock
        # Woken polls re-check through at most half the pool at a time: a burst of
        # wake-ups queues here (until each poll's deadline) instead of timing out in the
        # pool, and leaves connections for pushes and acks.
        self._rechecks = threading.BoundedSemaphore(max(1, store.db.pool.max_size // 2))
        self.presence = Presence(store, worker_id, clock)
        self.parked: Callable[[], None] = lambda: None  # called as a poll parks (metrics)
        if events is not None:
            events.while_waiting = self.presence.refresh
            # An ack's wake-up wakes a poll parked here first, with no notification.
            wakeups = store.polling.wakeups
            wakeups.here = events.wake_here
            events.notify_unused = lambda payload: wakeups.send([payload])

    @property
    def shutting_down(self) -> bool:
        return self.events is not None and self.events.shutting_down

    def pop(
        self,
        route: PopRoute,
        batch: int,
        *,
        wait: bool,
        timeout_s: float,
        client_gone: Callable[[], bool] = _still_there,
    ) -> list[Popped]:
        """Return claimed messages, or [] when none came within timeout_s (wait=True).

        Also [] without claiming when the client has gone or the server is shutting down.
        """
        if client_gone():
            return []
        if not wait or self.events is None or timeout_s <= 0:
            return self._claim(route, batch)
        if self.events.shutting_down:
            return []
        deadline = self.clock() + self._cap(route, timeout_s)
        with self.events.subscribe(route) as waiter:
            self.presence.ensure()  # pushes notify only while some worker is listed
            messages = self._claim(route, batch)
            if not messages:
                self.parked()
            while not messages:
                remaining = deadline - self.clock()
                if remaining <= 0 or not waiter.wait(remaining):
                    return []
                # What this re-check is for, read now: the poll may be woken again while it
                # waits for its turn, and that wake-up is the next re-check's.
                hint = waiter.hint
                if not self._rechecks.acquire(timeout=max(0.0, deadline - self.clock())):
                    waiter.forward()  # its time ran out before its turn came
                    return []
                try:  # checked once it is this poll's turn, which may have taken a while
                    if self.events.shutting_down:
                        return []
                    if client_gone():
                        waiter.forward()
                        return []
                    messages = self._recheck(route, batch, hint)
                finally:
                    self._rechecks.release()
            return messages

    def _claim(self, route: PopRoute, batch: int) -> list[Popped]:
        return self.store.messages.pop(route, batch, self.worker_id)

    def _recheck(self, route: PopRoute, batch: int, hint: str | None) -> list[Popped]:
        """Claim after a wake-up; a database hiccup keeps the poll parked instead of failing it.

        A poll by queue woken for one partition tries that partition first (an index
        probe, where the whole queue means walking its partitions in order), then the
        queue, in one database call: every process wakes a waiter per notification, so
        most of these tries find the partition taken, and should cost little.
        """
        try:
            hinted = _hinted_partition(route, hint)
            if hinted is not None:
                return self.store.messages.pop(route, batch, self.worker_id, hinted.partition)
            return self._claim(route, batch)
        except Unavailable as exc:
            log.warning("long-poll re-check failed, staying parked: %s", exc.message)
            return []

    def _cap(self, route: PopRoute, timeout_s: float) -> float:
        """Apply the queue's maxWaitTimeSeconds to a long poll on that queue."""
        if route.queue is None:
            return timeout_s
        flags = self.store.queues.flags(route.queue)
        if flags is not None and flags.max_wait_s > 0:
            return min(timeout_s, float(flags.max_wait_s))
        return timeout_s

    def delivered(self, messages: Sequence[Popped]) -> None:
        """Note that messages' answer reached the client's socket (their claim is theirs)."""
        self.store.messages.claims.end({m.lease_id for m in messages})

    def release(self, messages: Sequence[Popped]) -> None:
        """Give back the leases of messages popped for a response that never reached the
        client (a pop is one lease; the whole lease goes back)."""
        leases: dict[uuid.UUID, int] = {}
        for message in messages:
            leases[message.lease_id] = leases.get(message.lease_id, 0) + 1
        try:
            self._give_back(leases)
        finally:
            self.store.messages.claims.end(leases)

    def _give_back(self, leases: dict[uuid.UUID, int]) -> None:
        for lease_id, count in leases.items():
            try:
                released = self.store.polling.unclaim(lease_id)
            except QueenError as exc:
                log.warning(
                    "could not give back %d undelivered messages (%s); they return when"
                    " lease %s expires",
                    count,
                    exc.message,
                    lease_id,
                )
            else:
                log.info("gave back %d messages whose response was not delivered", released)


class Presence:
    """Keep this worker listed in queen.waiting_workers while it has polls parked.

    Pushes send wake-ups only while some worker is listed. A poll makes sure the listing
    outlasts it before its first database check (a write only after a quiet spell);
    while polls wait, the events registry calls refresh every 10 s.
    """

    def __init__(self, store: Store, worker_id: str, clock: Callable[[], float]) -> None:
        self.store = store
        self.worker_id = worker_id
        self.clock = clock
        self._until = float("-inf")  # our clock: when the listing surely still holds
        self._lock = threading.Lock()

    def ensure(self) -> None:
        """List this worker now unless the listing already lasts long enough."""
        if self.clock() + RELIST_S < self._until:
            return
        with self._lock:  # one write for a crowd of polls arriving after a quiet spell
            if self.clock() + RELIST_S < self._until:
                return
            self._list()

    def refresh(self) -> None:
        try:
            self._list()
        except QueenError as exc:
            log.warning("could not list this worker as waiting: %s", exc.message)

    def _list(self) -> None:
        started = self.clock()
        self.store.polling.list_waiting_worker(self.worker_id, LISTED_S)
        self._until = started + LISTED_S


def _hinted_partition(route: PopRoute, hint: str | None) -> PopRoute | None:
    """Return the partition a notification named, for a poll by queue on its queue."""
    if hint is None or route.kind != "queue":
        return None
    wake = parse(hint)
    if wake.queue != route.queue or not wake.partition:
        return None
    return PopRoute(queue=wake.queue, partition=wake.partition)


class ClaimedBody:
    """A WSGI body that gives its claimed messages back unless the server took all of it.

    The server writes each chunk it gets and asks for the next: being asked again after
    the only chunk proves its write returned (the bytes are with the kernel), and runs
    on_delivered. If the write failed, or the server never iterated, close() (always
    called, PEP 3333) runs on_undelivered.
    """

    __slots__ = ("_body", "_delivered", "_on_delivered", "_on_undelivered")

    def __init__(
        self,
        body: bytes,
        on_undelivered: Callable[[], None],
        on_delivered: Callable[[], None] = lambda: None,
    ) -> None:
        self._body: bytes | None = body
        self._delivered = False
        self._on_delivered = on_delivered
        self._on_undelivered = on_undelivered

    def __iter__(self) -> Iterator[bytes]:
        return self

    def __next__(self) -> bytes:
        body = self._body
        if body is None:
            if not self._delivered:
                self._delivered = True
                self._on_delivered()
            raise StopIteration
        self._body = None
        return body

    def close(self) -> None:
        if not self._delivered:
            self._delivered = True  # give back once
            self._on_undelivered()


def peer_closed(sock: Any) -> bool:
    """Tell whether the client closed its connection: a non-blocking MSG_PEEK reads EOF."""
    if not _PEEK_FLAGS & getattr(socket, "MSG_DONTWAIT", 0):
        return False  # no way to peek without blocking here
    raw = getattr(sock, "_sock", sock)  # gevent wraps the OS-level socket
    try:
        return bool(raw.recv(1, _PEEK_FLAGS) == b"")
    except (BlockingIOError, InterruptedError):
        return False  # nothing to read: the client is waiting
    except ConnectionError:
        return True
    except (OSError, ValueError, TypeError, AttributeError):
        return False  # not a plain TCP socket (TLS, a test double): assume connected


def client_gone_check(environ: Mapping[str, Any]) -> Callable[[], bool]:
    """Return a check of whether this request's client has gone (always False if unknown)."""
    sock = next((environ[k] for k in SOCKET_KEYS if environ.get(k) is not None), None)
    if sock is None:
        return _still_there
    return lambda: peer_closed(sock)
