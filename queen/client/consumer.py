"""The sync consumer: pop, run a handler per message, ack; leases renewed meanwhile."""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from queen.client import consuming
from queen.client.errors import NotFound, QueenError
from queen.client.models import Message

if TYPE_CHECKING:
    from queen.client.sync import Queen

log = logging.getLogger("queen.client")
Handler = Callable[[Message], Any]


class Renewal:
    """A thread that extends one lease until stopped."""

    def __init__(self, client: Queen, messages: list[Message]) -> None:
        self.client = client
        self.lease = messages[0].lease_id
        self.seconds = consuming.lease_seconds(messages)
        self._done = threading.Event()
        self._thread = threading.Thread(target=self._run, name="queen-renew", daemon=True)
        if self.lease:
            self._thread.start()

    def _run(self) -> None:
        assert self.lease is not None
        while not self._done.wait(consuming.renew_every(self.seconds)):
            try:
                self.client.extend(self.lease, self.seconds)
            except NotFound:
                log.warning("lease %s ended before its messages were handled", self.lease)
                return
            except QueenError as exc:
                log.warning("renewing lease %s failed: %s", self.lease, exc)

    def stop(self) -> None:
        self._done.set()
        if self._thread.is_alive():
            self._thread.join()


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
        self.budget = consuming.Budget(limit)
        self._stop = threading.Event()
        self._fatal: QueenError | None = None

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
        if self._fatal is not None:
            raise self._fatal
        return self.handled

    def _loop(self) -> None:
        failures = 0
        while not self._stop.is_set() and not self.budget.spent:
            wanted = self.budget.take(self.batch)
            if not wanted:
                self._stop.wait(0.05)  # other loops hold the rest of the limit
                continue
            try:
                messages = self.client.pop(
                    self.queue,
                    self.partition,
                    batch=wanted,
                    wait=True,
                    timeout=self.poll_timeout,
                    group=self.group,
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
            if messages:
                self._process(messages)

    def _process(self, messages: list[Message]) -> None:
        renewal = Renewal(self.client, messages) if self.renew else None
        try:
            outcomes = [(m, self._handle(m)) for m in messages]
        finally:
            if renewal is not None:
                renewal.stop()
        try:
            self.client.ack_many(outcomes)
        except QueenError as exc:
            log.error("acking %d message(s) of %s failed: %s", len(outcomes), self.queue, exc)
        self.budget.spend(len(messages))

    def _handle(self, message: Message) -> str | None:
        """Run the handler; return None (completed) or the failure text."""
        try:
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
