"""Run one workload case: start driver processes, open the window together, meter CPU, merge."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
import time
from dataclasses import dataclass, field
from typing import Any

import psycopg

from bench import procstat
from bench.systems import BENCH_DIR, ROOT, backend_pids, background_pids

NODE_SYSTEMS = {"pgboss"}
ASYNC_SYSTEMS = {"pgqueuer"}


@dataclass
class Case:
    """One measured point: a system, a workload and its shape."""

    system: str
    workload: str  # push | e2e | fanout | latency | backlog
    batch: int = 1
    partitions: int = 1
    producers: int = 0
    consumers: int = 0
    processes: int = 1
    warmup: float = 1.0
    duration: float = 5.0
    extra: dict[str, Any] = field(default_factory=dict)
    phase: str = ""  # set for a phase whose push / e2e windows are kept apart (small)

    @property
    def label(self) -> str:
        parts = [self.system, self.workload, f"b{self.batch}"]
        if self.workload == "fanout":
            parts[1] = f"fanout-{self.extra['variant']}"
            parts.append(f"g{self.extra['groups']}")
        if self.workload in ("e2e", "fanout"):
            parts.append(f"p{self.partitions}")
        if self.phase:
            clients = f"c{self.producers}" + (f"+{self.consumers}" if self.consumers else "")
            parts.append(clients)
        return "/".join(parts)


def _split(total: int, parts: int, index: int) -> int:
    return total // parts + (1 if index < total % parts else 0)


def percentile(values: list[float], q: float) -> float:
    """Return the q-th percentile (0-100) by nearest rank; NaN when there is nothing."""
    if not values:
        return math.nan
    ordered = sorted(values)
    rank = max(0, min(len(ordered) - 1, math.ceil(q / 100 * len(ordered)) - 1))
    return ordered[rank]


def _command(system: str, spec: dict[str, Any]) -> list[str]:
    if system in NODE_SYSTEMS:
        return ["node", str(BENCH_DIR / "pgboss_driver.mjs"), json.dumps(spec)]
    module = "bench.pgqueuer_driver" if system in ASYNC_SYSTEMS else "bench.driver"
    return [sys.executable, "-m", module, json.dumps(spec)]


def _read_ready(proc: subprocess.Popen[str], deadline: float) -> None:
    assert proc.stdout is not None
    while True:
        line = proc.stdout.readline()
        if not line:
            err = proc.stderr.read() if proc.stderr else ""
            raise RuntimeError(f"driver exited before READY: {err[-1500:]}")
        if line.strip() == "READY":
            return
        if time.monotonic() > deadline:
            raise RuntimeError("driver did not become ready in time")


WAL_NOW = (
    "SELECT pg_wal_lsn_diff(pg_current_wal_insert_lsn(), '0/0')::bigint,"
    " (SELECT wal_bytes FROM pg_stat_wal)::bigint"
)
WAL_NOW_BEFORE_14 = (
    "SELECT pg_wal_lsn_diff(pg_current_wal_insert_lsn(), '0/0')::bigint, NULL::bigint"
)


class WalMeter:
    """The WAL the whole server wrote over a window, read at its edges.

    The bytes are the distance between the WAL insert positions (pg_current_wal_insert_lsn),
    exact at any moment. pg_stat_wal.wal_bytes (PostgreSQL 14+) counts the same bytes but
    each backend adds its share at most once a second, so over a window of a few seconds
    it is off by tens of percent; it is kept beside, as a check. Both count every
    database's WAL: exact for the bench only on a server nobody else writes to (--cluster).
    """

    def __init__(self, dsn: str | None) -> None:
        self.conn = psycopg.connect(dsn, autocommit=True) if dsn else None
        self.edges: list[tuple[int, int | None]] = []

    def read(self) -> None:
        if self.conn is None:
            return
        with_stat = self.conn.info.server_version >= 140000
        row = self.conn.execute(WAL_NOW if with_stat else WAL_NOW_BEFORE_14).fetchone()
        assert row is not None
        self.edges.append((int(row[0]), row[1]))

    def written(self) -> dict[str, int | None]:
        """wal_bytes over the window, and pg_stat_wal's count of it (None where unknown)."""
        if len(self.edges) != 2:
            return {"wal_bytes": None, "wal_bytes_pg_stat_wal": None}
        (lsn0, stat0), (lsn1, stat1) = self.edges
        stat = stat1 - stat0 if stat0 is not None and stat1 is not None else None
        return {"wal_bytes": lsn1 - lsn0, "wal_bytes_pg_stat_wal": stat}

    def close(self) -> None:
        if self.conn is not None:
            self.conn.close()


