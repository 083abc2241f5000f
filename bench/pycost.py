"""`python -m bench.pycost`: Python CPU per message of push, pop and ack.

The full benchmark reads the gunicorn workers' CPU share on a shared machine, which
moves with everything else running there. This drives the same app in-process
(falcon's test client, no sockets on the HTTP side) against a fresh database and
reads this process's own CPU time (`time.process_time`: PostgreSQL runs elsewhere),
so the Python cost of one request path can be compared between two trees run one
after the other. Numbers include the test client's own small per-request overhead.

`--http` measures through gunicorn instead: the CPU time (/proc/PID/stat) of one
real worker process per one-message push, pop and ack, with the load from another
process, for one or more trees started side by side (`--tree before=/path/to/checkout`).
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import http.client
import multiprocessing
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import falcon.testing
import orjson

from bench import adapters, cluster, procstat
from bench.profile import summarise_stacks
from bench.systems import ROOT, drop_database, free_port, fresh_database

DEFAULT_SERVER = "postgresql://postgres@127.0.0.1:5432/postgres"
DB_NAME = "queen_bench_pycost"
ITEM = orjson.dumps({"queue": adapters.QUEUE, "partition": "p0", "payload": adapters.PAYLOAD})


def push_body(n: int) -> bytes:
    return b'{"items":[' + b",".join([ITEM] * n) + b"]}"


def cpu_us_per_message(call: Callable[[], int]) -> float:
    """Run call (which returns how many messages it handled); CPU microseconds per message."""
    started = time.process_time()
    handled = call()
    return (time.process_time() - started) * 1e6 / max(1, handled)


class Driver:
    """The three hot requests against one app, checked for the expected status."""

    def __init__(self, client: falcon.testing.TestClient) -> None:
        self.client = client
        self.handles: list[tuple[str, str]] = []  # (transactionId, leaseId), as the SDK acks

    def push(self, n: int) -> int:
        resp = self.client.simulate_post(
            "/api/v1/push", body=push_body(n), content_type="application/json"
        )
        assert resp.status_code == 201, resp.text[:200]
        return n

    def pop(self, n: int) -> int:
        resp = self.client.simulate_get(f"/api/v1/pop/queue/{adapters.QUEUE}?batch={n}")
        assert resp.status_code == 200, resp.text[:200]
        self.handles = [(m["transactionId"], m["leaseId"])
                        for m in orjson.loads(resp.content)["messages"]]
        return len(self.handles)

    def ack(self) -> int:
        acks = [{"transactionId": t, "status": "completed", "leaseId": lease}
                for t, lease in self.handles]
        body = orjson.dumps({"acknowledgments": acks})
        resp = self.client.simulate_post(
            "/api/v1/ack/batch", body=body, content_type="application/json"
        )
        assert resp.status_code == 200, resp.text[:200]
        return len(acks)


def measure(driver: Driver, push_batch: int, pop_batch: int, rounds: int) -> dict[str, float]:
    """Median CPU microseconds per message of each request over rounds."""
    costs: dict[str, list[float]] = {"push": [], "pop": [], "ack": []}
    for _ in range(rounds):
        costs["push"].append(cpu_us_per_message(lambda: driver.push(push_batch)))
        for _ in range(push_batch // pop_batch):
            costs["pop"].append(cpu_us_per_message(lambda: driver.pop(pop_batch)))
            costs["ack"].append(cpu_us_per_message(driver.ack))
    return {name: statistics.median(values) for name, values in costs.items()}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.pycost")
    parser.add_argument("--dsn", default=DEFAULT_SERVER)
    parser.add_argument("--push-batch", type=int, default=1000)
    parser.add_argument("--pop-batch", type=int, default=100)
    parser.add_argument("--rounds", type=int, help="default 20 (3 with --http)")
    add_http_arguments(parser)
    cluster.add_argument(parser)
    args = parser.parse_args(argv)
    if args.rounds is None:
        args.rounds = 3 if args.http else 20
    with contextlib.ExitStack() as stack:
        args.dsn = cluster.server_dsn(args.dsn, args.cluster, stack)
        return run_http(args) if args.http else run(args)


def run(args: argparse.Namespace) -> int:

    from queen.app import create_app
    from queen.config import Settings
    from queen.store import Store
    from queen.store.migrate import migrate

    dsn = fresh_database(args.dsn, DB_NAME)
    try:
        migrate(dsn)
        settings = Settings.from_env({"DATABASE_URL": dsn, "LOG_LEVEL": "warning"})
        store = Store.from_settings(settings)
        store.db.pool.open(wait=True)
        try:
            driver = Driver(falcon.testing.TestClient(create_app(settings, store)))
            measure(driver, args.push_batch, args.pop_batch, 2)  # warm-up
            costs = measure(driver, args.push_batch, args.pop_batch, args.rounds)
        finally:
            store.close()
    finally:
        drop_database(args.dsn, DB_NAME)
    print(
        f"CPU us per message (median of {args.rounds} rounds): "
        + ", ".join(f"{name} {value:.2f}" for name, value in costs.items())
        + f" (push batch {args.push_batch}, pop/ack batch {args.pop_batch})"
    )
    return 0


# Through gunicorn: the CPU time of one real worker process per request.

OPERATIONS = ("push", "pop", "ack")
PY_SPY = shutil.which("py-spy") or str(Path(sys.executable).with_name("py-spy"))
JSON_HEADERS = {"Content-Type": "application/json"}


def add_http_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--http", action="store_true", help="through gunicorn (one worker)")
    parser.add_argument(
        "--tree",
        action="append",
        default=[],
        metavar="LABEL=PATH",
        help="a checkout to serve (repeat to compare; default: this one, as 'this')",
    )
    parser.add_argument("--requests", type=int, default=3000, help="per operation and round")
    parser.add_argument(
        "--slices", type=int, default=6, help="each round's requests, in turns between the trees"
    )
    parser.add_argument("--connections", type=int, default=4, help="the client's, in parallel")
    parser.add_argument("--profile", type=Path, help="also py-spy each operation; write here")


def http_load(url: str, connections: int, spread: int, pipe: Connection) -> None:
    """Serve load commands from pipe: ("push", n), ("pop", n), ("ack", n); None ends.

    Runs in its own process. Pushes go round partitions p0..p<spread-1>, one message
    each, so that a round's spread pops of one message each find as many partitions
    to lease; acks answer the oldest messages popped and not yet acked. Replies with
    the statuses seen.
    """
    where = urlsplit(url)
    conns = [http.client.HTTPConnection(where.hostname, where.port) for _ in range(connections)]
    popped: list[tuple[str, str]] = []
    pushed = 0
    while (job := pipe.recv()) is not None:
        operation, count = job
        tasks: list[Any] = [(pushed + i) % spread for i in range(count)]
        if operation == "push":
            pushed += count
        elif operation == "ack":
            tasks = [  # (each naming its lease, as the SDK's acks do)
                orjson.dumps({"transactionId": t, "status": "completed", "leaseId": lease})
                for t, lease in popped[:count]
            ]
            del popped[:count]
        load = LoadPhase(operation, tasks)
        threads = [threading.Thread(target=load.drive, args=(c,)) for c in conns]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        if operation == "pop":
            popped.extend(load.popped)
        pipe.send(dict(load.statuses))


class LoadPhase:
    """One operation's requests, shared by the client's connections (one thread each)."""

    def __init__(self, operation: str, tasks: list[Any]) -> None:
        self.operation = operation
        self.tasks = iter(tasks)
        self.lock = threading.Lock()
        self.statuses: collections.Counter[int] = collections.Counter()
        self.popped: list[tuple[str, str]] = []  # (transactionId, leaseId)

    def drive(self, conn: http.client.HTTPConnection) -> None:
        while True:
            with self.lock:
                task = next(self.tasks, None)
            if task is None:
                return
            if self.operation == "push":
                item = {
                    "queue": adapters.QUEUE,
                    "partition": f"p{task}",
                    "payload": adapters.PAYLOAD,
                }
                conn.request("POST", "/api/v1/push", orjson.dumps({"items": [item]}), JSON_HEADERS)
            elif self.operation == "pop":
                conn.request("GET", f"/api/v1/pop/queue/{adapters.QUEUE}?batch=1")
            else:
                conn.request("POST", "/api/v1/ack", task, JSON_HEADERS)
            resp = conn.getresponse()
            data = resp.read()
            with self.lock:
                self.statuses[resp.status] += 1
                if self.operation == "pop" and resp.status == 200:
                    self.popped.extend((m["transactionId"], m["leaseId"])
                                       for m in orjson.loads(data)["messages"])


class TreeServer:
    """gunicorn with one worker from a checkout, on its own database, and its load process."""

    def __init__(
        self, label: str, root: Path, server_dsn: str, connections: int, spread: int
    ) -> None:
        self.label, self.root = label, root
        self.server_dsn = server_dsn
        self.dbname = f"{DB_NAME}_{label}"
        self.dsn = fresh_database(server_dsn, self.dbname)
        self.env = {
            **os.environ,
            "PYTHONPATH": str(root),  # this checkout's queen, before the installed one
            "DATABASE_URL": self.dsn,
            "HOST": "127.0.0.1",
            "PORT": str(free_port()),
            "QUEEN_WORKERS": "1",
            "LOG_LEVEL": "warning",
        }
        self.url = f"http://127.0.0.1:{self.env['PORT']}"
        self.connections = connections
        self.spread = spread

    def start(self, timeout_s: float = 30.0) -> TreeServer:
        migrate_code = "import sys; from queen.store.migrate import migrate; migrate(sys.argv[1])"
        subprocess.run(
            [sys.executable, "-c", migrate_code, self.dsn], env=self.env, cwd=self.root, check=True
        )
        self.log = (Path(tempfile.gettempdir()) / f"queen-pycost-{self.label}.log").open("wb")
        self.gunicorn = subprocess.Popen(
            [sys.executable, "-m", "gunicorn", "-c", str(self.root / "gunicorn.conf.py")],
            env=self.env,
            cwd=self.root,
            stdout=self.log,
            stderr=self.log,
        )
        deadline = time.monotonic() + timeout_s
        while not self._healthy():
            if time.monotonic() > deadline or self.gunicorn.poll() is not None:
                raise RuntimeError(f"{self.label}: gunicorn did not start (see {self.log.name})")
            time.sleep(0.2)
        (self.worker,) = procstat.children(self.gunicorn.pid)
        self.pipe, theirs = multiprocessing.get_context("spawn").Pipe()
        self.client = multiprocessing.get_context("spawn").Process(
            target=http_load, args=(self.url, self.connections, self.spread, theirs), daemon=True
        )
        self.client.start()
        return self

    def _healthy(self) -> bool:
        with contextlib.suppress(OSError, http.client.HTTPException):
            conn = http.client.HTTPConnection("127.0.0.1", int(self.env["PORT"]), timeout=2)
            conn.request("GET", "/health")
            return conn.getresponse().status == 200 and bool(procstat.children(self.gunicorn.pid))
        return False

    def phase(self, operation: str, count: int) -> tuple[float, dict[int, int]]:
        """Run count requests; return the worker's CPU seconds meanwhile and the statuses."""
        before = procstat.cpu_seconds(self.worker)
        self.pipe.send((operation, count))
        statuses: dict[int, int] = self.pipe.recv()
        return procstat.cpu_seconds(self.worker) - before, statuses

    def stop(self) -> None:
        with contextlib.suppress(Exception):
            self.pipe.send(None)
            self.client.join(10)
        self.gunicorn.send_signal(signal.SIGTERM)
        try:
            self.gunicorn.wait(15)
        except subprocess.TimeoutExpired:
            self.gunicorn.kill()
        self.log.close()
        drop_database(self.server_dsn, self.dbname)


