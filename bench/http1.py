"""A minimal HTTP/1.1 keep-alive client for the load generator.

http.client parses every response's headers with the email package: about 180 us of CPU
a request on the bench host, against about 50 us for this client (both measured with one
push per request against a local server). The load generator shares the machine with
the server it measures, so what it spends is taken from the system under test. It
sends a request, reads the head up to the blank line, then exactly Content-Length bytes
of body; it understands nothing else (no chunked bodies, which Queen never sends, no
redirects, no TLS).
"""

from __future__ import annotations

import socket


class ResponseError(ConnectionError):
    """The server answered with something this client does not read."""


class Connection:
    """One keep-alive connection; reconnects on the next request after a failure."""

    def __init__(self, host: str, port: int, timeout: float = 60.0) -> None:
        self.host, self.port, self.timeout = host, port, timeout
        self._sock: socket.socket | None = None
        self._buf = b""
        self._host_line = b"Host: %s:%d\r\n" % (host.encode(), port)

    def _connect(self) -> socket.socket:
        sock = socket.create_connection((self.host, self.port), timeout=self.timeout)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self._sock, self._buf = sock, b""
        return sock

    def close(self) -> None:
        if self._sock is not None:
            self._sock.close()
        self._sock, self._buf = None, b""

    def request(self, method: str, path: str, body: bytes | None = None) -> tuple[int, bytes]:
        """Send one request; return (status, body). Raises ConnectionError (the connection
        is closed then) when the server closed it, or answered what this cannot read."""
        sock = self._sock or self._connect()
        message = b"%s %s HTTP/1.1\r\n%s" % (method.encode(), path.encode(), self._host_line)
        if body is None:
            message += b"\r\n"
        else:
            message += b"Content-Type: application/json\r\nContent-Length: %d\r\n\r\n%s" % (
                len(body),
                body,
            )
        try:
            sock.sendall(message)
            return self._response(sock)
        except (OSError, ValueError) as exc:
            self.close()
            if isinstance(exc, ConnectionError):
                raise
            raise ConnectionError(str(exc)) from exc

    def _fill(self, sock: socket.socket, buf: bytes) -> bytes:
        chunk = sock.recv(65536)
        if not chunk:
            raise ConnectionError("the server closed the connection")
        return buf + chunk

    def _response(self, sock: socket.socket) -> tuple[int, bytes]:
        buf = self._buf
        while (end := buf.find(b"\r\n\r\n")) < 0:
            buf = self._fill(sock, buf)
        head = buf[:end].lower()
        status = int(head[9:12])
        length = 0
        close = False
        for line in head.split(b"\r\n")[1:]:
            name, _, value = line.partition(b":")
            if name == b"content-length":
                length = int(value)
            elif name == b"transfer-encoding":
                raise ResponseError(f"unsupported transfer-encoding {value.strip()!r}")
            elif name == b"connection" and value.strip() == b"close":
                close = True
        need = end + 4 + length
        while len(buf) < need:
            buf = self._fill(sock, buf)
        self._buf = buf[need:]
        payload = buf[end + 4 : need]
        if close or head.startswith(b"http/1.0"):
            self.close()
        return status, payload
