"""The gunicorn worker: geventwebsocket's gevent worker, plus what long polling needs.

- Each request's environ carries its client socket as `gunicorn.socket`, so a long
  poll can tell that its client has gone before it claims anything.
- SIGTERM releases parked long polls (and dashboard sockets) and closes connections
  kept alive between requests at once, instead of letting them run into
  graceful_timeout.
- Request headers are parsed by queen.headers (the same result as gevent's parser,
  without the email package for the usual lines).
- Client connections are bounded (queen.connections): idle keep-alive and slow headers
  are closed, and a worker at its cap answers 503 at once.

Imported by the gunicorn master (to find the worker class): nothing here may import
psycopg, which must first be imported after the worker has monkey-patched.
"""

from __future__ import annotations

import logging
import time
from typing import Any

import gevent  # type: ignore[import-untyped]
from gevent.pywsgi import format_date_time  # type: ignore[attr-defined]
from geventwebsocket.gunicorn.workers import GeventWebSocketWorker  # type: ignore[import-untyped]
from geventwebsocket.handler import WebSocketHandler  # type: ignore[import-untyped]

from queen import headers
from queen.connections import BUSY_RESPONSE, HEADROOM, Limits, Registry

MAX_REQUEST_LINE = 65536  # gevent.pywsgi's own limit (a longer line answers 414)
_connections: Registry | None = None  # this worker process's (Worker.init_process)


class Handler(WebSocketHandler):  # type: ignore[misc]
    """geventwebsocket's handler, exposing the connection to the application."""

    def log_request(self) -> None:
        """Log each request at DEBUG only: Queen keeps no access log (gunicorn.conf.py).

        geventwebsocket logs every request at INFO, which at the default LOG_LEVEL was a
        formatted line and a write to stderr per request. Run with LOG_LEVEL=debug, or
        put an access log in the load balancer, to see them.
        """
        if self.logger.isEnabledFor(logging.DEBUG) and "101" not in str(self.status):
            self.logger.debug(self.format_request())

    def MessageClass(self, *args: Any) -> Any:  # noqa: N802 (gevent's name)
        return headers.parse(*args)

    def handle(self) -> None:
        registry = _connections
        if registry is None:
            super().handle()
            return
        if not registry.admit():
            self.socket.sendall(BUSY_RESPONSE)
            return
        try:
            super().handle()
        finally:
            registry.leave(self)

    def read_requestline(self) -> str:
        if _connections is None:
            return str(super().read_requestline())
        line = _connections.read_request_line(self, lambda: self.rfile.readline(MAX_REQUEST_LINE))
        return line.decode("latin-1")

    def read_request(self, raw_requestline: str) -> Any:
        if _connections is None:
            return super().read_request(raw_requestline)
        return _connections.read_headers(
            self, lambda: super(Handler, self).read_request(raw_requestline)
        )

    def finalize_headers(self) -> None:
        """Add the Date header as gevent does, formatted once a second instead of per response."""
        if self.provided_date is None:  # type: ignore[has-type]
            self.response_headers.append((b"Date", _http_date(int(time.time()))))
            self.provided_date = True
        super().finalize_headers()

    def get_environ(self) -> dict[str, Any]:
        env: dict[str, Any] = super().get_environ()
        env["gunicorn.socket"] = self.socket
        return env


_date: tuple[int, bytes] = (0, b"")  # the last second formatted, and its Date header


def _http_date(second: int) -> bytes:
    global _date
    if _date[0] != second:
        _date = (second, format_date_time(second))
    return _date[1]


class Worker(GeventWebSocketWorker):  # type: ignore[misc]
    """The gevent worker Queen runs in (worker_class in gunicorn.conf.py)."""

    wsgi_handler = Handler

    def init_process(self) -> None:
        """Bound this process's client connections, then run (in the worker, after fork)."""
        from queen.config import Settings
        from queen.server.memory import return_large_frees

        global _connections
        return_large_frees()  # huge bodies do not leave the heap grown
        settings = Settings.from_env()
        limits = Limits(
            cap=int(self.cfg.worker_connections),
            idle_s=settings.idle_timeout_s,
            header_s=settings.header_timeout_s,
        )
        _connections = Registry(limits)
        self.worker_connections = limits.cap + HEADROOM  # the pool: room to answer 503
        super().init_process()

    def handle_exit(self, sig: int, frame: Any) -> None:
        super().handle_exit(sig, frame)  # stop accepting, then wait for in-flight requests
        gevent.spawn(_drain)  # a signal handler must not block: do it in a greenlet


def _drain() -> None:
    from queen import wsgi

    wsgi.shutdown()
    if _connections is not None:  # (kept-alive clients would hold it to graceful_timeout)
        _connections.close_idle()
