"""10,000 parked long polls over 2 workers: memory, database connections, exactly-once delivery.

    python -m bench.experiments.longpoll_scale [--polls 10000] [--workers 2] [--pool 10] [--cluster]

1. Start Queen (gunicorn, maintenance off) on a fresh database; warm each worker up;
   read each worker's RSS and the database connections (pg_stat_activity).
2. Park --polls long polls (pop by queue, timeout 60 s) on one plain-socket client.
3. Read RSS again: (delta over all workers) / polls is the memory per parked poll
   (goal <= 30 KB). Count database connections (goal: pool size + 1 listener per worker,
   whatever the number of waiters).
4. Push one message to each of --polls partitions (batches of 1000) and read every
   answer, acking what arrived in batches as a consumer would (a poll that times out
   with 204 is sent again): each message must reach exactly one poll. Connections are sampled during the wake-up storm too.
Writes bench/results/longpoll-scale.md.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime as dt
import os
import platform
import resource
import threading
import time

import psycopg
import requests

from bench import cluster, procstat
from bench.experiments import save_lines
from bench.experiments.rawpoll import Poll, Reader
from bench.systems import BENCH_DIR, QueenServer, drop_database, fresh_database

SERVER_DSN = os.environ.get("QUEEN_BENCH_DSN", "postgresql://postgres@127.0.0.1:5432/postgres")
PATH = "/api/v1/pop/queue/scale?wait=true&timeout=60000"
KB = 1024
# Queue mode's status of every message of the queue (queen.message_status), counted.
STATUSES = """
SELECT queen.message_status(m.id, c, f.status), count(*)
FROM queen.messages m
JOIN queen.partitions p ON p.id = m.partition_id
JOIN queen.queues q ON q.id = p.queue_id
LEFT JOIN queen.consumers c
       ON c.partition_id = m.partition_id AND c.consumer_group = '__queue__'
LEFT JOIN queen.failures f ON f.partition_id = m.partition_id
      AND f.consumer_group = '__queue__' AND f.message_id = m.id
WHERE q.name = 'scale' GROUP BY 1
"""


def connections(dsn: str) -> dict[str, int]:
    """Backends connected to the bench database, by application_name (not counting ours)."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        rows = conn.execute(
            "SELECT application_name, count(*) FROM pg_stat_activity"
            " WHERE datname = current_database() AND pid <> pg_backend_pid() GROUP BY 1"
        ).fetchall()
    return {name or "?": n for name, n in rows}


class Sampler(threading.Thread):
    """Keep the highest connection count seen while the wake-up storm runs."""

    def __init__(self, dsn: str) -> None:
        super().__init__(daemon=True)
        self.dsn = dsn
        self.peak: dict[str, int] = {}
        self.running = True

    def run(self) -> None:
        while self.running:
            seen = connections(self.dsn)
            if sum(seen.values()) > sum(self.peak.values()):
                self.peak = seen
            time.sleep(0.05)


def worker_rss(server: QueenServer) -> int:
    return sum(procstat.rss_bytes(pid) for pid in server.worker_pids())


def warm_up(server: QueenServer, workers: int) -> None:
    """Let every worker serve some pushes, pops and long polls before the baseline."""
    session = requests.Session()
    for i in range(20 * workers):
        item = {"queue": "warm", "partition": f"p{i % 7}", "payload": {"i": i}}
        session.post(f"{server.url}/api/v1/push", json={"items": [item]}, timeout=10)
        session.get(f"{server.url}/api/v1/pop/queue/warm?wait=true&timeout=10", timeout=10)
    reader = Reader()
    for _ in range(200):
        reader.add(Poll(server.port, "/api/v1/pop/queue/none?wait=true&timeout=300"))
    reader.until(200, 10)


def read_and_ack(
    reader: Reader, session: requests.Session, server: QueenServer, count: int, timeout_s: float
) -> tuple[list[Poll], int]:
    """Read answers as consumers would: ack what arrived, in batches; poll again after a 204.

    Returns the answered polls and how many polls were sent again.
    """
    deadline = time.monotonic() + timeout_s
    finished: list[Poll] = []
    delivered = repolled = 0
    while delivered < count and time.monotonic() < deadline:
        done = reader.step(max(0.0, min(0.2, deadline - time.monotonic())))
        finished += done
        for poll in done:
            if poll.status == 204:
                reader.add(Poll(server.port, PATH))
                repolled += 1
        acks = [
            {"transactionId": t, "status": "completed"} for p in done for t in p.transaction_ids
        ]
        delivered += len(acks)
        for first in range(0, len(acks), 1000):
            body = {"acknowledgments": acks[first : first + 1000]}
            response = session.post(f"{server.url}/api/v1/ack/batch", json=body, timeout=60)
            assert response.status_code == 200, response.text
    return finished, repolled


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--polls", type=int, default=10_000)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--pool", type=int, default=10, help="DB_POOL_SIZE per worker")
    parser.add_argument("--out", default=str(BENCH_DIR / "results" / "longpoll-scale.md"))
    cluster.add_argument(parser)
    args = parser.parse_args()
    with contextlib.ExitStack() as stack:
        run(args, cluster.server_dsn(SERVER_DSN, args.cluster, stack))


