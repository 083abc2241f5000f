"""Bounds on a worker's client connections, so slow or idle clients cannot starve real ones.

- A keep-alive connection waiting for its next request is closed after `idle_s`; one
  whose request headers take longer than `header_s` to arrive gets a 400 and is closed
  (slowloris). Neither applies once a request is being handled: a long poll or a dashboard
  socket may stay open as long as it is in use.
- At most `cap` connections are open at once. A new one beyond the cap first makes room
  by closing the connection idle longest; when none is idle it is answered 503 at once
  (JSON, `Retry-After`) instead of waiting unaccepted in the listen backlog, where a health
  check could not tell a busy worker from a dead one.

Nothing here imports psycopg (the gunicorn master imports the worker class).
"""

from __future__ import annotations

import contextlib
import socket
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


class Registry:
    """The open connections of one worker, and which of them wait idle for a request."""

    def __init__(self, limits: Limits) -> None:
        self.limits = limits
        self.open = 0
        self._idle: dict[Any, Callable[[], None]] = {}  # oldest first (insertion order)
        self._evicted: set[Any] = set()  # closed to make room, not yet gone

    def admit(self) -> bool:
        """Take a new connection, closing the one idle longest if at the cap."""
        if self.open >= self.limits.cap and self._idle:
            oldest = next(iter(self._idle))
            self._idle.pop(oldest)()
            self._evicted.add(oldest)
            self.open -= 1
        if self.open >= self.limits.cap:
            return False
        self.open += 1
        return True

    def leave(self, conn: Any) -> None:
        self._idle.pop(conn, None)
        if conn in self._evicted:
            self._evicted.discard(conn)
        else:
            self.open -= 1

    def read_request_line(self, conn: Any, read: Callable[[], bytes]) -> bytes:
        """Wait up to idle_s for a request line; b"" (close) when none came."""
        self._idle[conn] = lambda: _shutdown(conn.socket)
        try:
            line: bytes = gevent.with_timeout(self.limits.idle_s, read, timeout_value=b"")
            return line
        finally:
            self._idle.pop(conn, None)

    def read_headers(self, read: Callable[[], Any]) -> Any:
        """Run read (the header parse) under the header deadline."""
        with gevent.Timeout(
            self.limits.header_s,
            HeaderTimeout(f"request headers took longer than {self.limits.header_s:g} s"),
        ):
            return read()


def _shutdown(sock: socket.socket | None) -> None:
    """End an idle connection: its pending read returns end of file."""
    if sock is not None:
        with contextlib.suppress(OSError):
            sock.shutdown(socket.SHUT_RDWR)
