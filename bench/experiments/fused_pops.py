"""What does a fused call of many pops by queue cost when only some partitions are free?

    python -m bench.experiments.fused_pops [--dsn DSN | --cluster] [--pops 32] [--free 16]
        [--partitions 32] [--calls 300]

More consumers than partitions is the common case under load: a worker's fused call
carries more pops than there are free partitions. A fresh database migrated by
`queen migrate`'s code, one queue of --partitions partitions with 50 messages each and a
cursor row in every one; then, --calls times in one session: lease all but --free of the
partitions (one call), time one call of `queen.pop_many` with --pops pops by queue (the
set claim serves --free of them, the rest find nothing), and end every lease. Reported:
client-timed µs a call, lowest and median. Run it before and after a change to
`queen.pop_many` or `queen.pop`, each from its own checkout, on the same server.
"""

from __future__ import annotations

import argparse
import statistics
import time
import uuid
from typing import Any

import orjson
import psycopg

from bench.experiments import add_server_arguments, migrated_database

POP = {"kind": "queue", "queue": "q", "group": "__queue__", "batch": 1, "worker": "study"}
CALL = "SELECT pop FROM queen.pop_many(%s::jsonb)"
END_LEASES = """
UPDATE queen.consumers SET lease_id = NULL, leased_by = NULL, lease_expires_at = NULL,
       lease_last_id = NULL, lease_size = NULL, lease_digest = NULL
WHERE lease_id IS NOT NULL
"""


def pops(conn: psycopg.Connection[Any], n: int) -> list[int]:
    """One call of n pops by queue; the positions of the pops served (one row each)."""
    body = orjson.dumps([{**POP, "lease": str(uuid.uuid4())} for _ in range(n)]).decode()
    return [row[0] for row in conn.execute(CALL, (body,))]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.experiments.fused_pops")
    add_server_arguments(parser)
    parser.add_argument("--pops", type=int, default=32, help="pops in the timed call")
    parser.add_argument("--free", type=int, default=16, help="partitions left free for it")
    parser.add_argument("--partitions", type=int, default=32)
    parser.add_argument("--calls", type=int, default=300)
    args = parser.parse_args(argv)
    with (
        migrated_database(args, "queen_study_fused_pops") as (dsn, server),
        psycopg.connect(dsn, autocommit=True) as conn,
    ):
        conn.execute("SET queen.push_notify = 'after_commit'")
        items = [{"queue": "q", "partition": f"p{p:04d}", "payload": {"n": k}}
                 for p in range(args.partitions) for k in range(50)]
        conn.execute("SELECT count(*) FROM queen.push(%s::jsonb, NULL)",
                     (orjson.dumps(items).decode(),))
        pops(conn, args.partitions)  # a cursor row in every partition
        conn.execute(END_LEASES)
        spent = []
        for done in range(args.calls):
            pops(conn, args.partitions - args.free)
            started = time.perf_counter()
            served = pops(conn, args.pops)
            spent.append((time.perf_counter() - started) * 1e6)
            conn.execute(END_LEASES)
            if len(served) != min(args.free, args.pops):
                raise SystemExit(f"call {done}: {len(served)} pops served, not {args.free}")
            if (done + 1) % 50 == 0:
                print(f"{done + 1}/{args.calls} calls", flush=True)
        print(f"{server}: a call of {args.pops} pops by queue, {args.free} of "
              f"{args.partitions} partitions free, {args.calls} calls: lowest "
              f"{min(spent):.0f} µs, median {statistics.median(spent):.0f} µs")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
