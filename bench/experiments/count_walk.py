"""What maintenance's count rollup costs PostgreSQL per message, with nothing else running.

    python -m bench.experiments.count_walk [--dsn DSN | --cluster] [--partitions 16] [--messages 80000]
        [--batch 100] [--step 5000] [--fail-every 0] [--rounds 3]

A fresh database migrated by `queen migrate`'s code; --messages messages pushed at batch
--batch over --partitions partitions of one queue, popped by queue at that batch and
acked (every --fail-every'th acked as failed, which dead-letters it: the queue has
retryLimit 0), all through the hot path's own functions, then ANALYZEd. Each round forgets the
rollups (queen.partition_counts, queen.metrics_minute) and runs
queen.count_refresh(partitions, step) until every partition is caught up, as the
maintenance process does: the walk over what arrived and over what queue mode's cursor
passed. Reported: microseconds per message (median of the rounds) and a digest of the
rollups it wrote, to compare two builds' answers on the same history.
"""

from __future__ import annotations

import argparse
import statistics
import time
from typing import Any

import psycopg

from bench.experiments import add_server_arguments, migrated_database

DB_NAME = "queen_bench_count_walk"

SEED = """
CREATE OR REPLACE PROCEDURE pg_temp.seed(parts integer, rounds integer, fail_every integer,
                                          size integer)
LANGUAGE plpgsql AS $$
DECLARE
    acks jsonb;
BEGIN
    FOR r IN 1..rounds LOOP
        FOR p IN 0..parts - 1 LOOP
            PERFORM * FROM queen.push((
                SELECT jsonb_agg(jsonb_build_object('queue', 'bench', 'partition', 'p' || p,
                                                    'payload', jsonb_build_object('n', i)))
                FROM generate_series(1, size) i), NULL);
            COMMIT;
        END LOOP;
        FOR p IN 0..parts - 1 LOOP
            SELECT jsonb_agg(jsonb_build_object(
                       'transactionId', (x.message).transaction_id,
                       'status', CASE WHEN fail_every > 0 AND x.n % fail_every = 0
                                      THEN 'failed' ELSE 'completed' END))
            INTO acks
            FROM (SELECT m.message, row_number() OVER () AS n
                  FROM queen.pop_many(jsonb_build_array(jsonb_build_object(
                      'kind', 'queue', 'queue', 'bench', 'group', '__queue__', 'batch', size,
                      'worker', 'bench', 'lease', gen_random_uuid()))) m) x;
            COMMIT;
            PERFORM * FROM queen.ack(acks);
            COMMIT;
        END LOOP;
    END LOOP;
END
$$;
"""

DIGEST = """
SELECT md5(coalesce((SELECT string_agg(concat_ws(',', p.name, k.total, k.below, k.failed,
                                                 k.dead_letter), ';' ORDER BY p.name)
                     FROM queen.partition_counts k JOIN queen.partitions p ON p.id = k.partition_id),
                    '')
           || coalesce((SELECT string_agg(concat_ws(',', p.name, m.minute, m.incoming,
                                                    m.completed, m.failed, m.dead_letter,
                                                    m.lag_hist), ';'
                                          ORDER BY p.name, m.minute)
                        FROM queen.metrics_minute m
                        JOIN queen.partitions p ON p.id = m.partition_id), ''))
"""


def seed(
    conn: psycopg.Connection[Any], partitions: int, messages: int, fail_every: int,
    batch: int = 100,
) -> None:
    conn.execute(
        "SELECT * FROM queen.push("
        "'[{\"queue\": \"bench\", \"partition\": \"p0\", \"payload\": 0}]'::jsonb, NULL)"
    )
    conn.execute("UPDATE queen.queues SET retry_limit = 0, dlq_after_max_retries = true")
    conn.execute(SEED)
    rounds = max(1, messages // (batch * partitions))
    for r in range(rounds):
        conn.execute("CALL pg_temp.seed(%s, 1, %s, %s)", (partitions, fail_every, batch))
        if r % max(1, rounds // 5) == 0 or r == rounds - 1:
            print(f"seeded {(r + 1) * batch * partitions} messages", flush=True)
    conn.execute("ANALYZE")


def walk(conn: psycopg.Connection[Any], partitions: int, step: int) -> tuple[float, int, str]:
    """Forget the rollups and rebuild them; (seconds, messages walked, digest)."""
    conn.execute("DELETE FROM queen.partition_counts")
    conn.execute("DELETE FROM queen.metrics_minute")
    conn.execute("VACUUM ANALYZE queen.partition_counts, queen.metrics_minute")
    started = time.perf_counter()
    while True:
        (behind,) = conn.execute(
            "SELECT queen.count_refresh(%s, %s)", (partitions, step)
        ).fetchone() or (0,)
        if not behind:
            break
    spent = time.perf_counter() - started
    (walked,) = conn.execute(
        "SELECT coalesce(sum(total), 0)::bigint FROM queen.partition_counts"
    ).fetchone() or (0,)
    (digest,) = conn.execute(DIGEST).fetchone() or ("",)
    return spent, int(walked), str(digest)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.experiments.count_walk")
    parser.add_argument("--partitions", type=int, default=16)
    parser.add_argument("--messages", type=int, default=80_000)
    parser.add_argument("--step", type=int, default=5000, help="messages per partition a step")
    parser.add_argument("--fail-every", type=int, default=0, help="0: every ack completes")
    parser.add_argument("--batch", type=int, default=100, help="messages per push, pop and ack")
    parser.add_argument("--rounds", type=int, default=3)
    add_server_arguments(parser)
    args = parser.parse_args(argv)
    costs: list[float] = []
    with migrated_database(args, DB_NAME) as (dsn, server):
        with psycopg.connect(dsn, autocommit=True) as conn:
            seed(conn, args.partitions, args.messages, args.fail_every, args.batch)
            for number in range(1, args.rounds + 1):
                spent, walked, digest = walk(conn, args.partitions, args.step)
                costs.append(spent * 1e6 / max(1, walked))
                print(f"round {number}/{args.rounds}: {walked} messages in {spent:.3f} s,"
                      f" {costs[-1]:.2f} us a message; rollups {digest}", flush=True)
        print(f"\n{server}")
    print(f"count walk: {statistics.median(costs):.2f} us a message (median of {args.rounds};"
          f" {args.partitions} partitions, batch {args.batch}, step {args.step},"
          f" fail every {args.fail_every})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
