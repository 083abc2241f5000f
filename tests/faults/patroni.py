"""A two-node Patroni cluster behind HAProxy, on loopback, for the HA fault tests.

Everything runs from a temporary directory on free high ports:

- one etcd 3.4 member, Patroni's DCS, reached through its v2 API (`--enable-v2`, the
  `etcd` section). Not the v3 API: Patroni 3.0.2 (Debian 12's) renews the leader key on
  etcd3 with an unconditional put once its lease has expired, so a leader paused past
  the TTL takes the key back from the node promoted meanwhile when it resumes; the new
  leader demotes itself and pg_rewind discards what it committed (seen here: about 1,200
  messages acknowledged, delivered and acked, gone). Patroni 3.0.3 fixed it (patroni PR
  #2689). On the v2 API the renewal is a compare-and-swap on the key's value
  (QUEEN_FAULTS_HA_DCS=etcd3 selects the v3 API, to check a newer Patroni);
- two Patroni 3.0 nodes, each with its PostgreSQL (the system's binaries, bench.cluster's
  pg_bin), bootstrapped as a primary and a streaming standby. Synchronous mode (default)
  makes the standby the synchronous one, so a commit answered to a client is on both;
  `synchronous=False` keeps the standby asynchronous. ttl 10 s, loop_wait 2 s,
  retry_timeout 5 s. primary_start_timeout 0: a primary whose PostgreSQL dies fails over
  to the standby when it can, rather than restarting in place (a dead primary host);
- HAProxy in TCP mode routing to whichever node answers Patroni's `GET /primary` with 200
  (checked every 0.5 s, down after 2 failures, up after 1 success), with
  `on-marked-down shutdown-sessions`: the sessions to a node marked down are cut, so no
  client keeps talking to a demoted or frozen primary.

As root, Patroni (and so PostgreSQL, which refuses root) runs as the `postgres` user,
the way bench.cluster.Cluster runs initdb and pg_ctl; the temporary directory is handed
to that user. etcd and HAProxy run as whoever runs the tests.

Faults: `kill_postmaster` (SIGKILL of the leader's postmaster only; its Patroni lives and,
primary_start_timeout being 0, hands over), `switchover` (REST POST /switchover), and
`freeze`/`thaw`. A freeze sends SIGSTOP to the node's Patroni and to every process under
it (the postmaster, its backends, walsender): the whole node stops answering, as a primary
whose network is frozen does, seen from the rest. Its leader key is not renewed, expires
after ttl, and the standby takes over; HAProxy sees the health check time out, marks the
node down and cuts its sessions. Unlike a network partition, the frozen Patroni cannot
demote its own PostgreSQL meanwhile and resumes believing it leads (a paused VM, a stalled
host): the harder case. `thaw` sends SIGCONT; the old Patroni then finds another leader
and demotes its PostgreSQL (rejoining with pg_rewind when it needs to).
"""

from __future__ import annotations

import contextlib
import json
import os
import pwd
import shutil
import signal
import subprocess
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import psycopg
import pytest
import requests

from bench.cluster import pg_bin
from bench.systems import free_port

SCOPE = "queen-ha"
TTL_S = 10
LOOP_WAIT_S = 2
RETRY_TIMEOUT_S = 5
# Patroni's DCS section: "etcd" (the v2 API, the default; see the module docstring), or
# QUEEN_FAULTS_HA_DCS=etcd3 to reproduce the etcd3 leader-key race of Patroni < 3.0.3.
DCS = os.environ.get("QUEEN_FAULTS_HA_DCS", "etcd")


def missing_binaries() -> list[str]:
    """Name what the harness needs and this machine lacks."""
    missing = [name for name in ("patroni", "etcd") if shutil.which(name) is None]
    if shutil.which("haproxy") is None and not Path("/usr/sbin/haproxy").exists():
        missing.append("haproxy")
    if pg_bin("QUEEN_FAULTS_PGBIN") is None:
        missing.append("PostgreSQL binaries (QUEEN_FAULTS_PGBIN)")
    return missing


