"""What a message's lifecycle costs PostgreSQL when requests share calls: Queen's server
statements beside the same design in plain SQL and the naive lifecycle.

    python -m bench.experiments.fused_limit [--fused 1,8,16] [--batch 1] [--partitions 16]
        [--cycles 300] [--rounds 3] [--out FILE] [--plot FILE]

On a cluster of the bench's own, one database holds Queen's schema (`queen migrate`'s
code), raw's and minimal's (bench/adapters.py). A cycle is --fused requests of --batch
messages each (a request's into one partition), pushed, popped and acked; each system
runs --cycles of them in turns within every round (a warm-up pass, then a measured one),
on two sessions of its own: a producer's, whose commits wait for the disk, and a
consumer's, whose claims and acks do not, as in the PG-bound bench; every session is set
as the server's pool sets its own (one plan a prepared statement, no JIT), so that no
system pays for planning. The systems:

- raw: the naive lifecycle as raw's clients run it, a statement a request for each step;
- raw fused: the same statements with the cycle's requests in one call a step (raw's
  lifecycle at batch --fused times --batch);
- minimal: Queen's model in plain SQL as minimal's clients run it, a call a request a step;
- minimal fused: each step of the cycle in one statement: each request's messages pushed
  into a partition of its own under the partitions' locks, --fused partitions leased with
  a request's batch read from each, their cursors moved;
- queen: the server's own statements for a call of --fused requests of each kind
  (`push_new`, `pop_many`, `ack_whole`; one request: `push_new`, `pop_one`, `ack_lease`),
  pops by queue on --partitions partitions. The wake-ups a push sends while polls are
  parked and maintenance's count rollup are not counted (the PG-bound bench reports
  them).

Reported, the median of the rounds: the backends' CPU a message (/proc/<pid>/schedstat,
so the cluster runs on this machine; it counts what pg_stat_statements leaves out: the
parameters, the transaction's start and commit, the executor's set-up), by step and in
all, and raw's total over each system's: how many messages each moves for raw's one on
the same PostgreSQL CPU.
"""

from __future__ import annotations

import argparse
import contextlib
import statistics
from typing import Any

import orjson
import psycopg
from psycopg.types.string import TextLoader

from bench import cluster
from bench.adapters import (
    MINIMAL_ACK,
    MINIMAL_DDL,
    MINIMAL_POP,
    MINIMAL_PUSH,
    PAYLOAD,
    PAYLOAD_JSON,
    RAW_ACK,
    RAW_DDL,
    RAW_POP,
    RAW_PUSH,
)
from bench.experiments import save_lines
from bench.experiments.server_calls import BackendCpu, pop_params
from bench.systems import fresh_database
from queen.store.db import QUERIES
from queen.store.messages import ack_columns, ack_lease_params, push_new_params
from queen.store.migrate import migrate

Conn = psycopg.Connection[Any]
STEPS = ("push", "pop", "ack")
# Every session as the server's pool sets its own (queen.store.db): one plan a prepared
# statement, no JIT, UTC timestamps, pushes' wake-ups left to the server.
SESSION = (
    "SELECT set_config('plan_cache_mode', 'force_generic_plan', false),"
    " set_config('jit', 'off', false), set_config('TimeZone', 'UTC', false),"
    " set_config('queen.push_notify', 'after_commit', false)"
)

