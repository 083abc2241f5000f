"""What a pop, an ack or a push costs PostgreSQL, as the server sends it, and with a change.

    python -m bench.experiments.server_calls [--batch 100] [--cycles 200] [--rounds 3]
        [--partitions 8] [--fused 1] [--parked] [--nested] [--push] [--variant FILE ...]

On a cluster of the bench's own (pg_stat_statements preloaded), a database migrated by
`queen migrate`'s code is seeded with one queue of --partitions partitions; then one
session pops --batch by queue with the server's own statement (`pop_one`, or `pop_many`
for --fused pops a call) and acks what it got as the server does (the leases' messages,
as popped: the statement `ack_whole`; with --items, the `ack` statement the server sends
for other acks, queen.ack_items, which tries whole leases first too), --cycles times a
round. Reported,
the median of the rounds: PostgreSQL's mean time a pop call and an ack call
(pg_stat_statements, server side: no client, no network), and the median CPU time the
session's backend used a call (/proc/<pid>/schedstat), which also counts what
pg_stat_statements leaves out: the parameters parsed, the transaction begun and ended.
--push measures the server's push statement instead: pushes of --batch items into the
queue's partitions in turn.

Each --variant is measured beside the code as it is, in turns within every round: a
`.sql` file is run after the functions are installed (a changed function), a `.pop`,
`.many`, `.whole`, `.ack` or `.push` file replaces that statement of the server's (pop_one,
pop_many, ack_whole, ack, push); files joined by + make one variant. --parked lists a worker with
parked polls, so that acks make their wake-ups. --nested prints, after each run, the
statements inside the functions (pg_stat_statements.track = all) by time a cycle.
"""

from __future__ import annotations

import argparse
import contextlib
import statistics
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import orjson
import psycopg
from psycopg.types.string import TextLoader

from bench import cluster
from bench.pgquota import backend_ns
from bench.systems import fresh_database
from queen.store.db import QUERIES
from queen.store.messages import ack_columns
from queen.store.migrate import function_files, migrate

# A variant's files that replace one of the server's statements, by suffix.
STATEMENTS = {".pop": "pop_one", ".many": "pop_many", ".whole": "ack_whole", ".ack": "ack",
              ".push": "push"}
SEED = (
    "SELECT count(*) FROM queen.push((SELECT jsonb_agg(jsonb_build_object("
    "'queue', 'bench', 'partition', 'p' || (i %% %s::integer),"
    " 'payload', jsonb_build_object('kind', 'bench', 'n', i)))"
    " FROM generate_series(%s::integer, %s::integer) i), NULL)"
)
SPENT = (  # (ack_whole: the statement that updates the consumer rows itself)
    "SELECT CASE WHEN query LIKE '%%ack_items%%' OR query LIKE '%%UPDATE queen.consumers%%'"
    " THEN 'ack' ELSE 'pop' END,"
    " sum(total_exec_time) * 1000 / sum(calls) FROM pg_stat_statements"
    " WHERE toplevel AND (query LIKE '%%queen.pop(%%' OR query LIKE '%%queen.pop_many(%%'"
    " OR query LIKE '%%queen.pop_rows(%%'"
    " OR query LIKE '%%queen.ack_items(%%' OR query LIKE '%%UPDATE queen.consumers%%'"
    " OR query LIKE '%%queen.push%%(%%') GROUP BY 1"
)
NESTED = (
    "SELECT calls, total_exec_time * 1000 / %s, left(regexp_replace(query, '\\s+', ' ', 'g'), 110)"
    " FROM pg_stat_statements WHERE NOT toplevel ORDER BY total_exec_time DESC LIMIT 15"
)


def pop_params(batch: int) -> dict[str, Any]:
    return {"kind": "queue", "queue": "bench", "partition": None, "namespace": None,
            "task": None, "group": "__queue__", "mode": None, "since": None, "batch": batch,
            "worker": "bench", "lease": str(uuid.uuid4()), "prefer": None}


class BackendCpu:
    """The CPU time a session's backend has used (ns; /proc/<pid>/schedstat, so the cluster
    runs on this machine), by kind of call: what pg_stat_statements leaves out, too (the
    parameters parsed, the transaction begun and committed)."""

    def __init__(self, conn: psycopg.Connection[Any]) -> None:
        self.pid = conn.info.backend_pid
        self.spent: dict[str, list[int]] = {}

    def now(self) -> int:
        ns = backend_ns(self.pid)
        if ns is None:
            raise SystemExit(f"backend {self.pid} is not a process of this machine")
        return ns

    @contextlib.contextmanager
    def call(self, kind: str) -> Iterator[None]:
        start = self.now()
        yield
        self.spent.setdefault(kind, []).append(self.now() - start)

    def median_us(self, kind: str) -> float:
        return statistics.median(self.spent.get(kind) or [0]) / 1000


def cycle(conn: psycopg.Connection[Any], statements: dict[str, str], batch: int,
          fused: int, cpu: BackendCpu, ack: str = "ack_whole") -> None:
    """Pop (fused pops a call), then ack every lease popped, as its consumer would."""
    if fused > 1:
        pops = orjson.dumps([pop_params(batch) for _ in range(fused)]).decode()
        with cpu.call("pop"):
            rows = conn.execute(statements["pop_many"], {"pops": pops}).fetchall()
    else:
        with cpu.call("pop"):
            rows = conn.execute(statements["pop_one"], pop_params(batch)).fetchall()
    requests: dict[int, list[dict[str, Any]]] = {}
    lease = None
    for row in rows:  # (position, id, transactionId, ..., leaseId on a pop's first row)
        lease = row[11] or lease
        requests.setdefault(row[0], []).append(
            {"transactionId": row[2], "status": "completed", "leaseId": str(lease)})
    acks = [item for request in requests.values() for item in request]
    if not acks:
        raise SystemExit("the queue ran dry: seed more (--cycles, --rounds)")
    columns = ack_columns(acks, [len(r) for r in requests.values()])
    with cpu.call("ack"):
        conn.execute(statements[ack], columns)


