"""One connected dashboard: its socket, its subscription and its outgoing buffer."""

from __future__ import annotations

import contextlib
import logging
import socket
import struct
import threading
import uuid
from collections import deque
from collections.abc import Callable
from typing import Any, Protocol

log = logging.getLogger(__name__)

Write = Callable[[bytes], Any]  # writes all the bytes to the connection, or raises


class Socket(Protocol):
    """What the hub needs of a WebSocket (geventwebsocket.websocket.WebSocket has it).

    A socket whose `stream.write` is the connection's sendall (gevent-websocket's) gets
    the frames its writer finds queued in one write; any other gets one send per frame.
    """

    def receive(self) -> str | bytes | None: ...

    def send(self, message: str) -> Any: ...

    def close(self) -> Any: ...


def text_frame(payload: bytes) -> bytes:
    """Frame UTF-8 text as one final, unmasked WebSocket text frame (RFC 6455 5.2)."""
    size = len(payload)
    if size < 126:
        return bytes((0x81, size)) + payload
    if size <= 0xFFFF:
        return struct.pack("!BBH", 0x81, 126, size) + payload
    return struct.pack("!BBQ", 0x81, 127, size) + payload


def frame_text(frame: bytes) -> str:
    """Return the text a frame of text_frame carries."""
    size = frame[1]
    start = 2 if size < 126 else 4 if size == 126 else 10
    return frame[start:].decode()


def raw_writer(ws: Socket) -> Write | None:
    """The connection's own write under a gevent-websocket socket, if it has one."""
    write = getattr(getattr(ws, "stream", None), "write", None)
    return write if callable(write) else None


class DashboardClient:
    """A bounded outbox of ready frames drained by the client's own writer, so publishers
    never block.

    When the outbox is full the oldest frame is dropped: a slow dashboard loses
    events, it never slows the API. The writer takes every frame queued when it wakes
    and writes them to the connection with one call (one system call as a rule).
    """

    def __init__(self, ws: Socket, buffer_size: int) -> None:
        self.id = str(uuid.uuid4())
        self.ws = ws
        self.queues: frozenset[str] | None = None  # None: every queue
        self.batched = False  # True: one events.batch frame per worker batch, not one per event
        self.dropped = 0
        self.closed = False
        self._outbox: deque[bytes] = deque(maxlen=max(1, buffer_size))
        self._ready = threading.Event()
        self._write_raw = raw_writer(ws)

    def wants(self, queue: str | None) -> bool:
        """Tell whether an event about queue (None: not queue-scoped) passes the filter."""
        queues = self.queues
        return queue is None or queues is None or queue in queues

    def send(self, text: str) -> None:
        """Queue a text message for the writer; never blocks."""
        self.send_frame(text_frame(text.encode()))

    def send_frame(self, frame: bytes) -> None:
        """Queue a frame of text_frame (one object for every client it goes to); never blocks."""
        if self.closed:
            return
        if len(self._outbox) == self._outbox.maxlen:
            self.dropped += 1
        self._outbox.append(frame)
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
                try:
                    self._send_queued()
                except Exception as exc:  # noqa: BLE001 - a dead socket ends this client
                    log.debug("dashboard %s: send failed (%r)", self.id, exc)
                    self.close()

    def _send_queued(self) -> None:
        """Write every queued frame at once, or (no raw write) send the oldest one."""
        outbox = self._outbox
        write = self._write_raw
        if write is None:
            self.ws.send(frame_text(outbox.popleft()))
            return
        if getattr(self.ws, "closed", False):  # the peer's close frame was answered
            self.close()
            return
        # Publishers only append (a full outbox drops on the left, keeping its length).
        frames = [outbox.popleft() for _ in range(len(outbox))]
        write(frames[0] if len(frames) == 1 else b"".join(frames))

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
