"""One connected dashboard: its socket, its subscription and its outgoing buffer."""

from __future__ import annotations

import contextlib
import logging
import socket
import threading
import uuid
from collections import deque
from typing import Any, Protocol

log = logging.getLogger(__name__)


class Socket(Protocol):
    """What the hub needs of a WebSocket (geventwebsocket.websocket.WebSocket has it)."""

    def receive(self) -> str | bytes | None: ...

    def send(self, message: str) -> Any: ...

    def close(self) -> Any: ...


class DashboardClient:
    """A bounded outbox drained by the client's own writer, so publishers never block.

    When the outbox is full the oldest frame is dropped: a slow dashboard loses
    events, it never slows the API.
    """

    def __init__(self, ws: Socket, buffer_size: int) -> None:
        self.id = str(uuid.uuid4())
        self.ws = ws
        self.queues: frozenset[str] | None = None  # None: every queue
        self.batched = False  # True: one events.batch frame per worker batch, not one per event
        self.dropped = 0
        self.closed = False
        self._outbox: deque[str] = deque(maxlen=max(1, buffer_size))
        self._ready = threading.Event()

    def wants(self, queue: str | None) -> bool:
        """Tell whether an event about queue (None: not queue-scoped) passes the filter."""
        queues = self.queues
        return queue is None or queues is None or queue in queues

    def send(self, text: str) -> None:
        """Queue a frame for the writer; never blocks."""
        if self.closed:
            return
        if len(self._outbox) == self._outbox.maxlen:
            self.dropped += 1
        self._outbox.append(text)
        self._ready.set()

    def start_writer(self) -> threading.Thread:
        writer = threading.Thread(target=self._write, name=f"dashboard-{self.id}", daemon=True)
        writer.start()
        return writer

    def _write(self) -> None:
        while not self.closed:
            self._ready.wait()
            self._ready.clear()
            while self._outbox and not self.closed:
                text = self._outbox.popleft()
                try:
                    self.ws.send(text)
                except Exception as exc:  # noqa: BLE001 - a dead socket ends this client
                    log.debug("dashboard %s: send failed (%r)", self.id, exc)
                    self.close()

    def close(self) -> None:
        """Stop the writer and close the socket (safe to call twice, from any greenlet)."""
        if self.closed:
            return
        self.closed = True
        self._ready.set()
        with contextlib.suppress(Exception):
            self.ws.close()
        # Unblock a reader still waiting on the peer (a dead peer never answers the close).
        raw = getattr(getattr(self.ws, "handler", None), "socket", None)
        if raw is not None:
            with contextlib.suppress(OSError):
                raw.shutdown(socket.SHUT_RDWR)