def require_binaries() -> None:
    """pytest.skip, saying what is missing, unless patroni, etcd and haproxy are here."""
    missing = missing_binaries()
    if missing:
        pytest.skip(
            "HA fault tests need " + ", ".join(missing)
            + " (Debian: apt-get install patroni etcd-server haproxy)"
        )


def _descendants(pid: int) -> list[int]:
    """pid's children, grandchildren, ... (from /proc), parents before children."""
    found: list[int] = []
    todo = [pid]
    while todo:
        parent = todo.pop()
        with contextlib.suppress(OSError):
            for task in Path(f"/proc/{parent}/task").iterdir():
                children = (task / "children").read_text().split()
                found.extend(int(c) for c in children)
                todo.extend(int(c) for c in children)
    return found


class Node:
    """One Patroni node and its PostgreSQL."""

    def __init__(self, root: Path, name: str, etcd_port: int, bindir: Path,
                 synchronous: bool, user: str | None) -> None:
        self.name = name
        self.dir = root / name
        self.dir.mkdir()
        self.data = self.dir / "data"
        self.pg_port = free_port()
        self.rest_port = free_port()
        self.rest = f"http://127.0.0.1:{self.rest_port}"
        self.dsn = f"postgresql://postgres@127.0.0.1:{self.pg_port}/postgres"
        self.log_path = self.dir / "patroni.log"
        self.config = self.dir / "patroni.yml"
        self.user = user
        self.proc: subprocess.Popen[bytes] | None = None
        self.config.write_text(json.dumps(self._config(etcd_port, bindir, synchronous), indent=1))
        if user:
            entry = pwd.getpwnam(user)
            for path in (self.dir, self.config):
                os.chown(path, entry.pw_uid, entry.pw_gid)
            os.chmod(self.dir, 0o700)

    def _config(self, etcd_port: int, bindir: Path, synchronous: bool) -> dict[str, Any]:
        hba = ["local all all trust", "host all all 127.0.0.1/32 trust",
               "host replication all 127.0.0.1/32 trust"]
        return {  # JSON is YAML
            "scope": SCOPE,
            "name": self.name,
            "log": {"level": "INFO"},
            "restapi": {"listen": f"127.0.0.1:{self.rest_port}",
                        "connect_address": f"127.0.0.1:{self.rest_port}"},
            DCS: {"hosts": f"127.0.0.1:{etcd_port}"},  # the v2 API: see the docstring
            "bootstrap": {
                "dcs": {
                    "ttl": TTL_S,
                    "loop_wait": LOOP_WAIT_S,
                    "retry_timeout": RETRY_TIMEOUT_S,
                    "maximum_lag_on_failover": 1048576,
                    "synchronous_mode": synchronous,
                    "primary_start_timeout": 0,
                    "postgresql": {
                        "use_pg_rewind": True,
                        "use_slots": True,
                        "parameters": {
                            "max_connections": 200,
                            "wal_level": "replica",
                            "wal_log_hints": "on",
                            "hot_standby": "on",
                            "max_wal_senders": 10,
                            "max_replication_slots": 10,
                            "wal_keep_size": "256MB",
                        },
                    },
                },
                "initdb": [{"encoding": "UTF8"}, {"auth": "trust"}],
            },
            "postgresql": {
                "listen": f"127.0.0.1:{self.pg_port}",
                "connect_address": f"127.0.0.1:{self.pg_port}",
                "data_dir": str(self.data),
                "bin_dir": str(bindir),
                "pgpass": str(self.dir / "pgpass"),
                "pg_hba": hba,
                "authentication": {
                    "superuser": {"username": "postgres", "password": "postgres"},
                    "replication": {"username": "replicator", "password": "replicator"},
                },
                "parameters": {"unix_socket_directories": str(self.dir)},
                "remove_data_directory_on_rewind_failure": True,
                "remove_data_directory_on_diverged_timelines": True,
            },
        }

    def start(self) -> None:
        env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": str(self.dir),
               "LANG": "C.UTF-8", "LC_ALL": "C.UTF-8"}
        kwargs: dict[str, Any] = {}
        if self.user:
            entry = pwd.getpwnam(self.user)
            kwargs = {"user": entry.pw_uid, "group": entry.pw_gid, "extra_groups": []}
        with open(self.log_path, "ab") as log:
            self.proc = subprocess.Popen(
                ["patroni", str(self.config)], cwd=self.dir, env=env, stdout=log,
                stderr=subprocess.STDOUT, start_new_session=True, **kwargs,
            )

    def status(self, timeout: float = 1.0) -> dict[str, Any] | None:
        """GET /patroni, or None when the node does not answer."""
        try:
            r = requests.get(f"{self.rest}/patroni", timeout=timeout)
            return dict(r.json())
        except (requests.RequestException, ValueError):
            return None

    def is_primary(self, timeout: float = 1.0) -> bool:
        """Patroni's own answer to HAProxy's question: GET /primary is 200."""
        try:
            return requests.get(f"{self.rest}/primary", timeout=timeout).status_code == 200
        except requests.RequestException:
            return False

    def postmaster_pid(self) -> int | None:
        with contextlib.suppress(OSError, ValueError, IndexError):
            return int((self.data / "postmaster.pid").read_text().split()[0])
        return None

    def processes(self) -> list[int]:
        """Patroni's pid and every process under it (PostgreSQL's included)."""
        assert self.proc is not None
        return [self.proc.pid, *_descendants(self.proc.pid)]

    def signal_all(self, sig: int) -> int:
        """Send sig to Patroni and all under it; return how many processes got it."""
        sent = 0
        for pid in self.processes():
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, sig)
                sent += 1
        return sent

    def stop(self) -> None:
        if self.proc is None or self.proc.poll() is not None:
            return
        with contextlib.suppress(ProcessLookupError):
            self.signal_all(signal.SIGCONT)
        self.proc.terminate()  # Patroni stops its PostgreSQL (fast), then exits
        try:
            self.proc.wait(30)
        except subprocess.TimeoutExpired:
            self.signal_all(signal.SIGKILL)
            self.proc.wait(10)
        pid = self.postmaster_pid()
        if pid:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)


