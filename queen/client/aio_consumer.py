"""The asyncio consumer: the sync one's behaviour, with tasks instead of threads."""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import logging
import threading
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any

from queen.client import consuming, tracing
from queen.client.errors import NotFound, QueenError
from queen.client.models import Message

if TYPE_CHECKING:
    from queen.client.aio import AsyncQueen

log = logging.getLogger("queen.client")
AsyncHandler = Callable[[Message], Any]  # a coroutine function, or a plain one (run in a thread)


async def _renew(client: AsyncQueen, lease: str, seconds: int) -> None:
    """Extend a lease until cancelled."""
    while True:
        await asyncio.sleep(consuming.renew_every(seconds))
        try:
            await client.extend(lease, seconds)
        except NotFound:
            log.warning("lease %s ended before its messages were handled", lease)
            return
        except QueenError as exc:
            log.warning("renewing lease %s failed: %s", lease, exc)


@contextlib.contextmanager
def _loop_signals(stop: Callable[[], None], enabled: bool) -> Iterator[None]:
    """Call stop on the first SIGTERM/SIGINT (main thread only)."""
    if not enabled or threading.current_thread() is not threading.main_thread():
        yield
        return
    loop = asyncio.get_running_loop()

    def on_signal() -> None:
        remove()
        stop()

    def remove() -> None:
        for signum in consuming.STOP_SIGNALS:
            loop.remove_signal_handler(signum)

    for signum in consuming.STOP_SIGNALS:
        loop.add_signal_handler(signum, on_signal)
    try:
        yield
    finally:
        remove()


class AsyncConsumer:
    """Consume a queue with concurrency tasks, until stopped or limit messages were handled."""

    def __init__(
        self,
        client: AsyncQueen,
        queue: str,
        handler: AsyncHandler,
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
        self._stop = asyncio.Event()
        self._fatal: QueenError | None = None
        self._queue_checked = False  # after the first empty pop: warned once if unknown

    @property
    def handled(self) -> int:
        return self.budget.handled

    def stop(self) -> None:
        """Finish the messages in hand, then return from run()."""
        self._stop.set()

    async def run(self) -> int:
        """Consume until stopped; return how many messages were handled."""
        with _loop_signals(self.stop, self.handle_signals):
            loops = [asyncio.create_task(self._loop()) for _ in range(self.concurrency)]
            try:
                await asyncio.gather(*loops)
            except BaseException:
                self.stop()
                await asyncio.gather(*loops, return_exceptions=True)
                raise
        if self._fatal is not None:
            raise self._fatal
        return self.handled

    async def _pause(self, seconds: float) -> None:
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._stop.wait(), seconds)

    async def _loop(self) -> None:
        failures = 0
        in_hand: list[Message] = []  # the messages an ack's next pop brought
        while in_hand or (not self._stop.is_set() and not self.budget.spent):
            if in_hand:
                in_hand = await self._process(in_hand)
                continue
            wanted = self.budget.take(self.batch)
            if not wanted:
                await self._pause(0.05)
                continue
            try:
                messages = await self.client.pop(
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
                await self._pause(self.client.policy.pause(min(failures, 6)))
                continue
            failures = 0
            self.budget.give_back(wanted - len(messages))
            in_hand = messages
            if not messages and not self._queue_checked:
                await self._check_queue()

    async def _check_queue(self) -> None:
        """Warn once when the queue does not exist: a misspelt name would wait forever."""
        self._queue_checked = True
        try:
            await self.client.queue(self.queue)
        except NotFound:
            log.warning(consuming.UNKNOWN_QUEUE, self.queue)
        except QueenError:
            pass  # a token that may not read it, a server away: nothing to say

    async def _process(self, messages: list[Message]) -> list[Message]:
        """Handle messages and ack them; the ack also pops the next ones (returned) unless
        the consumer is stopping or its limit is reserved."""
        lease = messages[0].lease_id
        renewal = None
        if self.renew and lease:
            seconds = consuming.lease_seconds(messages)
            renewal = asyncio.create_task(_renew(self.client, lease, seconds))
        try:
            outcomes = [(m, await self._handle(m)) for m in messages]
        finally:
            if renewal is not None:
                renewal.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await renewal
        wanted = 0 if self._stop.is_set() else self.budget.take(self.batch)
        following: list[Message] = []
        try:
            if wanted:
                _, following = await self.client.ack_and_pop(
                    outcomes, self.queue, self.partition, batch=wanted, **self._long_poll
                )
            else:
                await self.client.ack_many(outcomes)
        except QueenError as exc:
            log.error("acking %d message(s) of %s failed: %s", len(outcomes), self.queue, exc)
        self.budget.give_back(wanted - len(following))
        self.budget.spend(len(messages))
        return following

    async def _handle(self, message: Message) -> str | None:
        """Run the handler; return None (completed) or the failure text."""
        try:
            with tracing.consuming(self.queue, message.transaction_id, message.trace_parent):
                if inspect.iscoroutinefunction(self.handler):
                    await self.handler(message)
                else:
                    result = await asyncio.to_thread(self.handler, message)
                    if inspect.isawaitable(result):
                        await result
        except Exception as exc:
            log.info("handler failed on %s: %s", message.transaction_id, exc)
            return consuming.error_text(exc)
        return None


class AsyncWorker:
    """A handler registered with @queen.worker(queue, ...): call it, or await run()."""

    def __init__(
        self, client: AsyncQueen, queue: str, handler: AsyncHandler, options: dict[str, Any]
    ) -> None:
        self.client = client
        self.queue = queue
        self.handler = handler
        self.options = options
        self.__wrapped__ = handler
        self.__doc__ = handler.__doc__

    def __call__(self, message: Message) -> Any:
        return self.handler(message)

    async def run(self, **overrides: Any) -> int:
        """Consume the queue with this handler (options as consume() takes them)."""
        return await self.client.consume(self.queue, self.handler, **{**self.options, **overrides})
