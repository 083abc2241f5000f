"""The asyncio client: AsyncQueen, the same methods as Queen, awaited."""

from __future__ import annotations

import datetime as dt
from collections.abc import Callable, Iterable, Sequence
from typing import Any, TypeVar

from queen.client import calls, tracing
from queen.client.aio_consumer import AsyncConsumer, AsyncHandler, AsyncWorker
from queen.client.calls import AckItem, Call, MessageOrId, segment
from queen.client.models import AckResult, Message, PushResult
from queen.client.producer import AsyncProducer
from queen.client.transaction import AsyncTransaction
from queen.client.transport import AsyncTransport, RetryPolicy

T = TypeVar("T")


class AsyncQueen:
    """A client of one Queen service (several base URLs: failover), for one event loop.

    url: a base URL, a list of them, or a comma-separated string (default: QUEEN_URL,
    else http://127.0.0.1:6632); token: a bearer token (default: QUEEN_TOKEN).
    """

    def __init__(
        self,
        url: str | Sequence[str] | None = None,
        *,
        token: str | None = None,
        retry: RetryPolicy | None = None,
        transport: AsyncTransport | None = None,
    ) -> None:
        self.transport = transport or AsyncTransport(url, token, retry)
        self.policy = self.transport.policy

    async def __aenter__(self) -> AsyncQueen:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        await self.transport.close()

    async def send(self, call: Call[T]) -> T:
        """Send one Call (retries and failover included)."""
        return await self.transport.send(call)

    # --- messages -------------------------------------------------------------------
    async def push(
        self,
        queue: str,
        payloads: Any,
        partition: str | None = None,
        transaction_ids: Sequence[str] | None = None,
    ) -> list[PushResult]:
        """Push payloads (a list or tuple: many; anything else: one) to a queue."""
        with tracing.producing(queue):
            items = calls.push_items(queue, payloads, partition, transaction_ids)
            return await self.send(calls.push(items))

    async def pop(
        self,
        queue: str,
        partition: str | None = None,
        batch: int = 1,
        wait: bool = False,
        timeout: float = 30.0,
        group: str | None = None,
        subscription: str | dt.datetime | None = None,
    ) -> list[Message]:
        """Lease up to batch messages ([] when none); wait: long poll up to timeout seconds."""
        return await self.send(
            calls.pop(queue, partition, batch, wait, timeout, group, subscription)
        )

    async def ack(
        self, target: MessageOrId, error: str | None = None, group: str | None = None
    ) -> AckResult:
        """Acknowledge a message (or a transactionId): completed, or failed with error."""
        return await self.send(calls.ack(calls.ack_item(target, error, group)))

    async def ack_many(self, acks: Iterable[AckItem], error: str | None = None) -> list[AckResult]:
        """Acknowledge messages or ids (error applies to all) or (message, error) pairs."""
        items = calls.ack_items(acks, error)
        return (await self.send(calls.ack_many(items))) if items else []

    async def ack_and_pop(
        self,
        acks: Iterable[AckItem],
        queue: str,
        partition: str | None = None,
        batch: int = 1,
        wait: bool = False,
        timeout: float = 30.0,
        group: str | None = None,
        subscription: str | dt.datetime | None = None,
        error: str | None = None,
    ) -> tuple[list[AckResult], list[Message]]:
        """Acknowledge (as ack_many), then lease the next messages (as pop): one request."""
        items = calls.ack_items(acks, error)
        if not items:  # (nothing to ack: a plain pop)
            return [], await self.pop(queue, partition, batch, wait, timeout, group, subscription)
        return await self.send(
            calls.ack_and_pop(items, queue, partition, batch, wait, timeout, group, subscription)
        )

    async def extend(self, target: Message | str, seconds: float | None = None) -> str:
        """Renew the lease of a message (or a leaseId); return the new leaseExpiresAt."""
        return await self.send(calls.extend(target, seconds))

    async def configure(
        self, queue: str, namespace: str | None = None, task: str | None = None, **options: Any
    ) -> dict[str, Any]:
        """Set queue options (snake_case: lease_time=60, retry_limit=5); return all of them."""
        return await self.send(calls.configure(queue, namespace, task, **options))

    def transaction(self) -> AsyncTransaction:
        """A builder: await queen.transaction().ack(m).push("next", [doc]).commit()."""
        return AsyncTransaction(self.send)

    # --- consumers and producers ------------------------------------------------------
    async def consume(self, queue: str, handler: AsyncHandler, **options: Any) -> int:
        """Run handler on each message until stopped (SIGTERM/SIGINT) or limit handled.

        Options: batch=1, concurrency=1, group=None, partition=None, renew=True,
        limit=None, handle_signals=True, poll_timeout=2.0. Returns messages handled.
        """
        return await AsyncConsumer(self, queue, handler, **options).run()

    def consumer(self, queue: str, handler: AsyncHandler, **options: Any) -> AsyncConsumer:
        """An AsyncConsumer to run() (and stop() from another task)."""
        return AsyncConsumer(self, queue, handler, **options)

    def worker(self, queue: str, **options: Any) -> Callable[[AsyncHandler], AsyncWorker]:
        """Decorator: @queen.worker("orders") async def handle(message): ...; await handle.run()."""
        return lambda handler: AsyncWorker(self, queue, handler, options)

    def producer(self, linger_ms: float = 5, max_items: int = 500) -> AsyncProducer:
        """A buffered producer for this event loop; aclose() it (or async with) to flush."""
        return AsyncProducer(self.send, linger_ms, max_items)

    # --- admin reads ----------------------------------------------------------------
    async def messages(
        self,
        queue: str | None = None,
        partition: str | None = None,
        status: str | None = None,
        limit: int = 100,
        offset: int = 0,
    ) -> list[dict[str, Any]]:
        """One page of messages, newest first."""
        return await self.send(calls.messages(queue, partition, status, limit, offset))

    async def message(self, transaction_id: str) -> dict[str, Any]:
        return await self.send(calls.get(f"/messages/{segment(transaction_id)}"))

    async def delete_message(self, transaction_id: str) -> dict[str, Any]:
        return await self.send(calls.delete(f"/messages/{segment(transaction_id)}"))

    async def retry_message(self, transaction_id: str) -> dict[str, Any]:
        """Make a failed or dead-lettered message pending again."""
        return await self.send(calls.post(f"/messages/{segment(transaction_id)}/retry"))

    async def dead_letters(self, queue: str, limit: int = 100) -> list[dict[str, Any]]:
        return await self.messages(queue, status="dead_letter", limit=limit)

    async def retry_dead_letters(self, queue: str, limit: int = 1000) -> list[str]:
        """Retry the queue's dead letters (up to limit); return their transactionIds."""
        retried = [m["transactionId"] for m in await self.dead_letters(queue, limit)]
        for txid in retried:
            await self.retry_message(txid)
        return retried

    async def queues(self) -> list[dict[str, Any]]:
        return await self.send(calls.get("/resources/queues", "queues"))

    async def queue(self, name: str) -> dict[str, Any]:
        return await self.send(calls.get(f"/resources/queues/{segment(name)}"))

    async def stats(self, queue: str | None = None) -> Any:
        """Analytics of one queue (a dict), or of every queue (a list)."""
        return await self.send(calls.stats(queue))

    async def consumer_groups(self, queue: str | None = None) -> list[dict[str, Any]]:
        """The consumer groups of queue (None: of every queue)."""
        return await self.send(calls.get("/consumer-groups", "consumerGroups", queue=queue))

    async def subscribe(
        self, group: str, queue: str, subscription: str | dt.datetime | None = None
    ) -> dict[str, Any]:
        """Subscribe group to queue as its first pop would ('all', 'new' or a start time);
        a group already there is left as it is."""
        return await self.send(calls.subscribe(group, queue, subscription))

    async def consumer_group(self, name: str) -> dict[str, Any]:
        return await self.send(calls.get(f"/consumer-groups/{segment(name)}"))

    async def seek(self, group: str, queue: str, to: str | dt.datetime) -> dict[str, Any]:
        """Move a group's position in a queue: 'beginning', 'end' or a time."""
        return await self.send(calls.seek(group, queue, to))

    async def delete_consumer_group(self, group: str, queue: str | None = None) -> dict[str, Any]:
        return await self.send(calls.delete(f"/consumer-groups/{segment(group)}", queue=queue))
