"""Latency of every read endpoint, and of push/pop/ack, on a seeded database under load.

    python -m bench.seed --dsn postgresql://postgres@127.0.0.1/queen_bench   # once
    python -m bench.api_latency --dsn postgresql://postgres@127.0.0.1/queen_bench \
        --out bench/results/api_latency.md

Starts gunicorn (and `queen maintenance`, which folds counters every second) on the
database, keeps producers and consumers pushing, popping and acking on their own queue,
and a dashboard polling its usual endpoints every second; meanwhile requests every
analytics, resources and message-listing endpoint --requests times, one at a time, and
reports p50 / p99 per endpoint (goal: p99 <= 200 ms) and the push/pop/ack latencies seen
by the load. Everything shares one machine: the numbers include its noise. With --direct
it calls every endpoint through the app in this process instead (no gunicorn, no load):
what the queries and the handlers cost by themselves.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import socket
import statistics
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
import requests

from bench import cluster

ROOT = Path(__file__).resolve().parents[1]
GOAL_MS = 200.0
LOAD_QUEUE = "latency-load"
DASHBOARD = (  # what a dashboard polls every second
    "/api/v1/resources/overview",
    "/api/v1/analytics/queue-depths",
    "/api/v1/analytics/throughput",
    "/api/v1/resources/queues",
)


def endpoints(sample: dict[str, str]) -> list[tuple[str, str]]:
    """(group, path) of every endpoint measured, with parameters that hit seeded data."""
    q, p, ns, task, txid = (sample[k] for k in ("queue", "partition", "namespace", "task", "txid"))
    return [
        ("analytics", f"/api/v1/analytics?namespace={ns}"),
        ("analytics", f"/api/v1/analytics?task={task}"),
        ("analytics", f"/api/v1/analytics/queue/{q}"),
        ("analytics", "/api/v1/analytics/queues"),
        ("analytics", f"/api/v1/analytics/queue-stats?queue={q}"),
        ("analytics", "/api/v1/analytics/queue-depths"),
        ("analytics", "/api/v1/analytics/throughput"),
        ("analytics", f"/api/v1/analytics/throughput?queue={q}"),
        ("analytics", "/api/v1/analytics/queue-lag"),
        ("analytics", f"/api/v1/analytics/queue-lag?queue={q}"),
        ("resources", "/api/v1/resources/queues"),
        ("resources", f"/api/v1/resources/queues/{q}"),
        ("resources", "/api/v1/resources/partitions"),
        ("resources", f"/api/v1/resources/partitions?queue={q}&minDepth=10"),
        ("resources", "/api/v1/resources/namespaces"),
        ("resources", "/api/v1/resources/tasks"),
        ("resources", "/api/v1/resources/overview"),
        ("messages", "/api/v1/messages"),
        ("messages", "/api/v1/messages?offset=5000"),
        ("messages", f"/api/v1/messages?queue={q}"),
        ("messages", f"/api/v1/messages?queue={q}&partition={p}"),
        ("messages", f"/api/v1/messages?queue={q}&status=pending&offset=500"),
        ("messages", f"/api/v1/messages?namespace={ns}&status=failed"),
        ("messages", "/api/v1/messages?status=dead_letter&offset=1000"),
        ("messages", "/api/v1/messages?status=processing"),
        ("messages", f"/api/v1/messages/{txid}"),
        ("messages", f"/api/v1/messages/{txid}/related"),
        ("system", "/health"),
        ("system", "/metrics"),
        ("system", "/metrics/prometheus"),
    ]


def pick_sample(dsn: str) -> dict[str, str]:
    """A busy queue (with its namespace/task), one of its partitions and one message."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        row = conn.execute(
            "SELECT q.name, p.name, m.transaction_id FROM queen.queues q"
            " JOIN queen.partitions p ON p.queue_id = q.id"
            " JOIN LATERAL (SELECT transaction_id FROM queen.messages x"
            "   WHERE x.partition_id = p.id ORDER BY x.id DESC LIMIT 1) m ON true"
            " WHERE q.name <> %s ORDER BY q.name, p.name LIMIT 1",
            (LOAD_QUEUE,),
        ).fetchone()
        ns = conn.execute("SELECT min(namespace), min(task) FROM queen.queues").fetchone()
    if row is None or ns is None:
        raise SystemExit("the database holds no messages: run python -m bench.seed first")
    return {
        "queue": row[0],
        "partition": row[1],
        "txid": row[2],
        "namespace": ns[0] or "none",
        "task": ns[1] or "none",
    }


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@contextlib.contextmanager
def running_server(dsn: str, workers: int, maintenance: bool) -> Iterator[str]:
    port = free_port()
    env = {
        **os.environ,
        "DATABASE_URL": dsn,
        "HOST": "127.0.0.1",
        "PORT": str(port),
        "QUEEN_WORKERS": str(workers),
        "LOG_LEVEL": "warning",
    }
    procs = [
        subprocess.Popen(
            [sys.executable, "-m", "gunicorn", "-c", "gunicorn.conf.py"], env=env, cwd=ROOT
        )
    ]
    if maintenance:
        procs.append(
            subprocess.Popen([sys.executable, "-m", "queen.cli", "maintenance"], env=env, cwd=ROOT)
        )
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 60
        while True:
            with contextlib.suppress(requests.RequestException):
                if requests.get(url + "/health", timeout=2).status_code == 200:
                    break
            if time.monotonic() > deadline or procs[0].poll() is not None:
                raise SystemExit("the server did not start")
            time.sleep(0.2)
        yield url
    finally:
        for proc in procs:
            proc.terminate()
        for proc in procs:
            try:
                proc.wait(20)
            except subprocess.TimeoutExpired:
                proc.kill()


