"""PostgreSQL as the bottleneck: the bench's cluster under a CPU quota, and what each
message costs it.

A cgroup (v1: the cpu and cpuacct hierarchies; v2: the unified one) holds every process
of the bench's own cluster, with `cpu.cfs_quota_us` / `cpu.max` set to a share of one core;
backends forked later inherit it. The server and the load generators stay outside, so the
quota, not the request tier, bounds the rates. Root is needed to make the group; where it
cannot be made the phase is skipped with the reason (`unavailable`).

`PgMeter` reads, at a window's edges: the group's CPU time, and each of its processes'
by role (`by_role`), the cluster's commits and tuples fetched (pg_stat_database), its
statements (pg_stat_statements, when preloaded) and the group's throttled periods. Backends report their database counters at most once a second,
so over a window of several seconds those two are good to a few percent; CPU time,
statements and WAL (the runner's own meter) are exact.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import psycopg

CGROUP_ROOT = Path("/sys/fs/cgroup")
DEFAULT_PERIOD_US = 20_000


def _v2(root: Path) -> bool:
    controllers = root / "cgroup.controllers"
    return controllers.exists() and "cpu" in controllers.read_text().split()


def unavailable(root: Path = CGROUP_ROOT) -> str:
    """Why no CPU quota can be set here ('' when one can)."""
    if os.geteuid() != 0:
        return "a CPU quota needs root (a cgroup of the cluster's processes)"
    if _v2(root):
        return ""
    if (root / "cpu" / "cpu.cfs_quota_us").exists() and (root / "cpuacct" / "cpuacct.usage").exists():
        return ""
    return f"no cgroup cpu controller under {root}"


class CpuQuota:
    """A cgroup holding processes to `cpus` cores (per period_us), and its CPU time."""

    def __init__(
        self, cpus: float, period_us: int = DEFAULT_PERIOD_US, root: Path = CGROUP_ROOT,
        name: str | None = None,
    ) -> None:
        if cpus <= 0:
            raise ValueError("cpus must be positive")
        reason = unavailable(root)
        if reason:
            raise RuntimeError(reason)
        self.cpus = cpus
        self.period_us = period_us
        self.quota_us = max(1000, int(cpus * period_us))
        self.name = name or f"queen-bench-pg-{os.getpid()}"
        self.v2 = _v2(root)
        self.root = root
        if self.v2:
            self.dirs = [root / self.name]
        else:
            self.dirs = [root / "cpu" / self.name, root / "cpuacct" / self.name]
        for directory in self.dirs:
            directory.mkdir(exist_ok=True)
        if self.v2:
            (self.dirs[0] / "cpu.max").write_text(f"{self.quota_us} {self.period_us}")
        else:
            (self.dirs[0] / "cpu.cfs_period_us").write_text(str(self.period_us))
            (self.dirs[0] / "cpu.cfs_quota_us").write_text(str(self.quota_us))

    def add(self, pids: list[int]) -> None:
        """Move processes into the group (their children forked later stay in it)."""
        for pid in pids:
            for directory in self.dirs:
                try:
                    (directory / "cgroup.procs").write_text(str(pid))
                except ProcessLookupError:
                    break  # gone meanwhile (a backend that exited)

    def pids(self) -> list[int]:
        text = (self.dirs[0] / "cgroup.procs").read_text()
        return [int(p) for p in text.split()]

    def usage_s(self) -> float:
        """CPU seconds the group's processes used since it was made."""
        if self.v2:
            for line in (self.dirs[0] / "cpu.stat").read_text().splitlines():
                key, value = line.split()
                if key == "usage_usec":
                    return int(value) / 1e6
            return 0.0
        return int((self.dirs[1] / "cpuacct.usage").read_text()) / 1e9

    def throttled(self) -> tuple[int, int]:
        """(periods, periods in which the group was throttled) since it was made."""
        stat = dict(
            line.split() for line in (self.dirs[0] / "cpu.stat").read_text().splitlines()
        )
        return int(stat.get("nr_periods", 0)), int(stat.get("nr_throttled", 0))

    def remove(self) -> None:
        """Move what is left to the parent group and delete the group."""
        for directory in self.dirs:
            parent = directory.parent / "cgroup.procs"
            for pid in (directory / "cgroup.procs").read_text().split():
                try:
                    parent.write_text(pid)
                except (ProcessLookupError, OSError):
                    continue
        for directory in self.dirs:
            try:
                directory.rmdir()
            except OSError:
                continue


