"""Would a pop's claim cost PostgreSQL less as one statement? queen.pop beside the same
claim written as one statement, and beside minimal's pop, at one batch size.

    python -m bench.experiments.pop_claim [--dsn DSN | --cluster] [--batch 100]
        [--calls 300] [--rounds 5] [--partitions 8]

A fresh database migrated by `queen migrate`'s code: --partitions partitions of one queue,
5,000 messages each, every partition with its cursor row, and the minimal lifecycle's
tables (bench/adapters.py) beside them with as many messages, all ANALYZEd. One session
runs each way of claiming --calls times in a PL/pgSQL loop, each call committed
(asynchronously, as claims commit) and its lease given back after it, untimed:

- `queen.pop`: the function alone, by queue;
- `pop_one`: the query the server sends for a lone pop (queen/store/queries.sql), which
  adds the answer's columns (the API id, what only a pop's first row carries);
- one statement: ONE_STATEMENT below, the common pop by queue (no window, ttl or delay,
  every cursor row there, at most 256 partitions) in a single statement: the queue, the
  ranking, the lock, the batch, the lease and its rows, as queen.pop's statements do them
  one after another. Made in the scratch database only: a server would need queen.pop
  beside it for every other pop;
- minimal: minimal's pop (MINIMAL_POP), the least this model's claim asks.

Reported: µs a call, the lowest and the median of the rounds' means.
"""

from __future__ import annotations

import argparse
import re
import statistics
from typing import Any

import orjson
import psycopg

from bench.adapters import MINIMAL_DDL, MINIMAL_POP, MINIMAL_PUSH, PAYLOAD
from bench.experiments import add_server_arguments, migrated_database
from queen.store.db import QUERIES

DATABASE = "queen_bench_pop_claim"
MESSAGES = 5_000  # per partition

ONE_STATEMENT = r"""
CREATE FUNCTION queen.pop_one_statement(p_queue text, p_group text, p_batch integer,
                                        p_worker text, p_lease uuid)
RETURNS TABLE (id bigint, transaction_id text, queue text, partition text, payload jsonb,
               encrypted boolean, producer text, trace_id text, retry_count integer,
               created_at timestamptz, lease_id uuid, lease_expires_at timestamptz,
               priority integer, lease_time integer, retry_limit integer, partition_id uuid)
LANGUAGE plpgsql SET plan_cache_mode = force_generic_plan AS $$
#variable_conflict use_column
BEGIN
    RETURN QUERY
    WITH q AS MATERIALIZED (
        SELECT x.id, x.name, x.priority, x.lease_time, x.retry_limit,
               now() + make_interval(secs => x.lease_time) AS expires, p_lease AS lease
        FROM queen.queues x
        WHERE x.name = p_queue AND x.window_buffer = 0 AND x.ttl = 0
          AND x.delayed_processing = 0
          AND EXISTS (SELECT 1 FROM queen.consumer_groups g
                      WHERE g.queue_id = x.id AND g.consumer_group = p_group)
          AND NOT EXISTS (SELECT 1 FROM queen.partitions p WHERE p.queue_id = x.id
                          ORDER BY p.id OFFSET 256 LIMIT 1)
    ), ranked AS MATERIALIZED (
        SELECT p.id
        FROM q JOIN queen.partitions p ON p.queue_id = q.id
        JOIN queen.consumers c ON c.partition_id = p.id AND c.consumer_group = p_group
        CROSS JOIN LATERAL (SELECT m.id FROM queen.messages m
                            WHERE m.partition_id = p.id AND m.id > c.cursor_id
                            ORDER BY m.id LIMIT 1) m
        WHERE c.lease_id IS NULL AND (c.not_before IS NULL OR c.not_before <= now())
        ORDER BY m.id
        LIMIT 32
    ), picked AS MATERIALIZED (
        SELECT x.partition_id, x.cursor_id, x.done_ids, x.retried_max,
               (SELECT p.name FROM queen.partitions p WHERE p.id = x.partition_id) AS name
        FROM ranked r
        CROSS JOIN LATERAL (SELECT * FROM queen.consumers x
                            WHERE x.partition_id = r.id AND x.consumer_group = p_group
                              AND x.lease_id IS NULL
                              AND NOT coalesce(x.not_before > now(), false)
                            FOR UPDATE SKIP LOCKED) x
        LIMIT 1
    ), batch AS MATERIALIZED (
        SELECT k.partition_id, k.name, k.retried_max, m.id,
               queen.txid(m.transaction_id, m.partition_id, m.id) AS transaction_id, m.payload,
               m.encrypted, m.producer, m.trace_id, m.created_at
        FROM picked k
        CROSS JOIN LATERAL (SELECT m.* FROM queen.messages m
                            WHERE m.partition_id = k.partition_id AND m.id > k.cursor_id
                              AND m.id <> ALL (k.done_ids)
                            ORDER BY m.id LIMIT p_batch) m
    ), leased AS (
        UPDATE queen.consumers x SET
            lease_id = q.lease, leased_by = p_worker, lease_expires_at = q.expires,
            lease_last_id = s.last_id, lease_size = s.size, lease_acked = '{}',
            lease_digest = s.digest, not_before = NULL, updated_at = now()
        FROM q, picked k,
             (SELECT max(b.id) AS last_id, count(*)::integer AS size,
                     queen.lease_digest(string_agg(b.transaction_id, E'\x1f' ORDER BY b.id),
                                        count(*)::integer) AS digest
              FROM batch b) s
        WHERE x.partition_id = k.partition_id AND x.consumer_group = p_group AND s.size > 0
    )
    SELECT b.id, b.transaction_id, q.name, b.name, b.payload, b.encrypted, b.producer,
           b.trace_id,
           CASE WHEN b.id <= b.retried_max
                THEN queen.retries_of(b.partition_id, p_group, b.id, b.retried_max)
                ELSE 0 END,
           b.created_at, q.lease, q.expires, q.priority, q.lease_time, q.retry_limit,
           b.partition_id
    FROM batch b, q
    ORDER BY b.id;
END
$$;
CREATE FUNCTION bench_min.pop(p_batch integer)
RETURNS TABLE (partition integer, id bigint, transaction_id text, payload jsonb)
LANGUAGE plpgsql SET plan_cache_mode = force_generic_plan AS $$
#variable_conflict use_column
BEGIN
    RETURN QUERY %(minimal)s;
END
$$;
"""

