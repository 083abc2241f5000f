"""`python -m bench.maintenance`: what the maintenance process costs, and how long a cycle takes.

Queen runs on the server of --dsn or, with
--cluster, on a throwaway cluster with default settings. Two phases (both by default;
--only throughput|cycle):

throughput  End-to-end Queen throughput (push, pop, ack over HTTP; the harness's e2e
            workload) with the maintenance process running and without, side by side,
            in alternating rounds so drift in the machine's load hits both alike.
cycle       One maintenance cycle (every task once) on a database seeded with 1M
            (--completed) completed and a tenth as many pending messages, written
            straight into the cursor tables with the count rollups caught up,
            repeated, while clients push, pop and
            ack over HTTP. Reports the cycle and per-task times, push/pop/ack latency
            during the cycles against the same load without them, and the longest lock
            wait any backend had (sampled from pg_locks.waitstart every few ms).

Results: bench/results/maintenance.md and maintenance.json (or --out).
"""

from __future__ import annotations

import argparse
import contextlib
import datetime as dt
import json
import os
import platform
import random
import statistics
import sys
import threading
import time
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import Any

import psycopg
import requests

from bench import adapters, cluster, procstat
from bench.backlog import analyze_if_unattended
from bench.runner import Case, percentile, run_case
from bench.systems import BENCH_DIR, QueenServer, drop_database, fresh_database, server_facts
from queen.config import Settings
from queen.store.migrate import migrate
from workers.maintenance import Maintenance

DEFAULT_SERVER = "postgresql://postgres@127.0.0.1:5432/postgres"
COMPLETED = 1_000_000
SEED_CHUNK = 250_000
PARTITIONS = 100  # per seeded queue
LOCK_SAMPLE = 0.005  # seconds between pg_locks samples


