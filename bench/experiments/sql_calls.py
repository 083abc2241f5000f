"""What one call of the hot path costs PostgreSQL at one batch size, with nothing else running.

    python -m bench.experiments.sql_calls [--dsn DSN | --cluster] [--calls 1000] [--rounds 3]
        [--partitions 16] [--messages 20000] [--durable] [--cases pop,ack,...] [--batch 1]

A fresh database migrated by `queen migrate`'s code, seeded with --messages messages over
--partitions partitions (16) of one queue and ANALYZEd (--stats maintenance: only what
Queen's maintenance analyses by itself, queen.analyze_tables); then one session (asynchronous commit unless --durable, so that
the WAL flush is not counted) runs each call in a loop inside a PL/pgSQL procedure, committing
after every call as a request would: push --batch messages into one partition
(queen.push, as Queen's pool calls it), pop a batch of --batch by queue
(queen.pop_many with one pop), ack those (queen.ack, one call), a pop
that finds every partition leased, and a bare INSERT of --batch rows beside them. Reported: microseconds per call (median of the rounds). No HTTP, no
client: the statement time under load is bench.profile's.
"""

from __future__ import annotations

import argparse
import statistics
from typing import Any

import psycopg

from bench.experiments import add_server_arguments, migrated_database

SETUP = """
SET queen.push_notify = 'after_commit';
CREATE OR REPLACE PROCEDURE pg_temp.calls(n integer, what text, parts integer, size integer,
                                           INOUT us numeric DEFAULT 0)
LANGUAGE plpgsql AS $$
DECLARE
    started timestamptz;
    spent   interval := '0';
    acks    jsonb;
    items   jsonb;
BEGIN
    FOR k IN 1..n LOOP
        items := (SELECT jsonb_agg(jsonb_build_object(
            'queue', 'bench', 'partition', 'p' || (k % parts), 'payload', jsonb_build_object('n', k, 'i', i)))
            FROM generate_series(1, size) i);
        IF what = 'ack' THEN
            SELECT jsonb_agg(jsonb_build_object('transactionId', (m.message).transaction_id,
                                                'status', 'completed'))
            INTO acks
            FROM queen.pop_many(jsonb_build_array(jsonb_build_object(
                'kind', 'queue', 'queue', 'bench', 'group', '__queue__', 'batch', size,
                'worker', 'bench', 'lease', gen_random_uuid()))) m;
            COMMIT;
        END IF;
        started := clock_timestamp();
        IF what = 'push' THEN
            PERFORM * FROM queen.push(items, NULL);
        ELSIF what IN ('pop', 'empty pop') THEN
            PERFORM * FROM queen.pop_many(jsonb_build_array(jsonb_build_object(
                'kind', 'queue', 'queue', 'bench', 'group', '__queue__', 'batch', size,
                'worker', 'bench', 'lease', gen_random_uuid()))) m;
        ELSIF what = 'ack' THEN
            PERFORM * FROM queen.ack(acks);
        ELSIF what = 'bare insert' THEN
            INSERT INTO bare (body) SELECT i FROM jsonb_array_elements(items) i;
        END IF;
        COMMIT;
        spent := spent + (clock_timestamp() - started);
        IF what = 'pop' THEN  -- given back (no attempt counted): every pop finds a free partition
            PERFORM queen.give_back(c.lease_id) FROM queen.consumers c
            WHERE c.lease_id IS NOT NULL;
            COMMIT;
        END IF;
    END LOOP;
    us := round(extract(epoch FROM spent) * 1e6 / n);
END
$$;
"""

CASES = ("push", "bare insert", "pop", "ack", "empty pop")


def seed(conn: psycopg.Connection[Any], partitions: int, messages: int, stats: str) -> None:
    conn.execute("CREATE TABLE bare (id bigserial PRIMARY KEY, body jsonb NOT NULL)")
    for first in range(0, messages, 10_000):
        conn.execute(
            "SELECT count(*) FROM queen.push((SELECT jsonb_agg(jsonb_build_object("
            "'queue', 'bench', 'partition', 'p' || (i %% %s::integer), 'payload', i))"
            " FROM generate_series(%s::integer, %s::integer) i), NULL)",
            (partitions, first, min(messages, first + 10_000) - 1),
        )
    if stats == "all":
        conn.execute("ANALYZE")
    else:  # what the server's maintenance process analyses on its own
        conn.execute("SELECT queen.analyze_tables()")


def lease_all(conn: psycopg.Connection[Any], partitions: int) -> None:
    """Lease every partition, so that the next pops find none free."""
    for _ in range(partitions):
        conn.execute(
            "SELECT count(*) FROM queen.pop('queue', 'bench', NULL, NULL, NULL,"
            " '__queue__', 1, 'bench', NULL, NULL, gen_random_uuid())"
        )


def run(
    dsn: str, calls: int, rounds: int, durable: bool, partitions: int, messages: int,
    cases: tuple[str, ...] = CASES, batch: int = 1, stats: str = "all",
) -> dict[str, list[float]]:
    results: dict[str, list[float]] = {case: [] for case in cases}
    with psycopg.connect(dsn, autocommit=True) as conn:
        seed(conn, partitions, messages, stats)
        conn.execute(SETUP)
        conn.execute(f"SET synchronous_commit = {'on' if durable else 'off'}")
        for number in range(1, rounds + 1):
            for case in cases:
                if case == "empty pop":
                    lease_all(conn, partitions)
                (us,) = conn.execute(
                    "CALL pg_temp.calls(%s, %s, %s, %s)", (calls, case, partitions, batch)
                ).fetchone() or (0,)
                results[case].append(float(us))
                if case == "empty pop":
                    conn.execute(
                        "SELECT queen.give_back(lease_id) FROM queen.consumers"
                        " WHERE lease_id IS NOT NULL"
                    )
                print(f"round {number}/{rounds}: {case} {us} us", flush=True)
    return results


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.experiments.sql_calls")
    parser.add_argument("--calls", type=int, default=1000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--partitions", type=int, default=16)
    parser.add_argument("--messages", type=int, default=20_000)
    parser.add_argument(
        "--durable", action="store_true", help="synchronous_commit on: each commit waits for its flush"
    )
    parser.add_argument("--batch", type=int, default=1, help="messages per push, pop and ack")
    parser.add_argument(
        "--cases", default=",".join(CASES), help=f"comma-separated, of: {', '.join(CASES)}"
    )
    parser.add_argument(
        "--stats", choices=("all", "maintenance"), default="all",
        help="after seeding, ANALYZE every table (all), or only what Queen's maintenance"
        " analyses by itself (maintenance: queen.analyze_tables), as a server has them",
    )
    add_server_arguments(parser)
    args = parser.parse_args(argv)
    cases = tuple(c.strip() for c in args.cases.split(","))
    if unknown := set(cases) - set(CASES):
        parser.error(f"unknown cases: {', '.join(sorted(unknown))}")
    with migrated_database(args, "queen_bench_sql_calls") as (dsn, server):
        results = run(
            dsn, args.calls, args.rounds, args.durable, args.partitions, args.messages,
            cases, args.batch, args.stats,
        )
        print(f"\n{server}; statistics: {args.stats}")
    print(f"| call (batch {args.batch}) | us per call (median) | rounds |")
    print("|---|---:|---|")
    for case, values in results.items():
        rounds = " / ".join(f"{v:.0f}" for v in values)
        print(f"| {case} | {statistics.median(values):.0f} | {rounds} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