LOOP = """
CREATE OR REPLACE PROCEDURE pg_temp.claims(n integer, size integer, INOUT us numeric DEFAULT 0)
LANGUAGE plpgsql AS $$
DECLARE
    started timestamptz;
    spent   interval := '0';
BEGIN
    FOR k IN 1..n LOOP
        started := clock_timestamp();
        PERFORM * FROM (%(claim)s) c;
        COMMIT;
        spent := spent + (clock_timestamp() - started);
        PERFORM queen.give_back(c.lease_id) FROM queen.consumers c WHERE c.lease_id IS NOT NULL;
        UPDATE bench_min.cursors SET lease_until = '-infinity' WHERE lease_until > now();
        COMMIT;
    END LOOP;
    us := extract(epoch FROM spent) * 1e6 / n;
END
$$
"""

# pop_one's parameters as the loop's values (a pop by queue, queue mode, a new lease).
POP_ONE_VALUES = {
    "kind": "'queue'", "queue": "'bench'", "partition": "NULL", "namespace": "NULL",
    "task": "NULL", "group": "'__queue__'", "batch": "size", "worker": "'bench'",
    "mode": "NULL", "since": "NULL", "lease": "gen_random_uuid()", "prefer": "NULL",
}
CLAIMS = {
    "queen.pop": "SELECT * FROM queen.pop('queue', 'bench', NULL, NULL, NULL, '__queue__',"
    " size, 'bench', NULL, NULL, gen_random_uuid())",
    "pop_one": re.sub(r"%\((\w+)\)s", lambda m: POP_ONE_VALUES[m.group(1)], QUERIES["pop_one"]),
    "one statement": "SELECT * FROM queen.pop_one_statement('bench', '__queue__', size,"
    " 'bench', gen_random_uuid())",
    "minimal": "SELECT * FROM bench_min.pop(size)",
}


def seed(conn: psycopg.Connection[Any], partitions: int) -> None:
    items = [{"queue": "bench", "partition": f"p{p}", "payload": PAYLOAD}
             for p in range(partitions)]
    for _ in range(MESSAGES // 1000):
        conn.execute("SELECT count(*) FROM queen.push(%s::jsonb)",
                     (orjson.dumps(items * 1000).decode(),))
    conn.execute(MINIMAL_DDL)
    for p in range(partitions):
        for _ in range(MESSAGES // 1000):
            conn.execute(MINIMAL_PUSH, {"partition": p, "items": orjson.dumps(
                [PAYLOAD] * 1000).decode()})
    for _ in range(partitions):  # every partition's cursor row
        conn.execute("SELECT count(*) FROM queen.pop('queue', 'bench', NULL, NULL, NULL,"
                     " '__queue__', 1, 'bench', NULL, NULL, gen_random_uuid())")
    conn.execute("SELECT queen.give_back(lease_id) FROM queen.consumers"
                 " WHERE lease_id IS NOT NULL")
    minimal = MINIMAL_POP.replace("%(batch)s", "p_batch").replace(
        "SELECT partition, id, transaction_id, payload FROM batch ORDER BY id",
        "SELECT b.partition, b.id, b.transaction_id, b.payload FROM batch b ORDER BY b.id")
    conn.execute(ONE_STATEMENT.replace("%(minimal)s", minimal))  # type: ignore[arg-type]
    conn.execute("ANALYZE")


def run(dsn: str, batch: int, calls: int, rounds: int, partitions: int) -> dict[str, list[float]]:
    results: dict[str, list[float]] = {name: [] for name in CLAIMS}
    with psycopg.connect(dsn, autocommit=True) as conn:
        seed(conn, partitions)
        conn.execute("SET synchronous_commit = off")
        for number in range(1, rounds + 1):
            for name, claim in CLAIMS.items():
                conn.execute(LOOP.replace("%(claim)s", claim))  # type: ignore[arg-type]
                (us,) = conn.execute(
                    "CALL pg_temp.claims(%s, %s)", (calls, batch)).fetchone() or (0,)
                results[name].append(float(us))
                print(f"round {number}/{rounds}: {name} {float(us):.0f} us", flush=True)
    return results


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.experiments.pop_claim")
    parser.add_argument("--batch", type=int, default=100)
    parser.add_argument("--calls", type=int, default=300)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--partitions", type=int, default=8)
    add_server_arguments(parser)
    args = parser.parse_args(argv)
    with migrated_database(args, DATABASE) as (dsn, server):
        results = run(dsn, args.batch, args.calls, args.rounds, args.partitions)
        print(f"\n{server}")
    print(f"| claim (batch {args.batch}, {args.partitions} partitions) | µs a call, lowest |"
          " median | rounds |")
    print("|---|---:|---:|---|")
    for name, values in results.items():
        rounds = " / ".join(f"{v:.0f}" for v in values)
        print(f"| {name} | {min(values):.0f} | {statistics.median(values):.0f} | {rounds} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
