"""A worker killed between a pop's claim and its answer: the claim comes back within
seconds, counted as no delivery (retryCount 0, nothing dead-lettered with retryLimit 0).

A raw client pops a batch too large for the socket buffers and never reads: the claim
is committed and the worker is stuck writing the answer when it is killed (-9). The
gunicorn master sees it die and gives the claim back (queen.server.claims).
"""

from __future__ import annotations

import os
import signal
import socket
import time
from pathlib import Path
from typing import Any

import psycopg
import pytest
import requests

from tests.conftest import Server

QUEUE = "orphans"
MESSAGES = 20
PAYLOAD = "x" * 400_000  # 20 x 400 kB: far more than loopback's socket buffers hold
API = "/api/v1"


def workers_of(master: int) -> list[int]:
    children = Path(f"/proc/{master}/task/{master}/children").read_text().split()
    return [int(pid) for pid in children]


def leased(dsn: str) -> int:
    with psycopg.connect(dsn) as conn:
        (count,) = conn.execute(
            "SELECT count(*) FROM queen.consumers c JOIN queen.queues q ON q.id = c.queue_id"
            " WHERE q.name = %s AND c.lease_id IS NOT NULL",
            [QUEUE],
        ).fetchone()
    return int(count)


def wait_for(check: Any, seconds: float, what: str) -> Any:
    deadline = time.monotonic() + seconds
    while True:
        value = check()
        if value:
            return value
        assert time.monotonic() < deadline, f"no {what} within {seconds} s"
        time.sleep(0.1)


@pytest.fixture
def server(db_dsn: str) -> Any:
    srv = Server(db_dsn, workers=1).start()
    yield srv
    srv.stop()


def test_a_claim_whose_worker_died_comes_back_undelivered(server: Server, db_dsn: str) -> None:
    options = {"leaseTime": 300, "retryLimit": 0, "dlqAfterMaxRetries": True}
    url = server.url
    assert requests.post(f"{url}{API}/configure", json={"queue": QUEUE, "options": options},
                         timeout=10).ok
    for start in range(0, MESSAGES, 5):
        items = [{"queue": QUEUE, "payload": {"n": n, "pad": PAYLOAD}}
                 for n in range(start, start + 5)]
        assert requests.post(f"{url}{API}/push", json={"items": items}, timeout=30).ok

    stuck = socket.socket()
    stuck.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)  # (before connecting)
    stuck.connect(("127.0.0.1", server.port))
    try:
        stuck.sendall(
            f"GET {API}/pop/queue/{QUEUE}?batch={MESSAGES} HTTP/1.1\r\nHost: q\r\n\r\n".encode()
        )
        wait_for(lambda: leased(db_dsn), 15, "claim")
        time.sleep(0.5)  # (the worker is writing the answer the client never reads)
        assert server.proc is not None
        (worker,) = workers_of(server.proc.pid)
        os.kill(worker, signal.SIGKILL)

        # The master gives the claim back; its new worker serves the messages again, as
        # their first delivery.
        wait_for(lambda: not leased(db_dsn), 20, "give-back")
        resp = wait_for(
            lambda: _pop(url), 20, "pop from the new worker"
        )
        messages = resp.json()["messages"]
        assert [m["data"]["n"] for m in messages] == list(range(MESSAGES))
        assert {m["retryCount"] for m in messages} == {0}
        dead = requests.get(f"{url}{API}/dlq", params={"queue": QUEUE}, timeout=10).json()
        assert dead["total"] == 0
    finally:
        stuck.close()


def _pop(url: str) -> requests.Response | None:
    try:
        resp = requests.get(
            f"{url}{API}/pop/queue/{QUEUE}", params={"batch": MESSAGES}, timeout=30
        )
    except requests.ConnectionError:
        return None  # (the new worker is starting)
    return resp if resp.status_code == 200 else None
