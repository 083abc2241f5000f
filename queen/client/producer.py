"""The buffered producer: pushes from many call sites, batched.

Items wait at most linger_ms for company and leave in pushes of at most max_items. Each
item gets its UUIDv7 transactionId when it is sent to the producer, so a push sent again
after a lost answer stores nothing twice (the server answers `duplicate`).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import threading
import time
from collections.abc import Awaitable, Callable
from typing import Any

from queen.client import calls
from queen.client.calls import Call
from queen.client.models import PushResult

Pending = tuple[dict[str, Any], Any]  # an item and its future
PushSender = Callable[[Call[list[PushResult]]], list[PushResult]]


def _item(queue: str, payload: Any, partition: str | None, transaction_id: str | None) -> dict:
    ids = None if transaction_id is None else [transaction_id]
    return calls.push_items(queue, [payload], partition, ids)[0]


class Producer:
    """Thread-safe: send() from any thread; close() (or the with block) flushes the rest."""

    def __init__(self, send: PushSender, linger_ms: float = 5, max_items: int = 500) -> None:
        if max_items < 1:
            raise ValueError("max_items must be at least 1")
        self._send = send
        self.linger = linger_ms / 1000
        self.max_items = max_items
        self._pending: list[Pending] = []
        self._first_at = 0.0  # monotonic time the oldest pending item came
        self._urgent = False
        self._closed = False
        self._cond = threading.Condition()
        self._thread = threading.Thread(target=self._run, name="queen-producer", daemon=True)
        self._thread.start()

    def send(
        self,
        queue: str,
        payload: Any,
        partition: str | None = None,
        transaction_id: str | None = None,
    ) -> concurrent.futures.Future[PushResult]:
        """Queue one payload for the next push; the future gets its PushResult."""
        future: concurrent.futures.Future[PushResult] = concurrent.futures.Future()
        item = _item(queue, payload, partition, transaction_id)
        with self._cond:
            if self._closed:
                raise RuntimeError("the producer is closed")
            if not self._pending:
                self._first_at = time.monotonic()
            self._pending.append((item, future))
            if len(self._pending) == 1 or len(self._pending) >= self.max_items:
                self._cond.notify()
        return future

    def flush(self, timeout: float | None = None) -> None:
        """Push everything sent so far now, and wait for the answers."""
        with self._cond:
            futures = [f for _, f in self._pending]
            self._urgent = True
            self._cond.notify()
        concurrent.futures.wait(futures, timeout)

    def close(self) -> None:
        """Push what is pending, then stop."""
        with self._cond:
            self._closed = True
            self._cond.notify()
        self._thread.join()

    def __enter__(self) -> Producer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _next_batch(self) -> list[Pending] | None:
        with self._cond:
            while not self._pending and not self._closed:
                self._cond.wait()
            if not self._pending:
                return None  # closed and drained
            while not (self._closed or self._urgent or len(self._pending) >= self.max_items):
                left = self._first_at + self.linger - time.monotonic()
                if left <= 0:
                    break
                self._cond.wait(left)
            batch = self._pending[: self.max_items]
            del self._pending[: self.max_items]
            self._first_at = float("-inf")  # whatever is left has waited enough
            self._urgent = bool(self._pending) and self._urgent
            return batch

    def _run(self) -> None:
        while (batch := self._next_batch()) is not None:
            try:
                results = self._send(calls.push([item for item, _ in batch]))
            except BaseException as exc:
                for _, future in batch:
                    future.set_exception(exc)
                continue
            for (_, future), result in zip(batch, results, strict=True):
                future.set_result(result)


class AsyncProducer:
    """The asyncio producer: send() from any task of one event loop; aclose() flushes."""

    def __init__(
        self,
        send: Callable[[Call[list[PushResult]]], Awaitable[list[PushResult]]],
        linger_ms: float = 5,
        max_items: int = 500,
    ) -> None:
        if max_items < 1:
            raise ValueError("max_items must be at least 1")
        self._send = send
        self.linger = linger_ms / 1000
        self.max_items = max_items
        self._pending: list[Pending] = []
        self._wake = asyncio.Event()
        self._closed = False
        self._task: asyncio.Task[None] | None = None

    def send(
        self,
        queue: str,
        payload: Any,
        partition: str | None = None,
        transaction_id: str | None = None,
    ) -> asyncio.Future[PushResult]:
        """Queue one payload for the next push; await the future for its PushResult."""
        if self._closed:
            raise RuntimeError("the producer is closed")
        if self._task is None:
            self._task = asyncio.get_running_loop().create_task(self._run())
        future: asyncio.Future[PushResult] = asyncio.get_running_loop().create_future()
        self._pending.append((_item(queue, payload, partition, transaction_id), future))
        self._wake.set()
        return future

    async def flush(self) -> None:
        """Push everything sent so far now, and wait for the answers."""
        futures = [f for _, f in self._pending]
        self._wake.set()
        if futures:
            await asyncio.wait(futures)

    async def aclose(self) -> None:
        self._closed = True
        self._wake.set()
        if self._task is not None:
            await self._task

    async def __aenter__(self) -> AsyncProducer:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    async def _run(self) -> None:
        while True:
            await self._wake.wait()
            self._wake.clear()
            if not self._pending:
                if self._closed:
                    return
                continue
            if len(self._pending) < self.max_items and not self._closed:
                await asyncio.sleep(self.linger)
            while self._pending:
                batch = self._pending[: self.max_items]
                del self._pending[: self.max_items]
                await self._push(batch)
            if self._closed and not self._pending:
                return

    async def _push(self, batch: list[Pending]) -> None:
        try:
            results = await self._send(calls.push([item for item, _ in batch]))
        except Exception as exc:
            for _, future in batch:
                if not future.done():
                    future.set_exception(exc)
            return
        for (_, future), result in zip(batch, results, strict=True):
            if not future.done():
                future.set_result(result)
