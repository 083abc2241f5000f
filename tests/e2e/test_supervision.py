"""`queen serve` keeps the API up when its maintenance child dies, and restarts the child."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest
import requests
from psycopg import sql

from queen.server.supervisor import MAX_FAILURES
from tests.conftest import ROOT, dsn_for, free_port, wait_until_healthy


@pytest.fixture
def empty_dsn(server_dsn: str) -> Iterator[str]:
    """A new database with nothing of Queen in it (`queen serve` migrates it)."""
    name = f"queen_s_{uuid.uuid4().hex[:12]}"
    with psycopg.connect(server_dsn, autocommit=True) as conn:
        conn.execute(sql.SQL("CREATE DATABASE {} TEMPLATE template0").format(sql.Identifier(name)))
    yield dsn_for(server_dsn, name)
    with psycopg.connect(server_dsn, autocommit=True) as conn:
        conn.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name)))


def children(pid: int) -> dict[int, str]:
    """Return the child processes of pid: {pid: command line}."""
    out = subprocess.run(
        ["ps", "-o", "pid=,args=", "--ppid", str(pid)], capture_output=True, text=True
    ).stdout
    found = {}
    for line in out.splitlines():
        child, _, args = line.strip().partition(" ")
        found[int(child)] = args
    return found


def maintenance_pid(pid: int) -> int | None:
    return next((c for c, args in children(pid).items() if "workers.maintenance" in args), None)


def test_a_killed_maintenance_child_is_restarted_and_the_api_keeps_answering(
    empty_dsn: str, tmp_path: Path
) -> None:
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    env = {
        **os.environ, "DATABASE_URL": empty_dsn, "HOST": "127.0.0.1", "PORT": str(port),
        "QUEEN_WORKERS": "1", "LOG_LEVEL": "info",
    }
    log_path = tmp_path / "serve.log"
    with open(log_path, "wb") as log:
        proc = subprocess.Popen(
            [sys.executable, "-m", "queen.cli", "serve"], env=env, cwd=ROOT,
            stdout=log, stderr=subprocess.STDOUT,
        )
    try:
        wait_until_healthy(url, 30, log_path.read_text)
        deadline = time.monotonic() + 20
        while (first := maintenance_pid(proc.pid)) is None:
            assert time.monotonic() < deadline, log_path.read_text()
            time.sleep(0.1)
        os.kill(first, signal.SIGKILL)
        deadline = time.monotonic() + 20
        while True:
            assert requests.get(f"{url}/health", timeout=5).status_code == 200
            assert proc.poll() is None, log_path.read_text()
            second = maintenance_pid(proc.pid)
            if second is not None and second != first:
                break
            assert time.monotonic() < deadline, log_path.read_text()
            time.sleep(0.1)
        for _ in range(10):  # and the API still answers once the new child runs
            assert requests.get(f"{url}/health", timeout=5).status_code == 200
            time.sleep(0.1)
        assert "killed by SIGKILL; restarting" in log_path.read_text()
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(30) == 0, log_path.read_text()
        assert not children(proc.pid)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def test_a_crash_looping_maintenance_child_is_reported_and_restarted_while_the_api_serves(
    empty_dsn: str, tmp_path: Path
) -> None:
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    env = {
        **os.environ, "DATABASE_URL": empty_dsn, "HOST": "127.0.0.1", "PORT": str(port),
        "QUEEN_WORKERS": "1", "LOG_LEVEL": "info",
    }
    log_path = tmp_path / "serve.log"
    with open(log_path, "wb") as log:
        proc = subprocess.Popen(
            [sys.executable, "-m", "queen.cli", "serve"], env=env, cwd=ROOT,
            stdout=log, stderr=subprocess.STDOUT,
        )
    try:
        wait_until_healthy(url, 30, log_path.read_text)
        killed: list[int] = []
        for _ in range(MAX_FAILURES + 1):  # one more than the old give-up rule allowed
            deadline = time.monotonic() + 60
            while (pid := maintenance_pid(proc.pid)) is None or pid in killed:
                assert proc.poll() is None, log_path.read_text()
                assert time.monotonic() < deadline, log_path.read_text()
                time.sleep(0.05)
            os.kill(pid, signal.SIGKILL)
            killed.append(pid)
        health = requests.get(f"{url}/health", timeout=5)
        assert health.status_code == 200 and proc.poll() is None, log_path.read_text()
        deadline = time.monotonic() + 10
        while (health.json().get("maintenance") or {}).get("status") != "crash-looping":
            assert time.monotonic() < deadline, health.text
            time.sleep(0.1)
            health = requests.get(f"{url}/health", timeout=5)
        assert health.json()["maintenance"]["lastExit"] == "killed by SIGKILL"
        scraped = requests.get(f"{url}/metrics/prometheus", timeout=10).text
        assert "queen_maintenance_crash_looping 1.0" in scraped, scraped
        assert "maintenance is crash-looping" in log_path.read_text()
        deadline = time.monotonic() + 60  # restarted again, after at most MAX_BACKOFF
        while (pid := maintenance_pid(proc.pid)) is None or pid in killed:
            assert requests.get(f"{url}/health", timeout=5).status_code == 200
            assert proc.poll() is None, log_path.read_text()
            assert time.monotonic() < deadline, log_path.read_text()
            time.sleep(0.2)
        assert requests.get(f"{url}/health", timeout=5).json()["maintenance"]["pid"] == pid
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(30) == 0, log_path.read_text()
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
