"""`python -m bench.profile`: where Queen's time goes under load (Python, SQL, HTTP).

Starts Queen (the cursor store) on a fresh database, drives an end-to-end load, and meanwhile:
- samples the gunicorn workers with py-spy while they hold the GIL (collapsed stacks,
  summarised by frame): their CPU in Python. Sampled without --gil, a gevent worker
  waiting in its hub is reported in the frame of the greenlet that ran last (a third of
  the samples of a pop-and-ack load landed in psycopg's send of a query that way);
- reads pg_stat_user_functions (track_functions = 'pl') before and after: calls,
  total and self time of every queen.* SQL function;
- reads pg_stat_all_tables before and after: the tuples each table (catalogs too) had
  fetched by index and read by scans, a message;
- reads pg_stat_statements over the window, where loaded (--cluster): the top-level
  statements, or with --nested the statements functions run too (their times are their
  runs, without executor set-up), with the plans each made and their planning time;
- runs push, pop and ack once more in a session with auto_explain loaded (plans of
  the statements nested in the functions, with actual times) and keeps those plans.
Writes bench/results/profiles/<case>/{pyspy-*.txt, functions.md, explain.txt, summary.md}.
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import shutil
import subprocess
import threading
from pathlib import Path
from typing import Any

import orjson
import psycopg
from psycopg import sql

from bench import adapters, cluster
from bench.runner import Case, run_case
from bench.systems import BENCH_DIR, QueenServer, drop_database, fresh_database

FUNCTIONS = """
SELECT funcname, calls, total_time, self_time FROM pg_stat_user_functions
WHERE schemaname = 'queen' ORDER BY funcname
"""


def function_stats(dsn: str) -> dict[str, tuple[int, float, float]]:
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("SELECT pg_stat_clear_snapshot()")
        return {r[0]: (r[1], r[2], r[3]) for r in conn.execute(FUNCTIONS).fetchall()}


TABLES = """
SELECT schemaname || '.' || relname, coalesce(idx_tup_fetch, 0), seq_tup_read,
       coalesce(idx_scan, 0), seq_scan
