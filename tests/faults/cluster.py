"""A throwaway PostgreSQL cluster of the fault suite's own, to restart, stop and crash.

Never the machine's shared server: initdb makes a new cluster in a temporary directory,
on a free port, from the PostgreSQL binaries of the system (QUEEN_FAULTS_PGBIN, else the
newest /usr/lib/postgresql/*/bin). As root it runs as the `postgres` user (PostgreSQL
refuses root).
"""

from __future__ import annotations

import contextlib
import glob
import os
import pwd
import shutil
import subprocess
import tempfile
import time
from pathlib import Path

import psycopg

from tests.conftest import free_port


def pg_bin() -> Path | None:
    """Return the directory of initdb and pg_ctl, or None when there is none."""
    given = os.environ.get("QUEEN_FAULTS_PGBIN")
    candidates = [given] if given else sorted(glob.glob("/usr/lib/postgresql/*/bin"))
    for candidate in reversed(candidates):
        if candidate and (Path(candidate) / "initdb").exists():
            return Path(candidate)
    return None


class Cluster:
    """initdb, start, stop (fast), crash (immediate stop: crash recovery at the next start)."""

    def __init__(self, bindir: Path) -> None:
        self.bindir = bindir
        self.port = free_port()
        self.root = Path(tempfile.mkdtemp(prefix="queen-faults-pg-"))
        self.data = self.root / "data"
        self.log = self.root / "postgres.log"
        self.dsn = f"postgresql://postgres@127.0.0.1:{self.port}/postgres"
        self._user = "postgres" if os.geteuid() == 0 else None
        if self._user:
            entry = pwd.getpwnam(self._user)
            os.chown(self.root, entry.pw_uid, entry.pw_gid)
            os.chmod(self.root, 0o700)

    def _run(self, *args: str, check: bool = True) -> subprocess.CompletedProcess[bytes]:
        command = [str(self.bindir / args[0]), *args[1:]]
        if self._user:
            command = ["runuser", "-u", self._user, "--", *command]
        return subprocess.run(command, check=check, capture_output=True, timeout=120)

    def init(self) -> Cluster:
        self._run("initdb", "-D", str(self.data), "-U", "postgres", "--auth=trust", "-E", "UTF8")
        return self

    def start(self) -> None:
        options = (
            f"-p {self.port} -c listen_addresses=127.0.0.1 -k {self.root}"
            " -c max_connections=200 -c fsync=on"
        )
        self._run("pg_ctl", "-D", str(self.data), "-l", str(self.log), "-o", options, "-w", "start")
        self.wait_ready()

    def wait_ready(self, timeout: float = 60) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            with (
                contextlib.suppress(psycopg.OperationalError),
                psycopg.connect(self.dsn, connect_timeout=2),
            ):
                return
            time.sleep(0.1)
        raise RuntimeError(f"the fault cluster did not start; see {self.log}")

    def stop(self, mode: str = "fast") -> None:
        self._run("pg_ctl", "-D", str(self.data), "-m", mode, "-w", "stop", check=False)

    def crash(self) -> None:
        """Stop as a crash does: no checkpoint; the next start recovers from the WAL."""
        self.stop("immediate")

    def restart(self) -> None:
        """Stop (fast) and start again at once, as `pg_ctl restart` does (with our log)."""
        self.stop("fast")
        self.start()

    def dsn_for(self, dbname: str, port: int | None = None) -> str:
        return f"postgresql://postgres@127.0.0.1:{port or self.port}/{dbname}"

    def destroy(self) -> None:
        self.stop("immediate")
        shutil.rmtree(self.root, ignore_errors=True)
