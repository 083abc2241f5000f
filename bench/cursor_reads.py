"""Latency of the read endpoints' store calls on the cursor store with 1 million messages.

    python -m bench.cursor_reads [--dsn DSN | --cluster] [--messages 1000000] [--runs 50]
        [--out FILE]

A database of its own on the server of --dsn (built by `queen migrate`'s code) gets one
queue of 16 partitions holding --messages messages, written as pushes write them (ids
from the identity, in order within a partition), of which queue mode has consumed half
of each partition: its cursor stands there, one completion record per 1,000 messages,
1% of them dead-lettered; then a real pop leases 100 more in each partition. A second
queue holds a few messages. Maintenance's count rollup runs until caught up and the
tables are ANALYZEd. Each call behind a read endpoint (Store with storage 'cursors', as
the API calls it) then runs --runs times: p50 and p99 in ms. Then 10% more messages
arrive and 5% more are consumed with no rollup step, and the count reads run again (the
walks past the watermarks).
"""

from __future__ import annotations

import argparse
import contextlib
import statistics
import sys
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import psycopg
from psycopg import sql

from bench import cluster
from queen.store import Store, lifecycle
from queen.store.admin import MessageFilter
from queen.store.analytics import Filters
from queen.store.db import Database
from queen.store.migrate import migrate

PARTITIONS = 16
ACK_RANGE = 1000  # messages per completion record of the seeded consumption
DEAD_EVERY = 100  # one in this many consumed messages is dead-lettered

SEED = """
INSERT INTO queen.messages (partition_id, transaction_id, payload, created_at)
SELECT p.id, format('%%s-%%s', p.name, g), jsonb_build_object('n', g),
       now() - interval '30 minutes' + g * interval '1 millisecond'
FROM queen.partitions p JOIN queen.queues q ON q.id = p.queue_id,
     generate_series(%(first)s::integer, %(last)s::integer) g
WHERE q.name = %(queue)s
ORDER BY p.id, g
"""

CONSUME = """
WITH target AS (
    SELECT p.id AS partition_id,
           (SELECT m.id FROM queen.messages m WHERE m.partition_id = p.id
            ORDER BY m.id OFFSET %(upto)s::integer - 1 LIMIT 1) AS upto,
           coalesce(c.cursor_id, 0) AS since
    FROM queen.partitions p JOIN queen.queues q ON q.id = p.queue_id
    LEFT JOIN queen.consumers c ON c.partition_id = p.id AND c.consumer_group = '__queue__'
    WHERE q.name = %(queue)s
), consumed AS (
    SELECT t.partition_id, m.id, row_number() OVER (PARTITION BY t.partition_id ORDER BY m.id) AS n
    FROM target t JOIN queen.messages m
      ON m.partition_id = t.partition_id AND m.id > t.since AND m.id <= t.upto
), dead AS (
    INSERT INTO queen.failures
        (partition_id, consumer_group, message_id, status, retry_count, error)
    SELECT c.partition_id, '__queue__', c.id, 'dead_letter', 0, 'boom'
    FROM consumed c WHERE c.n %% %(dead_every)s::integer = 0
), acks AS (
    INSERT INTO queen.completions (partition_id, consumer_group, first_id, last_id, acked)
    SELECT c.partition_id, '__queue__', min(c.id), max(c.id), count(*)
    FROM consumed c GROUP BY c.partition_id, (c.n - 1) / %(ack_range)s::integer
)
UPDATE queen.consumers x SET cursor_id = t.upto
FROM target t WHERE x.partition_id = t.partition_id AND x.consumer_group = '__queue__'
"""

Conn = psycopg.Connection[Any]


@contextlib.contextmanager
def bench_database(dsn: str) -> Iterator[str]:
    """A new database migrated for Queen; dropped afterwards."""
    name = f"queen_bench_reads_{uuid.uuid4().hex[:8]}"
    with psycopg.connect(dsn, autocommit=True) as admin:
        admin.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
    target = psycopg.conninfo.make_conninfo(dsn, dbname=name)
    try:
        migrate(target)
        yield target
    finally:
        with psycopg.connect(dsn, autocommit=True) as admin:
            admin.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(
                sql.Identifier(name)))