FROM pg_stat_all_tables
"""


def table_stats(dsn: str) -> dict[str, tuple[int, int, int, int]]:
    """Tuples fetched by index, read by scans, and the scans of each table, catalogs too
    (what pg_stat_database's tup_fetched sums: its index fetches)."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("SELECT pg_stat_clear_snapshot()")
        return {r[0]: (r[1], r[2], r[3], r[4]) for r in conn.execute(TABLES).fetchall()}


def tuple_table(before: dict[str, Any], after: dict[str, Any], messages: float) -> str:
    """The tables by tuples fetched a message over the window (table_stats)."""
    rows = []
    for name, counts in after.items():
        fetched, read, index_scans, seq_scans = (
            a - b for a, b in zip(counts, before.get(name, (0, 0, 0, 0)), strict=True)
        )
        if fetched or read:
            rows.append((name, fetched, read, index_scans, seq_scans))
    rows.sort(key=lambda r: -r[1])
    m = max(messages, 1)
    out = [
        "| table | fetched/msg | seq read/msg | index scans/msg | seq scans/msg |",
        "|---|---:|---:|---:|---:|",
    ]
    out += [
        f"| {name} | {f / m:.2f} | {r / m:.2f} | {i / m:.2f} | {s / m:.2f} |"
        for name, f, r, i, s in rows[:20]
    ]
    return "\n".join(out)


# (Comments dropped: most of Queen's statements open with one.)
STATEMENTS = """
SELECT left(regexp_replace(regexp_replace(query, '--[^\n]*', '', 'g'), '\\s+', ' ', 'g'), 110),
       calls, total_exec_time, rows, plans, total_plan_time
FROM pg_stat_statements WHERE dbid = (SELECT oid FROM pg_database WHERE datname = current_database())
ORDER BY total_exec_time DESC LIMIT %s
"""


def reset_statements(dsn: str) -> bool:
    """Start counting top-level statements afresh; False where pg_stat_statements is not loaded."""
    try:
        with psycopg.connect(dsn, autocommit=True) as conn:
            conn.execute("CREATE EXTENSION IF NOT EXISTS pg_stat_statements")
            conn.execute("SELECT pg_stat_statements_reset()")
        return True
    except psycopg.Error:
        return False


def track_nested(server_dsn: str, name: str) -> None:
    """Have pg_stat_statements count the statements that functions run in database name,
    from its next session on (pg_stat_statements.track = all; superuser)."""
    with psycopg.connect(server_dsn, autocommit=True) as conn:
        for setting in ("track = 'all'", "track_planning = on"):
            conn.execute(
                sql.SQL("ALTER DATABASE {} SET pg_stat_statements." + setting).format(
                    sql.Identifier(name)
                )
            )


def statement_table(dsn: str, seconds: float, messages: float, limit: int = 15) -> str:
    """The statements by total time since reset_statements (pg_stat_statements)."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        rows = conn.execute(STATEMENTS, (limit,)).fetchall()
    out = [
        "| statement | calls | rows/call | total ms | ms/call | us per message | share of wall"
        " | plans | plan ms |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for text, calls, total, returned, plans, planning in rows:
        cell = text.replace("|", "\\|")
        out.append(
            f"| `{cell}` | {calls:,} | {returned / max(calls, 1):.2f} | {total:,.0f} |"
            f" {total / max(calls, 1):.3f} | {1000 * total / max(messages, 1):.0f} |"
            f" {total / 1000 / seconds:.0%} | {plans:,} | {planning:,.0f} |"
        )
    return "\n".join(out)


def function_table(before: dict[str, Any], after: dict[str, Any], seconds: float) -> str:
    rows = []
    for name, (calls, total, self_ms) in after.items():
        c0, t0, s0 = before.get(name, (0, 0.0, 0.0))
        if calls - c0:
            rows.append((name, calls - c0, total - t0, self_ms - s0))
    rows.sort(key=lambda r: -r[3])
    out = [
        "| function | calls | total ms | self ms | total ms/call | self share of wall |",
        "|---|---:|---:|---:|---:|---:|",
    ]
    for name, calls, total, self_ms in rows:
        out.append(
            f"| {name} | {calls:,} | {total:,.0f} | {self_ms:,.0f} | {total / calls:.3f} |"
            f" {self_ms / 1000 / seconds:.0%} |"
        )
    return "\n".join(out)


WAITS = """
SELECT CASE WHEN state = 'idle' THEN 'idle: waiting for the client'
            ELSE coalesce(state, 'starting') || ': ' || coalesce(wait_event_type || ':' || wait_event, 'on CPU') END
FROM pg_stat_activity
WHERE datname = current_database() AND pid <> pg_backend_pid() AND backend_type = 'client backend'
UNION ALL
SELECT '  (blocked on ' || l.locktype || ' ' || coalesce(l.classid::regclass::text, '')
       || ' ' || coalesce(l.objid::text, '') || ' ' || l.mode || ')'
FROM pg_locks l JOIN pg_stat_activity a ON a.pid = l.pid
WHERE NOT l.granted AND a.datname = current_database()
"""


class WaitSampler(threading.Thread):
    """Sample what the bench database's backends are doing (pg_stat_activity, pg_locks)."""

    def __init__(self, dsn: str, interval: float = 0.005) -> None:
        super().__init__(daemon=True)
        self.dsn, self.interval = dsn, interval
        self.counts: collections.Counter[str] = collections.Counter()
        self.samples = 0
        self.stop = threading.Event()

    def run(self) -> None:
        with psycopg.connect(self.dsn, autocommit=True) as conn:
            while not self.stop.is_set():
                for (what,) in conn.execute(WAITS).fetchall():
                    self.counts[what] += 1
                self.samples += 1
                self.stop.wait(self.interval)

    def table(self) -> str:
        idle = self.counts.get("idle: waiting for the client", 0)
        active = sum(
            n for k, n in self.counts.items() if not k.startswith("  ") and not k.startswith("idle")
        )
        if not self.samples or not active:
            return "(no samples)"
        lines = [
            f"On average {active / self.samples:.1f} backends were busy and "
            f"{idle / self.samples:.1f} idle (pooled, waiting for a request).",
            "",
            "| busy backend: wait event (or lock it is blocked on) | share of busy samples |",
            "|---|---:|",
        ]
        lines += [
            f"| {k.strip()} | {n / active:.1%} |"
            for k, n in self.counts.most_common(16)
            if not k.startswith("idle")
        ]
        return "\n".join(lines)


def pyspy(pid: int, seconds: float, out: Path) -> subprocess.Popen[bytes] | None:
    exe = shutil.which("py-spy")
    if not exe:
        return None
    return subprocess.Popen(
        [
            exe,
            "record",
            "-p",
            str(pid),
            "-d",
            str(int(seconds)),
            "-r",
            "250",
            "--format",
            "raw",
            "--nonblocking",
            "--gil",
            "-o",
            str(out),
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )


def summarise_stacks(paths: list[Path], top: int = 40) -> str:
    """Return the frames with the most samples (inclusive and exclusive) over raw stack files."""
    inclusive: collections.Counter[str] = collections.Counter()
    exclusive: collections.Counter[str] = collections.Counter()
    buckets: collections.Counter[str] = collections.Counter()
    total = 0
    for path in paths:
        if not path.exists():
            continue
        for line in path.read_text().splitlines():
            stack, _, count = line.rpartition(" ")
            if not stack or not count.isdigit():
                continue  # a frame name that spans lines (py-spy prints it as is)
            n = int(count)
            total += n
            frames = stack.split(";")
            for frame in set(frames):
                inclusive[frame] += n
            exclusive[frames[-1]] += n
            buckets[_bucket(frames)] += n
    if not total:
        return "(no samples: py-spy missing or not permitted)"
    out = [f"{total} samples", "", "Buckets (by the deepest recognised layer):", ""]
    out += [f"- {name}: {n / total:.0%}" for name, n in buckets.most_common()]
    out += ["", "Inclusive:", ""]
    out += [f"- {n / total:5.1%} {frame}" for frame, n in inclusive.most_common(top)]
    out += ["", "Exclusive (self):", ""]
    out += [f"- {n / total:5.1%} {frame}" for frame, n in exclusive.most_common(top)]
    return "\n".join(out)


LAYERS = [
    ("psycopg (driver)", ("psycopg/", "psycopg_pool/")),
    ("orjson / JSON", ("orjson", "json/")),
    ("queen.store", ("queen/store/",)),
    ("queen.api / polling", ("queen/api/", "queen/polling.py", "queen/models.py")),
    ("queen dashboard/events", ("queen/dashboard", "queen/events.py")),
    ("falcon", ("falcon/",)),
    (
        "gunicorn / gevent pywsgi (HTTP parsing, socket I/O)",
        ("gunicorn/", "gevent/pywsgi", "geventwebsocket/"),
    ),
    ("gevent hub / other", ("gevent/",)),
]


def _bucket(frames: list[str]) -> str:
    for frame in reversed(frames):
        for name, needles in LAYERS:
            if any(n in frame for n in needles):
                return name
    return "other"


def explain(dsn: str, out: Path) -> None:
    """Run push, pop, ack once with auto_explain in this session; save the nested plans."""
    notices: list[str] = []
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.add_notice_handler(lambda d: notices.append(d.message_primary or ""))
        for stmt in (
            "LOAD 'auto_explain'",
            "SET auto_explain.log_min_duration = 0",
            "SET auto_explain.log_analyze = on",
            "SET auto_explain.log_buffers = on",
            "SET auto_explain.log_nested_statements = on",
            "SET auto_explain.log_timing = on",
            "SET client_min_messages = log",
        ):
            conn.execute(stmt)  # type: ignore[arg-type]
        items = [
            {"queue": adapters.QUEUE, "partition": f"p{i % 16}", "payload": adapters.PAYLOAD}
            for i in range(100)
        ]
        body = orjson.dumps({"items": items}).decode()
        sections = []
        for title, sql, params in (
            ("push 100", "SELECT * FROM queen.push(%s::jsonb -> 'items')", (body,)),
            (
                "pop by queue, batch 100",
                "SELECT transaction_id FROM queen.pop('queue', %s, NULL, NULL, NULL,"
                " '__queue__', 100, 'profile', NULL, NULL, gen_random_uuid())",
                (adapters.QUEUE,),
            ),
        ):
            notices.clear()
            rows = conn.execute(sql, params).fetchall()  # type: ignore[arg-type]
            sections.append((title, list(notices)))
            if title.startswith("pop"):
                acks = [{"transactionId": r[0], "status": "completed"} for r in rows]
        notices.clear()
        conn.execute("SELECT * FROM queen.ack_rows(%s::jsonb)", (orjson.dumps(acks).decode(),))
        sections.append((f"ack {len(acks)}", list(notices)))
    text = []
    for title, logs in sections:
        text.append(f"==================== {title} ====================")
        text.extend(logs)
    out.write_text("\n\n".join(text))


def profile_case(
    args: argparse.Namespace, workload: str, batch: int, partitions: int, out_dir: Path
) -> str:
    dbname = f"{args.db_prefix}_profile"
    dsn = fresh_database(args.dsn, dbname)
    if args.nested:
        track_nested(args.dsn, dbname)
    server = QueenServer(dsn, workers=2).start()
    try:
        target = {"url": server.url, "dsn": dsn}
        adapters.prepare("queen", target)
        label = workload
        extra: dict[str, Any] = {"backlog_cap": max(2000, 32 * batch), "pop_wait_ms": 1000}
        consumers = (args.consumers or 8) if workload == "e2e" else 0
        if workload.startswith("fanout-"):  # as the bench's fan-out phase: 2 consumers a reader
            consumers = args.consumers or 2 * args.groups
            extra.update(
                variant=workload.removeprefix("fanout-"),
                groups=args.groups,
                backlog_cap=max(2000, 4 * batch * consumers),
            )
            workload = "fanout"
        case = Case(
            "queen",
            workload,
            batch=batch,
            partitions=partitions,
            producers=args.producers or (8 if workload == "push" else 4),
            consumers=consumers,
            processes=args.processes,
            warmup=1.0,
            duration=args.duration,
            extra=extra,
        )
        before: dict[str, Any] = {}
        tables_before: dict[str, Any] = {}
        spies: list[subprocess.Popen[bytes] | None] = []
        stack_files = [out_dir / f"pyspy-worker{i}.txt" for i in range(2)]

        waits = WaitSampler(dsn)
        counting: list[bool] = []

        def start_sampling() -> None:
            before.update(function_stats(dsn))
            tables_before.update(table_stats(dsn))
            counting.append(reset_statements(dsn))
            waits.start()
            for pid, path in zip(server.worker_pids(), stack_files, strict=False):
                spies.append(pyspy(pid, args.duration, path))

        timer = threading.Timer(1.2, start_sampling)
        timer.start()
        result = run_case(case, target, server.pids())
        timer.join()
        waits.stop.set()
        waits.join()
        after = function_stats(dsn)
        messages = result["msgs_per_s"] * args.duration
        tuples = tuple_table(tables_before, table_stats(dsn), messages)
        statements = (
            statement_table(dsn, args.duration, messages, 40 if args.nested else 15)
            if counting and counting[0]
            else "(pg_stat_statements is not loaded on this server)"
        )
        for spy in spies:
            if spy is not None:
                spy.wait(30)
        explain(dsn, out_dir / "explain.txt")
    finally:
        server.stop()
        drop_database(args.dsn, dbname)
    functions = function_table(before, after, args.duration)
    stacks = summarise_stacks(stack_files)
    lat = result["latency_ms"]
    cpu = ", ".join(f"{k} {v:.0%}" for k, v in result["cpu"].items())
    summary = "\n".join(
        [
            f"# Queen {label} batch {batch}, {partitions} partitions, {args.duration:.0f} s",
            "",
            f"- {cluster.describe(args.dsn, args.cluster)}",
            f"- throughput {result['msgs_per_s']:,.0f} msg/s; CPU: {cpu}",
            "- client-side latency ms (p50/p99): "
            + ", ".join(f"{op} {v['p50']:.1f}/{v['p99']:.1f}" for op, v in lat.items()),
            "",
            "## PostgreSQL backends: what they wait on (sampled every 5 ms)",
            "",
            waits.table(),
            "",
            "## Statements, nested ones too (pg_stat_statements, during the window; a"
            " statement's time is its run, not its executor set-up)"
            if args.nested
            else "## Top-level statements (pg_stat_statements, during the window)",
            "",
            statements,
            "",
            "## Tuples by table, catalogs too (pg_stat_all_tables, during the window)",
            "",
            tuples,
            "",
            "## SQL functions (pg_stat_user_functions, during the window)",
            "",
            functions,
            "",
            "## Python in the gunicorn workers (py-spy --gil, both workers: their CPU in Python)",
            "",
            stacks,
            "",
        ]
    )
    (out_dir / "summary.md").write_text(summary)
    return summary


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.profile")
    parser.add_argument("--dsn", default="postgresql://postgres@127.0.0.1:5432/postgres")
    parser.add_argument("--db-prefix", default="queen_bench")
    parser.add_argument("--duration", type=float, default=10.0)
    parser.add_argument(
        "--cases",
        default="e2e:1,e2e:100,push:1,push:1000",
        help="comma list of workload:batch (workloads: push, e2e, fanout-groups, fanout-copy)",
    )
    parser.add_argument("--groups", type=int, default=4, help="consumer groups of a fan-out case")
    parser.add_argument("--partitions", type=int, default=16)
    parser.add_argument("--producers", type=int, default=0, help="default 4 (e2e), 8 (push)")
    parser.add_argument("--consumers", type=int, default=0, help="default 8")
    parser.add_argument("--processes", type=int, default=2, help="client processes")
    parser.add_argument("--out", type=Path, default=BENCH_DIR / "results" / "profiles")
    parser.add_argument(
        "--nested",
        action="store_true",
        help="count the statements functions run too (pg_stat_statements.track = all)",
    )
    cluster.add_argument(parser)
    args = parser.parse_args(argv)
    with contextlib.ExitStack() as stack:
        args.dsn = cluster.server_dsn(args.dsn, args.cluster, stack, "pg_stat_statements")
        run(args)
    return 0


def run(args: argparse.Namespace) -> None:
    for spec in args.cases.split(","):
        workload, batch = spec.split(":")
        partitions = 1 if workload == "push" else args.partitions
        out_dir = args.out / f"{workload}-b{batch}-p{partitions}"
        out_dir.mkdir(parents=True, exist_ok=True)
        print(profile_case(args, workload, int(batch), partitions, out_dir))


if __name__ == "__main__":
    raise SystemExit(main())
