"""A throwaway PostgreSQL cluster: the bench's default-settings server, the fault suite's victim.

Never the machine's shared server: initdb makes a new cluster in a temporary directory,
on a free port, from the PostgreSQL binaries of the system (the directory an environment
variable names, else the newest /usr/lib/postgresql/*/bin). As root it runs as the
`postgres` user (PostgreSQL refuses root). Only what a client here needs differs from
initdb's defaults: it listens on 127.0.0.1 with trust auth, and allows max_connections
(initdb's default of 100 is too few for the bench's peers and the fault suite's stacks).
Everything else, autovacuum included, stays as PostgreSQL ships it.
"""

from __future__ import annotations

import argparse
import contextlib
import glob
import os
import pwd
import shutil
import subprocess
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import psycopg

from bench.systems import free_port


def pg_bin(variable: str = "QUEEN_PGBIN") -> Path | None:
    """Return the directory of initdb and pg_ctl (from $variable if set), or None."""
    given = os.environ.get(variable)
    candidates = [given] if given else sorted(glob.glob("/usr/lib/postgresql/*/bin"))
    for candidate in reversed(candidates):
        if candidate and (Path(candidate) / "initdb").exists():
            return Path(candidate)
    return None


class Cluster:
    """initdb, start, stop (fast), crash (immediate stop: crash recovery at the next start)."""

    def __init__(
        self,
        bindir: Path,
        prefix: str = "queen-pg-",
        max_connections: int = 200,
        preload: str = "",
    ) -> None:
        self.bindir = bindir
        self.preload = preload  # shared_preload_libraries (bench.profile: pg_stat_statements)
        self.port = free_port()
        self.max_connections = max_connections
        self.root = Path(tempfile.mkdtemp(prefix=prefix))
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
            f" -c max_connections={self.max_connections}"
        )
        if self.preload:
            options += f" -c shared_preload_libraries={self.preload}"
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
        raise RuntimeError(f"the throwaway cluster did not start; see {self.log}")

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


@contextlib.contextmanager
def bench_cluster(preload: str = "") -> Iterator[Cluster]:
    """A started cluster with default settings for one bench run; stopped and removed after."""
    bindir = pg_bin()
    if bindir is None:
        raise RuntimeError(
            "no PostgreSQL binaries for a cluster of the bench's own"
            " (/usr/lib/postgresql/*/bin, or QUEEN_PGBIN)"
        )
    cluster = Cluster(bindir, prefix="queen-bench-pg-", preload=preload).init()
    try:
        cluster.start()
        yield cluster
    finally:
        cluster.destroy()


def add_argument(parser: argparse.ArgumentParser) -> None:
    """The --cluster flag of a bench script that creates its databases on a server."""
    parser.add_argument(
        "--cluster",
        action="store_true",
        help="run on a throwaway PostgreSQL cluster with default settings (autovacuum on), "
        "started for this run and removed at the end",
    )


def server_dsn(given: str, own: bool, stack: contextlib.ExitStack, preload: str = "") -> str:
    """The server DSN a bench script uses: given, or (own) a cluster the stack owns."""
    return stack.enter_context(bench_cluster(preload)).dsn if own else given


def origin(server_dsn: str, own: bool) -> str:
    """Which server this is, in the words of a results header."""
    if own:
        return "cluster started by the bench, default settings"
    return f"existing server at {server_dsn.rsplit('@', 1)[-1]}"


def describe(server_dsn: str, own: bool) -> str:
    """One line for a report: the PostgreSQL that ran, where from, autovacuum on or off."""
    with psycopg.connect(server_dsn, autocommit=True) as conn:
        row = conn.execute(
            "SELECT current_setting('server_version'), current_setting('autovacuum')"
        ).fetchone()
    version, autovacuum = row if row else ("?", "?")
    return f"PostgreSQL {version} ({origin(server_dsn, own)}; autovacuum {autovacuum})"