def say(text: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {text}", file=sys.stderr, flush=True)


def conditions(server_dsn: str, own: bool) -> dict[str, Any]:
    """What the machine was doing: the numbers mean little without this."""
    load = os.getloadavg()
    return {
        "when": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
        "cpus": os.cpu_count(),
        "loadavg_1_5_15": [round(x, 2) for x in load],
        "python": platform.python_version(),
        "platform": platform.platform(),
        "postgres": server_facts(server_dsn),
        "postgres_server": cluster.origin(server_dsn, own),
    }


# --------------------------------------------------------------------------- throughput


def run_throughput(
    server_dsn: str, batches: list[int], rounds: int, duration: float, partitions: int
) -> list[dict[str, Any]]:
    dsn = fresh_database(server_dsn, "queen_bench_maintenance_tp")
    migrate(dsn)
    results = []
    try:
        for batch in batches:
            for r in range(rounds):
                order = [False, True] if r % 2 == 0 else [True, False]
                for with_maintenance in order:
                    label = "with" if with_maintenance else "without"
                    say(f"throughput batch {batch} round {r + 1}/{rounds}: {label} maintenance")
                    results.append(_one_e2e(dsn, batch, partitions, duration, with_maintenance))
                    results[-1].update(round=r, batch=batch)
    finally:
        drop_database(server_dsn, "queen_bench_maintenance_tp")
    return results


def _one_e2e(
    dsn: str, batch: int, partitions: int, duration: float, with_maintenance: bool
) -> dict[str, Any]:
    queen = QueenServer(dsn, workers=2, maintenance=with_maintenance).start()
    try:
        target = {"url": queen.url, "dsn": dsn}
        adapters.prepare("queen", target)
        meter = MaintenanceCpu(queen, dsn) if with_maintenance else None
        case = Case(
            "queen",
            "e2e",
            batch=batch,
            partitions=partitions,
            producers=4,
            consumers=8,
            processes=2,
            warmup=2.0,
            duration=duration,
            extra={"backlog_cap": max(2000, 32 * batch), "pop_wait_ms": 1000},
        )
        result = run_case(case, target, queen.pids())
        with psycopg.connect(dsn, autocommit=True) as conn:
            (uncounted,) = conn.execute(UNCOUNTED).fetchone()  # type: ignore[misc]
        result.update(maintenance=with_maintenance, uncounted_after=uncounted)
        if meter is not None:
            result["maintenance_cpu"] = meter.share()
        say(
            f"  {result['msgs_per_s']:,.0f} msg/s; other processes used "
            f"{result['cpu'].get('other', 0):.0%} of the machine"
        )
        return result
    finally:
        queen.stop()


# Messages the count rollups have not reached yet (past queen.partition_counts.counted_id).
UNCOUNTED = """
SELECT count(*) FROM queen.messages m
LEFT JOIN queen.partition_counts k ON k.partition_id = m.partition_id
WHERE m.id > coalesce(k.counted_id, 0)
"""


class MaintenanceCpu:
    """CPU the maintenance process and its PostgreSQL backend use from here on (in cores)."""

    def __init__(self, queen: QueenServer, dsn: str) -> None:
        self.pids = [queen.procs[-1].pid]
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline and len(self.pids) == 1:
            with psycopg.connect(dsn, autocommit=True) as conn:
                row = conn.execute(
                    "SELECT pid FROM pg_stat_activity WHERE application_name LIKE %s",
                    (f"queen-maintenance-%-{self.pids[0]}",),
                ).fetchone()
            if row:
                self.pids.append(row[0])
            else:
                time.sleep(0.1)
        self.started = time.monotonic()
        self.before = [procstat.cpu_seconds(p) for p in self.pids]

    def share(self) -> dict[str, float]:
        elapsed = time.monotonic() - self.started
        used = [procstat.cpu_seconds(p) - b for p, b in zip(self.pids, self.before, strict=True)]
        names = ["process", "backend"][: len(used)]
        return {name: round(u / elapsed, 4) for name, u in zip(names, used, strict=True)}


# --------------------------------------------------------------------------- cycle

SEED = [
    """INSERT INTO queen.queues (name, retention_enabled, completed_retention_seconds)
       VALUES ('archive', true, 3600)""",
    "INSERT INTO queen.queues (name, ttl) VALUES ('work', 3000)",
    "INSERT INTO queen.queues (name, delayed_processing) VALUES ('later', 60)",
    "INSERT INTO queen.queues (name) VALUES ('idle'), ('hot')",
    f"""INSERT INTO queen.partitions (queue_id, name)
        SELECT q.id, 'p' || g FROM queen.queues q, generate_series(0, {PARTITIONS - 1}) g
        WHERE q.name IN ('archive', 'work', 'later', 'hot')""",
    """INSERT INTO queen.partitions (queue_id, name, created_at, last_activity_at)
       SELECT q.id, 'e' || g, now() - interval '2 days', now() - interval '2 days'
       FROM queen.queues q, generate_series(0, 499) g WHERE q.name = 'idle'""",
    # Metrics older than the retention.
    """INSERT INTO queen.metrics_minute (minute, partition_id, incoming)
       SELECT date_trunc('minute', now()) - interval '40 days' - make_interval(mins => g),
              p.id, 1
       FROM queen.partitions p JOIN queen.queues q ON q.id = p.queue_id,
            generate_series(1, 20000) g
       WHERE q.name = 'archive' AND p.name = 'p0'""",
]
# Messages of a queue spread over its partitions, created over the last `span` seconds
# (ids in created_at order within a partition, as pushes make them).
SEED_MESSAGES = """
WITH parts AS (SELECT array_agg(p.id ORDER BY p.name) AS ids FROM queen.partitions p
               JOIN queen.queues q ON q.id = p.queue_id WHERE q.name = %(queue)s)
INSERT INTO queen.messages (partition_id, transaction_id, payload, created_at)
SELECT parts.ids[1 + g %% cardinality(parts.ids)], %(queue)s || '-' || g,
       '{"kind": "bench", "body": "xxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxx"}'::jsonb,
       now() - make_interval(secs => %(span)s * (1 - g::float8 / %(total)s))
FROM parts, generate_series(%(first)s::bigint, %(last)s::bigint) g
ORDER BY g
"""
# Queue mode's cursors on every queue, as its first pop makes them.
SEED_CURSORS = """
SELECT queen.join_group(q.id, '__queue__', 'all', NULL), queen.ensure_cursors(q.id, '__queue__')
FROM queen.queues q ORDER BY q.name
"""
# Queue mode completed all of `archive`: its cursors at the newest message, one completion
# record per 1,000 messages.
SEED_COMPLETED = """
WITH done AS (
    SELECT m.partition_id, m.id, m.created_at,
           row_number() OVER (PARTITION BY m.partition_id ORDER BY m.id) AS n
    FROM queen.messages m JOIN queen.partitions p ON p.id = m.partition_id
    JOIN queen.queues q ON q.id = p.queue_id WHERE q.name = 'archive'
), completions AS (
    INSERT INTO queen.completions
        (partition_id, consumer_group, first_id, last_id, acked, acked_at)
    SELECT d.partition_id, '__queue__', min(d.id), max(d.id), count(*),
           max(d.created_at) + interval '1 s'
    FROM done d GROUP BY d.partition_id, (d.n - 1) / 1000
)
UPDATE queen.consumers c SET cursor_id = u.upto
FROM (SELECT d.partition_id, max(d.id) AS upto FROM done d GROUP BY 1) u
WHERE c.partition_id = u.partition_id AND c.consumer_group = '__queue__'
"""
# Twenty expired leases of ten messages each (queue mode, queue `work`).
SEED_LEASES = """
UPDATE queen.consumers c
SET lease_id = gen_random_uuid(), leased_by = 'seed', lease_expires_at = now() - interval '1 s',
    lease_size = 10,
    lease_last_id = (SELECT m.id FROM queen.messages m WHERE m.partition_id = c.partition_id
                     ORDER BY m.id OFFSET 9 LIMIT 1)
FROM (SELECT p.id FROM queen.partitions p JOIN queen.queues q ON q.id = p.queue_id
      WHERE q.name = 'work' ORDER BY p.name LIMIT 20) p
WHERE c.partition_id = p.id AND c.consumer_group = '__queue__'
"""
FILLED = (
    "queen.queues",
    "queen.partitions",
    "queen.messages",
    "queen.consumer_groups",
    "queen.consumers",
    "queen.completions",
    "queen.partition_counts",
    "queen.metrics_minute",
)


def seed(dsn: str, completed: int, pending: int) -> float:
    started = time.monotonic()
    with psycopg.connect(dsn, autocommit=True) as conn:
        for statement in SEED:
            conn.execute(statement)
        for first in range(1, completed + 1, SEED_CHUNK):
            last = min(completed, first + SEED_CHUNK - 1)
            conn.execute(
                SEED_MESSAGES,
                {
                    "queue": "archive",
                    "span": 7200,
                    "first": first,
                    "last": last,
                    "total": completed,
                },
            )
            say(f"  seeded {last:,} completed")
        conn.execute(
            SEED_MESSAGES,
            {"queue": "work", "span": 3600, "first": 1, "last": pending, "total": pending},
        )
        conn.execute(
            SEED_MESSAGES, {"queue": "later", "span": 30, "first": 1, "last": 1000, "total": 1000}
        )
        say(f"  seeded {pending:,} pending (+1,000 delayed)")
        conn.execute(SEED_CURSORS)
        conn.execute(SEED_COMPLETED)
        conn.execute(SEED_LEASES)
        (partitions,) = conn.execute("SELECT count(*) FROM queen.partitions").fetchone() or (0,)
        while conn.execute(
            "SELECT queen.count_refresh(%s, 100000)", (partitions,)
        ).fetchone() != (0,):
            pass  # the count rollups caught up, as maintenance keeps them
        analyze_if_unattended(conn, FILLED)
    return time.monotonic() - started


class Load:
    """Clients pushing, popping and acking over HTTP, each request timed."""

    def __init__(self, url: str, pushers: int = 2, consumers: int = 2, batch: int = 10) -> None:
        self.url = url
        self.batch = batch
        self.stop = threading.Event()
        self.ops: list[tuple[str, float, float]] = []  # (op, started, ended), monotonic
        self.errors = 0
        self.threads = [threading.Thread(target=self._push) for _ in range(pushers)]
        self.threads += [threading.Thread(target=self._consume) for _ in range(consumers)]

    def __enter__(self) -> Load:
        for t in self.threads:
            t.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop.set()
        for t in self.threads:
            t.join(30)

    def _timed(self, op: str, call: Callable[[], requests.Response]) -> Any:
        started = time.monotonic()
        try:
            response = call()
        except requests.RequestException:
            self.errors += 1
            return None
        self.ops.append((op, started, time.monotonic()))
        if response.status_code >= 500:
            self.errors += 1
        return response

    def _push(self) -> None:
        with requests.Session() as http:
            while not self.stop.is_set():
                part = f"p{random.randrange(PARTITIONS)}"
                items = [
                    {"queue": "hot", "partition": part, "payload": {"n": i}}
                    for i in range(self.batch)
                ]
                body = {"items": items}
                self._timed(
                    "push", partial(http.post, f"{self.url}/api/v1/push", json=body, timeout=30)
                )

    def _consume(self) -> None:
        with requests.Session() as http:
            while not self.stop.is_set():
                params = {"batch": self.batch, "wait": "true", "timeout": 1000}
                r = self._timed(
                    "pop",
                    partial(
                        http.get, f"{self.url}/api/v1/pop/queue/hot", params=params, timeout=30
                    ),
                )
                if r is None or r.status_code != 200:
                    continue
                acks = [
                    {"transactionId": m["transactionId"], "status": "completed"}
                    for m in r.json()["messages"]
                ]
                body = {"acknowledgments": acks}
                self._timed(
                    "ack", partial(http.post, f"{self.url}/api/v1/ack/batch", json=body, timeout=30)
                )

    def latency(self, windows: list[tuple[float, float]], inside: bool) -> dict[str, Any]:
        """Latency (ms) of requests overlapping (inside) or clear of (not inside) windows."""
        out = {}
        for op in ("push", "pop", "ack"):
            values = [
                (end - start) * 1000
                for o, start, end in self.ops
                if o == op and any(start < b and end > a for a, b in windows) == inside
            ]
            if op == "pop":  # long polls wait by design: only pops that returned at once
                values = [v for v in values if v < 900]
            out[op] = {
                "n": len(values),
                "p50": percentile(values, 50),
                "p99": percentile(values, 99),
                "max": max(values, default=float("nan")),
            }
        return out


class LockSampler:
    """Poll pg_locks for waiting backends; keep the longest wait seen and who blocked it."""

    def __init__(self, dsn: str) -> None:
        self.dsn = dsn
        self.stop = threading.Event()
        # (ms waited, pid, blocking pids, its query, the blockers' queries)
        self.waits: list[tuple[float, int, list[int], str, str]] = []
        self.thread = threading.Thread(target=self._run)

    def __enter__(self) -> LockSampler:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop.set()
        self.thread.join(10)

    def _run(self) -> None:
        with psycopg.connect(self.dsn, autocommit=True) as conn:
            while not self.stop.is_set():
                rows = conn.execute(
                    "SELECT extract(epoch FROM clock_timestamp() - l.waitstart) * 1000, l.pid,"
                    " pg_blocking_pids(l.pid),"
                    " l.locktype || ' ' || l.mode || coalesce(' ' || l.relation::regclass::text, '')"
                    " || ': ' || left(a.query, 60),"
                    " (SELECT string_agg(left(b.query, 60), ' | ') FROM pg_stat_activity b"
                    "  WHERE b.pid = ANY (pg_blocking_pids(l.pid)))"
                    " FROM pg_locks l JOIN pg_stat_activity a ON a.pid = l.pid"
                    " WHERE NOT l.granted AND l.waitstart IS NOT NULL"
                    "   AND a.datname = current_database()"
                ).fetchall()
                self.waits += [
                    (
                        float(r[0]),
                        r[1],
                        r[2],
                        " ".join(r[3].split()),
                        " ".join((r[4] or "").split()),
                    )
                    for r in rows
                ]
                time.sleep(LOCK_SAMPLE)

    def longest(self, blockers: set[int] | None = None) -> dict[str, Any]:
        chosen = [w for w in self.waits if blockers is None or set(w[2]) & blockers]
        if not chosen:
            return {"ms": 0.0}
        ms, _, _, query, blockers_query = max(chosen)
        top = sorted(chosen, reverse=True)[:5]
        return {
            "ms": round(ms, 1),
            "waiter": query,
            "blocked_by": blockers_query,
            "top": [(round(w[0], 1), w[3], w[4]) for w in top],
        }


def run_cycle(server_dsn: str, cycles: int, gap: float, completed: int) -> dict[str, Any]:
    name = "queen_bench_maintenance_cycle"
    dsn = fresh_database(server_dsn, name)
    migrate(dsn)
    pending = completed // 10
    say(f"cycle: seeding {completed:,} completed and {pending:,} pending messages")
    seed_s = seed(dsn, completed, pending)
    say(f"  seeded in {seed_s:.0f}s")
    settings = Settings.from_env(database_url=dsn, partition_cleanup_s=3600)
    maintenance = Maintenance(settings)
    maintenance.session.connect()
    assert maintenance.session.try_lead()
    maintenance_pid = _backend_pid(dsn, maintenance.name)
    queen = QueenServer(dsn, workers=2, maintenance=False).start()
    timings: list[dict[str, float]] = []
    windows: list[tuple[float, float]] = []
    try:
        with Load(queen.url) as load, LockSampler(dsn) as locks:
            say("  load running; baseline")
            time.sleep(3 * gap)
            for n in range(cycles):
                started = time.monotonic()
                timing = {}
                for task in maintenance.tasks:
                    t0 = time.monotonic()
                    task.run()
                    timing[task.name] = round((time.monotonic() - t0) * 1000, 1)
                ended = time.monotonic()
                timing["cycle"] = round((ended - started) * 1000, 1)
                windows.append((started, ended))
                timings.append(timing)
                say(f"  cycle {n + 1}/{cycles}: {timing['cycle']:.0f} ms  {timing}")
                time.sleep(gap)
            time.sleep(2 * gap)
        totals = dict(maintenance.totals)
    finally:
        queen.stop()
        maintenance.session.close()
        drop_database(server_dsn, name)
    return {
        "completed": completed,
        "pending": pending,
        "seed_seconds": round(seed_s, 1),
        "timings_ms": timings,
        "cycle_ms": {
            "median": statistics.median(t["cycle"] for t in timings),
            "max": max(t["cycle"] for t in timings),
        },
        "work_done": totals,
        "latency_during_cycles": load.latency(windows, inside=True),
        "latency_outside_cycles": load.latency(windows, inside=False),
        "requests": len(load.ops),
        "request_errors": load.errors,
        "longest_lock_wait": locks.longest(),
        "longest_lock_wait_on_maintenance": locks.longest({maintenance_pid}),
    }


def _backend_pid(dsn: str, application_name: str) -> int:
    with psycopg.connect(dsn, autocommit=True) as conn:
        row = conn.execute(
            "SELECT pid FROM pg_stat_activity WHERE application_name = %s", (application_name,)
        ).fetchone()
    assert row is not None
    return int(row[0])


# --------------------------------------------------------------------------- report


def render(doc: dict[str, Any]) -> str:
    lines = [
        "# Maintenance benchmark",
        "",
        "Produced by `python -m bench.maintenance`. The machine is shared and noisy:",
        "read the conditions first.",
        "",
        "## Conditions",
        "",
        "```",
        json.dumps(doc["conditions"], indent=2),
        "```",
        "",
    ]
    if "throughput" in doc:
        lines += _render_throughput(doc["throughput"])
    if "cycle" in doc:
        lines += _render_cycle(doc["cycle"])
    return "\n".join(lines) + "\n"


def _render_throughput(results: list[dict[str, Any]]) -> list[str]:
    lines = [
        "## End-to-end throughput with and without the maintenance process",
        "",
        "Push + pop + ack over HTTP (2 gunicorn workers; 4 producers, 8 consumers in",
        "2 driver processes), rounds alternating which goes first. Maintenance at its",
        "default settings (1 s cycle).",
        "",
        "| batch | round | without (msg/s) | with (msg/s) | ratio | p99 ack without / with (ms)"
        " | other processes' CPU without / with | maintenance CPU, cores (process + backend) |",
        "|---|---|---|---|---|---|---|---|",
    ]
    ratios: dict[int, list[float]] = {}
    for batch in sorted({r["batch"] for r in results}):
        for rnd in sorted({r["round"] for r in results if r["batch"] == batch}):
            pair = {
                r["maintenance"]: r for r in results if r["batch"] == batch and r["round"] == rnd
            }
            off, on = pair[False], pair[True]
            ratio = on["msgs_per_s"] / off["msgs_per_s"] if off["msgs_per_s"] else float("nan")
            ratios.setdefault(batch, []).append(ratio)
            p99 = [x["latency_ms"].get("ack", {}).get("p99", float("nan")) for x in (off, on)]
            lines.append(
                f"| {batch} | {rnd + 1} | {off['msgs_per_s']:,.0f} | "
                f"{on['msgs_per_s']:,.0f} | {ratio:.2f} | {p99[0]:.1f} / {p99[1]:.1f} | "
                f"{off['cpu'].get('other', 0):.0%} / {on['cpu'].get('other', 0):.0%} | "
                f"{sum(on.get('maintenance_cpu', {}).values()):.3f} |"
            )
    cpu = [sum(r.get("maintenance_cpu", {}).values()) for r in results if r["maintenance"]]
    lines += [
        "",
        f"Maintenance CPU (its process plus its PostgreSQL backend), median over the runs: "
        f"{statistics.median(cpu):.3f} cores. The throughput ratios swing with what the rest "
        "of the machine does (see the other processes' share); the CPU the maintenance "
        "process takes is the steadier measure of its cost.",
        "",
        "Median ratio per batch: "
        + ", ".join(f"batch {b}: {statistics.median(v):.2f}x" for b, v in ratios.items()),
        "",
    ]
    return lines


def _render_cycle(c: dict[str, Any]) -> list[str]:
    lines = [
        f"## One maintenance cycle on {c['completed']:,} completed + {c['pending']:,} pending"
        " messages (cursor store)",
        "",
        f"Seeded in {c['seed_seconds']} s: queue `archive` {c['completed']:,} completed over the",
        "last 2 h (retention 1 h: half of them due for deletion), `work` "
        f"{c['pending']:,} pending over the last",
        "hour (ttl 3000 s: a sixth expired) with 20 expired leases, `later` 1k delayed,",
        "500 idle empty partitions, 20k per-minute metric rows past retention. A cycle",
        "runs every task once (each one bounded statement). Meanwhile 2 pushers and 2",
        "consumers (batch 10) work queue `hot` over HTTP.",
        "",
        f"Cycle time: median {c['cycle_ms']['median']:.0f} ms, max "
        f"{c['cycle_ms']['max']:.0f} ms (goal < 1000 ms).",
        "",
        "| cycle | " + " | ".join(k for k in c["timings_ms"][0]) + " |",
        "|---|" + "---|" * len(c["timings_ms"][0]),
    ]
    for i, t in enumerate(c["timings_ms"]):
        lines.append(f"| {i + 1} | " + " | ".join(f"{v:.0f}" for v in t.values()) + " |")
    lines += [
        "",
        "Per-task times in ms. Work done over all cycles: "
        + ", ".join(f"{k} {v:,}" for k, v in sorted(c["work_done"].items())),
        "",
        "Request latency (ms) of requests overlapping a cycle vs the rest:",
        "",
        "| op | n during | p50 | p99 | max | n outside | p50 | p99 | max |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for op in ("push", "pop", "ack"):
        a, b = c["latency_during_cycles"][op], c["latency_outside_cycles"][op]
        lines.append(
            f"| {op} | {a['n']} | {a['p50']:.1f} | {a['p99']:.1f} | {a['max']:.1f} | "
            f"{b['n']} | {b['p50']:.1f} | {b['p99']:.1f} | {b['max']:.1f} |"
        )
    lw, lm = c["longest_lock_wait"], c["longest_lock_wait_on_maintenance"]
    lines += [
        "",
        f"Longest lock wait seen by any backend: {lw['ms']} ms"
        + (f" (`{lw.get('waiter')}` waiting on `{lw.get('blocked_by')}`)" if lw["ms"] else ""),
        f"Longest lock wait on the maintenance session: {lm['ms']} ms (goal < 50 ms)"
        + (f" (`{lm.get('waiter')}` waiting on `{lm.get('blocked_by')}`)." if lm["ms"] else "."),
        f"Requests: {c['requests']:,}, errors: {c['request_errors']}.",
        "",
    ]
    return lines


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m bench.maintenance", description=__doc__.split("\n")[0]
    )
    parser.add_argument("--dsn", default=DEFAULT_SERVER, help="PostgreSQL server")
    parser.add_argument("--only", choices=("throughput", "cycle"))
    parser.add_argument("--batches", default="10,100", help="e2e batch sizes")
    parser.add_argument("--rounds", type=int, default=3, help="with/without pairs per batch")
    parser.add_argument("--duration", type=float, default=10.0, help="seconds per e2e run")
    parser.add_argument("--partitions", type=int, default=16, help="e2e partitions")
    parser.add_argument("--cycles", type=int, default=8, help="maintenance cycles measured")
    parser.add_argument(
        "--completed",
        type=int,
        default=COMPLETED,
        help="completed messages seeded for the cycle (a tenth as many pending)",
    )
    parser.add_argument("--out", type=Path, default=BENCH_DIR / "results")
    cluster.add_argument(parser)
    args = parser.parse_args(argv)
    with contextlib.ExitStack() as stack:
        server = cluster.server_dsn(args.dsn, args.cluster, stack)
        doc = measure(args, server)
    args.out.mkdir(parents=True, exist_ok=True)
    suffix = f"-{args.only}" if args.only else ""
    (args.out / f"maintenance{suffix}.json").write_text(json.dumps(doc, indent=2, default=str))
    (args.out / f"maintenance{suffix}.md").write_text(render(doc))
    say(f"wrote {args.out / f'maintenance{suffix}.md'}")
    print(render(doc))
    return 0


def measure(args: argparse.Namespace, server: str) -> dict[str, Any]:
    """The phases asked for, on the PostgreSQL server of server."""
    doc: dict[str, Any] = {"conditions": conditions(server, args.cluster)}
    if args.only in (None, "throughput"):
        batches = [int(b) for b in args.batches.split(",")]
        doc["throughput"] = run_throughput(
            server, batches, args.rounds, args.duration, args.partitions
        )
    if args.only in (None, "cycle"):
        doc["cycle"] = run_cycle(server, args.cycles, 1.0, args.completed)
    doc["conditions"]["loadavg_after"] = [round(x, 2) for x in os.getloadavg()]
    return doc


if __name__ == "__main__":
    sys.exit(main())