def run_http(args: argparse.Namespace) -> int:
    trees = [spec.split("=", 1) for spec in args.tree] or [["this", str(ROOT)]]
    servers: list[TreeServer] = []
    try:
        for label, path in trees:
            root = Path(path).resolve()
            servers.append(TreeServer(label, root, args.dsn, args.connections, args.requests))
            servers[-1].start()
        costs: dict[str, dict[str, list[float]]] = {
            s.label: {op: [] for op in OPERATIONS} for s in servers
        }
        for round_no in range(args.rounds + 1):  # the first round creates the partitions
            for operation in OPERATIONS:
                for label, us in http_round(servers, operation, args).items():
                    if round_no:
                        costs[label][operation].append(us)
        print(http_table(costs, args), flush=True)
        if args.profile:
            for server in servers:
                profile_worker(server, args.requests, args.profile / server.label)
    finally:
        for server in servers:
            server.stop()
    return 0


def http_round(
    servers: list[TreeServer], operation: str, args: argparse.Namespace
) -> dict[str, float]:
    """Run a round's requests of one operation on every tree, in turns (slices), so that
    what else loads the machine meanwhile falls on all of them; CPU µs per request."""
    used = {s.label: 0.0 for s in servers}
    answered = dict.fromkeys(used, 0)
    size = -(-args.requests // args.slices)
    for i, first in enumerate(range(0, args.requests, size)):
        for server in servers if i % 2 else servers[::-1]:  # alternate who goes first
            seconds, statuses = server.phase(operation, min(size, args.requests - first))
            used[server.label] += seconds
            answered[server.label] += sum(statuses.values())
            if set(statuses) - {200, 201}:
                print(f"{server.label} {operation}: statuses {statuses}", file=sys.stderr)
    return {label: used[label] * 1e6 / max(1, answered[label]) for label in used}


def profile_worker(server: TreeServer, count: int, out: Path) -> None:
    """py-spy (--gil: the worker's CPU in Python) over one phase of each operation."""
    out.mkdir(parents=True, exist_ok=True)
    for operation in OPERATIONS:
        path = out / f"pyspy-{operation}.txt"
        spy = subprocess.Popen(
            [PY_SPY, "record", "-p", str(server.worker), "-r", "250", "--format", "raw",
             "--nonblocking", "--gil", "-o", str(path)],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        )  # fmt: skip
        time.sleep(1.0)  # py-spy attaches
        server.phase(operation, count)
        spy.send_signal(signal.SIGINT)
        spy.wait(30)
        (out / f"{operation}.md").write_text(summarise_stacks([path]))


def http_table(costs: dict[str, dict[str, list[float]]], args: argparse.Namespace) -> str:
    labels = list(costs)
    head = "| request | " + " | ".join(f"{label} µs" for label in labels)
    if len(labels) > 1:
        head += " | " + " | ".join(f"{label}/{labels[0]}" for label in labels[1:])
    lines = [
        f"Worker CPU per one-message request (median of {args.rounds} rounds of "
        f"{args.requests:,} in {args.slices} turns, {args.connections} connections;"
        " /proc/PID/stat of the one worker)",
        "",
        head + " |",
        "|---" + "|---:" * (2 * len(labels) - 1) + "|",
    ]
    for operation in OPERATIONS:
        medians = [statistics.median(costs[label][operation]) for label in labels]
        row = f"| {operation} | " + " | ".join(f"{m:.0f}" for m in medians)
        if len(labels) > 1:
            row += " | " + " | ".join(f"{m / medians[0]:.2f}" for m in medians[1:])
        lines.append(row + " |")
    lines.append("")
    for operation in OPERATIONS:
        rounds = "; ".join(
            f"{label} " + ", ".join(f"{us:.0f}" for us in costs[label][operation])
            for label in labels
        )
        lines.append(f"- {operation}, each round: {rounds}")
    return "\n".join(lines)


if __name__ == "__main__":
    raise SystemExit(main())