class Latencies:
    """Thread-safe lists of latencies (ms) by name."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.by_name: dict[str, list[float]] = {}
        self.errors: dict[str, int] = {}

    def add(self, name: str, ms: float, ok: bool = True) -> None:
        with self._lock:
            self.by_name.setdefault(name, []).append(ms)
            if not ok:
                self.errors[name] = self.errors.get(name, 0) + 1


def timed(session: requests.Session, method: str, url: str, **kw: Any) -> tuple[float, Any]:
    started = time.perf_counter()
    resp = session.request(method, url, timeout=30, **kw)
    return (time.perf_counter() - started) * 1000, resp


def producer(url: str, stop: threading.Event, lat: Latencies, batch: int, pause_s: float) -> None:
    with requests.Session() as s:
        n = 0
        while not stop.is_set():
            items = [
                {"queue": LOAD_QUEUE, "partition": f"p{(n + i) % 8}", "payload": {"n": n + i}}
                for i in range(batch)
            ]
            ms, resp = timed(s, "POST", url + "/api/v1/push", json={"items": items})
            lat.add(f"push (batch {batch})", ms, resp.status_code == 201)
            n += batch
            stop.wait(pause_s)


def consumer(url: str, stop: threading.Event, lat: Latencies, batch: int) -> None:
    with requests.Session() as s:
        while not stop.is_set():
            ms, resp = timed(
                s,
                "GET",
                f"{url}/api/v1/pop/queue/{LOAD_QUEUE}",
                params={"batch": batch, "wait": "true", "timeout": 1000},
            )
            if resp.status_code != 200:
                continue
            lat.add(f"pop (batch {batch}, ready)", ms)
            acks = [
                {"transactionId": m["transactionId"], "status": "completed"}
                for m in resp.json()["messages"]
            ]
            ms, resp = timed(s, "POST", url + "/api/v1/ack/batch", json={"acknowledgments": acks})
            lat.add(f"ack/batch (up to {batch})", ms, resp.status_code == 200)


def dashboard(url: str, stop: threading.Event, lat: Latencies) -> None:
    with requests.Session() as s:
        while not stop.is_set():
            started = time.monotonic()
            for path in DASHBOARD:
                ms, resp = timed(s, "GET", url + path)
                lat.add(f"dashboard poll {path}", ms, resp.status_code == 200)
            stop.wait(max(0.0, 1.0 - (time.monotonic() - started)))


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, round(q * (len(ordered) - 1))))]


def measure(args: argparse.Namespace) -> str:
    sample = pick_sample(args.dsn)
    with psycopg.connect(args.dsn, autocommit=True) as conn:
        messages = conn.execute(
            "SELECT sum(n_live_tup) FROM pg_stat_user_tables WHERE relname = 'messages'"
        ).fetchone()
        partitions = conn.execute("SELECT count(*) FROM queen.partitions").fetchone()
    lat, stop = Latencies(), threading.Event()
    load_before = os.getloadavg()[0]
    with running_server(args.dsn, args.workers, not args.no_maintenance) as url:
        threads = [
            threading.Thread(target=producer, args=(url, stop, lat, 10, 0.01))
            for _ in range(args.producers)
        ]
        threads += [
            threading.Thread(target=consumer, args=(url, stop, lat, 10))
            for _ in range(args.consumers)
        ]
        threads.append(threading.Thread(target=dashboard, args=(url, stop, lat)))
        for t in threads:
            t.start()
        time.sleep(args.warmup)
        endpoint_lat: dict[str, list[float]] = {}
        failures: dict[str, int] = {}
        with requests.Session() as s:
            for _ in range(args.requests):
                for _group, path in endpoints(sample):
                    ms, resp = timed(s, "GET", url + path)
                    endpoint_lat.setdefault(path, []).append(ms)
                    if resp.status_code != 200:
                        failures[path] = failures.get(path, 0) + 1
                time.sleep(args.pause)
        stop.set()
        for t in threads:
            t.join()
    machine = (
        f"{os.cpu_count()} cores, load average {load_before:.1f} before and "
        f"{os.getloadavg()[0]:.1f} after the run; {cluster.describe(args.dsn, False)}; "
        "Queen on the cursor store"
    )
    return report(
        args,
        sample,
        endpoint_lat,
        failures,
        lat,
        int(messages[0] or 0) if messages else 0,
        int(partitions[0]) if partitions else 0,
        machine,
    )


def report(args, sample, endpoint_lat, failures, lat, messages, partitions, machine) -> str:
    lines = [
        f"### {time.strftime('%Y-%m-%d %H:%M')}: ~{messages:,} messages, {partitions:,} partitions",
        "",
        f"Machine: {machine} (server, PostgreSQL and load generator on the same host).",
        "",
        f"{args.workers} gunicorn workers{'' if args.no_maintenance else ' + maintenance'}; "
        f"load: {args.producers} producers (push 10 every 10 ms), {args.consumers} consumers "
        "(long-poll pop 10, ack/batch), one dashboard polling "
        f"{len(DASHBOARD)} endpoints every second; {args.requests} sequential requests per "
        f"endpoint. Sample queue `{sample['queue']}`, partition `{sample['partition']}`.",
        "",
        "| endpoint | p50 ms | p99 ms | max ms | ok |",
        "|---|---:|---:|---:|---|",
    ]
    worst = 0.0
    for path, values in endpoint_lat.items():
        p99 = pct(values, 0.99)
        worst = max(worst, p99)
        shown = path.replace(sample["txid"], "{txid}")
        ok = (
            "yes"
            if p99 <= GOAL_MS and not failures.get(path)
            else (f"{failures.get(path, 0)} errors" if failures.get(path) else "over goal")
        )
        lines.append(
            f"| `{shown}` | {statistics.median(values):.1f} | {p99:.1f} | "
            f"{max(values):.1f} | {ok} |"
        )
    lines += ["", "| under load | count | p50 ms | p99 ms | errors |", "|---|---:|---:|---:|---:|"]
    for name, values in sorted(lat.by_name.items()):
        lines.append(
            f"| {name} | {len(values)} | {statistics.median(values):.1f} | "
            f"{pct(values, 0.99):.1f} | {lat.errors.get(name, 0)} |"
        )
    lines += ["", f"Worst endpoint p99: {worst:.1f} ms (goal {GOAL_MS:.0f} ms).", ""]
    return "\n".join(lines)


def measure_direct(args: argparse.Namespace) -> str:
    """Every endpoint through the app in this process: database and handler time only."""
    from falcon import testing

    from queen.app import create_app
    from queen.config import Settings
    from queen.store import Store

    sample = pick_sample(args.dsn)
    settings = Settings.from_env(database_url=args.dsn)
    store = Store.from_settings(settings)
    store.db.pool.open(wait=True)
    client = testing.TestClient(create_app(settings, store=store))
    timings: dict[str, list[float]] = {}
    failures: dict[str, int] = {}
    load_before = os.getloadavg()[0]
    for _ in range(args.requests):
        for _group, path in endpoints(sample):
            started = time.perf_counter()
            resp = client.simulate_get(path)
            timings.setdefault(path, []).append((time.perf_counter() - started) * 1000)
            if resp.status_code != 200:
                failures[path] = failures.get(path, 0) + 1
    store.close()
    lines = [
        f"### {time.strftime('%Y-%m-%d %H:%M')}: in-process, no load "
        f"({os.cpu_count()} cores, load average {load_before:.1f} before and "
        f"{os.getloadavg()[0]:.1f} after)",
        "",
        "Each endpoint through the Falcon app in one process (no HTTP, no gunicorn): query, "
        f"row handling and JSON only; {args.requests} requests per endpoint.",
        "",
        "| endpoint | p50 ms | p99 ms | max ms |",
        "|---|---:|---:|---:|",
    ]
    for path, values in timings.items():
        shown = path.replace(sample["txid"], "{txid}")
        flag = f" ({failures[path]} errors)" if failures.get(path) else ""
        lines.append(
            f"| `{shown}`{flag} | {statistics.median(values):.1f} | {pct(values, 0.99):.1f} | "
            f"{max(values):.1f} |"
        )
    return "\n".join([*lines, ""])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dsn", default="postgresql://postgres@127.0.0.1:5432/queen_bench")
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--producers", type=int, default=2)
    parser.add_argument("--consumers", type=int, default=2)
    parser.add_argument("--requests", type=int, default=100, help="per endpoint")
    parser.add_argument(
        "--pause", type=float, default=0.05, help="seconds between rounds over the endpoints"
    )
    parser.add_argument("--warmup", type=float, default=5.0, help="seconds of load first")
    parser.add_argument("--no-maintenance", action="store_true")
    parser.add_argument("--out", help="append the markdown report to this file")
    parser.add_argument(
        "--direct", action="store_true", help="only the endpoints, in this process, no load"
    )
    args = parser.parse_args(argv)
    text = measure_direct(args) if args.direct else measure(args)
    print(text)
    if args.out:
        with open(args.out, "a", encoding="utf-8") as f:
            f.write(text + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