# Minimal's three steps for many partitions at once, in the shape of its one-partition
# statements (bench/adapters.py): locks taken in partition order, each leased partition's
# batch read past its cursor, each cursor moved to its lease's last message. The pop's
# LIMIT is written into it, as minimal's: with a parameter there, a generic plan may join
# every message to find the partitions with work.
MINIMAL_PUSH_MANY = """
WITH locked AS MATERIALIZED (
    SELECT pg_advisory_xact_lock(p::bigint)
    FROM (SELECT DISTINCT p FROM unnest(%(partitions)s::integer[]) p) p ORDER BY p
), made AS (
    INSERT INTO bench_min.cursors (partition)
    SELECT DISTINCT p FROM (SELECT count(*) FROM locked) l, unnest(%(partitions)s::integer[]) p
    ON CONFLICT DO NOTHING
)
INSERT INTO bench_min.messages (partition, payload)
SELECT u.p, u.v
FROM (SELECT count(*) FROM locked) l,
     unnest(%(partitions)s::integer[], %(payloads)s::jsonb[]) u(p, v)
"""
MINIMAL_POP_MANY = """
WITH c AS (
    SELECT c.partition, c.cursor_id FROM bench_min.cursors c
    WHERE c.lease_until < now()
      AND EXISTS (SELECT 1 FROM bench_min.messages m
                  WHERE m.partition = c.partition AND m.id > c.cursor_id)
    LIMIT {pops} FOR UPDATE SKIP LOCKED
), batch AS MATERIALIZED (
    SELECT m.partition, m.id, m.transaction_id, m.payload
    FROM c CROSS JOIN LATERAL (
        SELECT x.partition, x.id, x.transaction_id, x.payload FROM bench_min.messages x
        WHERE x.partition = c.partition AND x.id > c.cursor_id ORDER BY x.id LIMIT {batch}
    ) m
), leased AS (
    UPDATE bench_min.cursors x
    SET lease_until = now() + interval '5 minutes', lease_last = s.last
    FROM (SELECT b.partition, max(b.id) AS last FROM batch b GROUP BY b.partition) s
    WHERE x.partition = s.partition
)
SELECT partition, id, transaction_id, payload FROM batch ORDER BY partition, id
"""
MINIMAL_ACK_MANY = """
UPDATE bench_min.cursors x SET cursor_id = x.lease_last, lease_until = '-infinity'
FROM unnest(%(partitions)s::integer[], %(lasts)s::bigint[]) u(p, l)
WHERE x.partition = u.p AND x.lease_last = u.l
"""


class System:
    """One system's producer and consumer sessions, the CPU their backends spend by step."""

    def __init__(self, dsn: str, fused: int, batch: int, partitions: int) -> None:
        self.fused = fused
        self.batch = batch
        self.partitions = partitions
        self.producer: Conn = psycopg.connect(dsn, autocommit=True)
        self.consumer: Conn = psycopg.connect(dsn, autocommit=True)
        self.consumer.execute("SET synchronous_commit = off")
        for conn in (self.producer, self.consumer):
            conn.adapters.register_loader("jsonb", TextLoader)
            conn.execute(SESSION)
        self.cpu = {"push": BackendCpu(self.producer), "pop": BackendCpu(self.consumer),
                    "ack": BackendCpu(self.consumer)}
        self.number = 0

    def close(self) -> None:
        self.producer.close()
        self.consumer.close()

    def step(self, kind: str, query: str, params: Any) -> list[Any]:
        """Run a step's statement (a push on the producer's session, else the consumer's);
        its rows."""
        conn = self.producer if kind == "push" else self.consumer
        with self.cpu[kind].call(kind):
            cursor = conn.execute(query, params)
            return cursor.fetchall() if cursor.description else []

    def reset(self) -> None:
        for kind, cpu in self.cpu.items():
            cpu.spent.pop(kind, None)

    def per_message(self) -> dict[str, float]:
        """The median CPU of a cycle's step, over the cycle's messages (µs)."""
        spent = {kind: statistics.median(self.cpu[kind].spent[kind]) / 1000 for kind in STEPS}
        per_cycle = {kind: spent[kind] * self.calls_a_step() for kind in STEPS}
        return {kind: per_cycle[kind] / (self.fused * self.batch) for kind in STEPS}

    def calls_a_step(self) -> int:
        return 1

    def cycle(self) -> None:
        raise NotImplementedError


class Raw(System):
    def calls_a_step(self) -> int:
        return self.fused

    def cycle(self) -> None:
        for _ in range(self.fused):
            self.step("push", RAW_PUSH, (0, body(self.batch)))
        popped = [[r[0] for r in self.step("pop", RAW_POP, (self.batch,))]
                  for _ in range(self.fused)]
        for ids in popped:
            self.step("ack", RAW_ACK, (ids,))


class RawFused(System):
    def cycle(self) -> None:
        self.step("push", RAW_PUSH, (0, body(self.fused * self.batch)))
        rows = self.step("pop", RAW_POP, (self.fused * self.batch,))
        self.step("ack", RAW_ACK, ([r[0] for r in rows],))


class Minimal(System):
    def calls_a_step(self) -> int:
        return self.fused

    def cycle(self) -> None:
        for _ in range(self.fused):
            partition = self.number % self.partitions
            self.number += 1
            self.step("push", MINIMAL_PUSH, {"partition": partition, "items": body(self.batch)})
        leases: list[tuple[int, int]] = []
        for _ in range(self.fused):
            rows = self.step("pop", MINIMAL_POP, {"batch": self.batch})
            leases.append((rows[0][0], max(r[1] for r in rows)))
        for partition, last in leases:
            self.step("ack", MINIMAL_ACK, {"partition": partition, "last": last})


