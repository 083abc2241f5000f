"""queen.client.AsyncQueen against a real gunicorn: the sync client's behaviour, awaited."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Awaitable, Callable
from typing import Any

import pytest

from queen.client import AsyncQueen, Message, NotFound, Queen, ResponseLost, RetryPolicy
from tests.conftest import ROOT, free_port
from tests.e2e.servers import fresh_server
from tests.e2e.test_client_sync import DroppingProxy, requests_served

FAST = RetryPolicy(rounds=3, base_delay=0.05, max_delay=0.2)
__all__ = ["fresh_server"]  # a fixture


def run(url: str | list[str], body: Callable[[AsyncQueen], Awaitable[Any]]) -> Any:
    """Run body(client) in a new event loop, with a client of url."""

    async def main() -> Any:
        async with AsyncQueen(url, retry=FAST) as client:
            return await asyncio.wait_for(body(client), 120)

    return asyncio.run(main())


async def consume(queen: AsyncQueen, queue: str, handler, guard: float = 60.0, **options) -> int:
    """queen.consume(...) without signal handlers, stopped after guard seconds at the latest."""
    consumer = queen.consumer(queue, handler, handle_signals=False, **options)
    stopper = asyncio.get_running_loop().call_later(guard, consumer.stop)
    try:
        return await consumer.run()
    finally:
        stopper.cancel()


def test_push_pop_ack_round_trip(server):
    async def body(queen: AsyncQueen) -> None:
        (pushed,) = await queen.push("orders", [{"id": 1}])
        (message,) = await queen.pop("orders", wait=True, timeout=5)
        assert message.transaction_id == pushed.transaction_id and message.data == {"id": 1}
        assert (await queen.extend(message, 600)) > (message.lease_expires_at or "")
        assert (await queen.ack(message)).status == "completed"
        assert await queen.pop("orders") == []
        with pytest.raises(NotFound):
            await queen.ack("no-such-message")
        with pytest.raises(NotFound):
            await queen.extend(message)  # its lease ended with the ack

    run(server.url, body)


def test_ack_and_pop_and_a_consumer_that_uses_it(server):
    async def body(queen: AsyncQueen) -> None:
        pushed = await queen.push("pairs", [{"n": n} for n in range(12)])
        first = await queen.pop("pairs", batch=2)
        results, following = await queen.ack_and_pop(first, "pairs", batch=3, wait=True, timeout=5)
        assert [r.status for r in results] == ["completed", "completed"]
        assert [m.transaction_id for m in first + following] == [
            p.transaction_id for p in pushed[:5]
        ]
        await queen.ack_many(following)
        pops_before = requests_served(server.url, "GET", "/api/v1/pop/queue/{queue}")
        got: list[int] = []

        async def handler(message: Message) -> None:
            got.append(message.data["n"])

        assert await consume(queen, "pairs", handler, batch=4, limit=7) == 7
        assert got == list(range(5, 12))
        assert requests_served(server.url, "GET", "/api/v1/pop/queue/{queue}") - pops_before == 1

    run(server.url, body)


def test_consume_with_async_and_plain_handlers_acks_failures_with_retries(server):
    seen: list[object] = []

    async def failing(message: Message) -> None:
        seen.append(message.data["n"])
        await asyncio.sleep(0)
        if message.data["n"] == "bad":
            raise RuntimeError("async failure")

    def plain(message: Message) -> None:
        seen.append(message.data["n"])

    async def body(queen: AsyncQueen) -> None:
        await queen.configure("jobs", retry_limit=1)
        await queen.push("jobs", [{"n": 1}, {"n": "bad"}, {"n": 2}])
        assert await consume(queen, "jobs", failing, limit=4) == 4
        assert Counter(seen) == {1: 1, "bad": 2, 2: 1}
        (dead,) = await queen.dead_letters("jobs")
        assert dead["errorMessage"] == "async failure"
        await queen.push("plain", [{"n": i} for i in range(10)])
        assert await consume(queen, "plain", plain, batch=3, concurrency=2, limit=10) == 10
        assert len(await queen.messages("plain", status="completed")) == 10

    run(server.url, body)


def test_a_renewed_lease_outlives_lease_time_without_redelivery(server):
    lease_time = 5  # seconds; the handler takes twice that (renewals may be late under load)
    stolen: list[Message] = []
    handling = asyncio.Event()

    async def handler(message: Message) -> None:
        handling.set()
        await asyncio.sleep(2 * lease_time)

    async def probe(other: AsyncQueen, done: asyncio.Event) -> None:
        # Pops only once the consumer holds the message: a pop before could take it first.
        while not handling.is_set() and not done.is_set():
            await asyncio.sleep(0.05)
        while not done.is_set():
            stolen.extend(await other.pop("slow"))
            await asyncio.sleep(0.3)

    async def body(queen: AsyncQueen) -> str:
        await queen.configure("slow", lease_time=lease_time)
        (pushed,) = await queen.push("slow", [{"slow": True}])
        done = asyncio.Event()
        async with AsyncQueen(server.url) as other:
            prober = asyncio.create_task(probe(other, done))
            try:
                assert await consume(queen, "slow", handler, limit=1) == 1
            finally:
                done.set()
                await prober
        stored = await queen.message(pushed.transaction_id)
        assert stored["status"] == "completed" and stored["retryCount"] == 0
        return "ok"

    assert run(server.url, body) == "ok"
    assert stolen == []


def test_buffered_producer_from_many_tasks_stores_every_message_once(server):
    async def body(queen: AsyncQueen) -> None:
        async with queen.producer(linger_ms=5, max_items=200) as producer:

            async def send(t: int) -> list[asyncio.Future[Any]]:
                futures = []
                for i in range(20):
                    futures.append(producer.send("produced", {"t": t, "i": i}))
                    await asyncio.sleep(0)
                return futures

            batches = await asyncio.gather(*(send(t) for t in range(50)))
        results = [f.result() for futures in batches for f in futures]
        assert {r.status for r in results} == {"queued"}
        assert len({r.transaction_id for r in results}) == 1000
        (summary,) = [q for q in await queen.queues() if q["name"] == "produced"]
        assert summary["messages"]["total"] == 1000

    run(server.url, body)


def test_failover_past_a_dead_first_url(server):
    async def body(queen: AsyncQueen) -> None:
        await queen.push("failover", [{"n": 1}])
        (message,) = await queen.pop("failover")
        await queen.ack(message)

    run([f"http://127.0.0.1:{free_port()}", server.url], body)


def test_a_push_resent_after_a_dropped_answer_is_stored_once(server):
    proxy = DroppingProxy(server.port, drops=1)

    async def body(queen: AsyncQueen) -> None:
        (result,) = await queen.push("dropped", [{"once": True}])
        assert result.status == "duplicate"  # the resend found the first one stored

    try:
        run(proxy.url, body)
    finally:
        proxy.close()
    with Queen(server.url) as queen:
        assert len(queen.messages("dropped")) == 1


def test_a_pop_whose_answer_was_dropped_is_not_resent(server):
    with Queen(server.url) as queen:
        queen.push("lost-pop", [{"n": 1}], partition="a")
        queen.push("lost-pop", [{"n": 2}], partition="b")
    proxy = DroppingProxy(server.port, drops=1)

    async def body(queen: AsyncQueen) -> None:
        with pytest.raises(ResponseLost):
            await queen.pop("lost-pop")

    try:
        run(proxy.url, body)
    finally:
        proxy.close()
    with Queen(server.url) as queen:  # one partition leased by the lost pop, not both
        assert len(queen.messages("lost-pop", status="processing")) == 1
        assert len(queen.messages("lost-pop", status="pending")) == 1


CONSUMER = """
import asyncio, sys
from pathlib import Path
from queen.client import AsyncQueen

