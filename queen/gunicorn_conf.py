"""gunicorn settings for Queen; values come from queen.config (environment variables).

Run: gunicorn -c python:queen.gunicorn_conf from any folder (`queen serve` does, and also runs
maintenance), or gunicorn -c gunicorn.conf.py in a checkout (that file imports this one).
Nothing here imports psycopg: the gevent worker patches the standard library after
fork, and each worker then builds its own pool and LISTEN connection (no preload).
"""

from __future__ import annotations

import logging
import os
import subprocess
import sys
from typing import Any

from queen import logs
from queen.config import SettingError, Settings, check_exposure
from queen.server import claims, multiproc

__all__ = [  # what gunicorn reads: settings and server hooks
    "wsgi_app", "bind", "workers", "worker_class", "worker_connections", "preload_app",
    "control_socket_disable", "timeout", "graceful_timeout", "backlog",
    "accesslog", "errorlog", "loglevel", "logconfig_dict", "on_starting", "worker_int", "worker_exit",
    "child_exit", "on_exit",
]

_settings = Settings.from_env()
try:
    check_exposure(_settings)
except SettingError as exc:
    sys.exit(f"queen: {exc}")
_metrics_dir = multiproc.prepare()  # before any worker imports prometheus_client
_claims_dir = claims.prepare()  # where workers keep their unanswered claims

wsgi_app = "queen.wsgi:get_app()"
bind = [f"{_settings.host}:{_settings.port}"]
workers = _settings.workers
worker_class = "queen.server.worker.Worker"  # geventwebsocket's gevent worker; see queen/server/worker.py
worker_connections = _settings.worker_connections
preload_app = False
control_socket_disable = True
timeout = 60  # seconds without a heartbeat before a worker is replaced
graceful_timeout = 10  # seconds for in-flight requests on shutdown; parked polls end at once
# (the worker's SIGTERM handler releases them: queen/server/worker.py)
# Idle keep-alive connections are closed by Queen's own handler (QUEEN_IDLE_TIMEOUT,
# queen/connections.py): gunicorn's `keepalive` does not apply to the gevent worker.
backlog = 2048
accesslog = None
errorlog = "-"
loglevel = _settings.log_level
# Every line in queen.logs' format, gunicorn's own included. This module is read by the
# master; the workers are its forks.
logconfig_dict = logs.gunicorn_config(_settings.log_level)
logs.set_role("master", children="worker")
logging.captureWarnings(True)


def on_starting(server: Any) -> None:
    """Refuse, in one line and before any worker starts, a database whose schema is missing
    or not this build's (`queen serve` has migrated it; gunicorn started alone may not).

    Checked in a child process: psycopg must not be imported before gevent patches a
    worker. A database that does not answer is left to /health/ready. Another app run
    with these settings (gunicorn reads ./gunicorn.conf.py in a checkout) is not checked.
    """
    if getattr(server.app, "app_uri", wsgi_app) != wsgi_app:
        return
    check = [sys.executable, "-m", "queen.store.migrate", "--check"]
    if subprocess.run(check, env=os.environ).returncode != 0:
        sys.exit(1)


def worker_int(worker: Any) -> None:
    from queen import wsgi

    wsgi.shutdown()


def worker_exit(server: Any, worker: Any) -> None:
    from queen import wsgi

    wsgi.shutdown()
    wsgi.close()


def child_exit(server: Any, worker: Any) -> None:
    multiproc.forget_worker(worker.pid)
    claims.worker_died(worker.pid)  # its pops claimed and never answered go back


def on_exit(server: Any) -> None:
    multiproc.remove(_metrics_dir)
    claims.remove(_claims_dir)
