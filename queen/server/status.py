"""What `queen serve`'s supervisor says about its children, for the API processes to report.

The supervisor writes one small JSON file (its path in QUEEN_SUPERVISOR_STATE, which the
children inherit) each time a child starts, ends or recovers; any process of the server
reads it. This module imports neither psycopg nor falcon.
"""

from __future__ import annotations

import contextlib
import json
import os
import tempfile
from pathlib import Path
from typing import Literal, TypedDict

STATE_ENV = "QUEEN_SUPERVISOR_STATE"

ChildStatus = Literal["running", "restarting", "crash-looping"]


class ChildState(TypedDict):
    """One supervised child as the supervisor last saw it (the JSON shape)."""

    status: ChildStatus  # crash-looping: it keeps exiting, and is restarted with backoff
    pid: int | None  # None while it waits to be started again
    restarts: int  # since the server started
    recentExits: int  # within the supervisor's failure window
    lastExit: str | None  # how it last ended ("killed by SIGKILL", "exit code 1")


def write(path: str | os.PathLike[str], children: dict[str, ChildState]) -> None:
    """Replace the state file at path with children's states (readers never see half)."""
    target = Path(path)
    fd, temporary = tempfile.mkstemp(dir=target.parent, prefix=".state-")
    with os.fdopen(fd, "w") as out:
        json.dump(children, out)
    os.replace(temporary, target)


def read_state(path: str | os.PathLike[str]) -> dict[str, ChildState]:
    """The children's states as written at path."""
    found = json.loads(Path(path).read_text())
    if not isinstance(found, dict):
        raise ValueError(f"{path}: not a JSON object")
    return found


def children_state() -> dict[str, ChildState] | None:
    """Every supervised child's state; None when this server runs without the supervisor
    (a bare gunicorn) or it has written nothing yet."""
    path = os.environ.get(STATE_ENV)
    if not path:
        return None
    with contextlib.suppress(OSError, ValueError):
        return read_state(path)
    return None


def maintenance_state() -> ChildState | None:
    """The maintenance child's state (None: not run by this server's supervisor)."""
    children = children_state()
    return None if children is None else children.get("maintenance")
