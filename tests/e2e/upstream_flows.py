"""The README flows of the original project's Python client, `queen-mq`, against a server.

Run by tests/e2e/test_upstream_client.py with that client's own interpreter (a virtualenv
of its own: its package is also named `queen`), never imported by the tests:

    python -P upstream_flows.py URL PREFIX

Each flow uses queues named PREFIX-<flow>, prints what the client answered, and leaves
the server-side state for the test to check. The output is one JSON object, by flow:
{"ok": true, ...what the flow saw} or {"ok": false, "error": "..."}.
"""

from __future__ import annotations

import asyncio
import json
import sys
import traceback
from typing import Any

from queen import Queen  # the upstream client (queen-mq)

LIMIT_S = 30  # a consume loop that stalls fails its flow instead of hanging the run


async def create(queen: Queen, name: str, **options: Any) -> None:
    builder = queen.queue(name)
    if options:
        builder = builder.config(options)
    await builder.create()


async def push_pop_ack(queen: Queen, q: str) -> dict[str, Any]:
    await create(queen, q)
    await queen.queue(q).push([{"data": {"n": i}} for i in range(4)])
    popped = await queen.queue(q).batch(2).pop()
    single = [await queen.ack(m, True) for m in popped]
    rest = await queen.queue(q).batch(2).pop()
    batch = await queen.ack(rest, True)
    return {
        "popped": len(popped) + len(rest),
        "partitionIds": [m.get("partitionId") for m in popped + rest],
        "single": single,
        "batch": batch,
    }


async def consume_queue(queen: Queen, q: str) -> dict[str, Any]:
    await create(queen, q)
    await queen.queue(q).push([{"data": {"n": i}} for i in range(5)])
    seen: list[Any] = []

    async def handler(message: dict[str, Any]) -> None:
        seen.append(message["data"]["n"])

    await asyncio.wait_for(queen.queue(q).limit(5).consume(handler), LIMIT_S)
    return {"seen": seen}


async def consume_groups(queen: Queen, q: str) -> dict[str, Any]:
    await create(queen, q)
    await queen.queue(q).push([{"data": {"n": i}} for i in range(4)])
    seen: dict[str, list[Any]] = {"g1": [], "g2": []}

    def handler_of(group: str) -> Any:
        async def handler(message: dict[str, Any]) -> None:
            seen[group].append(message["data"]["n"])

        return handler

    await asyncio.wait_for(
        asyncio.gather(*(
            queen.queue(q).group(g).limit(4).consume(handler_of(g)) for g in seen
        )),
        LIMIT_S,
    )
    return {"seen": seen}


async def group_batch_ack(queen: Queen, q: str) -> dict[str, Any]:
    await create(queen, q)
    await queen.queue(q).push([{"data": {"n": i}} for i in range(3)])
    popped = await queen.queue(q).group("audit").batch(3).pop()
    answer = await queen.ack(popped, True, {"group": "audit"})
    return {"popped": len(popped), "answer": answer}


async def transaction(queen: Queen, q: str) -> dict[str, Any]:
    source, target = f"{q}-in", f"{q}-out"
    await create(queen, source)
    await create(queen, target)
    await queen.queue(source).push([{"data": {"step": 1}}])
    (message,) = await queen.queue(source).pop()
    answer = await (
        queen.transaction().ack(message).queue(target).push([{"data": {"step": 2}}]).commit()
    )
    return {"answer": answer}


async def renew(queen: Queen, q: str) -> dict[str, Any]:
    await create(queen, q, lease_time=30)
    await queen.queue(q).push([{"data": {"n": 1}}])
    (message,) = await queen.queue(q).pop()
    answer = await queen.renew(message)
    await queen.ack(message, True)
    return {"before": message["leaseExpiresAt"], "answer": answer}


async def dead_letters(queen: Queen, q: str) -> dict[str, Any]:
    await create(queen, q, retry_limit=0, dlq_after_max_retries=True)
    await queen.queue(q).push([{"data": {"n": 1}}])
    (message,) = await queen.queue(q).pop()
    failed = await queen.ack(message, False, {"error": "boom"})
    listed = await queen.queue(q).dlq().limit(10).get()
    return {"failed": failed, "listed": listed, "transactionId": message["transactionId"]}


async def delete(queen: Queen, q: str) -> dict[str, Any]:
    await create(queen, q)
    await queen.queue(q).push([{"data": {"n": 1}}])
    answer = await queen.queue(q).delete()
    return {"answer": answer}


async def duplicates(queen: Queen, q: str) -> dict[str, Any]:
    await create(queen, q)
    called: list[Any] = []

    async def on_duplicate(items: Any, error: Any) -> None:
        called.append(str(error))

    item = {"transactionId": f"{q}-once", "data": {"n": 1}}
    await queen.queue(q).push([item])
    await queen.queue(q).push([item]).on_duplicate(on_duplicate)
    return {"callbacks": called}


FLOWS = {
    "push_pop_ack": push_pop_ack,
    "consume_queue": consume_queue,
    "consume_groups": consume_groups,
    "group_batch_ack": group_batch_ack,
    "transaction": transaction,
    "renew": renew,
    "dead_letters": dead_letters,
    "delete": delete,
    "duplicates": duplicates,
}


async def main(url: str, prefix: str) -> dict[str, Any]:
    outcomes: dict[str, Any] = {}
    async with Queen(url, retry_attempts=1) as queen:
        for name, flow in FLOWS.items():
            try:
                outcomes[name] = {"ok": True, **await flow(queen, f"{prefix}-{name}")}
            except BaseException as exc:  # noqa: BLE001 - every failure is the flow's result
                outcomes[name] = {
                    "ok": False,
                    "error": f"{type(exc).__name__}: {exc}",
                    "trace": traceback.format_exc(limit=3),
                }
    return outcomes


if __name__ == "__main__":
    print(json.dumps(asyncio.run(main(sys.argv[1], sys.argv[2])), default=str))
