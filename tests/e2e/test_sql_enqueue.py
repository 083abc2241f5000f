"""Enqueueing from SQL inside an application's own transaction (queen.push).

An application that already writes to the same PostgreSQL can push in its own
transaction: the messages exist, and parked long polls are woken, only if it commits.
The fallback re-check is set an hour away, so a poll answered promptly was answered by
the push's notification.
"""

from __future__ import annotations

import json
import select
import time
from collections.abc import Iterator

import psycopg
import pytest

from tests.conftest import Server
from tests.e2e.polls import Poll, gather

PROMPT = 3.0  # seconds: a notification, not the fallback an hour away (loaded 2-core machine)
PARK = 0.5  # seconds to let a poll reach the database and park
ITEMS = json.dumps([{"queue": "orders", "partition": "eu", "payload": {"order": 7}}])


@pytest.fixture
def quiet_server(db_dsn: str) -> Iterator[Server]:
    srv = Server(db_dsn, QUEEN_POLL_FALLBACK="3600").start()
    yield srv
    srv.stop()


def stored(dsn: str) -> int:
    with psycopg.connect(dsn) as conn:
        row = conn.execute("SELECT count(*) FROM queen.messages").fetchone()
    return int(row[0]) if row else 0


def test_a_rolled_back_transaction_enqueues_nothing_and_wakes_nobody(quiet_server, db_dsn):
    poll = Poll(quiet_server.port, "/api/v1/pop/queue/orders?wait=true&timeout=3000")
    time.sleep(PARK)
    with psycopg.connect(db_dsn) as app:  # the application's own transaction
        app.execute("CREATE TABLE IF NOT EXISTS app_orders (id int)")
        app.execute("INSERT INTO app_orders VALUES (7)")
        app.execute("SELECT * FROM queen.push(%s::jsonb)", (ITEMS,)).fetchall()
        app.rollback()
    assert stored(db_dsn) == 0
    assert gather([poll], 15) == []
    assert poll.status == 204  # answered at its timeout, with nothing


def test_a_committed_transaction_enqueues_and_wakes_a_parked_poll(quiet_server, db_dsn):
    poll = Poll(quiet_server.port, "/api/v1/pop/queue/orders?wait=true&timeout=20000")
    time.sleep(PARK)
    with psycopg.connect(db_dsn) as app:
        app.execute("CREATE TABLE IF NOT EXISTS app_orders (id int)")
        app.execute("INSERT INTO app_orders VALUES (7)")
        (row,) = app.execute("SELECT * FROM queen.push(%s::jsonb)", (ITEMS,)).fetchall()
        assert row[3] == "queued"
        readable, _, _ = select.select([poll.sock], [], [], PARK)
        assert readable == []  # no answer: nothing to claim before the commit
        assert stored(db_dsn) == 0
        app.commit()
        committed_at = time.monotonic()
    assert gather([poll], 15) == []
    assert poll.status == 200
    (message,) = poll.body["messages"]
    assert message["data"] == {"order": 7} and message["partition"] == "eu"
    assert message["transactionId"] == row[2]
    assert poll.done_at - committed_at < PROMPT  # type: ignore[operator]