def cluster_pids(data_dir: Path) -> list[int]:
    """The postmaster of a cluster (postmaster.pid) and its children."""
    postmaster = int((data_dir / "postmaster.pid").read_text().split()[0])
    pids = [postmaster]
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        ppid = int(stat.rsplit(")", 1)[1].split()[1])
        if ppid == postmaster:
            pids.append(int(entry.name))
    return pids


COUNTERS = """
SELECT coalesce(sum(xact_commit), 0)::bigint, coalesce(sum(tup_fetched), 0)::bigint,
       coalesce(sum(tup_returned), 0)::bigint
FROM pg_stat_database
"""
STATEMENTS = "SELECT coalesce(sum(calls), 0)::bigint FROM pg_stat_statements"
# Top-level statements (pg_stat_statements.track = top): a function call's time includes
# what it runs, so each of Queen's entry points is one line.
BY_STATEMENT = """
SELECT queryid, calls, total_exec_time, shared_blks_hit + shared_blks_read, rows,
       left(regexp_replace(regexp_replace(query, '^(\\s*--[^\\n]*\\n)+', ''), '\\s+', ' ', 'g'), 200)
FROM pg_stat_statements WHERE queryid IS NOT NULL
"""
# Tuples read per table, in the bench's databases: index fetches under the table's name,
# sequential reads under its name and "seq" (a scan reads every live row of the table).
BY_TABLE = """
SELECT schemaname || '.' || relname, coalesce(idx_tup_fetch, 0) FROM pg_stat_user_tables
UNION ALL
SELECT schemaname || '.' || relname || ' seq', coalesce(seq_tup_read, 0) FROM pg_stat_user_tables
"""
TOP_STATEMENTS = 6
# What each of the cluster's processes is: a client backend by its application name (Queen's
# pool "queen", its listener, its maintenance; the bench's own meter), any other by its type.
ROLES = """
SELECT pid, CASE WHEN backend_type <> 'client backend' THEN backend_type
                 WHEN application_name LIKE 'queen-maintenance%' THEN 'queen-maintenance'
                 ELSE coalesce(nullif(application_name, ''), 'client') END
FROM pg_stat_activity
"""
METER_NAME = "bench-meter"
EXITED = "exited"


def backend_ns(pid: int) -> int | None:
    """CPU time a process has used (ns, /proc/<pid>/schedstat); None once it is gone."""
    try:
        return int(Path(f"/proc/{pid}/schedstat").read_text().split()[0])
    except (OSError, IndexError, ValueError):
        return None


def by_role(before: dict[int, tuple[str, int]], after: dict[int, tuple[str, int]],
            total_s: float) -> dict[str, float]:
    """CPU seconds a role's processes used between two readings of (role, ns) by pid: a
    process first seen in the second counts whole (it started in the window); what the
    group used beyond the processes still there at the end went to those that exited."""
    spent: dict[str, float] = {}
    for pid, (role, ns) in after.items():
        start = before.get(pid, (role, 0))[1]
        spent[role] = spent.get(role, 0.0) + max(0, ns - start) / 1e9
    spent[EXITED] = max(0.0, total_s - sum(spent.values()))
    return spent


