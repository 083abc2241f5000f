"""The cost of the consumer-group routes' backlogs: bounded counts against a full count.

    python -m bench.group_listing [--dsn DSN | --cluster] [--per-partition 625 62500] [--rounds 5]

For each backlog size, a database of its own on the server of --dsn (built by `queen
migrate`'s code): one queue of 16 partitions holding --per-partition messages each, 4
groups that popped one batch, statistics taken and the table vacuumed. Then, side by side,
the median of --rounds calls of: the full count (queen.group_list, every message
past each cursor), the listing (queen.group_summaries: at most 1,000 a partition
and 50,000 in all) and one group's description (queen.group_partitions: 10,000 a
partition, 200,000 in all), with the limits queen.store.groups uses.
"""

from __future__ import annotations

import argparse
import contextlib
import statistics
import time
import uuid
from collections.abc import Iterator
from typing import Any

import psycopg
from psycopg import sql

from bench import cluster
from queen.store import lifecycle
from queen.store.migrate import migrate

PARTITIONS = 16
GROUPS = 4
STATEMENTS = {
    "full count": "SELECT * FROM queen.group_list('big')",
    "listing": "SELECT * FROM queen.group_summaries('big', NULL, 1000, 50000)",
    "one group": "SELECT * FROM queen.group_partitions('big', 'g0', 10000, 200000)",
}


@contextlib.contextmanager
def database(dsn: str) -> Iterator[str]:
    name = f"queen_bench_groups_{uuid.uuid4().hex[:8]}"
    with psycopg.connect(dsn, autocommit=True) as admin:
        admin.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
    try:
        yield psycopg.conninfo.make_conninfo(dsn, dbname=name)
    finally:
        with psycopg.connect(dsn, autocommit=True) as admin:
            admin.execute(
                sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name))
            )


def seed(conn: psycopg.Connection[Any], per_partition: int) -> None:
    items = [{"queue": "big", "partition": f"p{i}", "payload": 0} for i in range(PARTITIONS)]
    lifecycle.push(conn, items)
    conn.execute(
        "INSERT INTO queen.messages (partition_id, transaction_id, payload)"
        " SELECT p.id, p.name || '-' || g, '{\"n\": 1}'::jsonb"
        " FROM queen.partitions p, generate_series(1, %s) g ORDER BY p.id, g",
        (per_partition,),
    )
    for g in range(GROUPS):
        lifecycle.pop(conn, "big", group=f"g{g}", batch=10)
    conn.execute("VACUUM ANALYZE queen.messages")


def median_ms(conn: psycopg.Connection[Any], statement: str, rounds: int) -> float:
    times = []
    for _ in range(rounds):
        started = time.perf_counter()
        conn.execute(statement).fetchall()  # type: ignore[arg-type]
        times.append((time.perf_counter() - started) * 1000)
    return statistics.median(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dsn", default="postgresql://postgres@127.0.0.1:5432/postgres")
    parser.add_argument("--per-partition", type=int, nargs="+", default=[625, 62500])
    parser.add_argument("--rounds", type=int, default=5)
    cluster.add_argument(parser)
    args = parser.parse_args()
    with contextlib.ExitStack() as stack:
        args.dsn = cluster.server_dsn(args.dsn, args.cluster, stack)
        run(args)


def run(args: argparse.Namespace) -> None:
    print(cluster.describe(args.dsn, args.cluster), end="\n\n")
    print(f"| messages | {' | '.join(STATEMENTS)} |")
    print(f"|---:|{'---:|' * len(STATEMENTS)}")
    for per_partition in args.per_partition:
        with database(args.dsn) as dsn:
            migrate(dsn)
            with psycopg.connect(dsn, autocommit=True) as conn:
                seed(conn, per_partition)
                cells = [f"{median_ms(conn, s, args.rounds):.1f} ms" for s in STATEMENTS.values()]
        print(f"| {PARTITIONS * per_partition:,} | {' | '.join(cells)} |")


if __name__ == "__main__":
    main()
