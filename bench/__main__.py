"""`python -m bench [--smoke | --quick]`: Queen against a raw-SQL ceiling and peer queues.

Every system runs in this one invocation on the same PostgreSQL server (one fresh
database each), with the same workload shapes, so the ratios are comparable: the server
of --dsn, or with --cluster one the bench starts with default settings (autovacuum on)
and removes at the end. Queen is started here (gunicorn -c gunicorn.conf.py,
QUEEN_WORKERS=2, one per core of the 2-core machine, or --queen-workers; DB_POOL_SIZE
enough for a connection per concurrent client of the busiest case, at least the default
10; migrations first). Results
go to bench/results/ (or --out): RESULTS-<mode>.md, results-<mode>.json and PNG plots.
With --pg-cpus N the bench runs on a cluster of its own whose processes share N cores (a
cgroup, bench/pgquota.py), Queen and the load outside it: the PostgreSQL-bound phase,
which reports what each message costs the database. See docs/PERFORMANCE.md for what the
numbers mean.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import platform
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from bench import adapters, cluster, pgquota, profiles, report
from bench.backlog import seed_queen
from bench.procstat import pids_named
from bench.progress import Progress
from bench.runner import Case, run_case
from bench.systems import (
    BENCH_DIR,
    ROOT,
    QueenHosts,
    drop_database,
    dsn_url,
    fresh_database,
    server_facts,
)

DEFAULT_SERVER = "postgresql://postgres@127.0.0.1:5432/postgres"
DEFAULT_AMQP = "amqp://guest:guest@127.0.0.1:5672/%2F"
# Run on Queen's database: queen_sql (its SQL without HTTP) and queen3 (its server, with
# consumers that pop and ack in requests of their own: three requests a batch end to end,
# where queen's consumers ack each batch and pop the next in one).
QUEEN_VARIANTS = ("queen_sql", "queen3")
OWN = ("queen", "raw")  # measured at every batch size even in quick mode
PHASES = ("push", "e2e", "small", "fanout", "latency", "backlog", "memory", "pgbound")
QUEEN_WORKERS = 2  # one gevent worker per core of the 2-core machine, as deployed on it
QUEEN_DEFAULT_POOL = 10  # DB_POOL_SIZE's default (queen.config)


@dataclass
class Context:
    profile: profiles.Profile
    server_dsn: str
    amqp: str
    db_prefix: str
    own_cluster: bool = False
    systems: list[str] = field(default_factory=list)
    skipped: dict[str, str] = field(default_factory=dict)
    dsns: dict[str, str] = field(default_factory=dict)
    queen: QueenHosts | None = None
    versions: dict[str, str] = field(default_factory=dict)
    results: list[dict[str, Any]] = field(default_factory=list)
    quota: pgquota.CpuQuota | None = None
    commit: str = ""
    dirty_files: int = 0


def git(*args: str) -> str:
    return subprocess.run(["git", *args], cwd=ROOT, capture_output=True, text=True).stdout.strip()


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m bench", description=__doc__.split("\n")[0])
    mode = parser.add_mutually_exclusive_group()
    mode.add_argument(
        "--smoke",
        action="store_const",
        dest="mode",
        const="smoke",
        help="a few seconds: Queen and the raw ceiling, tiny sizes (tests)",
    )
    mode.add_argument(
        "--quick",
        action="store_const",
        dest="mode",
        const="quick",
        help="<= 3 minutes: every system, fewer points, short windows (CI)",
    )
    parser.set_defaults(mode="full")
    parser.add_argument("--systems", help="comma list, subset of " + ",".join(profiles.ALL_SYSTEMS))
    parser.add_argument(
        "--only",
        help="comma list of phases: " + ",".join(PHASES) + " (default: all of them). small: "
        "batches of 1 and 10 at high concurrency, where the requests of one worker overlap "
        "(full: push batch 1 from 64 clients; end to end at batch 1 and 10 with 32 producers "
        "and 32 consumers, 16 partitions; 4 client processes; every system alike)",
    )
    server = parser.add_mutually_exclusive_group()
    server.add_argument(
        "--dsn", default=DEFAULT_SERVER, help="PostgreSQL server to create the bench databases on"
    )
    server.add_argument(
        "--cluster",
        action="store_true",
        help="start a throwaway PostgreSQL cluster with default settings (autovacuum on) for "
        "this run, instead of --dsn; stopped and removed at the end",
    )
    parser.add_argument("--amqp", default=DEFAULT_AMQP, help="RabbitMQ URL (skipped if silent)")
    parser.add_argument("--db-prefix", default="queen_bench", help="bench database name prefix")
    parser.add_argument("--out", type=Path, default=BENCH_DIR / "results", help="results folder")
    parser.add_argument("--duration", type=float, help="seconds per case (overrides the mode)")
    parser.add_argument(
        "--batches", help="comma list of batch sizes for push and e2e (overrides the mode)"
    )
    parser.add_argument(
        "--partitions", help="comma list of Queen e2e partition counts (overrides the mode)"
    )
    parser.add_argument(
        "--rounds",
        type=int,
        default=1,
        help="run the push, e2e, small, fan-out and latency cases N times, round after round (the "
        "fan-out variants in a rotating order); goals are the median of the rounds' "
        "side-by-side ratios (default 1)",
    )
    parser.add_argument(
        "--groups",
        type=int,
        default=4,
        help="consumer groups of the fan-out phase, and queues of its copy approach (default 4)",
    )
    parser.add_argument(
        "--wal-baseline",
        type=float,
        metavar="BYTES",
        help="WAL bytes per message end to end at batch 100 of the earlier row store: the "
        "goal is at most half of it (default: the figure is only reported)",
    )
    parser.add_argument(
        "--queen-workers",
        type=int,
        default=QUEEN_WORKERS,
        metavar="N",
        help=f"Queen's gunicorn workers (default {QUEEN_WORKERS}, one per core): each fuses "
        "only its own requests into database calls",
    )
    parser.add_argument(
        "--queen-hosts",
        type=int,
        default=1,
        metavar="N",
        help="Queen servers (gunicorn masters) on the one database, each with --queen-workers "
        "workers; client i talks to server i mod N (default 1)",
    )
    parser.add_argument(
        "--queen-pool",
        type=int,
        metavar="N",
        help="Queen's DB_POOL_SIZE, connections per worker (default: enough for the run's "
        "most concurrent case to have one per client, spread over the workers; at least "
        f"Queen's default {QUEEN_DEFAULT_POOL})",
    )
    parser.add_argument(
        "--pg-cpus",
        type=float,
        metavar="CORES",
        help="PostgreSQL as the bottleneck: run on a cluster of the bench's own (with "
        "pg_stat_statements) whose processes share this CPU quota (a cgroup; root), the "
        "server and the load outside it, and report what each message costs it. Runs the "
        "pgbound phase (Queen, the minimal cursor SQL, raw, pgmq; push, end to end and "
        "fan-out) unless --only says otherwise",
    )
    parser.add_argument(
        "--pg-period-ms",
        type=float,
        default=pgquota.DEFAULT_PERIOD_US / 1000,
        help="the quota's period (default %(default)g ms)",
    )
    parser.add_argument(
        "--cases",
        help="comma list: run only the cases whose label contains one of these "
        "(e.g. e2e/b1/,push/b1000); for studying a few cases",
    )
    parser.add_argument("--name", help="results file suffix (default: the mode)")
    parser.add_argument(
        "--keep", action="store_true", help="keep the bench databases (not with --cluster)"
    )
    parser.add_argument("--no-progress", action="store_true", help="no progress bars")
    return parser.parse_args(argv)


# --------------------------------------------------------------------------- setup


def check_systems(ctx: Context, wanted: list[str]) -> None:
    """Keep the systems that can run here; note why the others are skipped."""
    for system in wanted:
        reason = _unavailable(system, ctx)
        if reason:
            ctx.skipped[system] = reason
        else:
            ctx.systems.append(system)


def _unavailable(system: str, ctx: Context) -> str:
    if system in ("pgmq", "pgqueuer"):
        try:
            __import__(system)
        except ImportError:
            return f"python package {system} not installed (pip install -e .[bench])"
    if system == "pgboss":
        if not shutil.which("node"):
            return "node not found"
        if not (BENCH_DIR / "node_modules" / "pg-boss").exists():
            return "pg-boss not installed (cd bench && npm install)"
    if system == "rabbitmq":
        try:
            import pika  # noqa: F401
        except ImportError:
            return "python package pika not installed"
        if not adapters.rabbit_answers(ctx.amqp):
            return f"RabbitMQ does not answer at {ctx.amqp}"
    return ""


def setup_databases(ctx: Context) -> None:
    for system in ctx.systems:
        if system in ("rabbitmq", *QUEEN_VARIANTS):
            continue
        ctx.dsns[system] = fresh_database(ctx.server_dsn, f"{ctx.db_prefix}_{system}")
    for variant in QUEEN_VARIANTS:  # Queen's own database: without HTTP; classic consumers
        if variant in ctx.systems:
            ctx.dsns[variant] = ctx.dsns["queen"]
    if "pgmq" in ctx.systems:
        ctx.versions["pgmq (SQL)"] = adapters.install_pgmq(ctx.dsns["pgmq"])
    for package in ("pgmq", "pgqueuer", "pika", "psycopg", "gevent", "gunicorn", "falcon"):
        try:
            from importlib.metadata import version

            ctx.versions[package] = version(package)
        except Exception:  # noqa: BLE001 - not installed
            continue
    if "pgboss" in ctx.systems:
        pkg = json.loads((BENCH_DIR / "node_modules" / "pg-boss" / "package.json").read_text())
        ctx.versions["pg-boss"] = pkg["version"]
        ctx.versions["node"] = subprocess.run(
            ["node", "--version"], capture_output=True, text=True
        ).stdout.strip()


def target(ctx: Context, system: str) -> dict[str, Any]:
    if system in ("queen", "queen3"):
        assert ctx.queen is not None
        return {"url": ctx.queen.url, "urls": ctx.queen.urls, "dsn": ctx.dsns["queen"]}
    if system == "rabbitmq":
        return {"amqp": ctx.amqp}
    if system == "pgboss":
        return {"dsn": ctx.dsns[system], "url": dsn_url(ctx.dsns[system])}
    return {"dsn": ctx.dsns[system]}


def server_pids(ctx: Context, system: str) -> list[int]:
    if system in ("queen", *QUEEN_VARIANTS) and ctx.queen is not None:
        return ctx.queen.pids()
    if system == "rabbitmq":
        return pids_named("beam.smp")
    return []


def prepare(ctx: Context, system: str, batch: int, queues: list[str] | None = None) -> None:
    """Bring a system to an empty queue (pgmq: queues) before a case."""
    tgt = target(ctx, system)
    spec = json.dumps({"install": True, "batch": batch, "target": tgt})
    if system == "pgqueuer":
        subprocess.run(
            [sys.executable, "-m", "bench.pgqueuer_driver", spec],
            cwd=ROOT,
            check=True,
            capture_output=True,
        )
    elif system == "pgboss":
        subprocess.run(
            ["node", str(BENCH_DIR / "pgboss_driver.mjs"), spec],
            cwd=ROOT,
            check=True,
            capture_output=True,
        )
    else:
        adapters.prepare(system, tgt, queues)
    checkpoint(ctx.server_dsn)


def checkpoint(dsn: str) -> None:
    """Write out what earlier cases left dirty, so that no case's window pays for the
    case before it (the checkpoint a heavy case brings on otherwise writes its buffers
    out during the next one). Where the role may not (CHECKPOINT needs superuser or
    pg_checkpoint), cases go on without."""
    import psycopg

    try:
        adapters._sql(dsn, "CHECKPOINT")
    except psycopg.Error as exc:
        print(f"(no checkpoint between cases: {exc})", file=sys.stderr)


# --------------------------------------------------------------------------- plan


def plan(ctx: Context, phases: set[str]) -> list[Case]:
    """Return the throughput and latency cases of this run, in order."""
    p = ctx.profile
    cases: list[Case] = []
    common: dict[str, Any] = {"warmup": p.warmup, "duration": p.duration}
    for system in ctx.systems:
        procs = 1 if system in ("pgqueuer", "pgboss") else p.processes
        if "push" in phases:
            batches = p.push_batches if system in OWN else p.peer_push_batches
            cases += [
                Case(system, "push", batch=b, producers=p.push_producers, processes=procs, **common)
                for b in batches
            ]
        if "e2e" in phases:
            batches = p.e2e_batches if system in OWN else p.peer_e2e_batches
            headline = p.partitions[-2:-1] or p.partitions
            parts = {"queen": p.partitions, "queen_sql": headline, "queen3": headline}
            parts_of = parts.get(system, (1,))
            cases += [
                Case(
                    system,
                    "e2e",
                    batch=b,
                    partitions=n,
                    producers=p.e2e_producers,
                    consumers=p.e2e_consumers,
                    processes=procs,
                    **common,
                    extra={
                        "backlog_cap": max(2000, 4 * b * p.e2e_consumers),
                        "pop_wait_ms": p.pop_wait_ms,
                    },
                )
                for b in batches
                for n in parts_of
            ]
        if "latency" in phases and system in p.latency_systems:
            pops = (p.warmup + p.latency_duration) * 200
            cases.append(
                Case(
                    system,
                    "latency",
                    producers=1,
                    consumers=1,
                    warmup=p.warmup,
                    duration=p.latency_duration,
                    extra={
                        "prefill_batches": int(pops / 100) + 1,
                        "prefill_batch": 100,
                        "probe_pause": 0.005,
                    },
                )
            )
    return cases


def plan_small(ctx: Context) -> list[Case]:
    """The small phase: push batch 1 and end to end at batch 1 and 10, many clients each.

    Every system gets the same clients (greenlets, or tasks of the async drivers) over the
    same processes; Queen's producers spread over small_partitions partitions. The
    baselines make one call per operation, each its own transaction (at batch 1 a commit
    per message and step): nothing shares a call or a commit across clients.
    """
    p = ctx.profile
    common: dict[str, Any] = {
        "warmup": p.warmup,
        "duration": p.duration,
        "processes": p.small_processes,
    }
    cases: list[Case] = []
    for system in ctx.systems:
        if p.small_systems is not None and system not in p.small_systems:
            continue
        cases.append(
            Case(system, "push", batch=1, producers=p.small_push_producers, phase="small", **common)
        )
        parts = p.small_partitions if system in ("queen", *QUEEN_VARIANTS) else 1
        cases += [
            Case(
                system,
                "e2e",
                batch=b,
                partitions=parts,
                producers=p.small_producers,
                consumers=p.small_consumers,
                phase="small",
                **common,
                extra={
                    "backlog_cap": max(2000, 4 * b * p.small_consumers),
                    "pop_wait_ms": p.pop_wait_ms,
                },
            )
            for b in p.small_batches
        ]
    return cases


PGBOUND_SYSTEMS = ("queen", "minimal", "raw", "pgmq")


def plan_pgbound(ctx: Context, groups: int) -> list[Case]:
    """The PostgreSQL-bound phase: the shapes of docs/PERFORMANCE.md's goals, every system
    alike. Small batches get many clients (32 + 32; 64 pushing), large ones few (2 + 4;
    the push producers of the mode); claims and acks of raw and minimal commit without
    waiting for the disk, as Queen's do. End to end, a client process's producers wait
    while 4 batches a consumer are pushed and not acked, so that within the warm-up the
    producers go at the consumers' pace and a window's work is whole lifecycles (with a
    larger backlog, a system whose pushes are cheap pushed twice what it acked at batch 1,
    and that pushing counted against each message acked)."""
    p = ctx.profile
    small = {"producers": p.small_producers, "consumers": p.small_consumers,
             "processes": p.small_processes}
    large = {"producers": max(1, p.e2e_producers // 2), "consumers": p.e2e_consumers // 2 or 1,
             "processes": p.processes}
    common: dict[str, Any] = {"warmup": p.warmup, "duration": p.duration, "phase": "pgbound"}
    extra = {"async_acks": True, "pop_wait_ms": p.pop_wait_ms}
    cases: list[Case] = []
    for system in [s for s in PGBOUND_SYSTEMS if s in ctx.systems]:
        procs = {"processes": p.small_processes}
        cases.append(Case(system, "push", batch=1, producers=p.small_push_producers,
                          **procs, **common, extra=extra))
        cases.append(Case(system, "push", batch=1000, producers=p.push_producers,
                          processes=p.processes, **common, extra=extra))
        for batch, shape, parts in ((1, small, 16), (10, small, 16), (100, large, 8),
                                    (1000, large, 8)):
            cases.append(Case(
                system, "e2e", batch=batch, partitions=parts, **shape, **common,
                extra={**extra, "backlog_cap": 4 * batch * shape["consumers"]},
            ))
    if "queen" in ctx.systems:
        consumers = groups * p.fanout_consumers
        cases += [
            Case("queen", "fanout", batch=100, partitions=p.fanout_partitions,
                 producers=p.fanout_producers, consumers=consumers, processes=p.processes,
                 **common, extra={**extra, "variant": variant, "groups": groups,
                                  "backlog_cap": max(2000, 400 * consumers)})
            for variant in ("groups", "copy")
        ]
    return cases


def queen_pool(cases: list[Case], workers: int = QUEEN_WORKERS) -> int:
    """DB_POOL_SIZE at which every concurrent client of the busiest case can hold a
    connection (its clients spread evenly over the workers), at least Queen's default."""
    clients = max(
        (c.producers + c.consumers for c in cases if c.system in ("queen", "queen3")), default=0
    )
    return max(QUEEN_DEFAULT_POOL, -(-clients // workers))


def plan_fanout(ctx: Context, groups: int) -> list[Case]:
    """The fan-out cases: Queen's consumer groups on one queue, the copy approach on Queen
    (a push carries each message into every one of G queues) and on pgmq, when it runs.

    Same producers, consumers per group or queue, batch and window for each; the rate is
    the deliveries acked per second over all groups (queues).
    """
    p = ctx.profile
    variants = []
    if "queen" in ctx.systems:
        variants += [("queen", "groups"), ("queen", "copy")]
    if "queen3" in ctx.systems:
        variants += [("queen3", "groups"), ("queen3", "copy")]
    if "pgmq" in ctx.systems:
        variants.append(("pgmq", "copy"))
    consumers = groups * p.fanout_consumers
    return [
        Case(
            system,
            "fanout",
            batch=p.fanout_batch,
            partitions=p.fanout_partitions,
            producers=p.fanout_producers,
            consumers=consumers,
            processes=p.processes,
            warmup=p.warmup,
            duration=p.duration,
            extra={
                "variant": variant,
                "groups": groups,
                "backlog_cap": max(2000, 4 * p.fanout_batch * consumers),
                "pop_wait_ms": p.pop_wait_ms,
            },
        )
        for system, variant in variants
    ]


def rotated(cases: list[Case], round_no: int) -> list[Case]:
    """cases starting one further each round, so that no variant always runs first."""
    if not cases:
        return cases
    shift = (round_no - 1) % len(cases)
    return cases[shift:] + cases[:shift]


# --------------------------------------------------------------------------- phases


def run_cases(ctx: Context, cases: list[Case], bar: Progress, round_no: int = 1) -> None:
    for case in cases:
        bar.describe(case.label if round_no == 1 else f"{case.label} (round {round_no})")
        try:
            queues = (
                adapters.fanout_queues(case.extra["groups"])
                if case.workload == "fanout" and case.extra["variant"] == "copy"
                else None
            )
            prepare(ctx, case.system, case.batch, queues)
            meter = pgquota.PgMeter(ctx.server_dsn, ctx.quota) if ctx.quota else None
            try:
                result = run_case(
                    case, target(ctx, case.system), server_pids(ctx, case.system), meter
                )
            finally:
                if meter is not None:
                    meter.close()
            if case.system == "queen" and ctx.queen is not None:
                result["server_rss"] = ctx.queen.rss()
        except Exception as exc:  # noqa: BLE001 - one failed case must not end the run
            result = {
                "case": case.label,
                "system": case.system,
                "workload": case.workload,
                "batch": case.batch,
                "partitions": case.partitions,
                "failed": f"{type(exc).__name__}: {exc}"[:500],
            }
        result["round"] = round_no
        ctx.results.append(result)
        bar.advance()


def run_backlog(ctx: Context, bar: Progress) -> None:
    """Pop latency (one consumer, batch 1) over a small and a large seeded backlog."""
    p = ctx.profile
    for size in p.backlog_sizes:
        bar.describe(f"queen/backlog/{size:,} (seeding)")
        prepare(ctx, "queen", 1)
        started = time.monotonic()
        seed_queen(ctx.dsns["queen"], adapters.QUEUE, size, p.backlog_partitions)
        seed_s = time.monotonic() - started
        bar.describe(f"queen/backlog/{size:,}")
        case = Case(
            "queen",
            "latency",
            producers=1,
            consumers=1,
            warmup=p.warmup,
            duration=p.latency_duration,
            extra={"prefill_batches": 0},
        )
        result = run_case(case, target(ctx, "queen"), server_pids(ctx, "queen"))
        result.update(
            workload="backlog",
            backlog=size,
            seed_seconds=round(seed_s, 1),
            case=f"queen/backlog/{size}",
        )
        ctx.results.append(result)
        bar.advance()


def run_memory(ctx: Context, bar: Progress) -> None:
    """Server RSS with memory_backlog queued, after an end-to-end run over that backlog."""
    p = ctx.profile
    assert ctx.queen is not None
    bar.describe(f"queen/memory/{p.memory_backlog:,} (seeding)")
    prepare(ctx, "queen", 100)
    seed_queen(ctx.dsns["queen"], adapters.QUEUE, p.memory_backlog, 16)
    before = ctx.queen.rss()
    bar.describe(f"queen/memory/{p.memory_backlog:,}")
    case = Case(
        "queen",
        "e2e",
        batch=100,
        partitions=16,
        producers=p.e2e_producers,
        consumers=p.e2e_consumers,
        processes=p.processes,
        warmup=p.warmup,
        duration=p.duration,
        extra={"backlog_cap": 10**9, "pop_wait_ms": p.pop_wait_ms},
    )
    result = run_case(case, target(ctx, "queen"), server_pids(ctx, "queen"))
    result.update(
        workload="memory",
        backlog=p.memory_backlog,
        rss_before=before,
        server_rss=ctx.queen.rss(),
        case=f"queen/memory/{p.memory_backlog}",
    )
    ctx.results.append(result)
    bar.advance()


def guarded(ctx: Context, label: str, phase: Any, bar: Progress) -> None:
    """Run a phase; record its failure as a failed case instead of ending the run."""
    try:
        phase(ctx, bar)
    except Exception as exc:  # noqa: BLE001
        ctx.results.append(
            {
                "case": label,
                "system": "queen",
                "workload": label.split("/")[1],
                "batch": 0,
                "partitions": 0,
                "failed": f"{type(exc).__name__}: {exc}"[:500],
            }
        )


# --------------------------------------------------------------------------- main


def conditions(ctx: Context, started: float) -> dict[str, Any]:

    with open("/proc/loadavg") as f:
        load = f.read().split()[:3]
    cpu_model = ""
    with open("/proc/cpuinfo") as f:
        for line in f:
            if line.startswith("model name"):
                cpu_model = line.split(":", 1)[1].strip()
                break
    return {
        "mode": ctx.profile.name,
        "started": time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(started)),
        "elapsed_s": round(time.time() - started, 1),
        "commit": ctx.commit,
        "dirty_files": ctx.dirty_files,
        "cpu": f"{cpu_model} x{__import__('os').cpu_count()}",
        "load_avg_at_end": load,
        "python": platform.python_version(),
        "postgres": server_facts(ctx.server_dsn),
        "postgres_server": cluster.origin(ctx.server_dsn, ctx.own_cluster),
        "versions": ctx.versions,
        "skipped": ctx.skipped,
        "queen_workers": int(ctx.queen.env["QUEEN_WORKERS"]) if ctx.queen else None,
        "queen_hosts": len(ctx.queen.servers) if ctx.queen else None,
        "queen_pool": int(ctx.queen.env["DB_POOL_SIZE"]) if ctx.queen else None,
        "queen_maintenance": bool(ctx.queen and ctx.queen.maintenance),
    }


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.rounds < 1:
        print("--rounds must be at least 1", file=sys.stderr)
        return 2
    if args.queen_workers < 1 or args.queen_hosts < 1:
        print("--queen-workers and --queen-hosts must be at least 1", file=sys.stderr)
        return 2
    with contextlib.ExitStack() as stack:
        if args.pg_cpus is None:
            return run(args, cluster.server_dsn(args.dsn, args.cluster, stack))
        reason = pgquota.unavailable()
        if reason:
            print(f"the PostgreSQL-bound phase is skipped: {reason}", file=sys.stderr)
            return 0
        own = stack.enter_context(cluster.bench_cluster(preload="pg_stat_statements"))
        adapters._sql(own.dsn, "CREATE EXTENSION IF NOT EXISTS pg_stat_statements")
        quota = pgquota.CpuQuota(args.pg_cpus, int(args.pg_period_ms * 1000))
        stack.callback(quota.remove)
        quota.add(pgquota.cluster_pids(own.data))
        args.cluster = True
        return run(args, own.dsn, quota)


def run(
    args: argparse.Namespace, server_dsn: str, quota: pgquota.CpuQuota | None = None
) -> int:
    """The whole bench on the PostgreSQL server of server_dsn (under quota, when given)."""
    profile = profiles.PROFILES[args.mode]
    overrides: dict[str, Any] = {}
    if args.duration:
        overrides["duration"] = args.duration
    if args.batches:
        batches = tuple(int(b) for b in args.batches.split(","))
        for name in ("push_batches", "e2e_batches", "peer_push_batches", "peer_e2e_batches"):
            overrides[name] = batches
    if args.partitions:
        overrides["partitions"] = tuple(int(n) for n in args.partitions.split(","))
    if overrides:
        profile = profiles.Profile(**{**profile.__dict__, **overrides})
    ctx = Context(profile, server_dsn, args.amqp, args.db_prefix, own_cluster=args.cluster)
    ctx.quota = quota
    default_systems = PGBOUND_SYSTEMS if quota else profile.systems
    wanted = args.systems.split(",") if args.systems else list(default_systems)
    if args.only:
        phases = set(args.only.split(","))
    else:
        phases = {"pgbound"} if quota else set(PHASES) - {"pgbound"}
    unknown = phases - set(PHASES)
    if unknown:
        print(f"unknown phases: {', '.join(sorted(unknown))}", file=sys.stderr)
        return 2
    if args.groups < 1:
        print("--groups must be at least 1", file=sys.stderr)
        return 2
    started = time.time()
    ctx.commit = git("rev-parse", "--short", "HEAD")
    ctx.dirty_files = len(git("status", "--porcelain", "--untracked-files=no").splitlines())
    check_systems(ctx, wanted)
    if set(QUEEN_VARIANTS) & set(ctx.systems) and "queen" not in ctx.systems:
        ctx.systems.insert(0, "queen")  # the variants run on Queen's database (and server)
    if not ctx.systems:
        print("no system can run here", file=sys.stderr)
        return 2
    if args.queen_pool is not None and args.queen_pool < 1:
        print("--queen-pool must be at least 1", file=sys.stderr)
        return 2
    if "queen" not in ctx.systems:
        phases -= {"backlog", "memory"}
    cases = plan(ctx, phases) + (plan_small(ctx) if "small" in phases else [])
    fanout = plan_fanout(ctx, args.groups) if "fanout" in phases else []
    if "pgbound" in phases:
        cases += plan_pgbound(ctx, args.groups)
    if args.cases:
        wanted_labels = args.cases.split(",")
        cases = [c for c in cases if any(w in c.label for w in wanted_labels)]
        fanout = [c for c in fanout if any(w in c.label for w in wanted_labels)]
    setup_databases(ctx)
    if "queen" in ctx.systems:
        pool = args.queen_pool or queen_pool(
            cases + fanout, args.queen_workers * args.queen_hosts
        )
        ctx.queen = QueenHosts.start(
            ctx.dsns["queen"], args.queen_hosts, args.queen_workers,
            extra_env={"DB_POOL_SIZE": str(pool)},
        )
    try:
        total = (
            (len(cases) + len(fanout)) * args.rounds
            + len(profile.backlog_sizes) * ("backlog" in phases)
            + ("memory" in phases)
        )
        with Progress(total, enabled=not args.no_progress) as bar:
            for round_no in range(1, args.rounds + 1):
                run_cases(ctx, cases, bar, round_no)
                run_cases(ctx, rotated(fanout, round_no), bar, round_no)
            if "backlog" in phases:
                guarded(ctx, "queen/backlog", run_backlog, bar)
            if "memory" in phases:
                guarded(ctx, "queen/memory", run_memory, bar)
    finally:
        if ctx.queen is not None:
            ctx.queen.stop()
        if not args.keep:
            for system in [s for s in ctx.dsns if s not in QUEEN_VARIANTS]:
                drop_database(ctx.server_dsn, f"{ctx.db_prefix}_{system}")
    facts = conditions(ctx, started)  # while the server still runs
    facts["rounds"] = args.rounds
    if quota is not None:
        facts["pg_quota"] = {"cpus": quota.cpus, "period_ms": quota.period_us / 1000}
    facts["wal_baseline"] = args.wal_baseline
    paths = report.write(args.out, args.name or profile.name, ctx.results, facts)
    failed = [r for r in ctx.results if "failed" in r]
    for r in failed:
        print(f"FAILED {r['case']}: {r['failed']}", file=sys.stderr)
    print(f"wrote {', '.join(str(p) for p in paths)} in {facts['elapsed_s']} s")
    return 1 if failed or not ctx.results else 0


if __name__ == "__main__":
    sys.exit(main())
