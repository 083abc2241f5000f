"""Seed a Queen database with a large, realistic backlog for read-path benchmarks.

    python -m bench.seed --dsn postgresql://postgres@127.0.0.1/queen_bench \
        --messages 10000000 --partitions 1000 --queues 20

Messages are generated inside PostgreSQL (INSERT ... SELECT generate_series, in chunks,
with the usual triggers on) so 10 million rows take minutes, not hours: about 70%
completed, 20% pending, 6% failed and 4% dead_letter, spread over the last
--hours hours. The status deltas are then folded into partition_counts, and
--metrics-hours of per-minute activity per partition are synthesised into
metrics_minute (what throughput and queue-lag read on a busy system).
"""

from __future__ import annotations

import argparse
import sys
import time

import psycopg

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
# created at start + i * step, so ids, seq and created_at all grow together.
INSERT_CHUNK = """
WITH parts AS (
    SELECT array_agg(p.id ORDER BY p.name) AS ids FROM queen.partitions p
    JOIN queen.queues q ON q.id = p.queue_id WHERE q.name LIKE 'bench-%%'
), gen AS (
    SELECT i, %(start)s::timestamptz + i * %(step)s::interval AS created_at,
           abs(hashint8(i)) %% 100 AS roll, queen.uuid_v7() AS u
    FROM generate_series(%(first)s::bigint, %(first)s::bigint + %(size)s - 1) i
)
INSERT INTO queen.messages (transaction_id, id, partition_id, payload, status, retry_count,
                            created_at, locked_at, completed_at, failed_at, error_message)
SELECT gen.u::text, gen.u, parts.ids[1 + gen.i %% cardinality(parts.ids)],
       jsonb_build_object('order', gen.i, 'customer', 'c-' || (gen.i %% 9973),
                          'amount', (gen.i %% 10000) / 100.0, 'note', 'seeded message'),
       s.status,
       CASE WHEN s.status IN ('failed', 'dead_letter') THEN 3 ELSE 0 END,
       gen.created_at,
       CASE WHEN s.status <> 'pending' THEN gen.created_at + interval '50 ms' END,
       CASE WHEN s.status = 'completed'
            THEN gen.created_at + (50 + gen.roll * 37) * interval '1 ms' END,
       CASE WHEN s.status IN ('failed', 'dead_letter') THEN gen.created_at + interval '2 s' END,
       CASE WHEN s.status IN ('failed', 'dead_letter') THEN 'seeded failure' END
FROM gen CROSS JOIN parts
CROSS JOIN LATERAL (SELECT CASE WHEN gen.roll < 70 THEN 'completed'
                                WHEN gen.roll < 90 THEN 'pending'
                                WHEN gen.roll < 96 THEN 'failed'
                                ELSE 'dead_letter' END AS status) s
"""

# Per-minute activity of every bench partition over one hour ending at %(until)s.
SYNTH_METRICS = """
INSERT INTO queen.metrics_minute AS m
    (minute, queue, partition, incoming, popped, completed, failed, dead_letter, lag_ms, lag_hist)
SELECT mi, q.name, p.name, 60 + r %% 40, 58 + r %% 40, 55 + r %% 40, r %% 3, (r %% 7 = 0)::int,
       (55 + r %% 40) * (200 + r * 10), h.hist
FROM generate_series(%(until)s::timestamptz - interval '59 minutes', %(until)s::timestamptz,
                     interval '1 minute') mi
CROSS JOIN queen.partitions p
JOIN queen.queues q ON q.id = p.queue_id AND q.name LIKE 'bench-%%'
CROSS JOIN LATERAL (SELECT abs(hashtext(p.name || mi::text)) %% 50 AS r) x
CROSS JOIN LATERAL (
    SELECT array_agg(CASE WHEN b BETWEEN 14 + x.r %% 4 AND 19 + x.r %% 4 THEN 9 + b %% 3 ELSE 0 END
                     ORDER BY b) AS hist
    FROM generate_series(0, 63) b) h
ON CONFLICT (minute, queue, partition) DO NOTHING
"""


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
        fold(conn)
        if args.metrics_hours:
            synthesise_metrics(conn, args.metrics_hours)
        log("vacuum analyze")
        conn.execute("VACUUM (ANALYZE) queen.messages")
        conn.execute("VACUUM (ANALYZE) queen.partitions")
        conn.execute("VACUUM (ANALYZE) queen.metrics_minute")
        conn.execute("VACUUM (ANALYZE) queen.partition_counts")
        conn.execute("VACUUM (ANALYZE) queen.status_deltas")
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
        if args.fold_every and done % (args.fold_every) < chunk:
            fold(conn, quiet=True)


def time_ago(conn: psycopg.Connection, hours: float) -> object:
    row = conn.execute("SELECT now() - %s * interval '1 hour'", (hours,)).fetchone()
    assert row is not None
    return row[0]


def fold(conn: psycopg.Connection, quiet: bool = False) -> None:
    folded = 0
    while True:
        row = conn.execute("SELECT queen.fold_deltas(100000)").fetchone()
        if not row or not row[0]:
            break
        folded += row[0]
    if not quiet:
        log(f"folded {folded:,} status deltas into partition_counts")


def synthesise_metrics(conn: psycopg.Connection, hours: int) -> None:
    (now,) = conn.execute("SELECT date_trunc('minute', now())").fetchone() or (None,)
    for h in range(hours):
        until = conn.execute("SELECT %s::timestamptz - %s * interval '1 hour'", (now, h)).fetchone()
        assert until is not None
        conn.execute(SYNTH_METRICS, {"until": until[0]})
        log(f"metrics_minute: hour {h + 1}/{hours}")


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
        "--fold-every",
        type=int,
        default=2_000_000,
        help="fold status deltas after this many rows (0: only at the end)",
    )
    parser.add_argument(
        "--metrics-hours",
        type=int,
        default=24,
        help="hours of synthetic per-minute metrics per partition",
    )
    parser.add_argument(
        "--skip-migrate", action="store_true", help="the schema is already in place"
    )
    seed(parser.parse_args(argv))
    return 0


if __name__ == "__main__":
    sys.exit(main())