class PatroniCluster:
    """etcd + two Patroni nodes + HAProxy; see the module docstring."""

    def __init__(self, synchronous: bool = True) -> None:
        require_binaries()
        bindir = pg_bin("QUEEN_FAULTS_PGBIN")
        assert bindir is not None
        self.synchronous = synchronous
        self.root = Path(tempfile.mkdtemp(prefix="queen-faults-ha-"))
        user = "postgres" if os.geteuid() == 0 else None
        if user:  # the nodes' directories are the postgres user's; it must traverse root
            os.chmod(self.root, 0o711)
        self.etcd_port, self.etcd_peer_port = free_port(), free_port()
        self.nodes = [
            Node(self.root, f"node{n}", self.etcd_port, bindir, synchronous, user)
            for n in range(2)
        ]
        self.haproxy_port = free_port()
        self.etcd: subprocess.Popen[bytes] | None = None
        self.haproxy: subprocess.Popen[bytes] | None = None
        self.frozen: Node | None = None

    # -- start and stop ------------------------------------------------------------

    def start(self, timeout: float = 120) -> PatroniCluster:
        try:
            self._start_etcd()
            self.nodes[0].start()
            self.wait_for_leader(timeout)  # node0 bootstraps; node1 then clones it
            self.nodes[1].start()
            self._start_haproxy()
            self.wait_healthy(timeout)
            self.wait_writable(timeout)
        except BaseException:
            self.stop()
            raise
        return self

    def _start_etcd(self) -> None:
        peer = f"http://127.0.0.1:{self.etcd_peer_port}"
        client = f"http://127.0.0.1:{self.etcd_port}"
        with open(self.root / "etcd.log", "ab") as log:
            self.etcd = subprocess.Popen(
                ["etcd", "--name", "etcd0", "--data-dir", str(self.root / "etcd"),
                 "--listen-client-urls", client, "--advertise-client-urls", client,
                 "--listen-peer-urls", peer, "--initial-advertise-peer-urls", peer,
                 "--initial-cluster", f"etcd0={peer}", "--initial-cluster-state", "new",
                 "--enable-v2=true"],
                stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
            )
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            with contextlib.suppress(requests.RequestException):
                if requests.get(f"{client}/health", timeout=1).status_code == 200:
                    return
            assert self.etcd.poll() is None, f"etcd exited; see {self.root / 'etcd.log'}"
            time.sleep(0.2)
        raise RuntimeError(f"etcd did not start; see {self.root / 'etcd.log'}")

    def _start_haproxy(self) -> None:
        servers = "\n".join(
            f"    server {n.name} 127.0.0.1:{n.pg_port} check port {n.rest_port}"
            for n in self.nodes
        )
        config = self.root / "haproxy.cfg"
        config.write_text(f"""global
    maxconn 2000
    log stdout format iso local0

defaults
    mode tcp
    log global
    option log-health-checks
    # A refused connect (the old primary stopping, not yet marked down) is retried on
    # the other node rather than 3 times on the same one, a second apart.
    retries 2
    option redispatch 1
    timeout connect 2s
    timeout client 30m
    timeout server 30m
    timeout check 1s

listen postgres
    bind 127.0.0.1:{self.haproxy_port}
    option httpchk GET /primary
    http-check expect status 200
    default-server inter 500ms fastinter 500ms downinter 500ms fall 2 rise 1 on-marked-down shutdown-sessions
{servers}
""")
        binary = shutil.which("haproxy") or "/usr/sbin/haproxy"
        with open(self.root / "haproxy.log", "ab") as log:
            self.haproxy = subprocess.Popen(
                [binary, "-db", "-f", str(config)], stdout=log, stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        time.sleep(0.5)
        assert self.haproxy.poll() is None, f"haproxy exited; see {self.root / 'haproxy.log'}"

    def stop(self) -> None:
        if self.frozen is not None:
            self.thaw()
        for node in self.nodes:
            with contextlib.suppress(Exception):
                node.stop()
        for proc in (self.haproxy, self.etcd):
            if proc is not None and proc.poll() is None:
                proc.terminate()
                try:
                    proc.wait(10)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    proc.wait()

    def destroy(self) -> None:
        """Stop everything and remove the directory (kept, logs and all, when
        QUEEN_FAULTS_KEEP_HA=1)."""
        self.stop()
        if os.environ.get("QUEEN_FAULTS_KEEP_HA") == "1":
            print(f"\nHA cluster directory kept: {self.root}")
            return
        shutil.rmtree(self.root, ignore_errors=True)

    # -- state ---------------------------------------------------------------------

    @property
    def dsn(self) -> str:
        """The postgres database through HAProxy (the leader's, whichever node it is)."""
        return self.dsn_for("postgres")

    def dsn_for(self, dbname: str) -> str:
        return f"postgresql://postgres@127.0.0.1:{self.haproxy_port}/{dbname}"

    def node(self, name: str) -> Node:
        return next(n for n in self.nodes if n.name == name)

    def leader(self) -> str | None:
        """The leader's name, as the DCS (through any node that answers) has it."""
        for node in self.nodes:
            if node is self.frozen:
                continue
            with contextlib.suppress(requests.RequestException, ValueError):
                members = requests.get(f"{node.rest}/cluster", timeout=1).json()["members"]
                for m in members:
                    if m.get("role") == "leader":
                        return str(m["name"])
        return None

    def primary(self) -> Node | None:
        """The node whose Patroni answers GET /primary with 200 (where HAProxy routes)."""
        for node in self.nodes:
            if node is not self.frozen and node.is_primary():
                return node
        return None

    def wait_for_leader(self, timeout: float = 60, other_than: str | None = None) -> Node:
        """Wait until a node (not other_than) is primary by GET /primary; return it."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            for node in self.nodes:
                if node.name != other_than and node is not self.frozen and node.is_primary(0.5):
                    return node
            time.sleep(0.1)
        raise AssertionError(f"no leader {'but ' + other_than if other_than else ''}"
                             f" within {timeout} s; logs in {self.root}")

    def members(self) -> list[dict[str, Any]]:
        for node in self.nodes:
            if node is self.frozen:
                continue
            with contextlib.suppress(requests.RequestException, ValueError):
                return list(requests.get(f"{node.rest}/cluster", timeout=1).json()["members"])
        return []

    def healthy(self) -> bool:
        """A leader, and the other node running and replicating (sync_standby in
        synchronous mode)."""
        members = self.members()
        roles = sorted(str(m.get("role")) for m in members)
        running = all(m.get("state") in ("running", "streaming") for m in members)
        want = ["leader", "sync_standby" if self.synchronous else "replica"]
        return running and roles == want

    def wait_healthy(self, timeout: float = 90) -> None:
        deadline = time.monotonic() + timeout
        while not self.healthy():
            if time.monotonic() > deadline:
                raise AssertionError(f"cluster not healthy: {self.members()}; logs in {self.root}")
            time.sleep(0.2)

    def wait_writable(self, timeout: float = 60) -> None:
        """Wait until a write through HAProxy commits."""
        deadline = time.monotonic() + timeout
        while True:
            try:
                with psycopg.connect(self.dsn, connect_timeout=2, autocommit=True) as conn:
                    conn.execute("SELECT txid_current()")
                    return
            except psycopg.Error:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.2)

    # -- faults --------------------------------------------------------------------

    def kill_postmaster(self) -> Node:
        """SIGKILL the leader's postmaster (only it); return the node."""
        node = self.wait_for_leader(5)
        pid = node.postmaster_pid()
        assert pid is not None, "no postmaster.pid on the leader"
        os.kill(pid, signal.SIGKILL)
        return node

    def switchover(self, timeout: float = 60) -> tuple[str, str]:
        """Planned switchover from the leader to the other node; return (old, new)."""
        old = self.wait_for_leader(5)
        new = next(n for n in self.nodes if n is not old)
        r = requests.post(f"{old.rest}/switchover", json={"leader": old.name,
                          "candidate": new.name}, timeout=timeout)
        assert r.status_code == 200, (r.status_code, r.text)
        return old.name, new.name

    def freeze(self) -> Node:
        """SIGSTOP the leader's Patroni, postmaster and every backend; return the node."""
        node = self.wait_for_leader(5)
        assert self.frozen is None
        self.frozen = node
        for _ in range(3):  # again, for anything forked while the first pass ran
            node.signal_all(signal.SIGSTOP)
        return node

    def thaw(self) -> None:
        """SIGCONT to everything the freeze stopped."""
        node, self.frozen = self.frozen, None
        if node is not None:
            node.signal_all(signal.SIGCONT)


class PromotionWatch:
    """Polls every node's GET /primary (a thread per node, every 0.1 s) and records when
    each first answers 200 after the watch starts: promotions, timed in monotonic
    seconds, without waiting on a frozen node."""

    def __init__(self, cluster: PatroniCluster) -> None:
        self.cluster = cluster
        self.primary_since: dict[str, float] = {}
        self.was_primary: dict[str, bool] = {}
        self._stop = threading.Event()
        self._threads = [threading.Thread(target=self._poll, args=(n,), daemon=True)
                         for n in cluster.nodes]

    def __enter__(self) -> PromotionWatch:
        for node in self.cluster.nodes:
            self.was_primary[node.name] = node.is_primary()
        for t in self._threads:
            t.start()
        return self

    def __exit__(self, *_: object) -> None:
        self._stop.set()
        for t in self._threads:
            t.join(5)

    def _poll(self, node: Node) -> None:
        while not self._stop.is_set():
            started = time.monotonic()
            if node.is_primary(0.5):
                if not self.was_primary[node.name] and node.name not in self.primary_since:
                    self.primary_since[node.name] = started
            else:
                self.was_primary[node.name] = False  # a later 200 counts as a promotion
            self._stop.wait(max(0.0, 0.1 - (time.monotonic() - started)))

    def promoted(self, name: str, timeout: float = 60) -> float:
        """Wait for the promotion of node name; return its monotonic time."""
        deadline = time.monotonic() + timeout
        while name not in self.primary_since:
            assert time.monotonic() < deadline, f"{name} was not promoted within {timeout} s"
            time.sleep(0.05)
        return self.primary_since[name]
