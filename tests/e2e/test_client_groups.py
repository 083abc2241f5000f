"""The client SDK and CLI against the transaction and consumer-group routes.

Messages are popped with queen.store.lifecycle on the server's database: what the SDK calls
here is only the routes of transactions and consumer groups.
"""

from __future__ import annotations

import asyncio
import datetime as dt
from typing import Any

import psycopg
import pytest

from queen.client import AsyncQueen, Conflict, NotFound, Queen
from queen.store import lifecycle
from tests.e2e.servers import fresh_server
from tests.e2e.test_client_cli import ndjson, queen_cli
from tests.e2e.test_client_sync import FAST

__all__ = ["fresh_server"]  # a fixture


@pytest.fixture
def conn(db_dsn: str):
    with psycopg.connect(db_dsn, autocommit=True) as connection:
        yield connection


@pytest.fixture
def queen(fresh_server):
    with Queen(fresh_server.url, retry=FAST) as client:
        yield client


def test_a_stage_through_the_sdk_transaction_builder(queen: Queen, conn: Any) -> None:
    pushed = queen.transaction().push("in", [{"n": 1}], transaction_ids=["in-1"]).commit()
    assert pushed[0]["messages"][0]["status"] == "queued"
    (got,) = lifecycle.pop(conn, "in", group="stage")
    stage = queen.transaction().ack("in-1", group="stage").push("out", [{"n": 2}])
    ack, push = stage.commit()
    assert (ack["status"], ack["consumerGroup"]) == ("completed", "stage")
    assert push["messages"][0]["status"] == "queued"
    again = queen.transaction().ack("in-1", group="stage").push("out", [{"n": 3}])
    with pytest.raises(Conflict) as refused:
        again.commit()
    assert refused.value.body["operation"] == 0
    assert "operations[0]" in str(refused.value)
    assert [d.payload for d in lifecycle.pop(conn, "out", batch=10)] == [{"n": 2}]
    assert got.transaction_id == "in-1"


def test_groups_through_the_sdk(queen: Queen, conn: Any) -> None:
    queen.transaction().push("fanout", [{"n": 1}, {"n": 2}]).commit()
    for group in ("a", "b"):
        assert len(lifecycle.pop(conn, "fanout", group=group, batch=10)) == 2
    names = {(g["name"], g["queue"]) for g in queen.consumer_groups()}
    assert {("a", "fanout"), ("b", "fanout")} <= names
    assert queen.consumer_group("a")["queues"][0]["pending"] == 2
    assert queen.seek("a", "fanout", "end")["partitions"] == 1
    assert queen.consumer_group("a")["pending"] == 0
    assert queen.seek("a", "fanout", dt.datetime.now(dt.UTC) - dt.timedelta(hours=1))
    assert len(lifecycle.pop(conn, "fanout", group="a", batch=10)) == 2
    queen.delete_consumer_group("b", "fanout")
    with pytest.raises(NotFound):
        queen.consumer_group("b")


def test_groups_through_the_async_sdk(fresh_server, conn: Any) -> None:
    async def body() -> None:
        async with AsyncQueen(fresh_server.url, retry=FAST) as queen:
            await queen.transaction().push("fanout", [{"n": 1}]).commit()
            lifecycle.pop(conn, "fanout", group="a")
            await queen.seek("a", "fanout", "beginning")
            assert any(g["name"] == "a" for g in await queen.consumer_groups())
            await queen.delete_consumer_group("a")
            with pytest.raises(NotFound):
                await queen.consumer_group("a")

    asyncio.run(asyncio.wait_for(body(), 60))


def test_groups_through_the_cli(fresh_server, conn: Any) -> None:
    with Queen(fresh_server.url, retry=FAST) as queen:
        queen.transaction().push("grouped", [{"n": 1}]).commit()
    lifecycle.pop(conn, "grouped", group="audit")
    listed = queen_cli(fresh_server, "groups", "list", "-o", "json")
    assert listed.returncode == 0, listed.stderr
    (audit,) = [g for g in ndjson(listed.stdout) if g["name"] == "audit"]
    assert (audit["queue"], audit["pending"]) == ("grouped", 1)
    sought = queen_cli(fresh_server, "groups", "seek", "audit", "grouped", "--to", "end")
    assert sought.returncode == 0, sought.stderr
    assert lifecycle.pop(conn, "grouped", group="audit") == []
    unknown = queen_cli(fresh_server, "groups", "seek", "audit", "nope", "--to", "end")
    assert unknown.returncode == 1
