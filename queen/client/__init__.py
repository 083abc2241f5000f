"""The Python client of Queen: sync (Queen) and asyncio (AsyncQueen), over httpx alone.

    from queen.client import Queen

    with Queen("http://127.0.0.1:6632") as queen:
        queen.push("orders", [{"id": 1}, {"id": 2}])
        queen.consume("orders", handle, batch=10, limit=2)

Pops are never sent again after a lost answer (see queen.client.transport); errors
form the tree drawn in queen.client.errors. docs/CLIENT.md is the reference.
"""

from __future__ import annotations

from queen.client.aio import AsyncQueen
from queen.client.aio_consumer import AsyncConsumer, AsyncWorker
from queen.client.consumer import Consumer, Worker
from queen.client.errors import (
    AlreadyAcknowledged,
    APIError,
    BadRequest,
    Conflict,
    Forbidden,
    LeasedByOther,
    LeaseExpired,
    NotFound,
    NotLeased,
    PayloadTooLarge,
    QueenError,
    RateLimited,
    ResponseLost,
    ServerError,
    TransportError,
    Unauthorized,
    Unavailable,
    Unreachable,
)
from queen.client.models import AckResult, Message, PushResult, uuid7
from queen.client.producer import AsyncProducer, Producer
from queen.client.sync import Queen
from queen.client.transaction import AsyncTransaction, Transaction
from queen.client.transport import RetryPolicy

__all__ = [
    "APIError",
    "AckResult",
    "AlreadyAcknowledged",
    "AsyncConsumer",
    "AsyncProducer",
    "AsyncQueen",
    "AsyncTransaction",
    "AsyncWorker",
    "BadRequest",
    "Conflict",
    "Consumer",
    "Forbidden",
    "LeaseExpired",
    "LeasedByOther",
    "Message",
    "NotFound",
    "NotLeased",
    "PayloadTooLarge",
    "Producer",
    "PushResult",
    "Queen",
    "QueenError",
    "RateLimited",
    "ResponseLost",
    "RetryPolicy",
    "ServerError",
    "Transaction",
    "TransportError",
    "Unauthorized",
    "Unavailable",
    "Unreachable",
    "Worker",
    "uuid7",
]
