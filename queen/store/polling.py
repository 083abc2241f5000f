"""What long polling asks of the database besides the pop itself."""

from __future__ import annotations

import logging
import threading
import time
import uuid
from collections.abc import Callable, Iterable
from typing import Any

from queen.errors import QueenError
from queen.store.db import Database
from queen.wakeup import DEFAULT_PARTITION

log = logging.getLogger(__name__)


def ready_params(
    queues: Iterable[str],
    partitions: Iterable[tuple[str, str]],
    filters: Iterable[tuple[str | None, str | None]],
    limit: int,
) -> dict[str, Any]:
    """The parameters of a ready_partitions query for these routes."""
    pairs = list(partitions)
    filter_list = list(filters)
    return {
        "queues": list(queues),
        "partition_queues": [q for q, _ in pairs],
        "partitions": [p for _, p in pairs],
        "namespaces": [ns for ns, _ in filter_list],
        "tasks": [task for _, task in filter_list],
        "limit": limit,
    }


class Polling:
    """The fallback re-check of parked polls, and giving back claims nobody received."""

    def __init__(self, db: Database) -> None:
        self.db = db
        self.wakeups = Wakeups(db)

    def ready_partitions(
        self,
        queues: Iterable[str],
        partitions: Iterable[tuple[str, str]],
        filters: Iterable[tuple[str | None, str | None]],
        limit: int,
    ) -> list[str]:
        """Return wake payloads of partitions with work for these routes (a hint).

        queues: routes by queue; partitions: (queue, partition) routes; filters:
        (namespace, task) routes, None matching anything.
        """
        params = ready_params(queues, partitions, filters, limit)
        return [row[0] for row in self.db.fetch("ready_partitions", params)]

    def list_waiting_worker(self, worker: str, seconds: int) -> None:
        """List this worker as having parked polls for the next seconds (pushes then notify)."""
        self.db.fetch("list_waiting_worker", {"worker": worker, "seconds": seconds})

    def unclaim(self, lease_id: uuid.UUID) -> int:
        """Give back a pop's lease (the whole batch of a response) without counting a retry;
        how many messages went back."""
        rows = self.db.fetch("unclaim", {"lease": lease_id})
        return int(rows[0][0] or 0) if rows else 0


class Wakeups:
    """Wake long polls for what pushes stored and acks freed, after they committed.

    Queen's sessions defer the push notifications (`queen.push_notify = after_commit`,
    see queen.notify_pushed for why), and acks hand back the wake-ups of the partitions
    they freed (queen.ack), as the server's common push (push_new) does for its
    partitions. Started, one thread (a greenlet under gevent) per process sends every
    wake-up noted meanwhile in one small transaction (queen.notify_sent, or
    queen.notify_wakes when every one noted is a payload already), so concurrent calls
    share it; not started, each call sends its own. An ack's wake-up that wakes a poll
    parked in this process (here) is not sent at all.
    """

    def __init__(self, db: Database) -> None:
        self.db = db
        self._pending: dict[tuple[str, str], None] = {}
        self._payloads: dict[str, None] = {}
        self._lock = threading.Lock()
        self._ready = threading.Event()
        self._running = False
        # Wakes a poll parked in this process for an ack's wake-up; True when one was.
        self.here: Callable[[str], bool] | None = None

    def pushed(self, items: Iterable[dict[str, Any]], payloads: list[str] | None = None) -> None:
        """Note the partitions of items that were just stored (the push has committed), or
        their wake-up payloads when the push made them."""
        if payloads is not None:
            self.send(payloads)
            return
        pairs = {(i["queue"], i.get("partition") or DEFAULT_PARTITION): None for i in items}
        if not self._running:
            self._send(list(pairs), [])
            return
        with self._lock:
            self._pending.update(pairs)
        self._wake_sender()

    def freed(self, payloads: Iterable[str]) -> None:
        """Note the wake-up payloads of partitions committed acks freed with work left:
        woken here when a poll parked here takes them, else sent."""
        here = self.here
        self.send([p for p in dict.fromkeys(payloads) if here is None or not here(p)])

    def send(self, payloads: list[str]) -> None:
        """Send wake-up payloads of committed work, each once, waking no poll here first:
        those of acks no poll here took, and those of pushes (for every group)."""
        if not payloads:
            return
        if not self._running:
            self._send([], payloads)
            return
        with self._lock:
            self._payloads.update(dict.fromkeys(payloads))
        self._wake_sender()

    def _wake_sender(self) -> None:
        self._ready.set()
        time.sleep(0)  # let the sender start its query now, not after this call's response

    def start(self) -> None:
        self._running = True
        threading.Thread(target=self._run, name="queen-wakeups", daemon=True).start()

    def stop(self) -> None:
        self._running = False
        self._ready.set()

    def _run(self) -> None:
        while self._running:
            self._ready.wait()
            self._ready.clear()
            with self._lock:
                pairs, self._pending = list(self._pending), {}
                payloads, self._payloads = list(self._payloads), {}
            self._send(pairs, payloads)

    def _send(self, pairs: list[tuple[str, str]], payloads: list[str]) -> None:
        if pairs:  # (with the acks' wake-ups: one transaction for both)
            params = {"queues": [q for q, _ in pairs], "partitions": [p for _, p in pairs],
                      "wakes": payloads}
            _try_waking(lambda: self.db.fetch("notify_sent", params))
        elif payloads:
            _try_waking(lambda: self.db.fetch("notify_wakes", {"payloads": payloads}))


def _try_waking(send: Callable[[], object]) -> None:
    """Send wake-ups; a lost one costs latency only (the fallback re-check finds the work)."""
    try:
        send()
    except QueenError as exc:
        log.warning("could not wake long polls: %s", exc.message)
