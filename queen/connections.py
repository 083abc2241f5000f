"""Bounds on a worker's client connections, so slow or idle clients cannot starve real ones.

- A keep-alive connection waiting for its next request is closed after `idle_s`; one
  whose request headers take longer than `header_s` to arrive gets a 400 and is closed
  (slowloris). Neither applies once a request is being handled: a long poll or a dashboard
  socket may stay open as long as it is in use.
- At most `cap` connections are open at once. A new one beyond the cap first makes room
  by closing the connection idle longest; when none is idle it is answered 503 at once
  (JSON, `Retry-After`) instead of waiting unaccepted in the listen backlog, where a health
  check could not tell a busy worker from a dead one.

Both deadlines are kept by one sweeper greenlet per worker, not by a timer per request
(arming and cancelling two gevent timeouts a request costs more than a sweep, one
comparison per connection due and one more). A
connection waiting for its request line or its headers is entered in a dict with its
deadline; the sweeper wakes every `Limits.sweep_s` and takes the ones due from the front
(insertion order is deadline order), so a deadline holds to within one sweep interval.
The sweeper only takes the connection out and shuts its socket down; the handler, woken,
finds itself gone from the dict and closes (idle) or answers 400 (headers). The handler
removes itself from the dict when its read returns; greenlets do not preempt one another, so a
connection is either still waiting (the sweeper may cut it, and its request is not
handled) or busy (the sweeper no longer sees it): never closed mid-request.

Nothing here imports psycopg (the gunicorn master imports the worker class).
"""

from __future__ import annotations

import contextlib
import socket
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import gevent  # type: ignore[import-untyped]

BUSY_RESPONSE = (
    b"HTTP/1.1 503 Service Unavailable\r\n"
    b"Content-Type: application/json\r\n"
    b"Content-Length: 56\r\n"
    b"Retry-After: 1\r\n"
    b"Connection: close\r\n\r\n"
    b'{"error": "too many connections to this worker, retry"}\n'
)
HEADROOM = 64  # connections beyond the cap accepted only to be answered 503


class HeaderTimeout(ValueError):
    """Request headers did not arrive in time."""


@dataclass(frozen=True)
class Limits:
    """What one worker allows its client connections."""

    cap: int  # open connections at once
    idle_s: float  # seconds a keep-alive connection may wait for its next request
    header_s: float  # seconds a request's headers may take to arrive

    @property
    def sweep_s(self) -> float:
        """How often the sweeper looks: deadlines hold to within this (1 s at most)."""
        return min(1.0, self.idle_s / 4, self.header_s / 4)


class Registry:
    """The open connections of one worker, and which of them wait for a request or its headers."""

    def __init__(self, limits: Limits) -> None:
        self.limits = limits
        self.open = 0
        # Connections waiting, by deadline (monotonic seconds), oldest first (insertion
        # order). A connection missing once its read returns was cut while waiting.
        self._idle: dict[Any, float] = {}  # for a request line
        self._heading: dict[Any, float] = {}  # for the rest of the headers
        self._evicted: set[Any] = set()  # closed to make room, not yet gone
        self._sweeper: Any = None  # the greenlet, started with the first request
        self.closing = False  # the worker is stopping: no connection waits for a request

    def admit(self) -> bool:
        """Take a new connection, closing the one idle longest if at the cap."""
        if self.open >= self.limits.cap and self._idle:
            oldest = next(iter(self._idle))
            del self._idle[oldest]
            _shutdown(getattr(oldest, "socket", None))
            self._evicted.add(oldest)
            self.open -= 1
        if self.open >= self.limits.cap:
            return False
        self.open += 1
        return True

    def leave(self, conn: Any) -> None:
        self._idle.pop(conn, None)
        self._heading.pop(conn, None)
        if conn in self._evicted:
            self._evicted.discard(conn)
        else:
            self.open -= 1

    def read_request_line(self, conn: Any, read: Callable[[], bytes]) -> bytes:
        """Wait up to idle_s for a request line; b"" (close) when none came, and at once
        once the worker is closing."""
        if self.closing:
            return b""
        if self._sweeper is None:
            self._sweeper = gevent.spawn(self._sweep_forever)
        idle = self._idle
        idle[conn] = time.monotonic() + self.limits.idle_s
        try:
            line = read()
        except OSError:  # gevent ends a read whose socket is shut down with an error
            if idle.pop(conn, None) is None:
                return b""
            raise
        if idle.pop(conn, None) is None:  # cut as the line came: it is not handled
            return b""
        if line:
            self._heading[conn] = time.monotonic() + self.limits.header_s
        return line

    def read_headers(self, conn: Any, read: Callable[[], Any]) -> Any:
        """Run read (the header parse), raising HeaderTimeout if the sweeper cut it."""
        heading = self._heading
        try:
            parsed = read()
        except Exception:
            if heading.pop(conn, None) is None:  # not a client error to log with a traceback
                raise self._late() from None
            raise
        if heading.pop(conn, None) is None:
            raise self._late()
        return parsed

    def _late(self) -> HeaderTimeout:
        return HeaderTimeout(f"request headers took longer than {self.limits.header_s:g} s")

    def close_idle(self) -> int:
        """The worker is stopping: end every connection waiting for a request (kept alive
        between requests), and each that comes to wait after its answer, so that the worker
        waits only for requests in flight, not for idle clients; how many were waiting.
        (A request being read or handled is answered.)"""
        self.closing = True
        waiting = list(self._idle)
        self._idle.clear()  # (in place: each waiting read holds this dict)
        for conn in waiting:
            _shutdown(getattr(conn, "socket", None))
        return len(waiting)

    def sweep(self, now: float) -> int:
        """Cut the connections whose deadline is before now; how many were cut."""
        late_idle = _due(self._idle, now)
        for conn in late_idle:  # the handler closes
            del self._idle[conn]
            _shutdown(getattr(conn, "socket", None))
        late_heading = _due(self._heading, now)
        for conn in late_heading:  # the handler can still answer 400: only reading is shut
            del self._heading[conn]
            _shutdown(getattr(conn, "socket", None), socket.SHUT_RD)
        return len(late_idle) + len(late_heading)

    def _sweep_forever(self) -> None:
        while True:
            gevent.sleep(self.limits.sweep_s)
            self.sweep(time.monotonic())


def _due(waiting: dict[Any, float], now: float) -> list[Any]:
    """The connections at the front of waiting whose deadline has passed."""
    due = []
    for conn, deadline in waiting.items():
        if deadline > now:
            break  # the rest came later and have later deadlines
        due.append(conn)
    return due


def _shutdown(sock: socket.socket | None, how: int = socket.SHUT_RDWR) -> None:
    """End a waiting connection: its pending read returns end of file."""
    if sock is not None:
        with contextlib.suppress(OSError):
            sock.shutdown(how)
