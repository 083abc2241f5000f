"""Claims whose answer was lost with the connection, given back once the database answers."""

from __future__ import annotations

import logging
import threading
import time
import uuid
from collections.abc import Callable

from queen.errors import QueenError
from queen.store.db import Backend, Database

log = logging.getLogger(__name__)

GIVE_BACK_EVERY_S = 1.0  # seconds between attempts while the database does not answer
# Past this a claim is left to its lease: it has expired by then (leaseTime 300 s unless
# configured longer), and giving back a redelivered batch would only be a no-op.
GIVE_BACK_FOR_S = 600.0


class GiveBacks:
    """Give back, in the background, the claims of pops whose answer was lost.

    A pop whose connection broke after its statement was sent may have committed: its
    messages are then leased to no one, and would return only when the lease expires,
    counted as a retry (with retryLimit 0, dead-lettered without a delivery). The pop
    drew its lease id itself, so the claim can be found: one thread (a greenlet under
    gevent) per process calls queen.give_back_claim for it until the database
    answers.
    """

    def __init__(self, db: Database, clock: Callable[[], float] = time.monotonic) -> None:
        self.db = db
        self.clock = clock
        self.given_back = 0  # messages returned to pending so far
        self._pending: dict[uuid.UUID, tuple[Backend, float]] = {}  # lease: (backend, until)
        self._lock = threading.Lock()
        self._wake = threading.Event()
        self._thread: threading.Thread | None = None
        self._closed = False

    def add(self, lease: uuid.UUID, backend: Backend) -> None:
        """Give back lease's claim, made by database backend `backend`, as soon as possible."""
        with self._lock:
            self._pending[lease] = (backend, self.clock() + GIVE_BACK_FOR_S)
            if self._thread is None:
                self._thread = threading.Thread(
                    target=self._run, name="queen-give-back", daemon=True
                )
                self._thread.start()
        self._wake.set()

    def pending(self) -> int:
        with self._lock:
            return len(self._pending)

    def close(self) -> None:
        self._closed = True
        self._wake.set()

    def _run(self) -> None:
        while not self._closed:
            self._wake.wait(GIVE_BACK_EVERY_S)
            self._wake.clear()
            with self._lock:
                if not self._pending:
                    self._thread = None  # add() starts another when needed
                    return
                pending = list(self._pending.items())
            for lease, (backend, until) in pending:
                if self._closed:
                    return
                if self._give_back(lease, backend) or self.clock() > until:
                    with self._lock:
                        self._pending.pop(lease, None)

    def _give_back(self, lease: uuid.UUID, backend: Backend) -> bool:
        """Try once; tell whether the claim is settled (given back, or there was none)."""
        params = {"lease": lease, "backend": backend.pid, "server_started": backend.server_started}
        try:
            ((released,),) = self.db.fetch("give_back_claim", params)
        except QueenError as exc:
            log.info("cannot give back lease %s yet: %s", lease, exc.message)
            return False
        if released is None:
            return False  # the backend that ran the pop is still ending
        if released:
            self.given_back += released
            log.warning("gave back %d messages of a pop whose answer was lost", released)
        return True
