"""Every request the dashboard's pages make, timed on a big database (goal: none over 1 s).

    python -m bench.experiments.dashboard_scale [--dsn ... | --cluster] [--skip-seed] [--repeat 5]
        [--messages 1000000]

Seeds (bench.experiments.seed) 100 queues, 1,000 partitions and 1 million messages
into a fresh database on $QUEEN_BENCH_DSN's server, or with --cluster on a throwaway
cluster with default settings (autovacuum on), starts Queen (2 workers plus maintenance)
and requests what each page asks for, --repeat times
one after another, on an otherwise idle server: the overview (page, scripts, token,
throughput, the socket's first queue.depth snapshot), a queue's page, the message browser
with each filter and a deep page, a message, dead letters, consumer groups, and the
actions (configure, retry, delete, clear). Writes bench/results/dashboard-scale.md.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime as dt
import json
import os
import platform
import statistics
import time
from collections.abc import Callable
from typing import Any

import psycopg
import requests
import websocket

from bench import cluster
from bench.experiments import save_lines, seed
from bench.systems import BENCH_DIR, QueenServer, fresh_database

SERVER_DSN = os.environ.get("QUEEN_BENCH_DSN", "postgresql://postgres@127.0.0.1:5432/postgres")
NAME = "queen_bench_dashscale"
GOAL_MS = 1000.0


def seed_database(dsn: str, messages: int) -> None:
    seed.main(["--dsn", dsn, "--messages", str(messages), "--partitions", "1000",
               "--queues", "100", "--chunk", "250000"])


# A pending message (past queue mode's cursor), a dead letter and a completed one (behind
# the cursor, with no failure record), in queue mode's terms.
SAMPLE_MESSAGES = """
SELECT (SELECT queen.txid(m.transaction_id, m.partition_id, m.id) FROM queen.consumers c
        JOIN queen.messages m ON m.partition_id = c.partition_id AND m.id > c.cursor_id
        WHERE c.consumer_group = '__queue__' LIMIT 1),
       (SELECT queen.txid(m.transaction_id, m.partition_id, m.id) FROM queen.failures f
        JOIN queen.messages m ON m.partition_id = f.partition_id AND m.id = f.message_id
        WHERE f.consumer_group = '__queue__' AND f.status = 'dead_letter' LIMIT 1),
       (SELECT queen.txid(m.transaction_id, m.partition_id, m.id) FROM queen.consumers c
        JOIN queen.messages m ON m.partition_id = c.partition_id AND m.id <= c.cursor_id
        WHERE c.consumer_group = '__queue__' AND NOT EXISTS (
            SELECT 1 FROM queen.failures f WHERE f.partition_id = m.partition_id
              AND f.consumer_group = '__queue__' AND f.message_id = m.id) LIMIT 1)
"""


def sample(dsn: str) -> dict[str, str]:
    """A queue with its busiest partition, one message, one dead letter, a queue to clear."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        queue, partition = conn.execute(
            "SELECT q.name, p.name FROM queen.partitions p JOIN queen.queues q ON q.id = p.queue_id"
            " ORDER BY q.name, p.name LIMIT 1").fetchone() or ("", "")
        txid, dead, doomed = conn.execute(SAMPLE_MESSAGES).fetchone() or ("", "", "")
        last = conn.execute(  # a queue that still has messages (an earlier run cleared one)
            "SELECT q.name FROM queen.queues q WHERE q.name <> %s AND EXISTS (SELECT 1 FROM"
            " queen.partitions p JOIN queen.messages m ON m.partition_id = p.id"
            " WHERE p.queue_id = q.id) ORDER BY q.name DESC LIMIT 1", (queue,)).fetchone()
    return {"queue": queue, "partition": partition, "txid": txid, "dead": dead,
            "doomed": doomed, "clear": last[0] if last else ""}


def first_depth(url: str) -> tuple[float, bool]:
    """Open the dashboard socket; time until its first queue.depth event."""
    started = time.perf_counter()
    ws = websocket.create_connection(url.replace("http", "ws") + "/ws/dashboard", timeout=30)
    ws.send(json.dumps({"type": "subscribe", "queues": [], "batch": True}))  # as the page does
    try:
        while True:
            event = json.loads(ws.recv())
            if event["event"] == "queue.depth":
                return (time.perf_counter() - started) * 1000, True
    finally:
        ws.close()


def requests_of(s: dict[str, str]) -> list[tuple[str, str, str, Any]]:
    """(page, method, path, json body) of what the pages request, in page order."""
    q, p = s["queue"], s["partition"]
    m = "/api/v1/messages"
    return [
        ("overview", "GET", "/dashboard", None),
        ("overview", "GET", "/dashboard/static/app.js", None),
        ("overview", "GET", "/dashboard/static/pages.js", None),
        ("overview", "GET", "/api/v1/auth/me", None),
        ("overview", "GET", "/api/v1/analytics/throughput", None),
        ("overview", "GET", f"/api/v1/analytics/throughput?queue={q}", None),
        ("queue", "GET", f"/api/v1/resources/queues/{q}", None),
        ("queue", "GET", f"/api/v1/consumer-groups?queue={q}", None),
        ("messages", "GET", "/api/v1/resources/queues", None),
        ("messages", "GET", f"{m}?limit=50&offset=0", None),
        ("messages", "GET", f"{m}?queue={q}&limit=50&offset=0", None),
        ("messages", "GET", f"{m}?queue={q}&partition={p}&limit=50&offset=0", None),
        ("messages", "GET", f"{m}?queue={q}&status=pending&limit=50&offset=0", None),
        ("messages", "GET", f"{m}?status=completed&limit=50&offset=0", None),
        ("messages", "GET", f"{m}?status=failed&limit=50&offset=0", None),
        ("messages", "GET", f"{m}?queue={q}&limit=50&offset=2000", None),
        ("message", "GET", f"{m}/{s['txid']}", None),
        ("dead letters", "GET", f"{m}?status=dead_letter&limit=50&offset=0", None),
        ("dead letters", "GET", f"{m}?queue={q}&status=dead_letter&limit=50&offset=0", None),
        ("groups", "GET", "/api/v1/consumer-groups", None),
        ("actions", "POST", "/api/v1/configure", {"queue": q, "options": {"retryLimit": 4}}),
    ]


