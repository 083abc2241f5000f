"""The connection registry's deadlines (queen/connections.py), on real gevent socket pairs.

The sweeper is driven by hand (`Registry.sweep(now)`) where the order of events matters,
so nothing here depends on how fast the machine is.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import gevent  # type: ignore[import-untyped]
import pytest
from gevent import socket  # type: ignore[import-untyped]

from queen.connections import HeaderTimeout, Limits, Registry

WAIT_S = 20.0  # how long a test waits for what must come (only a stalled machine nears it)
LATER = 1e9  # a `now` past every deadline


class Conn:
    """What the registry needs of a handler: its socket."""

    def __init__(self, sock: Any) -> None:
        self.socket = sock
        self.rfile: Any = sock.makefile("rb") if sock is not None else None


@pytest.fixture
def pairs() -> Iterator[list[tuple[Conn, Any]]]:
    made: list[tuple[Conn, Any]] = []
    yield made
    for conn, peer in made:
        conn.rfile.close()
        conn.socket.close()
        peer.close()


def pair(made: list[tuple[Conn, Any]]) -> tuple[Conn, Any]:
    server, client = socket.socketpair()
    made.append((Conn(server), client))
    return made[-1]


def registry(idle_s: float = 60.0, header_s: float = 60.0) -> Registry:
    return Registry(Limits(cap=100, idle_s=idle_s, header_s=header_s))


def wait_line(reg: Registry, conn: Conn) -> gevent.Greenlet:
    """A handler waiting for its request line (started: it is in the read when this returns)."""
    waiter = gevent.spawn(reg.read_request_line, conn, lambda: conn.rfile.readline(65536))
    gevent.sleep(0)
    return waiter


def test_a_sweep_cuts_only_the_connections_due(pairs) -> None:
    reg = registry()
    made = [pair(pairs) for _ in range(5)]
    waiters = [wait_line(reg, conn) for conn, _ in made]
    deadlines = list(reg._idle.values())
    assert deadlines == sorted(deadlines)  # insertion order is deadline order
    assert reg.sweep(deadlines[2]) == 3  # the first three are due; the sweep stops there
    gevent.joinall(waiters[:3], timeout=WAIT_S)
    assert [w.value for w in waiters[:3]] == [b"", b"", b""]
    assert not any(w.ready() for w in waiters[3:])
    for _conn, peer in made[3:]:  # the others still take a request
        peer.sendall(b"GET / HTTP/1.1\r\n")
    gevent.joinall(waiters[3:], timeout=WAIT_S)
    assert [w.value for w in waiters[3:]] == [b"GET / HTTP/1.1\r\n"] * 2


class Deadline(float):
    """A deadline that counts how often a sweep compares it."""

    looked = 0

    def __gt__(self, other: object) -> bool:
        Deadline.looked += 1
        return float(self) > other  # type: ignore[operator]


def test_with_thousands_idle_a_sweep_looks_only_at_those_due_and_the_next() -> None:
    reg = registry()
    now = time.monotonic()
    for i in range(5000):  # entered as read_request_line does, without the sockets
        reg._idle[Conn(None)] = Deadline(now + i)
    Deadline.looked = 0
    assert reg.sweep(now - 1) == 0
    assert Deadline.looked == 1
    Deadline.looked = 0
    assert reg.sweep(now + 9) == 10
    assert Deadline.looked == 11 and len(reg._idle) == 4990
    assert reg.sweep(LATER) == 4990 and not reg._idle


def test_a_line_that_arrives_before_the_sweep_is_busy_and_never_cut(pairs) -> None:
    reg = registry()
    conn, peer = pair(pairs)
    waiter = wait_line(reg, conn)
    peer.sendall(b"POST /api/v1/push HTTP/1.1\r\n")
    assert waiter.get(timeout=WAIT_S) == b"POST /api/v1/push HTTP/1.1\r\n"
    headers = gevent.spawn(reg.read_headers, conn, lambda: conn.rfile.readline())
    gevent.sleep(0)
    peer.sendall(b"\r\n")
    assert headers.get(timeout=WAIT_S) == b"\r\n"
    # Now handling the request (a long poll, a dashboard socket): no deadline applies.
    assert reg.sweep(LATER) == 0
    peer.sendall(b"still there")
    assert conn.socket.recv(64) == b"still there"
    conn.socket.sendall(b"answer")
    assert peer.recv(64) == b"answer"


def test_a_line_that_arrives_as_the_sweep_cuts_is_not_handled(pairs) -> None:
    reg = registry()
    conn, peer = pair(pairs)
    waiter = wait_line(reg, conn)
    peer.sendall(b"POST /api/v1/push HTTP/1.1\r\n")  # here, but the handler has not run yet
    assert reg.sweep(LATER) == 1
    assert waiter.get(timeout=WAIT_S) == b""  # dropped: the connection closes unhandled
    assert not reg._heading


def test_late_headers_raise_header_timeout_and_the_answer_still_goes_out(pairs) -> None:
    reg = registry()
    conn, peer = pair(pairs)
    waiter = wait_line(reg, conn)
    peer.sendall(b"GET / HTTP/1.1\r\n")
    assert waiter.get(timeout=WAIT_S)
    headers = gevent.spawn(reg.read_headers, conn, lambda: conn.rfile.readline())
    gevent.sleep(0)
    assert reg.sweep(LATER) == 1
    with pytest.raises(HeaderTimeout, match="longer than 60 s"):
        headers.get(timeout=WAIT_S)
    conn.socket.sendall(b"HTTP/1.1 400 Bad Request\r\n\r\n")  # only reading was shut
    assert peer.recv(64).startswith(b"HTTP/1.1 400")


def test_headers_read_before_the_sweep_are_not_cut(pairs) -> None:
    reg = registry()
    conn, peer = pair(pairs)
    waiter = wait_line(reg, conn)
    peer.sendall(b"GET / HTTP/1.1\r\nHost: q\r\n\r\n")  # line and headers in one segment
    assert waiter.get(timeout=WAIT_S)
    assert reg.read_headers(conn, lambda: conn.rfile.readline()) == b"Host: q\r\n"
    assert reg.sweep(LATER) == 0


def test_the_sweeper_closes_an_idle_connection_after_its_deadline_not_before(pairs) -> None:
    reg = registry(idle_s=0.4, header_s=0.4)
    assert reg.limits.sweep_s == pytest.approx(0.1)
    conn, _peer = pair(pairs)
    started = time.monotonic()
    waiter = wait_line(reg, conn)
    assert waiter.get(timeout=WAIT_S) == b""
    assert time.monotonic() - started >= 0.4


def test_evicting_to_make_room_closes_the_idle_connection(pairs) -> None:
    reg = Registry(Limits(cap=1, idle_s=60.0, header_s=60.0))
    conn, peer = pair(pairs)
    assert reg.admit()
    waiter = wait_line(reg, conn)
    assert reg.admit()  # the one idle longest made room
    assert waiter.get(timeout=WAIT_S) == b""
    reg.leave(conn)
    assert reg.open == 1
    assert peer.recv(64) == b""


def test_the_sweep_interval_is_at_most_a_quarter_of_each_deadline() -> None:
    assert Limits(cap=1, idle_s=75, header_s=10).sweep_s == 1.0
    assert Limits(cap=1, idle_s=75, header_s=2).sweep_s == 0.5


def test_closing_ends_the_connections_waiting_for_a_request_and_any_that_come_to_wait(
    pairs,
) -> None:
    reg = registry()
    waiting, peer = pair(pairs)
    heading, _ = pair(pairs)
    later, _ = pair(pairs)
    waiter = wait_line(reg, waiting)
    reg._heading[heading] = LATER  # (a request whose headers are being read)
    assert reg.close_idle() == 1
    assert waiter.get(timeout=WAIT_S) == b""
    assert peer.recv(64) == b""
    assert heading in reg._heading  # a request in flight is left to be answered
    started = time.monotonic()
    assert reg.read_request_line(later, lambda: later.rfile.readline(65536)) == b""
    assert time.monotonic() - started < WAIT_S  # at once, not after idle_s (60 s)