def seed(conn: Conn, messages: int) -> None:
    """The queue, its messages, queue mode's consumption and a lease per partition."""
    per = messages // PARTITIONS
    lifecycle.push(conn, [{"queue": "bench", "partition": f"p{i:02d}", "payload": {"n": -1},
                         "transactionId": f"first-{i}"} for i in range(PARTITIONS)])
    lifecycle.push(conn, [{"queue": "small", "payload": {"n": i}} for i in range(10)])
    for first in range(0, per, 50_000):
        conn.execute(SEED, {"queue": "bench", "first": first,
                            "last": min(per, first + 50_000) - 1})
    for i in range(PARTITIONS):  # queue mode's first pop makes its rows; acked at once
        got = lifecycle.pop(conn, "bench", partition=f"p{i:02d}", batch=1)
        lifecycle.ack(conn, [{"transactionId": d.transaction_id, "status": "completed"}
                           for d in got])
    consume(conn, per // 2)
    for i in range(PARTITIONS):
        lifecycle.pop(conn, "bench", partition=f"p{i:02d}", batch=100, worker="bench")


def consume(conn: Conn, upto: int) -> None:
    """Queue mode has consumed each partition up to its upto-th message."""
    conn.execute(CONSUME, {"queue": "bench", "upto": upto, "dead_every": DEAD_EVERY,
                           "ack_range": ACK_RANGE})


def refresh(conn: Conn) -> None:
    while conn.execute("SELECT queen.count_refresh(200, 5000)").fetchone() != (0,):
        pass


def calls(store: Store, per: int) -> dict[str, Callable[[], object]]:
    """One call per read endpoint, as its resource makes it."""
    a, admin, dash = store.analytics, store.admin, store.dashboard
    bench = Filters(queue="bench")
    return {
        "GET /analytics/queue/:q, /resources/queues/:q, queue-depths": lambda: a.queues(bench),
        "GET /analytics/queues, /resources/queues (all)": lambda: a.queues(),
        "GET /resources/queues/:q (message span)": lambda: a.message_span("bench"),
        "GET /resources/namespaces": lambda: a.labels("namespace"),
        "GET /resources/overview": a.overview,
        "GET /metrics/prometheus (queue totals)": a.queue_totals,
        "GET /analytics/throughput?queue=": lambda: a.throughput(bench),
        "GET /analytics/queue-lag?queue=": lambda: a.lag(bench),
        "GET /messages?limit=100": lambda: admin.page(MessageFilter(), 101, 0),
        "GET /messages?queue=&offset=1000": lambda: admin.page(MessageFilter("bench"), 101, 1000),
        "GET /messages?queue=&status=pending": lambda: admin.page(
            MessageFilter("bench", status="pending"), 101, 0),
        "GET /messages?queue=&status=processing": lambda: admin.page(
            MessageFilter("bench", status="processing"), 101, 0),
        "GET /messages?queue=&status=completed": lambda: admin.page(
            MessageFilter("bench", status="completed"), 101, 0),
        "GET /messages?queue=&status=dead_letter": lambda: admin.page(
            MessageFilter("bench", status="dead_letter"), 101, 0),
        "GET /messages?partition=&status=pending": lambda: admin.page(
            MessageFilter("bench", "p03", status="pending"), 101, 0),
        "GET /messages/:txid": lambda: admin.get(f"p05-{per // 5}"),
        "GET /messages/:txid/related": lambda: admin.related(f"p05-{per * 2 // 3}", 100),
        "dashboard depths": dash.depths,
        "dashboard recent": dash.recent,
        "dashboard locate (auth of message routes)": lambda: dash.locate([f"p01-{per // 7}", f"p02-{per // 9}"]),
    }


def measure(call: Callable[[], object], runs: int) -> tuple[float, float]:
    """p50 and p99 in ms (the first call warms up and is left out)."""
    call()
    times = []
    for _ in range(runs):
        start = time.perf_counter()
        call()
        times.append((time.perf_counter() - start) * 1000)
    times.sort()
    return statistics.median(times), times[min(len(times) - 1, int(len(times) * 0.99))]


def table(rows: list[tuple[str, float, float]]) -> str:
    lines = ["| call | p50 ms | p99 ms |", "|---|---:|---:|"]
    lines += [f"| {name} | {p50:.1f} | {p99:.1f} |" for name, p50, p99 in rows]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dsn", default="postgresql://postgres@127.0.0.1:5432/postgres")
    parser.add_argument("--messages", type=int, default=1_000_000)
    parser.add_argument("--runs", type=int, default=50)
    parser.add_argument("--out", type=Path, default=Path("bench/results/cursor-reads.md"))
    cluster.add_argument(parser)
    args = parser.parse_args(argv)
    with contextlib.ExitStack() as stack:
        args.dsn = cluster.server_dsn(args.dsn, args.cluster, stack)
        return run(args)


def run(args: argparse.Namespace) -> int:
    with bench_database(args.dsn) as dsn, psycopg.connect(dsn, autocommit=True) as conn:
        server = conn.execute(
            "SELECT format('PostgreSQL %s, autovacuum %s', current_setting('server_version'),"
            " current_setting('autovacuum'))").fetchone()
        where = cluster.origin(args.dsn, args.cluster)
        started = time.monotonic()
        seed(conn, args.messages)
        refresh(conn)
        conn.execute("ANALYZE")
        print(f"seeded in {time.monotonic() - started:.0f} s", file=sys.stderr, flush=True)
        store = Store(Database(dsn, pool_size=2, timeout_s=30))
        store.db.pool.open(wait=True)
        try:
            per = args.messages // PARTITIONS
            fresh = [(name, *measure(call, args.runs)) for name, call in calls(store, per).items()]
            conn.execute(SEED, {"queue": "bench", "first": per, "last": per + per // 10 - 1})
            consume(conn, per // 2 + per // 20)
            counted = {k: v for k, v in calls(store, per).items()
                       if k.startswith(("GET /analytics", "GET /resources/overview",
                                        "dashboard depths"))}
            stale = [(name, *measure(call, args.runs)) for name, call in counted.items()]
        finally:
            store.close()
    text = "\n".join([
        "# Read endpoints on the cursor store",
        "",
        f"`python -m bench.cursor_reads --messages {args.messages} --runs {args.runs}`: "
        f"one run on {server[0] if server else '?'} ({where}; this shared 2-core machine, "
        "other work running); the store call behind each endpoint, through a Store with storage "
        f"'cursors', {args.runs} calls each after one warm-up. {args.messages:,} messages in "
        f"{PARTITIONS} partitions, half of each consumed by queue mode (1% dead-lettered, one "
        "completion record per 1,000), a lease of 100 live in each; the count rollup caught "
        "up and statistics taken.",
        "",
        table(fresh),
        "",
        f"Then {args.messages // 10:,} more messages and {args.messages // 20:,} more consumed "
        "with no rollup step (maintenance stopped): the count reads walk what lies past the "
        "watermarks.",
        "",
        table(stale),
        "",
    ])
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(text, encoding="utf-8")
    print(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