def push(conn: psycopg.Connection[Any], statements: dict[str, str], batch: int,
         partitions: int, number: int, cpu: BackendCpu) -> None:
    """A push of batch items into one partition, as the server sends a lone request's."""
    items = [{"queue": "bench", "partition": f"p{number % partitions}",
              "payload": {"kind": "bench", "n": n}} for n in range(batch)]
    bodies = orjson.dumps([{"items": items}]).decode()
    with cpu.call("pop"):  # (the first column of the report)
        conn.execute(statements["push"], {"bodies": bodies, "producer": None}).fetchall()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.experiments.server_calls")
    parser.add_argument("--batch", type=int, default=100)
    parser.add_argument("--cycles", type=int, default=200)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--partitions", type=int, default=8)
    parser.add_argument("--fused", type=int, default=1, help="pops a call (pop_many above 1)")
    parser.add_argument("--parked", action="store_true", help="a worker has polls parked")
    parser.add_argument("--nested", action="store_true")
    parser.add_argument("--items", action="store_true",
                        help="ack through the ack statement (queen.ack_items), not ack_whole")
    parser.add_argument("--push", action="store_true",
                        help="measure the server's push statement instead")
    parser.add_argument("--variant", action="append", default=[],
                        help="a file, or files joined by + (one variant)")
    args = parser.parse_args(argv)
    variants: list[tuple[str, list[Path]]] = [("as is", [])]
    variants += [(v, [Path(f) for f in v.split("+")]) for v in args.variant]
    functions = "\n".join(f.read_text() for f in function_files())
    spent: dict[str, list[tuple[float, float, float, float]]] = {name: [] for name, _ in variants}
    with contextlib.ExitStack() as stack:
        server = stack.enter_context(cluster.bench_cluster(preload="pg_stat_statements"))
        dsn = fresh_database(server.dsn, "queen_server_calls")
        migrate(dsn)
        admin = stack.enter_context(psycopg.connect(dsn, autocommit=True))
        admin.execute("CREATE EXTENSION IF NOT EXISTS pg_stat_statements")
        # (Each variant runs a warm-up and a measured pass a round.)
        needed = args.batch * args.fused * args.cycles * 2 * args.rounds * len(variants)
        for first in range(0, needed + args.batch * args.partitions, 10_000):
            admin.execute(SEED, (args.partitions, first, first + 9_999))
            print(f"seeded {first + 10_000:,} messages", flush=True)
        admin.execute("SELECT queen.analyze_tables()")
        if args.parked:
            admin.execute("INSERT INTO queen.waiting_workers VALUES ('parked', now() + '1 day')")
        for number in range(1, args.rounds + 1):
            for name, files in variants:
                admin.execute(functions)
                statements = dict(QUERIES)
                for path in files:
                    if path.suffix in STATEMENTS:
                        statements[STATEMENTS[path.suffix]] = path.read_text()
                    else:
                        admin.execute(path.read_text())
                with psycopg.connect(dsn, autocommit=True) as conn:
                    conn.adapters.register_loader("jsonb", TextLoader)
                    if args.nested:
                        conn.execute("SET pg_stat_statements.track = 'all'")
                    for _warm_then_measured in range(2):
                        admin.execute("SELECT pg_stat_statements_reset()")
                        cpu = BackendCpu(conn)
                        for n in range(args.cycles):
                            if args.push:
                                push(conn, statements, args.batch, args.partitions, n, cpu)
                            else:
                                cycle(conn, statements, args.batch, args.fused, cpu,
                                      "ack" if args.items else "ack_whole")
                times: dict[str, float] = dict(admin.execute(SPENT).fetchall())
                spent[name].append((times.get("pop", 0.0), times.get("ack", 0.0),
                                    cpu.median_us("pop"), cpu.median_us("ack")))
                print(f"round {number}/{args.rounds}, {name}: pop {times.get('pop', 0):.0f} us,"
                      f" ack {times.get('ack', 0):.0f} us; backend CPU {cpu.median_us('pop'):.0f}"
                      f" and {cpu.median_us('ack'):.0f} us", flush=True)
                if args.nested:
                    for calls, us, query in admin.execute(NESTED, (args.cycles,)).fetchall():
                        print(f"    {calls / args.cycles:5.2f} a cycle {us:8.1f} us  {query}")
    calls = "a push" if args.push else f"{args.fused} pop(s) a call"
    print(f"\nbatch {args.batch}, {calls}, {args.cycles} cycles a round; PostgreSQL's µs a"
          " call (statements: pg_stat_statements' mean; CPU: the backend's median), median"
          " of the rounds")
    kind = "push" if args.push else "pop"
    print(f"| code | {kind} statement | ack statement | {kind} CPU | ack CPU |\n"
          "|---|---:|---:|---:|---:|")
    for name, values in spent.items():
        print(f"| {name} | " + " | ".join(
            f"{statistics.median(v[k] for v in values):.0f}" for k in range(4)) + " |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
