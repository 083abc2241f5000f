"""What the sync and async consumers share: the message budget, renewal timing, signals."""

from __future__ import annotations

import contextlib
import signal
import threading
from collections.abc import Callable, Iterator
from typing import Any

from queen.client.errors import QueenError, ServerError, TransportError
from queen.client.models import Message

POLL_TIMEOUT = 2.0  # seconds a consumer's long poll waits: how soon a stop is noticed
DEFAULT_LEASE_TIME = 300  # seconds, the server's default, when a message does not say
RENEWALS_PER_LEASE = 3  # a lease is renewed this often per leaseTime
STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT)
UNKNOWN_QUEUE = "queue %r does not exist (no push or configure made it yet): is its name right?"


def error_text(exc: BaseException) -> str:
    """The failure reason an ack carries for a handler's exception."""
    return str(exc) or type(exc).__name__


def transient(exc: QueenError) -> bool:
    """Tell whether a consumer should keep going after exc (retry later)."""
    return isinstance(exc, TransportError | ServerError)


def lease_seconds(messages: list[Message]) -> int:
    """The leaseTime to renew the lease of a pop's messages for."""
    return next((m.lease_time for m in messages if m.lease_time), DEFAULT_LEASE_TIME)


def renew_every(lease_time: float) -> float:
    """Seconds between renewals of a lease of lease_time seconds."""
    return max(0.1, lease_time / RENEWALS_PER_LEASE)


class Budget:
    """How many more messages a consumer with a limit may take (thread-safe).

    A loop reserves before it pops and gives back what the pop did not fill; the budget
    is spent when every reserved message was handled.
    """

    def __init__(self, limit: int | None) -> None:
        self.limit = limit
        self.reserved = 0
        self.handled = 0
        self._lock = threading.Lock()

    def take(self, wanted: int) -> int:
        """Reserve up to wanted messages; 0 when the limit is reserved (for now)."""
        with self._lock:
            if self.limit is None:
                return wanted
            granted = max(0, min(wanted, self.limit - self.reserved))
            self.reserved += granted
            return granted

    def give_back(self, unused: int) -> None:
        with self._lock:
            if self.limit is not None:
                self.reserved -= unused

    def spend(self, handled: int) -> None:
        with self._lock:
            self.handled += handled

    @property
    def spent(self) -> bool:
        return self.limit is not None and self.handled >= self.limit


@contextlib.contextmanager
def stop_on_signals(stop: Callable[[], None], enabled: bool) -> Iterator[None]:
    """Call stop on the first SIGTERM/SIGINT (main thread only); restore the handlers after.

    The previous handlers come back at the first signal, so a second Ctrl-C interrupts.
    """
    if not enabled or threading.current_thread() is not threading.main_thread():
        yield
        return
    previous: dict[int, Any] = {}

    def on_signal(signum: int, frame: object) -> None:
        restore()
        stop()

    def restore() -> None:
        for signum, handler in previous.items():
            signal.signal(signum, handler)
        previous.clear()

    for signum in STOP_SIGNALS:
        previous[signum] = signal.signal(signum, on_signal)
    try:
        yield
    finally:
        restore()
