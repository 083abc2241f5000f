"""Long polls on plain sockets and one selector: thousands of them cost the client little."""

from __future__ import annotations

import json
import selectors
import socket
import time
from typing import Any


class Poll:
    """One GET on its own connection (Connection: close); the answer is read later."""

    __slots__ = ("done_at", "raw", "sent_at", "sock")

    def __init__(self, port: int, path: str) -> None:
        self.sock = socket.create_connection(("127.0.0.1", port), timeout=30)
        request = f"GET {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n"
        self.sock.sendall(request.encode())
        self.sent_at = time.monotonic()
        self.sock.setblocking(False)
        self.raw = bytearray()
        self.done_at: float | None = None

    @property
    def status(self) -> int:
        return int(self.raw.split(b" ", 2)[1]) if self.raw else 0

    @property
    def transaction_ids(self) -> list[str]:
        payload = bytes(self.raw).split(b"\r\n\r\n", 1)[1] if self.raw else b""
        doc: Any = json.loads(payload) if payload else None
        return [m["transactionId"] for m in doc["messages"]] if doc else []


class Reader:
    """Reads whole responses of many polls as they come."""

    def __init__(self) -> None:
        self.selector = selectors.DefaultSelector()
        self.open = 0

    def add(self, poll: Poll) -> None:
        self.selector.register(poll.sock, selectors.EVENT_READ, poll)
        self.open += 1

    def step(self, timeout_s: float) -> list[Poll]:
        """Read what is there (waiting up to timeout_s); return the polls that finished."""
        finished = []
        for key, _ in self.selector.select(timeout=timeout_s):
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
            self.selector.unregister(poll.sock)
            poll.sock.close()
            self.open -= 1
            finished.append(poll)
        return finished

    def until(self, count: int, timeout_s: float) -> list[Poll]:
        """Read until count polls finished or timeout_s passed."""
        deadline = time.monotonic() + timeout_s
        finished: list[Poll] = []
        while len(finished) < count and time.monotonic() < deadline:
            finished += self.step(max(0.0, min(0.5, deadline - time.monotonic())))
        return finished


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    if not ordered:
        return float("nan")
    return ordered[min(len(ordered) - 1, int(round(q / 100 * (len(ordered) - 1))))]
