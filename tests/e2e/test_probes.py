"""The probes of a real gunicorn, and gunicorn alone on a database without the schema."""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
import uuid
from collections.abc import Iterator

import psycopg
import pytest
import requests
from psycopg import sql

from tests.conftest import GUNICORN_CONFIG, ROOT, dsn_for, free_port

REFUSAL_TIMEOUT = 60  # seconds: gunicorn checks the schema before it starts a worker


@contextlib.contextmanager
def empty_database(server_dsn: str) -> Iterator[str]:
    name = f"queen_empty_{uuid.uuid4().hex[:12]}"
    with psycopg.connect(server_dsn, autocommit=True) as conn:
        conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
    try:
        yield dsn_for(server_dsn, name)
    finally:
        with psycopg.connect(server_dsn, autocommit=True) as conn:
            conn.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(
                sql.Identifier(name)))


def gunicorn_alone(dsn: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "DATABASE_URL": dsn, "HOST": "127.0.0.1", "PORT": str(free_port()),
           "QUEEN_WORKERS": "2", "LOG_LEVEL": "warning"}
    return subprocess.run([sys.executable, "-m", "gunicorn", "-c", GUNICORN_CONFIG], env=env,
                          cwd=ROOT, capture_output=True, text=True, timeout=REFUSAL_TIMEOUT)


def refusals(stderr: str) -> list[str]:
    return [line for line in stderr.splitlines() if line.startswith("queen: ")]


def test_gunicorn_alone_refuses_a_database_without_the_schema(server_dsn) -> None:
    with empty_database(server_dsn) as dsn:
        done = gunicorn_alone(dsn)
    assert done.returncode == 1
    assert done.stderr.splitlines() == refusals(done.stderr), done.stderr  # nothing else
    (line,) = refusals(done.stderr)
    assert "no Queen schema" in line and "queen migrate" in line


def test_gunicorn_alone_refuses_an_older_schema(db_dsn) -> None:
    with psycopg.connect(db_dsn, autocommit=True) as conn:
        conn.execute("DELETE FROM queen.schema_migrations")
    done = gunicorn_alone(db_dsn)
    assert done.returncode == 1
    (line,) = refusals(done.stderr)
    assert "older" in line and "0001_schema.sql" in line and "queen migrate" in line


def test_live_and_ready_on_a_serving_server(server, db_dsn) -> None:
    assert requests.get(f"{server.url}/health/live", timeout=10).json() == {"status": "live"}
    ready = requests.get(f"{server.url}/health/ready", timeout=10)
    assert ready.status_code == 200, ready.text
    assert ready.json()["checks"] == {
        "database": {"ok": True}, "schema": {"ok": True}, "listener": {"ok": True}
    }
    assert requests.get(f"{server.url}/health", timeout=10).json()["status"] == "healthy"
    # The schema made older under a running server: not ready, still live.
    with psycopg.connect(db_dsn, autocommit=True) as conn:
        names = [r[0] for r in conn.execute("DELETE FROM queen.schema_migrations RETURNING name")]
        try:
            ready = requests.get(f"{server.url}/health/ready", timeout=10)
            assert ready.status_code == 503
            assert "queen migrate" in ready.json()["checks"]["schema"]["reason"]
            assert requests.get(f"{server.url}/health/live", timeout=10).status_code == 200
        finally:
            conn.execute("INSERT INTO queen.schema_migrations (name) SELECT unnest(%s::text[])",
                         (names,))
    assert requests.get(f"{server.url}/health/ready", timeout=10).status_code == 200


@pytest.mark.parametrize("path", ["/health/live", "/health/ready"])
def test_probes_need_no_token(db_dsn, path) -> None:
    from tests.conftest import Server

    srv = Server(db_dsn, QUEEN_AUTH="on").start()
    try:
        assert requests.get(f"{srv.url}{path}", timeout=10).status_code == 200
    finally:
        srv.stop()