class MinimalFused(System):
    def cycle(self) -> None:
        partitions = [(self.number + k) % self.partitions for k in range(self.fused)
                      for _ in range(self.batch)]
        self.number += self.fused
        payloads = [PAYLOAD_JSON.decode()] * len(partitions)
        self.step("push", MINIMAL_PUSH_MANY, {"partitions": partitions, "payloads": payloads})
        pop = MINIMAL_POP_MANY.format(pops=self.fused, batch=self.batch)
        lasts: dict[int, int] = {}
        for row in self.step("pop", pop, None):  # (in partition and id order)
            lasts[row[0]] = row[1]
        self.step("ack", MINIMAL_ACK_MANY, {"partitions": list(lasts),
                                             "lasts": list(lasts.values())})


class Queen(System):
    def cycle(self) -> None:
        requests = []
        for _ in range(self.fused):
            partition = f"p{self.number % self.partitions}"
            requests.append([{"queue": "bench", "partition": partition, "payload": PAYLOAD}
                             for _ in range(self.batch)])
            self.number += 1
        bodies = ",".join(orjson.dumps({"items": r}).decode() for r in requests)
        items = [item for r in requests for item in r]
        params, _ = push_new_params({"bodies": f"[{bodies}]", "producer": None}, items)
        (fits, *_), = self.step("push", QUERIES["push_new"], params)
        if not fits:
            raise SystemExit("push_new stored nothing: the queue's partitions must exist")
        if self.fused > 1:
            pops = orjson.dumps([pop_params(self.batch) for _ in range(self.fused)]).decode()
            rows = self.step("pop", QUERIES["pop_many"], {"pops": pops})
        else:
            rows = self.step("pop", QUERIES["pop_one"], pop_params(self.batch))
        acks = popped_acks(rows)
        if sum(map(len, acks)) != len(items):
            raise SystemExit(f"a pop call served {sum(map(len, acks))} of {len(items)}")
        if self.fused == 1:  # (a lone request naming its lease: ack_lease, as the server's)
            self.step("ack", QUERIES["ack_lease"], ack_lease_params(acks[0]))
            return
        columns = ack_columns([a for r in acks for a in r], [len(r) for r in acks])
        self.step("ack", QUERIES["ack_whole"], columns)


def popped_acks(rows: list[Any]) -> list[list[dict[str, Any]]]:
    """The acks of each pop's messages as popped, from the rows of pop_one or pop_many
    (position, id, transactionId, ..., the leaseId on a pop's first row)."""
    requests: dict[int, list[dict[str, Any]]] = {}
    lease = None
    for row in rows:
        lease = row[11] or lease
        requests.setdefault(row[0], []).append(
            {"transactionId": row[2], "status": "completed", "leaseId": str(lease)})
    return list(requests.values())


def body(n: int) -> str:
    """A push body of n messages (raw's and minimal's)."""
    return "[" + ",".join([PAYLOAD_JSON.decode()] * n) + "]"


SYSTEMS: dict[str, type[System]] = {
    "raw": Raw, "raw fused": RawFused, "minimal": Minimal, "minimal fused": MinimalFused,
    "queen": Queen,
}


