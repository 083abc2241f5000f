"""A misspelt queue or group name is said so, not met with silence."""

from __future__ import annotations

import asyncio
import logging
import threading

import pytest

from queen.client import AsyncQueen, Queen
from queen.client.consuming import UNKNOWN_QUEUE
from tests.e2e.servers import module_dsn, module_server, q
from tests.e2e.test_client_cli import queen_cli

__all__ = ["module_dsn", "module_server", "q"]  # fixtures

RUN_FOR = 1.5  # seconds a consumer runs: several empty long polls of 0.2 s


def unknown_queue_warnings(caplog: pytest.LogCaptureFixture, queue: str) -> int:
    text = UNKNOWN_QUEUE % queue
    return sum(r.getMessage() == text for r in caplog.records if r.name == "queen.client")


def consume_for(url: str, queue: str) -> None:
    with Queen(url) as queen:
        consumer = queen.consumer(queue, lambda m: None, poll_timeout=0.2, handle_signals=False)
        threading.Timer(RUN_FOR, consumer.stop).start()
        consumer.run()


def test_a_consumer_of_an_unknown_queue_warns_once(module_server, q, caplog) -> None:
    caplog.set_level(logging.WARNING, "queen.client")
    consume_for(module_server.url, f"{q}-typo")
    assert unknown_queue_warnings(caplog, f"{q}-typo") == 1


def test_a_consumer_of_an_empty_queue_does_not_warn(module_server, q, caplog) -> None:
    with Queen(module_server.url) as queen:
        queen.configure(q)
    caplog.set_level(logging.WARNING, "queen.client")
    consume_for(module_server.url, q)
    assert unknown_queue_warnings(caplog, q) == 0


def test_an_async_consumer_of_an_unknown_queue_warns_once(module_server, q, caplog) -> None:
    caplog.set_level(logging.WARNING, "queen.client")

    async def consume() -> None:
        async with AsyncQueen(module_server.url) as queen:
            consumer = queen.consumer(
                f"{q}-typo", lambda m: None, poll_timeout=0.2, handle_signals=False
            )
            asyncio.get_running_loop().call_later(RUN_FOR, consumer.stop)
            await consumer.run()

    asyncio.run(consume())
    assert unknown_queue_warnings(caplog, f"{q}-typo") == 1


def test_the_pop_route_still_answers_204_for_an_unknown_queue(module_server, q) -> None:
    import requests

    resp = requests.get(f"{module_server.url}/api/v1/pop/queue/{q}-typo", timeout=30)
    assert resp.status_code == 204 and resp.content == b""


def test_the_cli_says_a_queue_does_not_exist(module_server, q) -> None:
    with Queen(module_server.url) as queen:
        queen.push(q, [{"n": 1}])
    listed = queen_cli(module_server, "dlq", "list", f"{q}-typo")
    assert listed.returncode == 1, listed.stderr
    assert f"{q}-typo" in listed.stderr and "not found" in listed.stderr
    assert queen_cli(module_server, "dlq", "list", q).returncode == 0  # known, and empty
    popped = queen_cli(module_server, "pop", f"{q}-typo")
    assert popped.returncode == 4
    assert "does not exist" in popped.stderr