def one_shot(s: dict[str, str]) -> list[tuple[str, str, str, Any]]:
    """Actions that change what they act on: timed once each."""
    m = "/api/v1/messages"
    return [
        ("actions", "POST", f"{m}/{s['dead']}/retry", None),
        ("actions", "DELETE", f"{m}/{s['doomed']}", None),
        ("actions", "DELETE", f"/api/v1/queues/{s['clear']}/clear", None),
    ]


def timed(session: requests.Session, url: str, method: str, path: str, body: Any) -> tuple[float, int]:
    started = time.perf_counter()
    resp = session.request(method, url + path, json=body, timeout=60)
    return (time.perf_counter() - started) * 1000, resp.status_code


def measure(url: str, s: dict[str, str], repeat: int) -> list[dict[str, Any]]:
    rows: list[dict[str, Any]] = []
    with requests.Session() as session:
        for page, method, path, body in requests_of(s):
            times, codes = [], set()
            for _ in range(repeat):
                ms, code = timed(session, url, method, path, body)
                times.append(ms)
                codes.add(code)
            rows.append(row(page, f"{method} {path}", times, codes))
        socket_times = [first_depth(url)[0] for _ in range(repeat)]
        rows.insert(6, row("overview", "WS /ws/dashboard (to the first queue.depth)",
                           socket_times, {101}))
        for page, method, path, body in one_shot(s):
            ms, code = timed(session, url, method, path, body)
            rows.append(row(page, f"{method} {path}", [ms], {code}))
    return rows


def row(page: str, what: str, times: list[float], codes: set[int]) -> dict[str, Any]:
    return {"page": page, "request": what, "median": statistics.median(times),
            "max": max(times), "codes": ",".join(map(str, sorted(codes)))}


def report(
    rows: list[dict[str, Any]], counts: dict[str, int], repeat: int, server: str
) -> list[str]:
    worst = max(rows, key=lambda r: r["max"])
    over = [r for r in rows if r["max"] > GOAL_MS]
    lines = [
        f"# The dashboard's requests on {counts['queues']} queues, {counts['partitions']:,} "
        f"partitions, {counts['messages']:,} messages",
        "",
        f"Run {dt.datetime.now(dt.UTC):%Y-%m-%d %H:%M} UTC on {platform.node()} "
        f"({os.cpu_count()} cores, Python {platform.python_version()}); {server}, "
        "ANALYZEd after seeding only when autovacuum is off. Queen: 2 workers + maintenance, "
        "idle apart from these "
        f"requests, each made {repeat} times one after another (actions that change their "
        f"target once). Database: {counts['queues']} queues, {counts['partitions']:,} "
        f"partitions, {counts['messages']:,} messages.",
        "",
        f"Goal: no request over {GOAL_MS:.0f} ms. Slowest: {worst['request']} at "
        f"{worst['max']:.0f} ms. Over the goal: {len(over)}.",
        "",
        "| page | request | median ms | max ms | status |",
        "|---|---|---|---|---|",
    ]
    lines += [f"| {r['page']} | `{r['request']}` | {r['median']:.1f} | {r['max']:.1f} | "
              f"{r['codes']} |" for r in rows]
    return lines


def counts_of(dsn: str) -> dict[str, int]:
    with psycopg.connect(dsn, autocommit=True) as conn:
        q, p, m = conn.execute(
            "SELECT (SELECT count(*) FROM queen.queues), (SELECT count(*) FROM queen.partitions),"
            " (SELECT count(*) FROM queen.messages)").fetchone() or (0, 0, 0)
    return {"queues": int(q), "partitions": int(p), "messages": int(m)}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dsn", default=None, help="an existing database (default: a fresh one)")
    parser.add_argument("--skip-seed", action="store_true")
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--messages", type=int, default=1_000_000, help="seeded (goal: 1 million)")
    cluster.add_argument(parser)
    args = parser.parse_args(argv)
    if args.cluster and args.dsn:
        parser.error("--cluster makes a fresh database: no --dsn with it")
    with contextlib.ExitStack() as stack:
        server = cluster.server_dsn(SERVER_DSN, args.cluster, stack)
        dsn = args.dsn or fresh_database(server, NAME)
        return run(args, dsn, cluster.describe(dsn, args.cluster))


def run(args: argparse.Namespace, dsn: str, server: str) -> int:
    log: Callable[[str], None] = lambda text: print(text, flush=True)  # noqa: E731
    if not args.skip_seed:
        log(f"seeding {args.messages:,} messages")
        seed_database(dsn, args.messages)
    counts = counts_of(dsn)
    s = sample(dsn)
    server_ = QueenServer(dsn, workers=2, maintenance=True).start()
    try:
        time.sleep(3)  # maintenance folds the counters once
        rows = measure(server_.url, s, args.repeat)
    finally:
        server_.stop()
    lines = report(rows, counts, args.repeat, server)
    save_lines(BENCH_DIR / "results" / "dashboard-scale.md", lines)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
