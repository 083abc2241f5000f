"""A TCP proxy between Queen and PostgreSQL that can reset or freeze every connection."""

from __future__ import annotations

import contextlib
import socket
import struct
import threading
import time


class Proxy:
    """Forward 127.0.0.1:port to target; reset() cuts every connection with a RST,
    freeze() stops forwarding (new connections included) while keeping sockets open."""

    def __init__(self, target_port: int, target_host: str = "127.0.0.1") -> None:
        self.target = (target_host, target_port)
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = self.listener.getsockname()[1]
        self.frozen = threading.Event()
        self._pairs: list[tuple[socket.socket, socket.socket]] = []
        self._lock = threading.Lock()
        self.resets = 0
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self.listener.accept()
            except OSError:
                return
            threading.Thread(target=self._connect, args=(client,), daemon=True).start()

    def _connect(self, client: socket.socket) -> None:
        while self.frozen.is_set():
            time.sleep(0.05)
        try:
            server = socket.create_connection(self.target, timeout=5)
            server.settimeout(None)
        except OSError:
            client.close()
            return
        with self._lock:
            self._pairs.append((client, server))
        for src, dst in ((client, server), (server, client)):
            threading.Thread(target=self._pipe, args=(src, dst), daemon=True).start()

    def _pipe(self, src: socket.socket, dst: socket.socket) -> None:
        with contextlib.suppress(OSError):
            while data := src.recv(65536):
                while self.frozen.is_set():
                    time.sleep(0.05)
                dst.sendall(data)
        for sock in (src, dst):
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)

    def reset(self) -> int:
        """Cut every open connection with a RST on both sides; return how many."""
        with self._lock:
            pairs, self._pairs = self._pairs, []
        for pair in pairs:
            for sock in pair:
                with contextlib.suppress(OSError):
                    sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
                    # Wake the pipe blocked in recv (a close alone would not, and the socket
                    # would stay open until it returned); the close then sends the RST.
                    sock.shutdown(socket.SHUT_RD)
                    sock.close()
        self.resets += len(pairs)
        return len(pairs)

    def close(self) -> None:
        self.frozen.clear()
        self.listener.close()
        self.reset()


class AnswerDropper(Proxy):
    """A Proxy in front of an HTTP server whose drop_next_answer() loses the next answer:
    the request reaches the server and is handled, then its client's connection is reset
    instead of getting the answer (the "applied, answer lost" case)."""

    def __init__(self, target_port: int, target_host: str = "127.0.0.1") -> None:
        self.dropping = threading.Event()
        self.dropped = 0
        super().__init__(target_port, target_host)

    def drop_next_answer(self) -> None:
        self.dropping.set()

    def _pipe(self, src: socket.socket, dst: socket.socket) -> None:
        with self._lock:
            answers = any(src is server for _, server in self._pairs)
        if not answers:
            super()._pipe(src, dst)
            return
        with contextlib.suppress(OSError):
            while data := src.recv(65536):
                if self.dropping.is_set():
                    self.dropping.clear()
                    self.dropped += 1
                    break
                dst.sendall(data)
        for sock in (dst, src):  # the client gets a RST, not an answer
            with contextlib.suppress(OSError):
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
                sock.shutdown(socket.SHUT_RD)  # (wakes the other pipe's recv: as reset())
                sock.close()
