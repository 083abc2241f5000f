"""The store's SQL beside a naive lifecycle, over plain psycopg.

    python -m bench.experiments.sql_lifecycle [--dsn DSN] [--seconds 7] [--rounds 3] [--out FILE]

Each system gets a database of its own on the server of --dsn, built by `queen migrate`'s
code, seeded with a backlog and ANALYZEd (a server with autovacuum off never would), then
2 producers (batch 100 into one of 16 partitions) and 4 consumers (pop by queue, batch
100, ack the batch) run for --seconds, each thread on its own connection; the systems
take turns, --rounds times, so that load from elsewhere falls on all. Reported (medians):
messages pushed and consumed per second, and WAL bytes per consumed message
(pg_current_wal_lsn before and after: other work on the server counts too).
"""

from __future__ import annotations

import argparse
import contextlib
import random
import sys
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import orjson
import psycopg
from psycopg import sql

from queen.store.migrate import migrate

PARTITIONS = 16
BATCH = 100
PRODUCERS = 2
CONSUMERS = 4
SEED_PER_PARTITION = 500

Conn = psycopg.Connection[Any]


@dataclass
class System:
    """One lifecycle: how to push a batch, and pop and ack one."""

    name: str
    push: Callable[[Conn, int, int], None]  # (conn, partition, first number)
    consume: Callable[[Conn, str], int]  # (conn, worker) -> messages acked


def _items(partition: int, first: int) -> list[dict[str, Any]]:
    return [{"queue": "bench", "partition": f"p{partition}", "payload": {"n": first + i}}
            for i in range(BATCH)]


def push_rows(conn: Conn, partition: int, first: int) -> None:
    conn.execute("SELECT count(*) FROM queen.push_rows(%s::jsonb, NULL)",
                 (orjson.dumps(_items(partition, first)).decode(),))


def minimal_consume(conn: Conn, worker: str) -> int:
    # (The statements of queen.store.lifecycle, reading only what the ack needs, as the
    # naive system does.)
    rows = conn.execute("SELECT transaction_id, lease_id FROM queen.pop_queue("
                        "'bench', '__queue__', %s, %s)", (BATCH, worker)).fetchall()
    if rows:
        lease = str(rows[0][1])
        acks = [{"transactionId": r[0], "status": "completed", "leaseId": lease} for r in rows]
        conn.execute("SELECT count(*) FROM queen.ack_rows(%s::jsonb)",
                     (orjson.dumps(acks).decode(),))
    return len(rows)


NAIVE_TABLE = """
CREATE TABLE bench_naive (
    id bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY, part text NOT NULL,
    payload jsonb NOT NULL, status text NOT NULL DEFAULT 'pending', worker text,
    locked_at timestamptz, completed_at timestamptz, created_at timestamptz NOT NULL DEFAULT now());
CREATE INDEX bench_naive_pending ON bench_naive (id) WHERE status = 'pending';
"""


def naive_push(conn: Conn, partition: int, first: int) -> None:
    conn.execute(
        "INSERT INTO bench_naive (part, payload) SELECT x.partition, x.payload"
        " FROM jsonb_to_recordset(%s::jsonb) x(partition text, payload jsonb)",
        (orjson.dumps(_items(partition, first)).decode(),))


def naive_consume(conn: Conn, worker: str) -> int:
    rows = conn.execute(
        "UPDATE bench_naive SET status = 'processing', worker = %s, locked_at = now()"
        " WHERE id = ANY (ARRAY(SELECT id FROM bench_naive WHERE status = 'pending'"
        " ORDER BY id LIMIT %s FOR UPDATE SKIP LOCKED)) RETURNING id",
        (worker, BATCH)).fetchall()
    if rows:
        conn.execute("UPDATE bench_naive SET status = 'completed', completed_at = now()"
                     " WHERE id = ANY (%s)", ([r[0] for r in rows],))
    return len(rows)


SYSTEMS = [
    System("Queen's functions (queen.push_rows, pop_queue, ack_rows)", push_rows, minimal_consume),
    System("naive lifecycle (insert, claim UPDATE, UPDATE)", naive_push, naive_consume),
]


@contextlib.contextmanager
def bench_database(dsn: str) -> Iterator[str]:
    """A new database migrated for Queen; dropped afterwards."""
    name = f"queen_bench_sql_{uuid.uuid4().hex[:8]}"
    with psycopg.connect(dsn, autocommit=True) as admin:
        admin.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
    target = psycopg.conninfo.make_conninfo(dsn, dbname=name)
    try:
        migrate(target)
        with psycopg.connect(target, autocommit=True) as conn:
            conn.execute(NAIVE_TABLE)  # type: ignore[arg-type]
        yield target
    finally:
        with psycopg.connect(dsn, autocommit=True) as admin:
            admin.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(
                sql.Identifier(name)))


def connect(dsn: str) -> Conn:
    conn = psycopg.connect(dsn, autocommit=True)
    conn.execute("SELECT set_config('queen.push_notify', 'after_commit', false)")
    return conn


