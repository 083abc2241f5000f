"""The load generator's HTTP/1.1 client (bench.http1) against a scripted socket server."""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Callable, Iterator

import pytest

from bench import http1

Reply = Callable[[socket.socket, bytes], None]


class Server:
    """Accepts connections; answers each request with the next scripted reply."""

    def __init__(self, replies: list[Reply]) -> None:
        self.replies = replies
        self.requests: list[bytes] = []
        self.connections = 0
        self.sock = socket.create_server(("127.0.0.1", 0))
        self.port = self.sock.getsockname()[1]
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self) -> None:
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            self.connections += 1
            threading.Thread(target=self._handle, args=(conn,), daemon=True).start()

    def _handle(self, conn: socket.socket) -> None:
        buf = b""
        with conn:
            while self.replies:
                while b"\r\n\r\n" not in buf:
                    chunk = conn.recv(65536)
                    if not chunk:
                        return
                    buf += chunk
                head, _, rest = buf.partition(b"\r\n\r\n")
                length = 0
                for line in head.split(b"\r\n")[1:]:
                    name, _, value = line.partition(b":")
                    if name.lower() == b"content-length":
                        length = int(value)
                while len(rest) < length:
                    rest += conn.recv(65536)
                request, buf = head + b"\r\n\r\n" + rest[:length], rest[length:]
                self.requests.append(request)
                self.replies.pop(0)(conn, request)


def answer(status: str, body: bytes = b"", *headers: str) -> Reply:
    def reply(conn: socket.socket, request: bytes) -> None:
        lines = [f"HTTP/1.1 {status}", *headers]
        if not status.startswith("204"):
            lines.append(f"Content-Length: {len(body)}")
        conn.sendall(("\r\n".join(lines) + "\r\n\r\n").encode() + body)

    return reply


def in_pieces(body: bytes) -> Reply:
    """The head and the body's halves in three writes, a pause between them."""

    def reply(conn: socket.socket, request: bytes) -> None:
        conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n" % len(body))
        time.sleep(0.05)
        conn.sendall(b"\r\n" + body[: len(body) // 2])
        time.sleep(0.05)
        conn.sendall(body[len(body) // 2 :])

    return reply


def close_after(reply: Reply) -> Reply:
    def closing(conn: socket.socket, request: bytes) -> None:
        reply(conn, request)
        conn.shutdown(socket.SHUT_RDWR)

    return closing


@pytest.fixture
def serve() -> Iterator[Callable[[list[Reply]], Server]]:
    servers: list[Server] = []

    def start(replies: list[Reply]) -> Server:
        servers.append(Server(replies))
        return servers[-1]

    yield start
    for server in servers:
        server.sock.close()


def test_requests_share_one_connection_and_each_gets_its_own_answer(serve):
    server = serve(
        [
            answer("201 Created", b'{"a":1}'),
            answer("204 No Content"),
            answer("200 OK", b"[]", "Content-Type: application/json"),
        ]
    )
    conn = http1.Connection("127.0.0.1", server.port)
    assert conn.request("POST", "/api/v1/push", b'{"items":[]}') == (201, b'{"a":1}')
    assert conn.request("GET", "/api/v1/pop/queue/q?batch=1") == (204, b"")
    assert conn.request("GET", "/health") == (200, b"[]")
    assert server.connections == 1
    first, second, _ = server.requests
    assert first.startswith(b"POST /api/v1/push HTTP/1.1\r\nHost: 127.0.0.1:")
    assert b"\r\nContent-Length: 12\r\n" in first and first.endswith(b'\r\n\r\n{"items":[]}')
    assert second.startswith(b"GET /api/v1/pop/queue/q?batch=1 HTTP/1.1\r\n")
    assert b"Content-Length" not in second


def test_a_body_arriving_in_pieces_is_read_whole(serve):
    body = b"x" * 200_000
    server = serve([in_pieces(body), answer("200 OK", b"next")])
    conn = http1.Connection("127.0.0.1", server.port)
    assert conn.request("GET", "/big") == (200, body)
    assert conn.request("GET", "/after") == (200, b"next")  # nothing of the first left over


def test_a_connection_the_server_closed_is_replaced_on_the_next_request(serve):
    server = serve([close_after(answer("200 OK", b"one")), answer("200 OK", b"two")])
    conn = http1.Connection("127.0.0.1", server.port)
    assert conn.request("GET", "/one") == (200, b"one")
    time.sleep(0.05)
    with pytest.raises(ConnectionError):  # the closed socket is found out by this request
        conn.request("GET", "/two")
    assert conn.request("GET", "/two") == (200, b"two")
    assert server.connections == 2


def test_connection_close_in_the_answer_ends_the_connection(serve):
    server = serve([answer("200 OK", b"one", "Connection: close"), answer("200 OK", b"two")])
    conn = http1.Connection("127.0.0.1", server.port)
    assert conn.request("GET", "/one") == (200, b"one")
    assert conn.request("GET", "/two") == (200, b"two")
    assert server.connections == 2


def test_a_chunked_answer_is_refused_and_the_connection_dropped(serve):
    def chunked(conn: socket.socket, request: bytes) -> None:
        conn.sendall(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nabc\r\n0\r\n\r\n")

    server = serve([chunked, answer("200 OK", b"fine")])
    conn = http1.Connection("127.0.0.1", server.port)
    with pytest.raises(http1.ResponseError, match="chunked"):
        conn.request("GET", "/chunked")
    assert conn.request("GET", "/fine") == (200, b"fine")
    assert server.connections == 2
