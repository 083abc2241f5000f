"""Pop with optional long polling: claim now, or park until a notification or the timeout."""

from __future__ import annotations

import time
from collections.abc import Callable

from queen.events import Events
from queen.models import Popped, PopRoute
from queen.store import Store


class LongPoller:
    """Serve pops for the API: immediate, or parked on the events registry without a connection."""

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

    def pop(self, route: PopRoute, batch: int, *, wait: bool, timeout_s: float) -> list[Popped]:
        """Return claimed messages, or [] when nothing came within timeout_s (wait=True)."""
        if not wait or self.events is None or timeout_s <= 0:
            return self.store.messages.pop(route, batch, self.worker_id)
        timeout_s = self._cap(route, timeout_s)
        deadline = self.clock() + timeout_s
        with self.events.subscribe(route) as waiter:
            while not self.events.shutting_down:
                messages = self.store.messages.pop(route, batch, self.worker_id)
                remaining = deadline - self.clock()
                if messages or remaining <= 0:
                    return messages
                waiter.wait(remaining)
        return []

    def _cap(self, route: PopRoute, timeout_s: float) -> float:
        """Apply the queue's maxWaitTimeSeconds to a long poll on that queue."""
        if route.queue is None:
            return timeout_s
        flags = self.store.queues.flags(route.queue)
        if flags is not None and flags.max_wait_s > 0:
            return min(timeout_s, float(flags.max_wait_s))
        return timeout_s
