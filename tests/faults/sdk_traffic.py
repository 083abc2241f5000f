"""The Python SDK through a fault, as an application runs it: a producer pushing one
message at a time and a Consumer loop, both with the client's default RetryPolicy."""

from __future__ import annotations

import functools
import threading
import time
from collections import Counter
from typing import Any

from queen.client import Message, Queen

GROUP = "ha-group"
LEASE_S = 5  # the queue's leaseTime, well inside drain()'s wait


class SdkTraffic:
    """Push `sdk-N` payloads to queue (two partitions) and consume them, until stopped:
    in queue mode, and as the consumer group GROUP (its cursors and leases live through
    the fault too)."""

    def __init__(self, url: str, queue: str) -> None:
        self.client = Queen(url)
        self.queue = queue
        self.pushed: list[str] = []  # payload ids whose push returned
        self.errors: list[str] = []  # what a push raised: the client gave up
        self.handled: dict[str | None, Counter[str]] = {None: Counter(), GROUP: Counter()}
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self.consumers = [
            self.client.consumer(
                queue, functools.partial(self._handle, group), group=group,
                handle_signals=False, poll_timeout=2,
            )
            for group in self.handled
        ]
        self._threads = [
            threading.Thread(target=self._produce, name="sdk-producer", daemon=True),
            *(threading.Thread(target=c.run, name="sdk-consumer", daemon=True)
              for c in self.consumers),
        ]

    def start(self) -> SdkTraffic:
        # An acknowledgment committed without waiting for the disk may die with the
        # primary; its lease then holds the partition until it expires, and its messages
        # come again after that. A short lease brings them back within the drain.
        self.client.configure(self.queue, lease_time=LEASE_S)
        for thread in self._threads:
            thread.start()
        return self

    def _handle(self, group: str | None, message: Message) -> None:
        with self._lock:
            self.handled[group][message.data["id"]] += 1

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
        """Wait until queue mode and the group handled every pushed id; stop consuming;
        return those one of them never handled (`group:id`)."""
        deadline = time.monotonic() + timeout
        while True:
            with self._lock:
                missing = [
                    f"{group or 'queue mode'}:{item}"
                    for group, handled in self.handled.items()
                    for item in self.pushed
                    if item not in handled
                ]
            if not missing or time.monotonic() > deadline:
                break
            time.sleep(0.2)
        for consumer in self.consumers:
            consumer.stop()
        for thread in self._threads[1:]:
            thread.join(30)
        self.client.close()
        return missing

    def figures(self) -> dict[str, Any]:
        with self._lock:
            return {
                "sdk_pushed": len(self.pushed),
                "sdk_gave_up": len(self.errors),
                **{
                    f"sdk_{'group' if group else 'queue_mode'}_{what}": count
                    for group, handled in self.handled.items()
                    for what, count in (
                        ("handled", len(handled)),
                        ("handled_twice", sum(1 for n in handled.values() if n > 1)),
                    )
                },
            }