def seed(dsn: str, system: System) -> None:
    """A backlog in every partition, then statistics for the planner."""
    with connect(dsn) as conn:
        for p in range(PARTITIONS):
            for b in range(SEED_PER_PARTITION // BATCH):
                system.push(conn, p, b * BATCH)
        conn.execute("ANALYZE")


def run(dsn: str, system: System, seconds: float) -> dict[str, float]:
    """Producers and consumers for seconds; msg/s pushed and consumed, WAL per message."""
    stop = threading.Event()
    pushed = [0] * PRODUCERS
    consumed = [0] * CONSUMERS
    errors: list[BaseException] = []

    def producer(i: int) -> None:
        with connect(dsn) as conn:
            while not stop.is_set():
                system.push(conn, random.randrange(PARTITIONS), pushed[i])
                pushed[i] += BATCH

    def consumer(i: int) -> None:
        with connect(dsn) as conn:
            while not stop.is_set():
                got = system.consume(conn, f"c{i}")
                consumed[i] += got
                if not got:
                    time.sleep(0.001)

    def guarded(target: Callable[[int], None], i: int) -> Callable[[], None]:
        def go() -> None:
            try:
                target(i)
            except BaseException as exc:  # noqa: BLE001 - reported after the run
                errors.append(exc)
                stop.set()
        return go

    with connect(dsn) as conn:
        (start_lsn,) = conn.execute("SELECT pg_current_wal_lsn()").fetchone()  # type: ignore[misc]
        threads = [threading.Thread(target=guarded(producer, i)) for i in range(PRODUCERS)]
        threads += [threading.Thread(target=guarded(consumer, i)) for i in range(CONSUMERS)]
        began = time.monotonic()
        for t in threads:
            t.start()
        stop.wait(seconds)
        stop.set()
        for t in threads:
            t.join(60)
        elapsed = time.monotonic() - began
        (wal,) = conn.execute("SELECT pg_wal_lsn_diff(pg_current_wal_lsn(), %s)",  # type: ignore[misc]
                              (start_lsn,)).fetchone()
    if errors:
        raise errors[0]
    done = sum(consumed)
    return {"pushed": sum(pushed) / elapsed, "consumed": done / elapsed,
            "wal": float(wal) / max(1, done)}


def median(values: list[float]) -> float:
    ordered = sorted(values)
    mid = len(ordered) // 2
    return ordered[mid] if len(ordered) % 2 else (ordered[mid - 1] + ordered[mid]) / 2


def report(rounds: list[dict[str, dict[str, float]]], seconds: float, server: str) -> str:
    """The markdown table: each system's median over the rounds, and its median ratio."""
    naive = SYSTEMS[-1].name
    lines = [
        "# Queen's SQL beside a naive lifecycle",
        "",
        f"`python -m bench.experiments.sql_lifecycle --seconds {seconds:g} --rounds {len(rounds)}`: "
        f"{PRODUCERS} producers (batch {BATCH} into one of {PARTITIONS} partitions) and "
        f"{CONSUMERS} consumers (pop by queue, batch {BATCH}, ack), plain psycopg, one thread "
        f"and connection each; a backlog of {SEED_PER_PARTITION} per partition seeded and "
        f"ANALYZEd first; the systems take turns, {seconds:g} s each, round after round "
        f"(medians of the rounds; the ratio is the median of each round's ratio). "
        f"Server: {server}.",
        "",
        "| system | pushed msg/s | consumed msg/s | consumed vs naive | WAL bytes / msg |",
        "|---|---:|---:|---:|---:|",
    ]
    for system in SYSTEMS:
        runs = [r[system.name] for r in rounds]
        ratio = median([r[system.name]["consumed"] / r[naive]["consumed"] for r in rounds])
        lines.append(
            f"| {system.name} | {median([x['pushed'] for x in runs]):,.0f} | "
            f"{median([x['consumed'] for x in runs]):,.0f} | {ratio:.2f}x | "
            f"{median([x['wal'] for x in runs]):,.0f} |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dsn", default="postgresql://postgres@127.0.0.1:5432/postgres")
    parser.add_argument("--seconds", type=float, default=7.0, help="per system and round")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--out", type=Path, default=Path("bench/results/sql-lifecycle.md"))
    args = parser.parse_args(argv)
    with psycopg.connect(args.dsn) as conn:
        settings = dict(conn.execute(
            "SELECT name, setting FROM pg_settings WHERE name IN"
            " ('server_version', 'autovacuum', 'synchronous_commit')").fetchall())
    server = (f"PostgreSQL {settings['server_version']}, autovacuum {settings['autovacuum']}, "
              f"synchronous_commit {settings['synchronous_commit']}")
    rounds: list[dict[str, dict[str, float]]] = []
    with contextlib.ExitStack() as stack:
        dsns = {}
        for system in SYSTEMS:
            print(f"seeding {system.name}", file=sys.stderr, flush=True)
            dsns[system.name] = stack.enter_context(bench_database(args.dsn))
            seed(dsns[system.name], system)
        for n in range(1, args.rounds + 1):
            rounds.append({})
            for system in SYSTEMS:
                result = run(dsns[system.name], system, args.seconds)
                rounds[-1][system.name] = result
                print(f"[round {n}/{args.rounds}] {system.name}: "
                      f"{result['consumed']:,.0f} msg/s consumed, "
                      f"{result['wal']:,.0f} WAL bytes/msg", file=sys.stderr, flush=True)
    text = report(rounds, args.seconds, server)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(text, encoding="utf-8")
    print(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
