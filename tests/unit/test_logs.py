"""queen.logs: one prefix on every line of a record, the time in UTC, the role by process."""

from __future__ import annotations

import datetime
import logging
import os
import sys

import pytest

from queen import logs


@pytest.fixture(autouse=True)
def _keep_role(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("_role", "_role_pid", "_children"):
        monkeypatch.setattr(logs, name, getattr(logs, name))


def record(message: str, exc_info: object = None) -> logging.LogRecord:
    rec = logging.LogRecord("queen.app", logging.WARNING, __file__, 1, message, (), exc_info)  # type: ignore[arg-type]
    rec.created, rec.msecs = 1796480437.123456, 123.456  # 2026-12-05T14:20:37.123Z
    return rec


def test_a_line_names_the_time_in_utc_the_level_the_role_and_the_pid() -> None:
    logs.set_role("maintenance")
    line = logs.Formatter().format(record("leading"))
    assert line == f"2026-12-05T14:20:37.123Z WARNING maintenance[{os.getpid()}] queen.app: leading"
    stamp = datetime.datetime.fromisoformat(line.split()[0].replace("Z", "+00:00"))
    assert stamp.timestamp() == pytest.approx(1796480437.123, abs=0.001)


def test_every_line_of_a_traceback_carries_the_prefix() -> None:
    logs.set_role("worker")
    try:
        raise ValueError("first\nsecond")
    except ValueError:
        lines = logs.Formatter().format(record("failed", sys.exc_info())).splitlines()
    prefix = f"2026-12-05T14:20:37.123Z WARNING worker[{os.getpid()}] queen.app: "
    assert len(lines) > 3 and all(line.startswith(prefix) for line in lines), lines
    assert lines[0] == prefix + "failed" and lines[-1] == prefix + "second"


def test_a_fork_logs_as_the_children_of_the_process_that_set_the_role() -> None:
    logs.set_role("master", children="worker")
    assert logs.role_of(os.getpid()) == "master"
    assert logs.role_of(os.getpid() + 1) == "worker"
    logs.set_role("maintenance")
    assert logs.role_of(os.getpid() + 1) == "maintenance"


def test_gunicorns_own_logger_is_not_named_error() -> None:
    rec = record("Starting gunicorn")
    rec.name = "gunicorn.error"
    assert " gunicorn: Starting gunicorn" in logs.Formatter().format(rec)