def prepare(dsn: str, partitions: int) -> None:
    """Raw's and minimal's tables, and Queen's queue with its partitions made."""
    migrate(dsn)
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(RAW_DDL)
        conn.execute(MINIMAL_DDL)
        conn.execute(
            "INSERT INTO bench_min.cursors (partition) SELECT generate_series(0, %s - 1)",
            (partitions,))
        items = [{"queue": "bench", "partition": f"p{k}", "payload": PAYLOAD}
                 for k in range(partitions)]
        conn.execute("SELECT count(*) FROM queen.push(%s::jsonb, NULL)",
                     (orjson.dumps(items).decode(),))
        # (Drained, so that each cycle's pops take what it pushed.)
        while rows := conn.execute(QUERIES["pop_one"], pop_params(1)).fetchall():
            conn.execute(QUERIES["ack_lease"], ack_lease_params(popped_acks(rows)[0]))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.experiments.fused_limit")
    parser.add_argument("--fused", default="1,8,16", help="requests a call, comma list")
    parser.add_argument("--batch", type=int, default=1, help="messages a request")
    parser.add_argument("--partitions", type=int, default=16)
    parser.add_argument("--cycles", type=int, default=300)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--out", default="", help="the table's markdown file")
    parser.add_argument("--plot", default="", help="a PNG of the table (matplotlib)")
    args = parser.parse_args(argv)
    sizes = [int(x) for x in args.fused.split(",")]
    if max(sizes) > args.partitions:
        parser.error("--fused may not exceed --partitions: each message leases a partition")
    results: dict[tuple[int, str], list[dict[str, float]]] = {}
    with contextlib.ExitStack() as stack:
        server = stack.enter_context(cluster.bench_cluster())
        dsn = fresh_database(server.dsn, "queen_fused_limit")
        prepare(dsn, args.partitions)
        describe = cluster.describe(server.dsn, True)
        for number in range(1, args.rounds + 1):
            for fused in sizes:
                for name, kind in SYSTEMS.items():
                    system = kind(dsn, fused, args.batch, args.partitions)
                    try:
                        for _warm_then_measured in range(2):
                            system.reset()
                            for _ in range(args.cycles):
                                system.cycle()
                        spent = system.per_message()
                    finally:
                        system.close()
                    results.setdefault((fused, name), []).append(spent)
                    steps = ", ".join(f"{kind} {spent[kind]:.0f}" for kind in STEPS)
                    print(f"round {number}/{args.rounds}, {fused} a cycle, {name}:"
                          f" {sum(spent.values()):.0f} µs a message ({steps})", flush=True)
    medians = {
        (fused, name): {kind: statistics.median(r[kind] for r in results[(fused, name)])
                        for kind in STEPS}
        for fused in sizes for name in SYSTEMS
    }
    lines = [
        "# A message's lifecycle, fused: Queen's statements beside minimal and raw",
        "",
        f"- {describe}",
        f"- {args.cycles} cycles a round, {args.rounds} rounds, {args.partitions} partitions,"
        f" {args.batch} message(s) a request; the backends' CPU a message (µs), medians of"
        " the rounds",
        "",
        "| requests a call | system | push | pop | ack | total | raw / this |",
        "|---:|---|---:|---:|---:|---:|---:|",
    ]
    for fused in sizes:
        raw = sum(medians[(fused, "raw")].values())
        for name in SYSTEMS:
            m = medians[(fused, name)]
            total = sum(m.values())
            lines.append(f"| {fused} | {name} | {m['push']:.0f} | {m['pop']:.0f} |"
                         f" {m['ack']:.0f} | {total:.0f} | {raw / total:.2f} |")
    if args.out:
        save_lines(args.out, lines)
    else:
        print("\n".join(lines))
    if args.plot:
        plot(args.plot, sizes, args.batch, medians)
    return 0


def plot(path: str, sizes: list[int], batch: int,
         medians: dict[tuple[int, str], dict[str, float]]) -> None:
    """Stacked bars: each system's µs a message by step, a group of bars a call size."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(9, 4.5))
    width = 0.8 / len(SYSTEMS)
    colors = {"push": "#4c72b0", "pop": "#dd8452", "ack": "#55a868"}
    for i, name in enumerate(SYSTEMS):
        xs = [x + (i - (len(SYSTEMS) - 1) / 2) * width for x in range(len(sizes))]
        bottom = [0.0] * len(sizes)
        for kind in STEPS:
            values = [medians[(fused, name)][kind] for fused in sizes]
            ax.bar(xs, values, width * 0.95, bottom=bottom, color=colors[kind],
                   label=kind if i == 0 else None)
            bottom = [b + v for b, v in zip(bottom, values, strict=True)]
        for x, total in zip(xs, bottom, strict=True):
            ax.text(x, total, name, rotation=90, ha="center", va="bottom", fontsize=7)
    top = max(sum(m.values()) for m in medians.values())
    ax.set_ylim(0, top * 1.2)  # (room for the names above the bars)
    ax.set_xticks(range(len(sizes)), [f"{f} request(s) a call" for f in sizes])
    ax.set_ylabel("PostgreSQL CPU µs / message")
    ax.set_title(f"A message's lifecycle, fused ({batch} message(s) a request):"
                 " Queen beside minimal and raw")
    ax.grid(True, axis="y", alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


if __name__ == "__main__":
    raise SystemExit(main())
