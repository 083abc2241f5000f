"""The server keeps no access log at the default log level (gunicorn.conf.py: accesslog = None)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import requests

from tests.conftest import ROOT, free_port, wait_until_healthy


def run_server(dsn: str, log: Path, level: str) -> str:
    """Start gunicorn with LOG_LEVEL=level, its output into log; make a few requests; stop it."""
    port = free_port()
    env = {**os.environ, "DATABASE_URL": dsn, "HOST": "127.0.0.1", "PORT": str(port),
           "QUEEN_WORKERS": "1", "LOG_LEVEL": level}
    with open(log, "wb") as out:
        proc = subprocess.Popen(
            [sys.executable, "-m", "gunicorn", "-c", str(ROOT / "gunicorn.conf.py")],
            env=env, cwd=ROOT, stdout=out, stderr=subprocess.STDOUT,
        )
    url = f"http://127.0.0.1:{port}"
    try:
        wait_until_healthy(url, 20, lambda: log.read_text(errors="replace")[-2000:])
        body = {"items": [{"queue": "logged", "payload": {"n": 1}}]}
        assert requests.post(f"{url}/api/v1/push", json=body, timeout=5).status_code == 201
        assert requests.get(f"{url}/api/v1/no-such-thing", timeout=5).status_code == 404
    finally:
        proc.terminate()
        proc.wait(15)
    return log.read_text(errors="replace")


def test_requests_are_not_logged_at_info(db_dsn: str, tmp_path: Path) -> None:
    text = run_server(db_dsn, tmp_path / "info.log", "info")
    assert "Booting worker" in text  # the log itself was written, at info
    assert "POST /api/v1/push" not in text
    assert "GET /health" not in text


def test_requests_are_logged_at_debug(db_dsn: str, tmp_path: Path) -> None:
    text = run_server(db_dsn, tmp_path / "debug.log", "debug")
    assert "POST /api/v1/push" in text
    assert "/api/v1/no-such-thing" in text