def run_case(
    case: Case, target: dict[str, Any], server_pids: list[int], pg: Any = None
) -> dict[str, Any]:
    """Run case against target; return throughput, latency percentiles, CPU shares and WAL
    (and with pg, a bench.pgquota.PgMeter, what each message cost the cluster)."""
    procs = []
    wal = WalMeter(target.get("dsn"))
    for i in range(case.processes):
        spec = {
            "system": case.system,
            "workload": case.workload,
            "batch": case.batch,
            "partitions": case.partitions,
            "index": i,
            "target": target,
            "producers": _split(case.producers, case.processes, i),
            "consumers": _split(case.consumers, case.processes, i),
            "first_consumer": sum(_split(case.consumers, case.processes, k) for k in range(i)),
            "warmup": case.warmup,
            "duration": case.duration,
            **case.extra,
        }
        procs.append(
            subprocess.Popen(
                _command(case.system, spec),
                cwd=ROOT,
                text=True,
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
            )
        )
    try:
        deadline = time.monotonic() + 60
        for proc in procs:
            _read_ready(proc, deadline)
        start = time.time() + 0.2
        for proc in procs:
            assert proc.stdin is not None
            proc.stdin.write(f"GO {start}\n")
            proc.stdin.flush()
        meter = procstat.CpuMeter()
        time.sleep(max(0.0, start + case.warmup - time.time()))
        wal.read()
        if pg is not None:
            pg.read()
        db_pids = backend_pids(target["dsn"]) if "dsn" in target else []
        bg_pids = background_pids(target["dsn"]) if "dsn" in target else []
        groups = {
            "client": [p.pid for p in procs],
            "server": server_pids,
            "postgres": db_pids,
            "pg_background": bg_pids,
        }
        counted = [server_counts(target)] if case.system == "queen" else []
        meter.start(groups)
        time.sleep(max(0.0, start + case.warmup + case.duration - time.time()))
        cpu = meter.stop()
        wal.read()
        if pg is not None:
            pg.read()
        if counted:
            counted.append(server_counts(target))
        outputs = []
        for proc in procs:
            out, err = proc.communicate(timeout=60)
            lines = [ln for ln in out.splitlines() if ln.startswith("{")]
            if proc.returncode != 0 or not lines:
                raise RuntimeError(f"driver failed ({proc.returncode}): {err[-1500:]}")
            outputs.append(json.loads(lines[-1]))
    finally:
        wal.close()
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    # The backends open on the bench database as the window opened: a pool (Queen's)
    # or the clients' own connections, so a report shows whether they ran short.
    result = {**_merge(case, outputs, cpu, wal.written()), "backends": len(db_pids)}
    done = result["counts"].get("pushed" if case.workload == "push" else "acked", 0)
    if pg is not None:
        result.update(pg.result(case.duration, done))
    if len(counted) == 2 and counted[0] is not None and counted[1] is not None:
        result["server"] = server_per_message(counted[0], counted[1], done)
    return result