marks = Path(sys.argv[2])

async def handler(message):
    marks.joinpath("started").write_text(message.transaction_id)
    await asyncio.sleep(2)
    marks.joinpath("finished").write_text(message.transaction_id)

async def main():
    async with AsyncQueen(sys.argv[1]) as queen:
        return await queen.consume("shutdown", handler)

marks.joinpath("handled").write_text(str(asyncio.run(main())))
"""


def test_sigterm_mid_handler_finishes_and_acks_the_message_then_exits_0(server, tmp_path):
    with Queen(server.url) as queen:
        (pushed,) = queen.push("shutdown", [{"long": True}])
        proc = subprocess.Popen([sys.executable, "-c", CONSUMER, server.url, str(tmp_path)],
                                cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)})
        try:
            deadline = time.monotonic() + 30
            while not (tmp_path / "started").exists():
                assert time.monotonic() < deadline and proc.poll() is None
                time.sleep(0.05)
            proc.send_signal(signal.SIGTERM)
            assert proc.wait(30) == 0
        finally:
            if proc.poll() is None:
                proc.kill()
        assert (tmp_path / "handled").read_text() == "1"
        assert queen.message(pushed.transaction_id)["status"] == "completed"


def test_a_transaction_acks_and_pushes_together(fresh_server):
    server = fresh_server

    async def body(queen: AsyncQueen) -> None:
        await queen.push("tx-in", [{"n": 1}])
        (message,) = await queen.pop("tx-in")
        results = await queen.transaction().ack(message).push("tx-out", [{"n": 2}]).commit()
        assert len(results) == 2
        assert [m.data for m in await queen.pop("tx-out")] == [{"n": 2}]

    run(server.url, body)


def test_consumer_groups_pop_ack_and_seek(fresh_server):
    server = fresh_server

    async def body(queen: AsyncQueen) -> None:
        await queen.push("fanout", [{"n": 1}])
        (message,) = await queen.pop("fanout", group="a", subscription="all")
        assert message.group == "a"
        await queen.ack(message)
        await queen.seek("a", "fanout", "beginning")
        assert len(await queen.pop("fanout", group="a")) == 1
        assert any(g["name"] == "a" for g in await queen.consumer_groups())

    run(server.url, body)
