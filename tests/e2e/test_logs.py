"""Every process of `queen serve` logs in one format (queen/logs.py): supervisor, gunicorn's
master and workers, maintenance, each line with its UTC time, level, role and pid."""

from __future__ import annotations

import contextlib
import datetime
import os
import re
import signal
import subprocess
import sys
import threading
import time
from collections import defaultdict
from pathlib import Path

import requests

from tests.conftest import ROOT, free_port, wait_until_healthy

LINE = re.compile(
    r"(?P<time>\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z)"
    r" (?P<level>DEBUG|INFO|WARNING|ERROR|CRITICAL)"
    r" (?P<role>supervisor|master|worker|maintenance)\[(?P<pid>\d+)\]"
    r" (?P<logger>[\w.]+): (?P<message>.*)"
)


def wait_for(log_path: Path, proc: subprocess.Popen[bytes], done: object, timeout: float) -> str:
    """Wait until done(text of the log) holds; return the text."""
    deadline = time.monotonic() + timeout
    while True:
        text = log_path.read_text(errors="replace")
        if done(text):  # type: ignore[operator]
            return text
        assert proc.poll() is None and time.monotonic() < deadline, text
        time.sleep(0.1)


def park(url: str) -> None:
    """A long poll; how the shutdown ends it is for other tests."""
    with contextlib.suppress(requests.RequestException):
        requests.get(f"{url}/api/v1/pop/queue/logged?wait=true&timeout=20000", timeout=30)


def test_every_process_logs_one_format_with_its_role_and_pid(db_dsn: str, tmp_path: Path) -> None:
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    env = {
        **os.environ, "DATABASE_URL": db_dsn, "HOST": "127.0.0.1", "PORT": str(port),
        "QUEEN_WORKERS": "2", "LOG_LEVEL": "debug",  # every logger, gunicorn's config dump
    }
    log_path = tmp_path / "serve.log"
    with open(log_path, "wb") as log:
        proc = subprocess.Popen(
            [sys.executable, "-m", "queen.cli", "serve"], env=env, cwd=ROOT,
            stdout=log, stderr=subprocess.STDOUT,
        )
    started = datetime.datetime.now(datetime.UTC)
    try:
        wait_until_healthy(url, 30, log_path.read_text)
        wait_for(log_path, proc, lambda t: t.count("Booting worker") == 2 and " leading" in t, 30)
        assert requests.get(f"{url}/api/v1/no-such-route", timeout=10).status_code == 404
        parked = threading.Thread(target=park, args=(url,))  # released by the shutdown
        parked.start()
        time.sleep(0.3)
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(30) == 0, log_path.read_text()
        parked.join(30)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    text = log_path.read_text(errors="replace")
    pids: dict[str, set[int]] = defaultdict(set)
    for line in text.splitlines():
        found = LINE.fullmatch(line)
        assert found, f"not in the one format: {line!r}\n{text}"
        at = datetime.datetime.fromisoformat(found["time"].replace("Z", "+00:00"))
        assert started - datetime.timedelta(seconds=5) <= at <= started + datetime.timedelta(minutes=2)
        assert found["level"] not in ("ERROR", "CRITICAL"), line  # a calm start and stop
        pids[found["role"]].add(int(found["pid"]))
        if booted := re.fullmatch(r"Booting worker with pid: (\d+)", found["message"]):
            assert (found["role"], found["pid"]) == ("worker", booted[1]), line
    assert pids["supervisor"] == {proc.pid}, text
    assert len(pids["master"]) == 1 and len(pids["worker"]) == 2, text
    assert len(pids["maintenance"]) == 1, text
    every = [pid for role in pids.values() for pid in role]
    assert len(set(every)) == len(every), text  # one role per process