class PgMeter:
    """What the cluster did over a window: read() at each edge, then per_message(n)."""

    def __init__(self, dsn: str, quota: CpuQuota | None) -> None:
        self.conn = psycopg.connect(dsn, autocommit=True, application_name=METER_NAME)
        self.quota = quota
        self.statements = bool(
            self.conn.execute(
                "SELECT count(*) FROM pg_extension WHERE extname = 'pg_stat_statements'"
            ).fetchone()[0]  # type: ignore[index]
        )
        self.edges: list[dict[str, float]] = []
        self.statement_edges: list[dict[int, tuple[int, float, int, str]]] = []
        self.table_edges: list[dict[str, int]] = []
        self.process_edges: list[dict[int, tuple[str, int]]] = []
        # One connection per database, opened before the window: table statistics are
        # per database.
        names = [r[0] for r in self.conn.execute(
            "SELECT datname FROM pg_database WHERE datallowconn AND NOT datistemplate")]
        self.db_conns = {
            name: psycopg.connect(psycopg.conninfo.make_conninfo(dsn, dbname=name),
                                  autocommit=True, application_name=METER_NAME)
            for name in names
        }

    def read(self) -> None:
        row = self.conn.execute(COUNTERS).fetchone()
        assert row is not None
        edge: dict[str, float] = {
            "commits": row[0], "tuples_fetched": row[1], "tuples_returned": row[2],
        }
        if self.statements:
            (edge["statements"],) = self.conn.execute(STATEMENTS).fetchone() or (0,)
            self.statement_edges.append(
                {r[0]: tuple(r[1:]) for r in self.conn.execute(BY_STATEMENT)}
            )
        self.table_edges.append(self._tables())
        if self.quota is not None:
            self.process_edges.append(self._processes(self.quota.pids()))
            edge["cpu_s"] = self.quota.usage_s()
            edge["periods"], edge["throttled"] = self.quota.throttled()
        self.edges.append(edge)

    def result(self, seconds: float, messages: int) -> dict[str, Any]:
        """The window's totals per message (and the quota's use) for a results row."""
        if len(self.edges) != 2:
            return {}
        before, after = self.edges
        delta = {key: after[key] - before[key] for key in after}
        per = max(messages, 1)
        out: dict[str, Any] = {
            "pg_commits_per_msg": delta["commits"] / per,
            "pg_tuples_fetched_per_msg": delta["tuples_fetched"] / per,
            "pg_tuples_returned_per_msg": delta["tuples_returned"] / per,
        }
        if "statements" in delta:
            out["pg_statements_per_msg"] = delta["statements"] / per
        if "cpu_s" in delta:
            out["pg_cpu_us_per_msg"] = delta["cpu_s"] * 1e6 / per
            out["pg_cores"] = delta["cpu_s"] / seconds if seconds else 0.0
            periods = delta["periods"]
            out["pg_throttled_share"] = delta["throttled"] / periods if periods else 0.0
        if "cpu_s" in delta and len(self.process_edges) == 2:
            first, last = self.process_edges
            spent = by_role(first, last, delta["cpu_s"])
            out["pg_cpu_us_per_msg_by_role"] = {
                role: round(s * 1e6 / per, 1)
                for role, s in sorted(spent.items(), key=lambda kv: -kv[1])
            }
        if len(self.statement_edges) == 2:
            out["pg_top_statements"] = self._top(per)
        if len(self.table_edges) == 2:
            before_t, after_t = self.table_edges
            reads = {k: (v - before_t.get(k, 0)) / per for k, v in after_t.items()}
            out["pg_tuples_read_per_msg_by_table"] = {
                k: round(v, 2) for k, v in sorted(reads.items(), key=lambda kv: -kv[1]) if v > 0
            }
        return out

    def _processes(self, pids: list[int]) -> dict[int, tuple[str, int]]:
        """(role, CPU ns) of each of the group's processes now; the postmaster is not in
        pg_stat_activity."""
        roles = {int(pid): role for pid, role in self.conn.execute(ROLES)}
        found: dict[int, tuple[str, int]] = {}
        for pid in pids:
            ns = backend_ns(pid)
            if ns is not None:
                found[pid] = (roles.get(pid, "postmaster"), ns)
        return found

    def _tables(self) -> dict[str, int]:
        """Tuples read so far per table, of every database."""
        reads: dict[str, int] = {}
        for name, conn in self.db_conns.items():
            for table, count in conn.execute(BY_TABLE):
                reads[f"{name}:{table}"] = int(count)
        return reads

    def _top(self, messages: int) -> list[dict[str, Any]]:
        """The statements that took most of the window's execution time, per message."""
        before, after = self.statement_edges
        rows: list[dict[str, Any]] = []
        for queryid, (calls, ms, blocks, returned, text) in after.items():
            calls0, ms0, blocks0, returned0, _ = before.get(queryid, (0, 0.0, 0, 0, text))
            if calls > calls0:
                rows.append({
                    "query": text,
                    "calls_per_msg": (calls - calls0) / messages,
                    "exec_us_per_msg": (ms - ms0) * 1000 / messages,
                    "blocks_per_msg": (blocks - blocks0) / messages,
                    "rows_per_call": (returned - returned0) / (calls - calls0),
                })
        rows.sort(key=lambda r: -float(r["exec_us_per_msg"]))
        return rows[:TOP_STATEMENTS]

    def close(self) -> None:
        for conn in self.db_conns.values():
            conn.close()
        self.conn.close()
