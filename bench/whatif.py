"""`python -m bench.whatif`: measure candidate server changes before anyone makes them.

Runs Queen's own SQL (the queen_sql client: the cursor store's named queries over
psycopg, no HTTP) on a
scratch database, first as the schema is, then with one change applied to that
database only (never to the repository):

- no_notify: queen.wake becomes a no-op, i.e. no NOTIFY inside the writing
  transactions that still send one (maintenance, transactions; pushes and acks send
  theirs after commit);
- async_commit: synchronous_commit = off for every session of the database (what it
  would save on pop and ack, whose loss on a crash only means a redelivery).
Prints one markdown table; the numbers go to docs/PERFORMANCE.md.
"""

from __future__ import annotations

import argparse
import contextlib
from typing import Any

import psycopg
from psycopg import sql

from bench import adapters, cluster
from bench.report import fmt, latency_of
from bench.runner import Case, run_case
from bench.systems import drop_database, fresh_database

VARIANTS = {
    "as is": [],
    "no NOTIFY in the transaction": [
        "CREATE OR REPLACE FUNCTION queen.wake(p_partitions uuid[]) RETURNS void"
        " LANGUAGE sql AS $$ SELECT $$",
    ],
    "synchronous_commit off": ["ALTER DATABASE {db} SET synchronous_commit = off"],
}


def cases(duration: float) -> list[Case]:
    common: dict[str, Any] = {"warmup": 1.0, "duration": duration, "processes": 2}
    return [
        Case("queen_sql", "push", batch=1, producers=8, **common),
        Case("queen_sql", "push", batch=1000, producers=8, **common),
        Case(
            "queen_sql",
            "e2e",
            batch=1,
            partitions=16,
            producers=4,
            consumers=8,
            **common,
            extra={"backlog_cap": 2000},
        ),
        Case(
            "queen_sql",
            "e2e",
            batch=100,
            partitions=16,
            producers=4,
            consumers=8,
            **common,
            extra={"backlog_cap": 3200},
        ),
        Case(
            "queen_sql",
            "latency",
            producers=1,
            consumers=1,
            warmup=1.0,
            duration=duration,
            extra={"prefill_batches": 20, "prefill_batch": 100, "probe_pause": 0.005},
        ),
    ]


def apply(server_dsn: str, dsn: str, dbname: str, statements: list[str]) -> None:
    with psycopg.connect(dsn, autocommit=True) as conn:
        for statement in statements:
            if "{db}" in statement:
                stmt = sql.SQL(statement.replace("{db}", "{}")).format(sql.Identifier(dbname))
                conn.execute(stmt)
            else:
                conn.execute(statement)  # type: ignore[arg-type]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.whatif")
    parser.add_argument("--dsn", default="postgresql://postgres@127.0.0.1:5432/postgres")
    parser.add_argument("--duration", type=float, default=6.0)
    cluster.add_argument(parser)
    args = parser.parse_args(argv)
    with contextlib.ExitStack() as stack:
        args.dsn = cluster.server_dsn(args.dsn, args.cluster, stack)
        print(cluster.describe(args.dsn, args.cluster), end="\n\n")
        return run(args)


def run(args: argparse.Namespace) -> int:
    from queen.store.migrate import migrate

    rows = []
    for variant, statements in VARIANTS.items():
        dbname = "queen_bench_whatif"
        dsn = fresh_database(args.dsn, dbname)
        try:
            migrate(dsn)
            apply(args.dsn, dsn, dbname, statements)
            for case in cases(args.duration):
                adapters.prepare("queen_sql", {"dsn": dsn})
                result = run_case(case, {"dsn": dsn}, [])
                rows.append((variant, case.label, result))
        finally:
            drop_database(args.dsn, dbname)
    print("| variant | case | msg/s | pop p50 ms | pop p99 ms | ack p50 ms | push p50 ms |")
    print("|---|---|---:|---:|---:|---:|---:|")
    for variant, label, r in rows:
        shown = [("pop", "p50"), ("pop", "p99"), ("ack", "p50"), ("push", "p50")]
        cells = " | ".join(fmt(latency_of(r, q, op), 2) for op, q in shown)
        print(f"| {variant} | {label} | {fmt(r['msgs_per_s'])} | {cells} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
