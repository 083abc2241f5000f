"""Fixtures shared by every test depth.

The database server comes from QUEEN_TEST_DSN (set by .ci/run), else the local
PostgreSQL at 127.0.0.1:5432 when it answers, else an embedded one. Integration and
e2e tests get a fresh database per test, cloned from a template built once by
`queen migrate`'s own function (sql/migrations/, then the functions of sql/functions/).
"""

from __future__ import annotations

import atexit
import contextlib
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import psycopg
import pytest
from psycopg import sql

ROOT = Path(__file__).resolve().parents[1]
# What `queen serve` runs; ROOT / "gunicorn.conf.py" imports the same settings.
GUNICORN_CONFIG = "python:queen.gunicorn_conf"
LOCAL_DSN = "postgresql://postgres@127.0.0.1:5432/postgres"


def _answers(dsn: str) -> bool:
    try:
        with psycopg.connect(dsn, connect_timeout=3):
            return True
    except psycopg.OperationalError:
        return False


def embedded_parent() -> Path:
    """Return a fresh folder for embedded data directories, removed at exit.

    Not pytest's tmp_path: that is 0700, and as root the embedded PostgreSQL runs as another
    user, which must reach its data directory (queen/embedded.py). Removed by an atexit hook
    registered before any server starts there, so it runs after the hook that stops them.
    """
    path = Path(tempfile.mkdtemp(prefix="queen-test-pg-"))
    path.chmod(0o711)
    atexit.register(shutil.rmtree, path, True)
    return path


@pytest.fixture(scope="session")
def server_dsn() -> str:
    """DSN of a maintenance database on the PostgreSQL server the tests use."""
    dsn = os.environ.get("QUEEN_TEST_DSN")
    if dsn:
        return dsn
    if _answers(LOCAL_DSN):
        return LOCAL_DSN
    from queen.embedded import start_embedded

    return start_embedded(embedded_parent() / "pg")


def dsn_for(server_dsn: str, dbname: str) -> str:
    """Return server_dsn pointing at another database."""
    return psycopg.conninfo.make_conninfo(server_dsn, dbname=dbname)


def _admin(server_dsn: str, statement: sql.Composable) -> None:
    with psycopg.connect(server_dsn, autocommit=True) as conn:
        conn.execute(statement)


@pytest.fixture(scope="session")
def template_db(server_dsn: str) -> Iterator[str]:
    """A database built once by migrate (as `queen migrate` builds one), cloned by each test."""
    from queen.store.migrate import migrate

    name = f"queen_tmpl_{os.getpid()}"
    _admin(server_dsn, sql.SQL("DROP DATABASE IF EXISTS {}").format(sql.Identifier(name)))
    _admin(server_dsn, sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
    migrate(dsn_for(server_dsn, name))
    yield name
    _admin(server_dsn, sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(
        sql.Identifier(name)))


@contextlib.contextmanager
def cloned_database(server_dsn: str, template_db: str, prefix: str = "queen_t") -> Iterator[str]:
    """Create a database from the template, yield its DSN, drop it afterwards."""
    name = f"{prefix}_{uuid.uuid4().hex[:12]}"
    _admin(server_dsn, sql.SQL("CREATE DATABASE {} TEMPLATE {}").format(
        sql.Identifier(name), sql.Identifier(template_db)))
    try:
        yield dsn_for(server_dsn, name)
    finally:
        _admin(server_dsn, sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(
            sql.Identifier(name)))


@pytest.fixture
def db_dsn(server_dsn: str, template_db: str) -> Iterator[str]:
    """A fresh database for one test, cloned from the template."""
    with cloned_database(server_dsn, template_db) as dsn:
        yield dsn


@pytest.fixture
def store(db_dsn: str) -> Iterator[object]:
    from queen.store import Store
    from queen.store.db import Database

    s = Store(Database(db_dsn, pool_size=8, timeout_s=5))
    s.db.pool.open(wait=True)
    yield s
    s.close()


def wait_until_healthy(url: str, timeout: float, why: Callable[[], str]) -> None:
    """Poll url's /health until it answers 200; fail with why() after timeout seconds."""
    import requests

    deadline = time.monotonic() + timeout
    while True:
        try:
            if requests.get(f"{url}/health", timeout=2).status_code == 200:
                return
        except requests.RequestException:
            pass
        assert time.monotonic() < deadline, why()
        time.sleep(0.1)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class Server:
    """A real gunicorn (Queen's settings, queen/gunicorn_conf.py) on a free port, as a subprocess."""

    def __init__(
        self, dsn: str, workers: int = 1, log_path: Path | None = None, **env: str
    ) -> None:
        self.log_path = log_path  # where gunicorn's output goes (default: inherited)
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.env = {
            **os.environ, "DATABASE_URL": dsn, "HOST": "127.0.0.1", "PORT": str(self.port),
            "QUEEN_WORKERS": str(workers), "LOG_LEVEL": "warning", **env,
        }
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self, timeout: float = 20.0) -> Server:
        log = open(self.log_path, "ab") if self.log_path else None  # noqa: SIM115
        try:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "gunicorn", "-c", GUNICORN_CONFIG],
                env=self.env, cwd=ROOT, stdout=log, stderr=log,
            )
        finally:
            if log:
                log.close()
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"gunicorn exited with {self.proc.returncode}")
            with contextlib.suppress(OSError), socket.create_connection(
                ("127.0.0.1", self.port), timeout=0.5
            ):
                if self._healthy():
                    return self
            time.sleep(0.1)
        raise RuntimeError("gunicorn did not start in time")

    def _healthy(self) -> bool:
        import requests

        try:
            return requests.get(f"{self.url}/health", timeout=2).status_code == 200
        except requests.RequestException:
            return False

    def stop(self, timeout: float = 15.0) -> int:
        if self.proc is None or self.proc.poll() is not None:
            return self.proc.returncode if self.proc else 0
        self.proc.terminate()
        try:
            return self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            return self.proc.wait()


@pytest.fixture
def server(db_dsn: str) -> Iterator[Server]:
    """One gunicorn with one worker on a fresh database."""
    srv = Server(db_dsn).start()
    yield srv
    srv.stop()


@pytest.fixture
def http() -> Iterator[object]:
    import requests

    with requests.Session() as session:
        yield session
