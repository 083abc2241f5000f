"""A transaction builder: acks and pushes that commit together or not at all."""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence
from typing import Any

from queen.client import calls
from queen.client.calls import Call, MessageOrId


class TransactionBuilder:
    """Collect operations for POST /api/v1/transaction; each method returns the builder."""

    def __init__(self) -> None:
        self.operations: list[dict[str, Any]] = []

    def ack(self, target: MessageOrId, error: str | None = None, group: str | None = None) -> Any:
        """Acknowledge a message (failed when error is given) in this transaction."""
        self.operations.append({"type": "ack", **calls.ack_item(target, error, group)})
        return self

    def push(
        self,
        queue: str,
        payloads: Any,
        partition: str | None = None,
        transaction_ids: Sequence[str] | None = None,
    ) -> Any:
        """Push payloads (a list or tuple: many) in this transaction."""
        items = calls.push_items(queue, payloads, partition, transaction_ids)
        self.operations.append({"type": "push", "items": items})
        return self

    def call(self) -> Call[list[Any]]:
        if not self.operations:
            raise ValueError("a transaction needs at least one operation")
        return calls.transaction(self.operations)


class Transaction(TransactionBuilder):
    def __init__(self, send: Callable[[Call[list[Any]]], list[Any]]) -> None:
        super().__init__()
        self._send = send

    def commit(self) -> list[Any]:
        """Send every operation; return their results (raises APIError naming a failed one)."""
        return self._send(self.call())


class AsyncTransaction(TransactionBuilder):
    def __init__(self, send: Callable[[Call[list[Any]]], Awaitable[list[Any]]]) -> None:
        super().__init__()
        self._send = send

    async def commit(self) -> list[Any]:
        """Send every operation; return their results (raises APIError naming a failed one)."""
        return await self._send(self.call())
