"""Where a message's WAL goes: the store's lifecycle at one batch size, by record type.

    python -m bench.experiments.wal_records [--dsn DSN | --cluster] [--batch 100] [--rounds 100]
        [--partitions 16]

A fresh database migrated by `queen migrate`'s code; one session pushes --batch messages
(the bench's payload, no transactionId) into one of --partitions partitions, pops them by
partition as queue mode (batch --batch, or one at a time at batch 1) and acks them, --rounds
times, after a CHECKPOINT (so that full-page images count as they would after one). Then
pg_walinspect reads the WAL written in between: bytes per acked message in all, and by
resource manager / record type and by relation. Run it on a cluster of its own (--cluster):
the WAL of other work on the server counts otherwise. No HTTP: the WAL of the requests is
the same.
"""

from __future__ import annotations

import argparse
import uuid
from typing import Any

import orjson
import psycopg

from bench.adapters import PAYLOAD
from bench.experiments import add_server_arguments, migrated_database

DATABASE = "queen_bench_wal_records"
POP = "SELECT (message).transaction_id, (message).lease_id FROM queen.pop_many(%s::jsonb)"
PUSH = "SELECT count(*) FROM queen.push(%s::jsonb)"
ACK = "SELECT count(*) FROM queen.ack(%s::jsonb)"
BY_TYPE = """
SELECT "resource_manager/record_type", count, record_size, fpi_size
FROM pg_get_wal_stats(%s, %s, true) WHERE count > 0 ORDER BY combined_size DESC LIMIT 12
"""
BY_RELATION = """
SELECT coalesce(c.oid::regclass::text, '(no relation)'), count(*), sum(w.record_length)
FROM pg_get_wal_records_info(%s, %s) w
LEFT JOIN pg_class c
       ON c.relfilenode = (regexp_match(w.block_ref, 'rel \\d+/\\d+/(\\d+)'))[1]::oid
GROUP BY 1 ORDER BY 3 DESC LIMIT 12
"""


def lifecycle(conn: psycopg.Connection[Any], batch: int, rounds: int, partitions: int) -> int:
    """Push, pop and ack --rounds batches; return the messages acked."""
    acked = 0
    for r in range(rounds):
        partition = f"p{r % partitions}"
        item = {"queue": "bench", "partition": partition, "payload": PAYLOAD}
        conn.execute(PUSH, (orjson.dumps([item] * batch).decode(),))
        pop = {"kind": "partition", "queue": "bench", "partition": partition,
               "group": "__queue__", "batch": batch, "worker": "bench",
               "lease": str(uuid.uuid4())}
        rows = conn.execute(POP, (orjson.dumps([pop]).decode(),)).fetchall()
        acks = [{"transactionId": t, "status": "completed", "leaseId": str(lease)}
                for t, lease in rows]
        conn.execute(ACK, (orjson.dumps(acks).decode(),))
        acked += len(rows)
    return acked


def run(dsn: str, batch: int, rounds: int, partitions: int) -> None:
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("CREATE EXTENSION IF NOT EXISTS pg_walinspect")
        conn.execute("SET queen.push_notify = 'after_commit'")
        lifecycle(conn, 1, partitions, partitions)  # the queue, its partitions and cursors
        conn.execute("CHECKPOINT")
        (start,) = conn.execute("SELECT pg_current_wal_lsn()").fetchone() or (None,)
        acked = lifecycle(conn, batch, rounds, partitions)
        (end,) = conn.execute("SELECT pg_current_wal_lsn()").fetchone() or (None,)
        # Claims and acks commit without waiting for the disk: a durable commit flushes
        # the WAL up to end, which pg_walinspect reads only once it is flushed.
        with conn.transaction():
            conn.execute("SET LOCAL synchronous_commit = on")
            conn.execute("SELECT pg_current_xact_id()")
        (total,) = conn.execute("SELECT pg_wal_lsn_diff(%s, %s)", (end, start)).fetchone() or (0,)
        print(f"batch {batch}: {acked} messages acked, {float(total) / acked:,.0f} WAL bytes"
              " per message\n")
        print("| record type | records per message | bytes per message | of which full pages |")
        print("|---|---:|---:|---:|")
        for kind, count, size, fpi in conn.execute(BY_TYPE, (start, end)):
            print(f"| {kind} | {count / acked:.3f} | {(size + fpi) / acked:,.1f} |"
                  f" {fpi / acked:,.1f} |")
        print("\n| relation | records per message | bytes per message |")
        print("|---|---:|---:|")
        for relation, count, size in conn.execute(BY_RELATION, (start, end)):
            print(f"| {relation} | {count / acked:.3f} | {float(size) / acked:,.1f} |")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.experiments.wal_records")
    parser.add_argument("--batch", type=int, default=100)
    parser.add_argument("--rounds", type=int, default=100)
    parser.add_argument("--partitions", type=int, default=16)
    add_server_arguments(parser)
    args = parser.parse_args(argv)
    with migrated_database(args, DATABASE) as (dsn, server):
        run(dsn, args.batch, args.rounds, args.partitions)
        print(f"\n{server}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
