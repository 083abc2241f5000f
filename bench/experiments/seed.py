"""Seed a Queen database with a large, realistic backlog for read benchmarks.

    python -m bench.experiments.seed --dsn postgresql://postgres@127.0.0.1/queen_bench \
        --messages 10000000 --partitions 1000 --queues 20

Messages are generated inside PostgreSQL (INSERT ... SELECT generate_series into
queen.messages, in chunks) so 10 million take minutes, not hours, spread over the
last --hours hours. Queue mode has then consumed the oldest 80% of each partition (its
cursor stands there): about 70% completed, 20% pending, 6% failed and 4% dead_letter.
Maintenance's count rollups are brought up to date (queen.partition_counts, and the
per-minute activity in queen.metrics_minute that throughput and queue-lag read),
and the tables ANALYZEd when the server runs without autovacuum.
"""

from __future__ import annotations

import argparse
import sys
import time

import psycopg

from bench.backlog import analyze_if_unattended
from queen.store.migrate import migrate

NAMESPACES = ("billing", "shipping", "marketing", None)
TASKS = ("invoices", "labels", "emails", "reports", None)

CREATE_QUEUES = """
INSERT INTO queen.queues (name, namespace, task, priority)
SELECT 'bench-' || lpad(q::text, 3, '0'),
       (%(namespaces)s::text[])[1 + q %% cardinality(%(namespaces)s::text[])],
       (%(tasks)s::text[])[1 + q %% cardinality(%(tasks)s::text[])],
       q %% 3
FROM generate_series(0, %(queues)s - 1) q
ON CONFLICT (name) DO NOTHING
"""

CREATE_PARTITIONS = """
INSERT INTO queen.partitions (queue_id, name)
SELECT q.id, 'p-' || lpad(i::text, 5, '0')
FROM generate_series(0, %(partitions)s - 1) i
JOIN (SELECT id, row_number() OVER (ORDER BY name) - 1 AS n FROM queen.queues
      WHERE name LIKE 'bench-%%') q ON q.n = i %% %(queues)s
ON CONFLICT (queue_id, name) DO NOTHING
"""

# One chunk of messages, numbered first .. first + size - 1 of total; message i is
# created at start + i * step. Ids come from the identity in i order, so within a partition
# ids and created_at grow together (as pushes make them).
INSERT_CHUNK = """
WITH parts AS (
    SELECT array_agg(p.id ORDER BY p.name) AS ids FROM queen.partitions p
    JOIN queen.queues q ON q.id = p.queue_id WHERE q.name LIKE 'bench-%%'
)
INSERT INTO queen.messages (partition_id, transaction_id, payload, created_at)
SELECT parts.ids[1 + i %% cardinality(parts.ids)], queen.uuid_v7()::text,
       jsonb_build_object('order', i, 'customer', 'c-' || (i %% 9973),
                          'amount', (i %% 10000) / 100.0, 'note', 'seeded message'),
       %(start)s::timestamptz + i * %(step)s::interval
FROM parts, generate_series(%(first)s::bigint, %(first)s::bigint + %(size)s - 1) i
ORDER BY i
"""

# Queue mode of one queue has consumed the oldest 80% of each partition: its cursor stands
# there; of what it passed, 6 in 80 failed and 4 in 80 were dead-lettered (3 retries each,
# failure records), the rest completed, one completion record per ACK_RANGE messages.
CONSUME = """
WITH ranked AS (
    SELECT m.partition_id, m.id, m.created_at,
           row_number() OVER (PARTITION BY m.partition_id ORDER BY m.id) AS n,
           count(*) OVER (PARTITION BY m.partition_id) AS total
    FROM queen.consumers c
    JOIN queen.messages m ON m.partition_id = c.partition_id AND m.id > c.cursor_id
    WHERE c.queue_id = %(queue)s AND c.consumer_group = '__queue__'
), consumed AS (
    SELECT r.*, abs(hashint8(r.id)) %% 80 AS roll FROM ranked r WHERE r.n * 10 <= r.total * 8
), failures AS (
    INSERT INTO queen.failures
        (partition_id, consumer_group, message_id, status, retry_count, error, failed_at)
    SELECT c.partition_id, '__queue__', c.id, CASE WHEN c.roll < 6 THEN 'failed' ELSE 'dead_letter' END,
           3, 'seeded failure', c.created_at + interval '2 s'
    FROM consumed c WHERE c.roll < 10
), completions AS (
    INSERT INTO queen.completions
        (partition_id, consumer_group, first_id, last_id, acked, acked_at)
    SELECT c.partition_id, '__queue__', min(c.id), max(c.id), count(*) FILTER (WHERE c.roll >= 10),
           max(c.created_at) + (50 + min(c.roll) * 37) * interval '1 ms'
    FROM consumed c GROUP BY c.partition_id, (c.n - 1) / %(ack_range)s
)
UPDATE queen.consumers x SET cursor_id = u.upto, updated_at = now()
FROM (SELECT c.partition_id, max(c.id) AS upto FROM consumed c GROUP BY 1) u
WHERE x.partition_id = u.partition_id AND x.consumer_group = '__queue__'
"""
ACK_RANGE = 10  # messages per completion record of the seeded consumption
FILLED = (
    "queen.queues",
    "queen.partitions",
    "queen.messages",
    "queen.consumer_groups",
    "queen.consumers",
    "queen.failures",
    "queen.completions",
    "queen.partition_counts",
    "queen.metrics_minute",
)


