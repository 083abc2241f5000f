"""The sync consumer: pop, run a handler per message, ack; leases renewed meanwhile."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from queen.client import consuming, tracing
from queen.client.errors import NotFound, QueenError
from queen.client.models import Message

if TYPE_CHECKING:
    from queen.client.sync import Queen

log = logging.getLogger("queen.client")
TICK = 0.1  # seconds between the renewal thread's looks at the leases in hand
Handler = Callable[[Message], Any]


class Renewer:
    """One thread per consumer that extends the leases of the batches being handled.

    A batch registers its lease (a dict entry: no thread, no wake-up of its own); the
    thread starts with the first one and looks at the leases at least every TICK seconds.
    """

    def __init__(self, client: Queen) -> None:
        self.client = client
        self._due: dict[str, tuple[float, int]] = {}  # lease -> (monotonic due time, seconds)
        self._cond = threading.Condition()
        self._closed = False
        self._thread: threading.Thread | None = None

    def watch(self, messages: list[Message]) -> str | None:
        """Keep the lease of messages alive until forget(); return the lease."""
        lease = messages[0].lease_id
        if lease is None:
            return None
        seconds = consuming.lease_seconds(messages)
        with self._cond:
            self._due[lease] = (time.monotonic() + consuming.renew_every(seconds), seconds)
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name="queen-renew", daemon=True)
                self._thread.start()
        return lease

    def forget(self, lease: str | None) -> None:
        if lease is not None:
            with self._cond:
                self._due.pop(lease, None)

    def close(self) -> None:
        with self._cond:
            self._closed = True
            self._cond.notify()
        if self._thread is not None:
            self._thread.join()

    def _next(self) -> tuple[str, int] | None:
        """Wait for the next lease due; None once closed."""
        with self._cond:
            while not self._closed:
                left = TICK
                if self._due:
                    lease, (due, seconds) = min(self._due.items(), key=lambda kv: kv[1][0])
                    left = min(left, due - time.monotonic())
                    if left <= 0:
                        self._due[lease] = (due + consuming.renew_every(seconds), seconds)
                        return lease, seconds
                self._cond.wait(left)
            return None

    def _run(self) -> None:
        while (due := self._next()) is not None:
            lease, seconds = due
            try:
                self.client.extend(lease, seconds)
            except NotFound:
                with self._cond:
                    watched = self._due.pop(lease, None) is not None
                if watched:  # (not just acked meanwhile)
                    log.warning("lease %s ended before its messages were handled", lease)
            except QueenError as exc:
                log.warning("renewing lease %s failed: %s", lease, exc)


class Consumer:
    """Consume a queue with concurrency loops, until stopped or limit messages were handled."""

    def __init__(
        self,
        client: Queen,
        queue: str,
        handler: Handler,
        *,
        batch: int = 1,
        concurrency: int = 1,
        group: str | None = None,
        partition: str | None = None,
        renew: bool = True,
        limit: int | None = None,
        handle_signals: bool = True,
        poll_timeout: float = consuming.POLL_TIMEOUT,
    ) -> None:
        if batch < 1 or concurrency < 1:
            raise ValueError("batch and concurrency must be at least 1")
        self.client = client
        self.queue = queue
        self.handler = handler
        self.batch = batch
        self.concurrency = concurrency
        self.group = group
        self.partition = partition
        self.renew = renew
        self.handle_signals = handle_signals
        self.poll_timeout = poll_timeout
        # How a loop pops, alone or with an ack: a long poll, as this consumer's group.
        self._long_poll: dict[str, Any] = {"wait": True, "timeout": poll_timeout, "group": group}
        self.budget = consuming.Budget(limit)
        self.renewer = Renewer(client)
        self._stop = threading.Event()
        self._fatal: QueenError | None = None
        self._queue_checked = False  # after the first empty pop: warned once if unknown

    @property
    def handled(self) -> int:
        return self.budget.handled

    def stop(self) -> None:
        """Finish the messages in hand, then return from run()."""
        self._stop.set()

    def run(self) -> int:
        """Consume until stopped; return how many messages were handled."""
        with consuming.stop_on_signals(self.stop, self.handle_signals):
            loops = [
                threading.Thread(target=self._loop, name=f"queen-consume-{i}", daemon=True)
                for i in range(self.concurrency)
            ]
            for loop in loops:
                loop.start()
            try:
                for loop in loops:
                    while loop.is_alive():
                        loop.join(0.2)
            except BaseException:
                self.stop()
                for loop in loops:
                    loop.join()
                raise
            finally:
                self.renewer.close()
        if self._fatal is not None:
            raise self._fatal
        return self.handled

    def _loop(self) -> None:
        failures = 0
        in_hand: list[Message] = []  # the messages an ack's next pop brought
        while in_hand or (not self._stop.is_set() and not self.budget.spent):
            if in_hand:
                in_hand = self._process(in_hand)
                continue
            wanted = self.budget.take(self.batch)
            if not wanted:
                self._stop.wait(0.05)  # other loops hold the rest of the limit
                continue
            try:
                messages = self.client.pop(
                    self.queue, self.partition, batch=wanted, **self._long_poll
                )
            except QueenError as exc:
                self.budget.give_back(wanted)
                if not consuming.transient(exc):
                    self._fatal = exc
                    self.stop()
                    return
                failures += 1
                log.warning("pop from %s failed (%s); retrying", self.queue, exc)
                self._stop.wait(self.client.policy.pause(min(failures, 6)))
                continue
            failures = 0
            self.budget.give_back(wanted - len(messages))
            in_hand = messages
            if not messages and not self._queue_checked:
                self._check_queue()

    def _check_queue(self) -> None:
        """Warn once when the queue does not exist: a misspelt name would wait forever."""
        self._queue_checked = True
        try:
            self.client.queue(self.queue)
        except NotFound:
            log.warning(consuming.UNKNOWN_QUEUE, self.queue)
        except QueenError:
            pass  # a token that may not read it, a server away: nothing to say

    def _process(self, messages: list[Message]) -> list[Message]:
        """Handle messages and ack them; the ack also pops the next ones (returned) unless
        the consumer is stopping or its limit is reserved."""
        lease = self.renewer.watch(messages) if self.renew else None
        try:
            outcomes = [(m, self._handle(m)) for m in messages]
        finally:
            self.renewer.forget(lease)
        wanted = 0 if self._stop.is_set() else self.budget.take(self.batch)
        following: list[Message] = []
        try:
            if wanted:
                _, following = self.client.ack_and_pop(
                    outcomes, self.queue, self.partition, batch=wanted, **self._long_poll
                )
            else:
                self.client.ack_many(outcomes)
        except QueenError as exc:
            log.error("acking %d message(s) of %s failed: %s", len(outcomes), self.queue, exc)
        self.budget.give_back(wanted - len(following))
        self.budget.spend(len(messages))
        return following

    def _handle(self, message: Message) -> str | None:
        """Run the handler; return None (completed) or the failure text."""
        try:
            with tracing.consuming(self.queue, message.transaction_id, message.trace_parent):
                self.handler(message)
        except Exception as exc:
            log.info("handler failed on %s: %s", message.transaction_id, exc)
            return consuming.error_text(exc)
        return None


class Worker:
    """A handler registered with @queen.worker(queue, ...): call it, or run() it."""

    def __init__(self, client: Queen, queue: str, handler: Handler, options: dict[str, Any]):
        self.client = client
        self.queue = queue
        self.handler = handler
        self.options = options
        self.__wrapped__ = handler
        self.__doc__ = handler.__doc__

    def __call__(self, message: Message) -> Any:
        return self.handler(message)

    def run(self, **overrides: Any) -> int:
        """Consume the queue with this handler (options as consume() takes them)."""
        return self.client.consume(self.queue, self.handler, **{**self.options, **overrides})
