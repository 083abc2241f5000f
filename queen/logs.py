"""One log format for every process of `queen serve`, and the role each process logs as.

    2026-12-05T14:20:37.123Z INFO worker[1234] queen.app: message

The time in UTC (ISO 8601, milliseconds, `Z`), the level, the process's role and pid,
the logger, the message. The roles: `supervisor` (`queen serve`, which starts and
restarts the others), `master` and `worker` (gunicorn's), `maintenance`; other
commands log under their own name. All of them write to stderr, so that `queen serve`'s
output (a terminal, journald, a container's log) reads as one log, whoever wrote a line.
"""

from __future__ import annotations

import logging
import os
import time
from typing import Any

__all__ = ["PREFIX", "Formatter", "gunicorn_config", "role_of", "set_role", "setup"]

# Each line of a record: a traceback, or a message of several lines, carries it too.
PREFIX = "{time} {level} {role}[{pid}] {logger}: "

_role = "queen"  # this process's (set_role)
_role_pid = 0  # the process _role names; its forks are _children
_children: str | None = None
# gunicorn logs its own lines, an INFO "Starting gunicorn" included, on "gunicorn.error".
NAMES = {"gunicorn.error": "gunicorn"}


def set_role(role: str, children: str | None = None) -> None:
    """Name this process in every line it logs from now on, and its forks as children.

    A forked process takes children from its first line (gunicorn's worker logs before
    any hook of its own runs).
    """
    global _role, _role_pid, _children
    _role, _role_pid, _children = role, os.getpid(), children


def role_of(pid: int) -> str:
    """The role of this process (pid), or of a fork of the process that set it."""
    if pid != _role_pid and _children is not None:
        return _children
    return _role


class Formatter(logging.Formatter):
    """PREFIX on every line of a record, the time as ISO 8601 in UTC: lines from several
    processes and hosts sort as text and read the same whatever the machine's time zone,
    and grepping a pid finds a traceback whole."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:  # dictConfig may pass a format
        super().__init__("%(message)s")

    def formatTime(self, record: logging.LogRecord, datefmt: str | None = None) -> str:  # noqa: N802 (logging's name)
        seconds = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created))
        return f"{seconds}.{int(record.msecs):03d}Z"

    def format(self, record: logging.LogRecord) -> str:
        prefix = PREFIX.format(
            time=self.formatTime(record),
            level=record.levelname,
            role=role_of(record.process or 0),
            pid=record.process,
            logger=NAMES.get(record.name, record.name),
        )
        return "\n".join(prefix + line for line in super().format(record).split("\n"))


def handler() -> logging.Handler:
    """A handler writing Formatter's lines to stderr."""
    out = logging.StreamHandler()
    out.setFormatter(Formatter())
    return out


def setup(role: str, level: str | int | None = None) -> None:
    """Log this process's records (and Python's warnings) to stderr as Formatter says, at
    level (LOG_LEVEL when None).

    A root logger that already has handlers keeps them and its level, only the role
    changes: `queen maintenance` sets up in the CLI then in the maintenance module, and a
    test calling either in its own process keeps its capture.
    """
    from queen.config import log_level

    set_role(role)
    if logging.getLogger().handlers:
        return
    logging.basicConfig(level=level or log_level(), handlers=[handler()])
    logging.captureWarnings(True)


def gunicorn_config(level: str) -> dict[str, Any]:
    """gunicorn's `logconfig_dict`: its own loggers and the root logger (Queen's, in the
    workers) through one stderr handler and Formatter, instead of gunicorn's own format."""
    stderr = {"handlers": ["stderr"], "level": level.upper(), "propagate": False}
    return {
        "version": 1,
        "disable_existing_loggers": False,
        "formatters": {"queen": {"()": Formatter}},
        "handlers": {
            "stderr": {
                "class": "logging.StreamHandler",
                "formatter": "queen",
                "stream": "ext://sys.stderr",
            },
        },
        "root": {"handlers": ["stderr"], "level": level.upper()},
        "loggers": {"gunicorn.error": stderr, "gunicorn.access": dict(stderr)},
    }
