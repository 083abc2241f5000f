"""What the server's one-statement push and acks save PostgreSQL against what they go
before, call by call in one session.

    python -m bench.experiments.paired_calls [--dsn DSN | --cluster] [--batch 1]
        [--cycles 600] [--runs 3]

A fresh database migrated by `queen migrate`'s code holds one queue of 8 partitions,
50,000 messages in them, ANALYZEd (as maintenance leaves a table that grew).
One session, with the server's settings, pushes --batch items without transactionIds
into a partition at a time, by `push_new` and by `push` (queen.push_batch) in turn;
then pops --batch by queue (`pop_one`) and acks the lease as popped, by `ack_lease`,
`ack_whole` and `ack` (queen.ack_items) in turn. Alternating call by call, the two of a pair see
the same machine and the same tables. Reported: the median CPU time the session's
backend spent a call (/proc/<pid>/schedstat: parameters, execution and commit), each
run's and their median, the first 20 calls of each left out (plans being made).
"""

from __future__ import annotations

import argparse
import statistics
from typing import Any

import orjson
import psycopg
from psycopg.types.string import TextLoader

from bench.experiments import add_server_arguments, migrated_database
from bench.experiments.server_calls import BackendCpu, pop_params
from queen.store.db import QUERIES
from queen.store.messages import ack_columns, ack_lease_params, push_new_params

DB_NAME = "queen_bench_paired_calls"
PARTITIONS = 8
PAIRS = (("push_new", "push"), ("ack_whole", "ack"), ("ack_lease", "ack_whole"))
ACKS = ("ack_lease", "ack_whole", "ack")  # taken in turn
WARM = 20  # calls of each statement left out: the driver prepares it, five custom plans
SEEDED = 50_000  # messages pushed and ANALYZEd before the runs


def run(conn: psycopg.Connection[Any], batch: int, cycles: int) -> dict[str, float]:
    """One run: pushes, then pops and acks, the statements of each pair in turn."""
    cpu = BackendCpu(conn)
    for n in range(cycles * len(ACKS)):  # (as many pushed as the acks below take)
        items = [{"queue": "bench", "partition": f"p{n % PARTITIONS}", "payload": {"n": k}}
                 for k in range(batch)]
        name = PAIRS[0][n % 2]
        params = {"bodies": orjson.dumps([{"items": items}]).decode(), "producer": None}
        if name == "push_new":  # (with the parameters the server sends it)
            params, _ = push_new_params(params, items)
        with cpu.call(name):
            rows = conn.execute(QUERIES[name], params).fetchall()
        if name == "push_new" and not rows[0][0]:
            raise SystemExit("push_new stored nothing")
    for n in range(cycles * len(ACKS)):
        rows = conn.execute(QUERIES["pop_one"], pop_params(batch)).fetchall()
        lease = str(rows[0][11])
        acks = [{"transactionId": r[2], "status": "completed", "leaseId": lease} for r in rows]
        name = ACKS[n % len(ACKS)]
        params = ack_lease_params(acks) if name == "ack_lease" else ack_columns(acks)
        with cpu.call(name):
            conn.execute(QUERIES[name], params).fetchall()
    return {name: statistics.median(cpu.spent[name][WARM:]) / 1000
            for pair in PAIRS for name in pair}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.experiments.paired_calls")
    parser.add_argument("--batch", type=int, default=1)
    parser.add_argument("--cycles", type=int, default=600,
                        help="calls of each ack statement a run (of each push, 1.5 times that)")
    parser.add_argument("--runs", type=int, default=3)
    add_server_arguments(parser)
    args = parser.parse_args(argv)
    runs: list[dict[str, float]] = []
    with migrated_database(args, DB_NAME) as (dsn, server):
        with psycopg.connect(dsn, autocommit=True) as conn:
            conn.adapters.register_loader("jsonb", TextLoader)
            conn.execute("SET queen.push_notify = 'after_commit'")  # (as the server's pool)
            seed = [{"queue": "bench", "partition": f"p{n % PARTITIONS}", "payload": n}
                    for n in range(1000)]
            for _ in range(SEEDED // len(seed)):
                conn.execute(QUERIES["push"], {"bodies": orjson.dumps([{"items": seed}]).decode(),
                                               "producer": None}).fetchall()
            conn.execute("ANALYZE")  # (as maintenance does once a table has grown)
            for number in range(1, args.runs + 1):
                runs.append(run(conn, args.batch, args.cycles))
                print(f"run {number}/{args.runs}: " + ", ".join(
                    f"{name} {us:.0f} us" for name, us in runs[-1].items()), flush=True)
        print(f"\n{server}")
    print(f"batch {args.batch}, {args.cycles} acks of each statement a run; the backend's CPU µs a call"
          " (median of the calls; each run's, then the median of the runs)")
    print("| statement | what it goes before | the statement | that | saved |\n"
          "|---|---|---:|---:|---:|")
    for one, function in PAIRS:
        a = statistics.median(r[one] for r in runs)
        b = statistics.median(r[function] for r in runs)
        print(f"| `{one}` | `{function}` | {a:.0f} | {b:.0f} | {1 - a / b:.0%} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