def log(message: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {message}", flush=True)


def seed(args: argparse.Namespace) -> None:
    if not args.skip_migrate:
        applied = migrate(args.dsn)
        if applied:
            log(f"applied migrations: {', '.join(applied)}")
    with psycopg.connect(args.dsn, autocommit=True) as conn:
        conn.execute("SET statement_timeout = 0")
        conn.execute(
            CREATE_QUEUES,
            {"queues": args.queues, "namespaces": list(NAMESPACES), "tasks": list(TASKS)},
        )
        conn.execute(CREATE_PARTITIONS, {"partitions": args.partitions, "queues": args.queues})
        log(f"{args.queues} queues, {args.partitions} partitions")
        insert_messages(conn, args)
        consume(conn)
        refresh(conn)
        analyze_if_unattended(conn, FILLED)
    log("done")


def insert_messages(conn: psycopg.Connection, args: argparse.Namespace) -> None:
    total, chunk = args.messages, args.chunk
    step_ms = args.hours * 3_600_000 / max(total, 1)
    start = time_ago(conn, args.hours)
    started = time.monotonic()
    done = 0
    while done < total:
        size = min(chunk, total - done)
        conn.execute(
            INSERT_CHUNK,
            {
                "first": done,
                "size": size,
                "step": f"{step_ms} milliseconds",
                "start": start,
            },
        )
        done += size
        rate = done / (time.monotonic() - started)
        log(f"messages {done:,}/{total:,} ({rate:,.0f}/s)")


def time_ago(conn: psycopg.Connection, hours: float) -> object:
    row = conn.execute("SELECT now() - %s * interval '1 hour'", (hours,)).fetchone()
    assert row is not None
    return row[0]


def consume(conn: psycopg.Connection) -> None:
    """Queue mode's cursors, as its first pop makes them, then its consumption (CONSUME)."""
    queues = [
        r[0]
        for r in conn.execute("SELECT id FROM queen.queues WHERE name LIKE 'bench-%' ORDER BY name")
    ]
    for queue in queues:
        conn.execute("SELECT queen.join_group(%s, '__queue__', 'all', NULL)", (queue,))
        conn.execute("SELECT queen.ensure_cursors(%s, '__queue__')", (queue,))
        conn.execute(CONSUME, {"queue": queue, "ack_range": ACK_RANGE})
    log(f"queue mode consumed 80% of each partition of {len(queues)} queues")


def refresh(conn: psycopg.Connection) -> None:
    """Maintenance's count rollups (queen.partition_counts, metrics_minute) caught up."""
    (partitions,) = conn.execute("SELECT count(*) FROM queen.partitions").fetchone() or (0,)
    while conn.execute(
        "SELECT queen.count_refresh(%s, 100000)", (partitions,)
    ).fetchone() != (0,):
        pass
    log("count rollups caught up")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dsn", default="postgresql://postgres@127.0.0.1:5432/queen_bench")
    parser.add_argument("--messages", type=int, default=10_000_000)
    parser.add_argument("--partitions", type=int, default=1000)
    parser.add_argument("--queues", type=int, default=20)
    parser.add_argument(
        "--hours", type=float, default=24.0, help="spread created_at over this many past hours"
    )
    parser.add_argument("--chunk", type=int, default=250_000, help="rows per INSERT")
    parser.add_argument(
        "--skip-migrate", action="store_true", help="the schema is already in place"
    )
    seed(parser.parse_args(argv))
    return 0


if __name__ == "__main__":
    sys.exit(main())
