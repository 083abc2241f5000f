"""Seed the cursor store with a large pending backlog directly in SQL (no HTTP).

A bulk INSERT into queen.messages keeps what queen.push_rows keeps: the queue and
its partitions exist, ids come from the table's identity (so later pushes draw past them),
each partition's push lock is held until the chunk commits (ids of a partition commit in
order), and the count rollups (queen.partition_counts and the minute's arrivals in
queen.metrics_minute) already count the seeded messages, as maintenance would have
once caught up: it does not walk ten million messages during the measurement.
"""

from __future__ import annotations

import uuid
from typing import Any

import psycopg

SEED_CHUNK = 500_000  # rows per transaction

SEED_QUEUE = """
INSERT INTO queen.queues (name) VALUES (%(queue)s) ON CONFLICT (name) DO NOTHING;
"""
SEED_PARTITIONS = """
INSERT INTO queen.partitions (queue_id, name)
SELECT q.id, 'p' || g FROM queen.queues q, generate_series(0, %(partitions)s::integer - 1) g
WHERE q.name = %(queue)s
ON CONFLICT (queue_id, name) DO NOTHING
"""
PARTITION_IDS = """
SELECT array_agg(p.id ORDER BY p.name) FROM queen.partitions p
JOIN queen.queues q ON q.id = p.queue_id WHERE q.name = %(queue)s
"""
# Push locks in partition id order (as queen.push_rows takes them), then the count rows
# (as queen.counts_lock does), so a count refresh running meanwhile sees all or none.
LOCKS = (
    "SELECT count(pg_advisory_xact_lock(queen.push_lock_key(p)))"
    " FROM unnest(%(ids)s::uuid[]) p",
    "SELECT queen.counts_lock(%(ids)s::uuid[])",
)
SEED_MESSAGES = """
WITH stored AS (
    INSERT INTO queen.messages (partition_id, transaction_id, payload)
    SELECT (%(ids)s::uuid[])[1 + g %% cardinality(%(ids)s::uuid[])], %(tag)s || g,
           '{"kind": "bench", "body": "xxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxx"}'::jsonb
    FROM generate_series(%(first)s::bigint, %(last)s::bigint) g
    ORDER BY 1, g
    RETURNING partition_id, id
), per_partition AS (
    SELECT partition_id, count(*) AS n, max(id) AS newest FROM stored GROUP BY partition_id
), counted AS (
    UPDATE queen.partition_counts k
    SET total = k.total + s.n, counted_id = s.newest, refreshed_at = now()
    FROM per_partition s
    WHERE k.partition_id = s.partition_id AND k.counted_id = (
        SELECT coalesce(max(m.id), 0) FROM queen.messages m
        WHERE m.partition_id = s.partition_id)
    RETURNING k.partition_id, s.n
)
INSERT INTO queen.metrics_minute AS t (minute, partition_id, incoming)
SELECT date_trunc('minute', now()), c.partition_id, c.n FROM counted c
ON CONFLICT (minute, partition_id) DO UPDATE SET incoming = t.incoming + EXCLUDED.incoming
"""
FILLED = (
    "queen.queues",
    "queen.partitions",
    "queen.messages",
    "queen.partition_counts",
    "queen.metrics_minute",
)


def seed_queen(dsn: str, queue: str, total: int, partitions: int) -> None:
    """Insert `total` pending messages spread over `partitions` partitions of `queue`."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(SEED_QUEUE, {"queue": queue})
        conn.execute(SEED_PARTITIONS, {"queue": queue, "partitions": partitions})
        row = conn.execute(PARTITION_IDS, {"queue": queue}).fetchone()
        ids = row[0] if row else []
        tag = f"seed-{uuid.uuid4().hex[:8]}-"  # transaction ids unique across seedings
        done = 0
        while done < total:
            n = min(SEED_CHUNK, total - done)
            with conn.transaction():
                for lock in LOCKS:
                    conn.execute(lock, {"ids": ids})
                conn.execute(
                    SEED_MESSAGES, {"ids": ids, "tag": tag, "first": done, "last": done + n - 1}
                )
            done += n
        analyze_if_unattended(conn, FILLED)


def analyze_if_unattended(conn: psycopg.Connection[Any], tables: tuple[str, ...]) -> None:
    """ANALYZE tables on a server without autovacuum (nothing else would); with it, leave
    the statistics to autovacuum, as on a real server."""
    row = conn.execute("SELECT current_setting('autovacuum')").fetchone()
    if row and row[0] == "off":
        conn.execute("ANALYZE " + ", ".join(tables))
