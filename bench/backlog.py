"""Seed Queen's tables with a large pending backlog directly in SQL (no HTTP)."""

from __future__ import annotations

from collections.abc import Callable

import psycopg

SEED_CHUNK = 500_000  # rows per INSERT statement

SEED_QUEUE = """
INSERT INTO queen.queues (name) VALUES (%(queue)s) ON CONFLICT (name) DO NOTHING;
"""
SEED_PARTITIONS = """
INSERT INTO queen.partitions (queue_id, name)
SELECT q.id, 'p' || g FROM queen.queues q, generate_series(0, %(partitions)s::integer - 1) g
WHERE q.name = %(queue)s
ON CONFLICT (queue_id, name) DO NOTHING
"""
SEED_MESSAGES = """
WITH parts AS (
    SELECT array_agg(p.id ORDER BY p.name) AS ids
    FROM queen.partitions p JOIN queen.queues q ON q.id = p.queue_id
    WHERE q.name = %(queue)s
)
INSERT INTO queen.cursor_messages (transaction_id, partition_id, payload)
SELECT 'seed-' || g, parts.ids[1 + g %% cardinality(parts.ids)],
       '{"kind": "bench", "body": "xxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxx"}'::jsonb
FROM parts, generate_series(%(first)s::bigint, %(last)s::bigint) g
"""


def seed_queen(
    dsn: str,
    queue: str,
    total: int,
    partitions: int,
    progress: Callable[[int], None] | None = None,
    start: int = 0,
) -> None:
    """Insert `total` pending messages spread over `partitions` partitions of `queue`."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(SEED_QUEUE, {"queue": queue})
        conn.execute(SEED_PARTITIONS, {"queue": queue, "partitions": partitions})
        done = 0
        while done < total:
            n = min(SEED_CHUNK, total - done)
            conn.execute(
                SEED_MESSAGES, {"queue": queue, "first": start + done, "last": start + done + n - 1}
            )
            done += n
            if progress:
                progress(n)
        conn.execute("VACUUM ANALYZE queen.cursor_messages")


def pending_count(dsn: str) -> int:
    with psycopg.connect(dsn, autocommit=True) as conn:
        row = conn.execute(
            "SELECT sum(pending) FROM queen.cursor_partition_counts("
            "ARRAY(SELECT id FROM queen.partitions))"
        ).fetchone()
    return int(row[0] or 0) if row else 0
