"""Fusion through a real gunicorn worker: many concurrent clients, each answered its own."""

from __future__ import annotations

import fcntl
import os
import socket
import threading
import time
from collections import Counter
from typing import Any

import psycopg
import pytest
import requests

from queen.dashboard.nodes import encode
from queen.server.turns import SERVERS_TTL_S, TURN_WAIT_S
from queen.store.dashboard import DASHBOARD_CHANNEL
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


@pytest.mark.parametrize(
    ("mode", "turns"),
    [("kind", ["push.turn"]), ("host", ["call.turn"]), ("auto", ["call.turn", "call.1.turn"])],
)
def test_a_hosts_workers_take_turns_at_calls(db_dsn, tmp_path, mode, turns):
    """A push waits while other processes hold the host's turns (the push turn; with
    QUEEN_FUSION_TURNS=host the one for every call; auto, alone on its database: both of
    its two slots for calls of any kind), and goes without once it has waited
    TURN_WAIT_S: a stuck holder costs fusion, not availability."""
    srv = Server(db_dsn, workers=2, QUEEN_CLAIMS_DIR=str(tmp_path),
                 QUEEN_FUSION_TURNS=mode).start()
    fds = [os.open(tmp_path / turn, os.O_RDWR | os.O_CREAT) for turn in turns]
    try:
        def push(name: str, answers: list[requests.Response]) -> threading.Thread:
            item = {"queue": "turns", "payload": {"n": name}}
            thread = threading.Thread(target=lambda: answers.append(requests.post(
                srv.url + "/api/v1/push", json={"items": [item]}, timeout=TIMEOUT_S)))
            thread.start()
            return thread

        for fd in fds:  # as workers in the middle of their calls
            fcntl.flock(fd, fcntl.LOCK_EX)
        answers: list[requests.Response] = []
        thread = push("waits", answers)
        thread.join(0.5)
        assert answers == []  # waiting for a turn
        for fd in fds:
            fcntl.flock(fd, fcntl.LOCK_UN)
        thread.join(TIMEOUT_S)
        assert [r.status_code for r in answers] == [201]

        for fd in fds:  # now as workers that never give them back
            fcntl.flock(fd, fcntl.LOCK_EX)
        started = time.monotonic()
        answers = []
        push("goes without", answers).join(TIMEOUT_S)
        assert [r.status_code for r in answers] == [201]
        assert time.monotonic() - started >= TURN_WAIT_S * 0.9
    finally:
        for fd in fds:
            os.close(fd)
        srv.stop()


def test_node_notes_name_each_workers_server(db_dsn):
    """Two servers on one database: each worker's note names its server, the host and its
    gunicorn master, which its workers share (and with it their turns)."""
    first = Server(db_dsn, workers=2).start()
    second = Server(db_dsn, workers=1)
    try:
        second.start()
        assert first.proc is not None and second.proc is not None
        host = socket.gethostname()
        wanted = Counter({f"{host}:{first.proc.pid}": 2, f"{host}:{second.proc.pid}": 1})
        deadline = time.monotonic() + TIMEOUT_S
        while True:  # (a worker's first note may go out before any worker listens)
            doc = requests.get(second.url + "/api/v1/system/nodes", timeout=10).json()
            servers = Counter(w["server"] for h in doc["hosts"] for w in h["workers"])
            if servers == wanted:
                break
            assert time.monotonic() < deadline, servers
            time.sleep(0.5)
    finally:
        second.stop()
        first.stop()


def test_auto_turns_follow_the_servers_the_node_notes_show(db_dsn, tmp_path):
    """By default a server alone on its database makes two calls at once (one slot held
    elsewhere, a push goes at once); once another server's node notes arrive, its share
    of the database's two calls is one: a push waits for that slot."""
    srv = Server(db_dsn, workers=2, QUEEN_CLAIMS_DIR=str(tmp_path)).start()
    fd = os.open(tmp_path / "call.turn", os.O_RDWR | os.O_CREAT)
    stop = threading.Event()
    try:
        def push(name: str) -> requests.Response:
            item = {"queue": "auto-turns", "payload": {"n": name}}
            return requests.post(srv.url + "/api/v1/push", json={"items": [item]},
                                 timeout=TIMEOUT_S)

        assert push("first").status_code == 201
        fcntl.flock(fd, fcntl.LOCK_EX)  # held for good: alone, the other slot is free
        started = time.monotonic()
        assert push("alone").status_code == 201
        assert time.monotonic() - started < TURN_WAIT_S * 0.9
        fcntl.flock(fd, fcntl.LOCK_UN)

        def another_server() -> None:  # its one worker's note, every second
            note = encode("elsewhere-1", {"host": "elsewhere", "pid": 1,
                                          "server": "elsewhere:1"})
            with psycopg.connect(db_dsn, autocommit=True) as conn:
                while not stop.is_set():
                    conn.execute("SELECT pg_notify(%s, %s)", (DASHBOARD_CHANNEL, note))
                    stop.wait(1.0)

        threading.Thread(target=another_server, daemon=True).start()
        deadline = time.monotonic() + TIMEOUT_S
        while True:  # both workers heard it (each answers some of these)
            hosts = [requests.get(srv.url + "/api/v1/system/nodes", timeout=10).json()["hosts"]
                     for _ in range(8)]
            if all(any(h["host"] == "elsewhere" for h in seen) for seen in hosts):
                break
            assert time.monotonic() < deadline, "the other server's notes never arrived"
            time.sleep(0.2)
        time.sleep(SERVERS_TTL_S + 1.0)  # (each worker counts again after SERVERS_TTL_S)
        fcntl.flock(fd, fcntl.LOCK_EX)  # as another worker's call of any kind
        answers: list[requests.Response] = []
        thread = threading.Thread(target=lambda: answers.append(push("shared")))
        thread.start()
        thread.join(0.5)
        assert [(r.status_code, r.text) for r in answers] == []  # waiting for its slot
        fcntl.flock(fd, fcntl.LOCK_UN)
        thread.join(TIMEOUT_S)
        assert [r.status_code for r in answers] == [201]
    finally:
        stop.set()
        os.close(fd)
        srv.stop()


def run_all(target: Any) -> None:
    threads = [threading.Thread(target=target, args=(c,)) for c in range(CLIENTS)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(TIMEOUT_S * 4)
