"""The Python SDK through a fault, as an application runs it: a producer pushing one
message at a time and a Consumer loop, both with the client's default RetryPolicy."""

from __future__ import annotations

import threading
import time
from collections import Counter
from typing import Any

from queen.client import Message, Queen


class SdkTraffic:
    """Push `sdk-N` payloads to queue (two partitions) and consume them, until stopped."""

    def __init__(self, url: str, queue: str) -> None:
        self.client = Queen(url)
        self.queue = queue
        self.pushed: list[str] = []  # payload ids whose push returned
        self.errors: list[str] = []  # what a push raised: the client gave up
        self.handled: Counter[str] = Counter()
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self.consumer = self.client.consumer(
            queue, self._handle, handle_signals=False, poll_timeout=2
        )
        self._threads = [
            threading.Thread(target=self._produce, name="sdk-producer", daemon=True),
            threading.Thread(target=self.consumer.run, name="sdk-consumer", daemon=True),
        ]

    def start(self) -> SdkTraffic:
        for thread in self._threads:
            thread.start()
        return self

    def _handle(self, message: Message) -> None:
        with self._lock:
            self.handled[message.data["id"]] += 1

    def _produce(self) -> None:
        n = 0
        while not self._stop.is_set():
            item = f"sdk-{n}"
            try:
                self.client.push(self.queue, {"id": item}, partition=f"p{n % 2}")
            except Exception as exc:  # noqa: BLE001 - recorded: the test fails on any
                self.errors.append(repr(exc))
                return
            self.pushed.append(item)
            n += 1
            time.sleep(0.05)

    def stop_producing(self) -> None:
        self._stop.set()
        self._threads[0].join(60)

    def drain(self, timeout: float = 90) -> list[str]:
        """Wait until every pushed id was handled; stop consuming; return those never handled."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            with self._lock:
                missing = [item for item in self.pushed if item not in self.handled]
            if not missing:
                break
            time.sleep(0.2)
        self.consumer.stop()
        self._threads[1].join(30)
        self.client.close()
        return missing

    def figures(self) -> dict[str, Any]:
        with self._lock:
            return {
                "sdk_pushed": len(self.pushed),
                "sdk_handled": len(self.handled),
                "sdk_handled_twice": sum(1 for n in self.handled.values() if n > 1),
                "sdk_gave_up": len(self.errors),
            }
