"""A minimal HTTP/1.1 client for many concurrent long polls on plain sockets.

Thousands of parked polls on threads or sessions would cost the test more than the
server; one selector over raw sockets costs next to nothing.
"""

from __future__ import annotations

import contextlib
import json
import selectors
import socket
import struct
import time
from dataclasses import dataclass, field
from typing import Any


@dataclass
class Poll:
    """One GET sent on its own connection (Connection: close), answered later."""

    port: int
    path: str
    sock: socket.socket = field(init=False)
    raw: bytearray = field(default_factory=bytearray)
    sent_at: float = 0.0
    done_at: float | None = None

    def __post_init__(self) -> None:
        self.sock = socket.create_connection(("127.0.0.1", self.port), timeout=10)
        request = f"GET {self.path} HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n"
        self.sock.sendall(request.encode())
        self.sent_at = time.monotonic()
        self.sock.setblocking(False)

    @property
    def status(self) -> int:
        return int(self.raw.split(b" ", 2)[1]) if self.raw else 0

    @property
    def body(self) -> Any:
        payload = bytes(self.raw).split(b"\r\n\r\n", 1)[1] if self.raw else b""
        return json.loads(payload) if payload else None

    @property
    def transaction_ids(self) -> list[str]:
        body = self.body
        return [m["transactionId"] for m in body["messages"]] if body else []

    def abandon(self, reset: bool = False) -> None:
        """Close the connection without reading (reset: send RST instead of FIN)."""
        if reset:
            self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        self.sock.close()


def gather(polls: list[Poll], timeout_s: float) -> list[Poll]:
    """Read every poll's whole response (until the server closes); return those unfinished."""
    selector = selectors.DefaultSelector()
    for poll in polls:
        selector.register(poll.sock, selectors.EVENT_READ, poll)
    deadline = time.monotonic() + timeout_s
    pending = len(polls)
    while pending and time.monotonic() < deadline:
        for key, _ in selector.select(timeout=max(0.0, deadline - time.monotonic())):
            poll: Poll = key.data
            try:
                chunk = poll.sock.recv(65536)
            except BlockingIOError:
                continue
            except ConnectionError:
                chunk = b""
            if chunk:
                poll.raw += chunk
                continue
            poll.done_at = time.monotonic()
            selector.unregister(poll.sock)
            poll.sock.close()
            pending -= 1
    unfinished = [p for p in polls if p.done_at is None]
    for poll in unfinished:
        with contextlib.suppress(Exception):
            selector.unregister(poll.sock)
        poll.sock.close()
    selector.close()
    return unfinished