def server_counts(target: dict[str, Any]) -> dict[str, Any] | None:
    """What Queen's workers counted so far (its /metrics): statements, commits, and
    database calls and the requests they served per kind (fusion); None if unanswered."""
    import urllib.request

    counts: dict[str, Any] = {
        "statements": 0, "commits": 0, "fusion": {}, "parked": 0, "wakeup_calls": 0
    }
    try:
        for url in target.get("urls") or [target["url"]]:  # (every host's, summed)
            with urllib.request.urlopen(url + "/metrics", timeout=5) as answer:
                doc = json.loads(answer.read())
            counts["statements"] += doc["database"]["statements"]
            counts["commits"] += doc["database"]["commits"]
            polls = doc.get("longPolls") or {}  # (not from a server before it had them)
            counts["parked"] += polls.get("parked", 0)
            counts["wakeup_calls"] += polls.get("wakeupCalls", 0)
            for kind, v in doc["fusion"].items():
                calls, requests = counts["fusion"].get(kind, (0, 0))
                counts["fusion"][kind] = (calls + v["calls"], requests + v["requests"])
    except (OSError, ValueError, KeyError):
        return None
    return counts


def server_per_message(
    before: dict[str, Any], after: dict[str, Any], messages: int
) -> dict[str, Any]:
    """A window's statements and commits per message as Queen's workers counted them, the
    requests each of their push, pop and ack calls served, and the long polls parked and
    wake-up transactions sent per message."""
    per = max(messages, 1)
    served = {}
    for kind, (calls, requests) in after["fusion"].items():
        calls -= before["fusion"].get(kind, (0, 0))[0]
        requests -= before["fusion"].get(kind, (0, 0))[1]
        if calls:
            served[kind] = requests / calls
    return {
        "statements_per_msg": (after["statements"] - before["statements"]) / per,
        "commits_per_msg": (after["commits"] - before["commits"]) / per,
        "requests_per_call": served,
        "parked_per_msg": (after.get("parked", 0) - before.get("parked", 0)) / per,
        "wakeup_calls_per_msg": (after.get("wakeup_calls", 0) - before.get("wakeup_calls", 0))
        / per,
    }


def _merge(
    case: Case,
    outputs: list[dict[str, Any]],
    cpu: dict[str, float],
    wal: dict[str, int | None],
) -> dict[str, Any]:
    counts: dict[str, int] = {}
    samples: dict[str, list[float]] = {}
    errors: list[str] = []
    for out in outputs:
        for key, value in out["counts"].items():
            counts[key] = counts.get(key, 0) + value
        for op, values in out["samples"].items():
            samples.setdefault(op, []).extend(values)
        errors.extend(out.get("errors", []))
    done = counts.get("pushed", 0) if case.workload == "push" else counts.get("acked", 0)
    wal_bytes = wal["wal_bytes"]
    latency = {
        op: {f"p{q}": percentile(values, q) for q in (50, 90, 99)} | {"n": len(values)}
        for op, values in samples.items()
        if values
    }
    return {
        "case": case.label,
        "system": case.system,
        "workload": case.workload,
        "batch": case.batch,
        "partitions": case.partitions,
        "producers": case.producers,
        "consumers": case.consumers,
        "processes": case.processes,
        **({"phase": case.phase} if case.phase else {}),
        "duration_s": case.duration,
        "msgs_per_s": done / case.duration,
        "counts": counts,
        **wal,
        # pushed messages for push cases, acked ones (deliveries) for the others
        "wal_bytes_per_msg": wal_bytes / done if wal_bytes is not None and done else None,
        "latency_ms": latency,
        "cpu": cpu,
        "cores": os.cpu_count() or 1,  # cpu shares are of all of them
        "errors": errors[:5],
        **_fanout_fields(case, counts),
    }


def _fanout_fields(case: Case, counts: dict[str, int]) -> dict[str, Any]:
    """A fan-out window's variant, its readers and the messages published per second (a
    copied message counts once: what the producers' callers asked for)."""
    if case.workload != "fanout":
        return {}
    return {
        "variant": case.extra["variant"],
        "groups": case.extra["groups"],
        "published_per_s": counts.get("pushed", 0) / case.duration,
    }
