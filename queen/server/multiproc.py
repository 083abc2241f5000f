"""Where the gunicorn workers of one server keep their Prometheus samples.

prometheus_client decides at import whether samples live in process memory or in
memory-mapped files under PROMETHEUS_MULTIPROC_DIR, so the master sets the variable
before any worker starts (workers inherit it at fork). This module imports neither
prometheus_client at load nor psycopg: gunicorn.conf.py runs it in the master.
"""

from __future__ import annotations

import os
import shutil
import tempfile
import time
from pathlib import Path

MULTIPROC_ENV = "PROMETHEUS_MULTIPROC_DIR"
STARTED_AT_ENV = "QUEEN_STARTED_AT"  # epoch seconds the server started (uptime, rates)


def prepare() -> str | None:
    """Point PROMETHEUS_MULTIPROC_DIR at an empty directory; return it if we made it.

    A directory given by the operator is emptied of old sample files (a restarted server
    must not count the previous run's requests); otherwise a fresh temporary one is used.
    """
    os.environ.setdefault(STARTED_AT_ENV, str(time.time()))
    given = os.environ.get(MULTIPROC_ENV)
    if given:
        directory = Path(given)
        directory.mkdir(parents=True, exist_ok=True)
        for stale in directory.glob("*.db"):
            stale.unlink(missing_ok=True)
        return None
    made = tempfile.mkdtemp(prefix="queen-metrics-")
    os.environ[MULTIPROC_ENV] = made
    return made


def forget_worker(pid: int) -> None:
    """Drop a dead worker's live gauges (its counters keep counting in the totals)."""
    if os.environ.get(MULTIPROC_ENV):
        from prometheus_client import multiprocess

        multiprocess.mark_process_dead(pid)


def remove(directory: str | None) -> None:
    if directory:
        shutil.rmtree(directory, ignore_errors=True)
