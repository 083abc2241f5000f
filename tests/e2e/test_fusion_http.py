"""Fusion through a real gunicorn worker: many concurrent clients, each answered its own."""

from __future__ import annotations

import fcntl
import os
import threading
import time
from collections import Counter
from typing import Any

import pytest
import requests

from queen.server.turns import TURN_WAIT_S
from tests.conftest import Server

CLIENTS = 24
PUSHES = 10  # per client
TIMEOUT_S = 30


def test_concurrent_pushes_pops_and_acks_fuse_and_each_client_gets_its_own_answers(db_dsn):
    srv = Server(db_dsn, workers=1).start()  # one worker: every request fuses with the others
    errors: list[str] = []
    try:
        def produce(client: int) -> None:
            with requests.Session() as http:
                for n in range(PUSHES):
                    sent = [f"c{client}-{n}-{k}" for k in range(2)]
                    items = [{"queue": "fz", "partition": f"p{client % 4}", "payload": t,
                              "transactionId": t} for t in sent]
                    r = http.post(srv.url + "/api/v1/push", json={"items": items},
                                  timeout=TIMEOUT_S)
                    got = [(m["transactionId"], m["status"]) for m in r.json()["messages"]]
                    if r.status_code != 201 or got != [(t, "queued") for t in sent]:
                        errors.append(f"push {sent}: {r.status_code} {got}")

        run_all(produce)
        assert errors == []
        total = CLIENTS * PUSHES * 2

        delivered: list[str] = []
        acked: list[str] = []

        def consume(client: int) -> None:
            with requests.Session() as http:
                while True:
                    r = http.get(srv.url + "/api/v1/pop/queue/fz?batch=3", timeout=TIMEOUT_S)
                    if r.status_code == 204:
                        return
                    messages = r.json()["messages"]
                    delivered.extend(m["transactionId"] for m in messages)
                    acks = [{"transactionId": m["transactionId"], "status": "completed",
                             "leaseId": m["leaseId"]} for m in messages]
                    a = http.post(srv.url + "/api/v1/ack/batch",
                                  json={"acknowledgments": acks}, timeout=TIMEOUT_S)
                    statuses = [x["status"] for x in a.json()["results"]]
                    if a.status_code != 200 or statuses != ["completed"] * len(acks):
                        errors.append(f"ack {acks}: {a.status_code} {statuses}")
                    acked.extend(x["transactionId"] for x in a.json()["results"])

        run_all(consume)
        assert errors == []
        assert Counter(delivered) == Counter(acked)
        assert len(delivered) == total and len(set(delivered)) == total  # each exactly once

        fusion = requests.get(srv.url + "/metrics", timeout=10).json()["fusion"]
        assert fusion["push"]["requests"] == CLIENTS * PUSHES
        # 24 clients and two calls at a time: requests queued behind them and shared calls.
        assert fusion["push"]["calls"] < fusion["push"]["requests"]
        assert fusion["pop"]["requests"] >= total // 3
    finally:
        srv.stop()


@pytest.mark.parametrize(("mode", "turn"), [("kind", "push.turn"), ("host", "call.turn")])
def test_a_hosts_workers_take_turns_at_calls(db_dsn, tmp_path, mode, turn):
    """A push waits while another process holds the host's turn (the push turn, or with
    QUEEN_FUSION_TURNS=host the one for every call), and goes without it once it has
    waited TURN_WAIT_S: a stuck holder costs fusion, not availability."""
    srv = Server(db_dsn, workers=2, QUEEN_CLAIMS_DIR=str(tmp_path),
                 QUEEN_FUSION_TURNS=mode).start()
    fd = os.open(tmp_path / turn, os.O_RDWR | os.O_CREAT)
    try:
        def push(name: str, answers: list[requests.Response]) -> threading.Thread:
            item = {"queue": "turns", "payload": {"n": name}}
            thread = threading.Thread(target=lambda: answers.append(requests.post(
                srv.url + "/api/v1/push", json={"items": [item]}, timeout=TIMEOUT_S)))
            thread.start()
            return thread

        fcntl.flock(fd, fcntl.LOCK_EX)  # as a worker in the middle of its push call
        answers: list[requests.Response] = []
        thread = push("waits", answers)
        thread.join(0.5)
        assert answers == []  # waiting for the turn
        fcntl.flock(fd, fcntl.LOCK_UN)
        thread.join(TIMEOUT_S)
        assert [r.status_code for r in answers] == [201]

        fcntl.flock(fd, fcntl.LOCK_EX)  # now as a worker that never gives it back
        started = time.monotonic()
        answers = []
        push("goes without", answers).join(TIMEOUT_S)
        assert [r.status_code for r in answers] == [201]
        assert time.monotonic() - started >= TURN_WAIT_S * 0.9
    finally:
        os.close(fd)
        srv.stop()


def run_all(target: Any) -> None:
    threads = [threading.Thread(target=target, args=(c,)) for c in range(CLIENTS)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(TIMEOUT_S * 4)
