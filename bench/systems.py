"""The systems under test: bench databases on one PostgreSQL server, Queen's processes, peers."""

from __future__ import annotations

import contextlib
import http.client
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import psycopg
from psycopg import sql

from bench import procstat

ROOT = Path(__file__).resolve().parents[1]
BENCH_DIR = ROOT / "bench"


def dsn_for(server_dsn: str, dbname: str) -> str:
    return psycopg.conninfo.make_conninfo(server_dsn, dbname=dbname)


def fresh_database(server_dsn: str, name: str) -> str:
    """Drop and create database `name`; return its DSN."""
    with psycopg.connect(server_dsn, autocommit=True) as conn:
        conn.execute(
            sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name))
        )
        conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
        # Per-function call counts and times for the profile (no server restart needed;
        # superuser only, so skipped where the role cannot).
        with contextlib.suppress(psycopg.errors.InsufficientPrivilege):
            conn.execute(
                sql.SQL("ALTER DATABASE {} SET track_functions = 'pl'").format(sql.Identifier(name))
            )
    return dsn_for(server_dsn, name)


def dsn_url(dsn: str) -> str:
    """Return dsn as a postgresql:// URL (for clients that only take URLs, like node-postgres)."""
    from urllib.parse import quote

    params = psycopg.conninfo.conninfo_to_dict(dsn)
    user = quote(str(params.get("user", "postgres")))
    password = params.get("password")
    auth = f"{user}:{quote(str(password))}" if password else user
    host = str(params.get("host", "127.0.0.1"))
    port = params.get("port", "5432")
    db = quote(str(params.get("dbname", "postgres")))
    if host.startswith("/"):
        return f"postgresql://{auth}@/{db}?host={quote(host)}&port={port}"
    return f"postgresql://{auth}@{host}:{port}/{db}"


def drop_database(server_dsn: str, name: str) -> None:
    with psycopg.connect(server_dsn, autocommit=True) as conn:
        conn.execute(
            sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name))
        )


def backend_pids(dsn: str) -> list[int]:
    """Return the pids of the server backends connected to the database of dsn."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        rows = conn.execute(
            "SELECT pid FROM pg_stat_activity WHERE datname = current_database()"
            " AND pid <> pg_backend_pid()"
        ).fetchall()
    return [r[0] for r in rows]


def background_pids(dsn: str) -> list[int]:
    """Return the pids of PostgreSQL's own processes (WAL writer, checkpointer, autovacuum…)."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        rows = conn.execute(
            "SELECT pid FROM pg_stat_activity WHERE backend_type <> 'client backend'"
        ).fetchall()
    return [r[0] for r in rows]


def server_facts(server_dsn: str) -> dict[str, str]:
    """Return the PostgreSQL settings that decide queue throughput."""
    names = [
        "server_version",
        "shared_buffers",
        "synchronous_commit",
        "fsync",
        "autovacuum",
        "wal_level",
        "max_connections",
        "commit_delay",
        "work_mem",
        "effective_io_concurrency",
    ]
    with psycopg.connect(server_dsn, autocommit=True) as conn:
        return {
            n: conn.execute(sql.SQL("SHOW {}").format(sql.Identifier(n))).fetchone()[0]
            for n in names
        }  # type: ignore[index]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class QueenServer:
    """gunicorn -c gunicorn.conf.py (plus the maintenance process when there is one)."""

    def __init__(
        self,
        dsn: str,
        workers: int = 2,
        maintenance: bool = True,
        extra_env: dict[str, str] | None = None,
    ) -> None:
        self.dsn = dsn
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.env = {
            **os.environ,
            "DATABASE_URL": dsn,
            "HOST": "127.0.0.1",
            "PORT": str(self.port),
            "QUEEN_WORKERS": str(workers),
            "LOG_LEVEL": "warning",
            **(extra_env or {}),
        }
        self.maintenance = maintenance and (ROOT / "workers" / "maintenance.py").exists()
        self.procs: list[subprocess.Popen[bytes]] = []
        self.log_path = Path(tempfile.gettempdir()) / f"queen-bench-{self.port}.log"
        self.log = open(self.log_path, "wb")  # noqa: SIM115 - closed in stop()

    def start(self, timeout: float = 30.0) -> QueenServer:
        from queen.store.migrate import migrate

        migrate(self.dsn)
        self.gunicorn = subprocess.Popen(
            [sys.executable, "-m", "gunicorn", "-c", str(ROOT / "gunicorn.conf.py")],
            env=self.env,
            cwd=ROOT,
            stdout=self.log,
            stderr=self.log,
        )
        self.procs.append(self.gunicorn)
        if self.maintenance:
            self.procs.append(
                subprocess.Popen(
                    [sys.executable, "-m", "workers.maintenance"],
                    env=self.env,
                    cwd=ROOT,
                    stdout=self.log,
                    stderr=self.log,
                )
            )
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.gunicorn.poll() is not None:
                err = self.log_path.read_text(errors="replace")[-2000:]
                raise RuntimeError(f"gunicorn exited with {self.gunicorn.returncode}: {err}")
            if self._healthy() and len(self.worker_pids()) >= int(self.env["QUEEN_WORKERS"]):
                return self
            time.sleep(0.1)
        self.stop()
        raise RuntimeError("Queen did not become healthy in time")

    def _healthy(self) -> bool:
        with contextlib.suppress(OSError, http.client.HTTPException):
            conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=2)
            conn.request("GET", "/health")
            ok = conn.getresponse().status == 200
            conn.close()
            return ok
        return False

    def worker_pids(self) -> list[int]:
        return procstat.children(self.gunicorn.pid)

    def pids(self) -> list[int]:
        """gunicorn master, its workers and the maintenance process."""
        return [p.pid for p in self.procs] + self.worker_pids()

    def rss(self) -> dict[str, int]:
        """Return resident memory (bytes) of the master and of each worker."""
        out = {"master": procstat.rss_bytes(self.gunicorn.pid)}
        for i, pid in enumerate(self.worker_pids()):
            out[f"worker{i}"] = procstat.rss_bytes(pid)
        return out

    def stop(self) -> None:
        for proc in self.procs:
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
        for proc in self.procs:
            try:
                proc.wait(15)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        self.log.close()


class QueenHosts:
    """Several Queen servers (each its own gunicorn master: hosts, as far as fusion and
    turns go) on one database, the maintenance process beside the first only; a client
    talks to the host of its index (bench.adapters)."""

    def __init__(self, servers: list[QueenServer]) -> None:
        self.servers = servers
        self.url = servers[0].url
        self.urls = [s.url for s in servers]
        self.env = servers[0].env
        self.maintenance = servers[0].maintenance

    @classmethod
    def start(
        cls, dsn: str, hosts: int, workers: int, extra_env: dict[str, str] | None = None
    ) -> QueenHosts:
        servers: list[QueenServer] = []
        try:
            for n in range(hosts):
                server = QueenServer(dsn, workers, maintenance=n == 0, extra_env=extra_env)
                servers.append(server)
                server.start()
        except BaseException:
            for server in servers:
                server.stop()
            raise
        return cls(servers)

    def pids(self) -> list[int]:
        return [pid for s in self.servers for pid in s.pids()]

    def rss(self) -> dict[str, int]:
        """Resident memory of the first host's master and workers (see QueenServer.rss)."""
        return self.servers[0].rss()

    def stop(self) -> None:
        for server in self.servers:
            server.stop()
