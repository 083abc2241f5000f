"""A worker bounds its client connections: idle keep-alive and slow headers are closed, and
a worker at its connection cap makes room or answers 503 at once (queen/connections.py).

The deadlines are kept by a sweeper that looks every quarter of the shortest one, so with
both at 1 s a connection is cut between 1 and 1.25 s (plus the machine's delays)."""

from __future__ import annotations

import json
import socket
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import requests
import websocket

from tests.conftest import Server

REQUEST = b"GET /health HTTP/1.1\r\nHost: q\r\n\r\n"
CLOSED_WITHIN = 10.0  # seconds: the bounds below are 1 s; the rest is a loaded machine's margin


@pytest.fixture
def bounded(db_dsn: str, tmp_path: Path) -> Iterator[Server]:
    srv = Server(
        db_dsn,
        log_path=tmp_path / "gunicorn.log",
        QUEEN_IDLE_TIMEOUT="1",
        QUEEN_HEADER_TIMEOUT="1",
        QUEEN_WORKER_CONNECTIONS="5",
        LOG_LEVEL="info",
    ).start()
    yield srv
    srv.stop()


def connect(srv: Server) -> socket.socket:
    sock = socket.create_connection(("127.0.0.1", srv.port), timeout=CLOSED_WITHIN)
    return sock


def read_all(sock: socket.socket) -> bytes:
    """Read until the server closes the connection (fails after CLOSED_WITHIN)."""
    data = b""
    while chunk := sock.recv(65536):
        data += chunk
    return data


def test_an_idle_keep_alive_connection_is_closed(bounded: Server) -> None:
    with connect(bounded) as sock:
        sock.sendall(REQUEST)
        time.sleep(0.2)
        started = time.monotonic()
        answer = read_all(sock)  # the answer, then the close
        assert answer.startswith(b"HTTP/1.1 200")
        assert time.monotonic() - started < CLOSED_WITHIN
    with connect(bounded) as silent:  # connected, never sent a byte
        assert read_all(silent) == b""


def test_headers_that_take_too_long_get_a_400_and_a_close(bounded: Server) -> None:
    with connect(bounded) as sock:
        sock.sendall(b"GET /health HTTP/1.1\r\nHost: q\r\n")
        time.sleep(0.3)
        sock.sendall(b"X-Slow: 1\r\n")  # slowloris: a header now and then, never the end
        assert read_all(sock).startswith(b"HTTP/1.1 400")
    assert requests.get(f"{bounded.url}/health", timeout=10).status_code == 200


def test_too_many_headers_get_a_400_and_one_log_line(bounded: Server) -> None:
    many = b"".join(b"X-%d: v\r\n" % i for i in range(150))
    with connect(bounded) as sock:
        sock.sendall(b"GET /health HTTP/1.1\r\nHost: q\r\n" + many + b"\r\n")
        assert read_all(sock).startswith(b"HTTP/1.1 400")
    time.sleep(0.3)
    log = bounded.log_path.read_text() if bounded.log_path else ""
    assert "more than 100 headers" in log
    assert "Traceback" not in log


def test_at_the_cap_the_connection_idle_longest_makes_room(bounded: Server) -> None:
    idle = [connect(bounded) for _ in range(5)]
    time.sleep(0.3)  # all five accepted and waiting for a request line
    try:
        assert requests.get(f"{bounded.url}/health", timeout=10).status_code == 200
        assert read_all(idle[0]) == b""  # the oldest was closed to make room
    finally:
        for sock in idle:
            sock.close()


def test_at_the_cap_with_nothing_idle_a_request_gets_503_at_once(bounded: Server) -> None:
    polls = []
    for i in range(5):  # five long polls: busy connections, none idle
        sock = connect(bounded)
        sock.sendall(
            b"GET /api/v1/pop/queue/q/partition/p%d?wait=true&timeout=3000 HTTP/1.1\r\n"
            b"Host: q\r\n\r\n" % i
        )
        polls.append(sock)
    time.sleep(0.5)
    try:
        r = requests.get(f"{bounded.url}/health", timeout=10)
        assert r.status_code == 503
        assert r.headers["Retry-After"] == "1"
        assert "too many connections" in json.loads(r.content)["error"]
        # Once the polls have answered (204 at their 3 s timeout) their connections are
        # idle, and the next request makes room again.
        deadline = time.monotonic() + 3 + CLOSED_WITHIN
        while requests.get(f"{bounded.url}/health", timeout=10).status_code != 200:
            assert time.monotonic() < deadline, "the worker did not take connections again"
            time.sleep(0.1)
    finally:
        for sock in polls:
            sock.close()


def test_a_long_poll_outlasting_both_deadlines_is_answered_then_idles_out(bounded: Server) -> None:
    with connect(bounded) as sock:
        sock.sendall(
            b"GET /api/v1/pop/queue/q/partition/p?wait=true&timeout=3000 HTTP/1.1\r\n"
            b"Host: q\r\n\r\n"
        )
        answer = read_all(sock)  # 204 at 3 s (three idle deadlines), then idle: closed
        assert answer.startswith(b"HTTP/1.1 204")


def test_a_dashboard_socket_in_use_outlasts_the_idle_deadline(bounded: Server) -> None:
    ws = websocket.create_connection(f"ws://127.0.0.1:{bounded.port}/ws/dashboard", timeout=10)
    try:
        assert '"connected"' in ws.recv()
        time.sleep(3)  # three idle deadlines, no frame from the client
        ws.send("ping")
        while (frame := ws.recv()) != "pong":
            assert frame  # other events may come first; a close would end in an error
    finally:
        ws.close()


def test_a_request_line_then_silence_is_cut_by_the_header_deadline(bounded: Server) -> None:
    with connect(bounded) as sock:
        sock.sendall(b"GET /health HTTP/1.1\r\n")  # the line, then no header at all
        assert read_all(sock).startswith(b"HTTP/1.1 400")
    assert bounded.log_path is not None
    deadline = time.monotonic() + CLOSED_WITHIN
    while "request headers took longer than 1 s" not in (log := bounded.log_path.read_text()):
        assert time.monotonic() < deadline, "the late headers were not logged"
        time.sleep(0.1)
    assert "Traceback" not in log


def test_a_stopping_worker_closes_kept_alive_connections_instead_of_waiting_for_them(
    db_dsn: str,
) -> None:
    """A client keeping its connection open between requests (as load balancers and most
    HTTP clients do) does not hold a stopping worker until graceful_timeout (10 s): the
    worker closes it, and exits once the requests in flight are answered."""
    srv = Server(db_dsn).start()
    try:
        with connect(srv) as sock:
            sock.sendall(REQUEST)
            answer = b""
            while b"\r\n\r\n" not in answer:  # the answer's head; the connection stays open
                answer += sock.recv(65536)
            assert answer.startswith(b"HTTP/1.1 200")
            assert srv.proc is not None
            srv.proc.terminate()
            started = time.monotonic()
            read_all(sock)  # (its body, then the close)
            assert srv.proc.wait(CLOSED_WITHIN) == 0
            assert time.monotonic() - started < 8.0  # graceful_timeout is 10 s
    finally:
        srv.stop()