def run(args: argparse.Namespace, server_dsn: str) -> None:
    n = args.polls
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (min(hard, max(soft, n + 1000)), hard))

    name = "queen_bench_scale"
    dsn = fresh_database(server_dsn, name)
    postgres = cluster.describe(server_dsn, args.cluster)
    env = {
        "QUEEN_WORKER_CONNECTIONS": str(n + 1000),
        "DB_POOL_SIZE": str(args.pool),
    }
    server = QueenServer(dsn, workers=args.workers, maintenance=False, extra_env=env).start()
    try:
        print(f"Queen up on {server.url} ({args.workers} workers); warming up", flush=True)
        warm_up(server, args.workers)
        time.sleep(1)
        rss_before = worker_rss(server)
        conns_idle = connections(dsn)
        print(f"baseline: workers RSS {rss_before / KB / KB:.1f} MB, connections {conns_idle}")

        reader = Reader()
        started = time.monotonic()
        for i in range(n):
            reader.add(Poll(server.port, PATH))
            if (i + 1) % 2000 == 0:
                print(f"  {i + 1}/{n} polls sent", flush=True)
        park_s = time.monotonic() - started
        time.sleep(5)  # every poll checks once, then parks
        early = reader.step(0)
        rss_parked = worker_rss(server)
        conns_parked = connections(dsn)
        per_poll = (rss_parked - rss_before) / n
        print(
            f"parked: workers RSS {rss_parked / KB / KB:.1f} MB, {per_poll / KB:.1f} KB/poll,"
            f" connections {conns_parked}, answered early {len(early)}",
            flush=True,
        )

        sampler = Sampler(dsn)
        sampler.start()
        session = requests.Session()
        pushed: list[str] = []
        push_started = time.monotonic()
        for start in range(0, n, 1000):
            items = [
                {"queue": "scale", "partition": f"p{i}", "payload": {"i": i}}
                for i in range(start, min(n, start + 1000))
            ]
            response = session.post(f"{server.url}/api/v1/push", json={"items": items}, timeout=60)
            assert response.status_code == 201, response.text
            pushed += [m["transactionId"] for m in response.json()["messages"]]
        answered, repolled = read_and_ack(reader, session, server, n, 300)
        finished = early + answered
        storm_s = time.monotonic() - push_started
        sampler.running = False
        sampler.join()
        delivered = [t for p in finished for t in p.transaction_ids]
        statuses = {code: sum(p.status == code for p in finished) for code in (200, 204)}
        exactly_once = sorted(delivered) == sorted(pushed)
        with psycopg.connect(dsn, autocommit=True) as conn:
            by_status = dict(conn.execute(STATUSES).fetchall())
        print(
            f"delivered {len(delivered)} of {len(pushed)} in {storm_s:.2f}s,"
            f" distinct {len(set(delivered))}, statuses {statuses}, exactly once: {exactly_once}"
        )
        print(f"peak connections during the wake-ups: {sampler.peak}")
    finally:
        server.stop()
        drop_database(server_dsn, name)

    expected = args.workers * (args.pool + 1)
    lines = [
        "# 10,000 parked long polls",
        "",
        f"{dt.datetime.now(dt.UTC):%Y-%m-%d %H:%M} UTC, `python -m bench.experiments.longpoll_scale"
        f" --polls {n} --workers {args.workers} --pool {args.pool}`; {platform.node()},"
        f" {os.cpu_count()} CPUs, load average {os.getloadavg()[0]:.1f} at the end;"
        f" {postgres}.",
        "",
        "| measure | value | goal |",
        "|---|---|---|",
        f"| polls parked (sent in) | {n} ({park_s:.1f} s) | |",
        f"| workers' RSS before → parked | {rss_before / KB / KB:.1f} MB →"
        f" {rss_parked / KB / KB:.1f} MB | |",
        f"| memory per parked poll | {per_poll / KB:.1f} KB | ≤ 30 KB |",
        f"| DB connections, idle | {sum(conns_idle.values())} {conns_idle} | |",
        f"| DB connections, {n} parked | {sum(conns_parked.values())} {conns_parked}"
        f" | ≤ {expected} (pool {args.pool} + 1 listener per worker) |",
        f"| DB connections, peak while waking | {sum(sampler.peak.values())} {sampler.peak}"
        f" | ≤ {expected} |",
        f"| messages pushed / delivered / distinct | {len(pushed)} / {len(delivered)} /"
        f" {len(set(delivered))} | equal |",
        f"| every message delivered exactly once | {'yes' if exactly_once else 'NO'} | yes |",
        f"| message statuses afterwards | {by_status} | all completed |",
        f"| push of all → last message answered | {storm_s:.2f} s | |",
        f"| answers 200 / 204 (polls re-sent after a 204) | {statuses[200]} / {statuses[204]}"
        f" ({repolled}) | |",
    ]
    save_lines(args.out, lines)


if __name__ == "__main__":
    main()
