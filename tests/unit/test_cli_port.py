"""`queen serve` on a port already in use fails at once, with one line naming the port."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from collections.abc import Iterator

import pytest

from queen.cli import PortInUse, check_port_free


@pytest.fixture
def taken() -> Iterator[int]:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as server:
        server.bind(("127.0.0.1", 0))
        server.listen()
        yield server.getsockname()[1]


def test_a_free_port_passes_and_a_taken_one_is_named(taken):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        free = s.getsockname()[1]
    check_port_free("127.0.0.1", free)
    with pytest.raises(PortInUse, match=str(taken)):
        check_port_free("127.0.0.1", taken)


def test_serve_on_a_taken_port_exits_1_with_one_line(taken):
    env = {k: v for k, v in os.environ.items() if k not in ("DATABASE_URL", "PG_HOST")}
    done = subprocess.run(
        [sys.executable, "-m", "queen.cli", "serve", "--port", str(taken), "--no-maintenance"],
        env=env, capture_output=True, text=True, timeout=60,
    )
    assert done.returncode == 1, done.stderr
    lines = [line for line in done.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and str(taken) in lines[0], done.stderr
    assert "Address already in use" in lines[0]
