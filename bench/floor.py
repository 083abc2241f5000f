"""`python -m bench.floor`: what the request tier costs before Queen does any work.

Serves an app with Queen's three hot routes but no queue behind them, through gunicorn
with Queen's own worker class (gevent, pywsgi, geventwebsocket's handler): a push
parses its body and answers each item's id and status; a pop answers `batch` messages
shaped as Queen's; an ack batch parses its body and answers each item. With `--dsn`,
each request also runs one statement over a psycopg pool that returns its batch's rows
(made by generate_series), as any request of a queue on PostgreSQL must; the answers
are made from those rows. Another process drives it over keep-alive connections
(bench/http1.py), and the server's CPU time (its processes', /proc/PID/stat) is read
around each phase.

`--server granian` serves the same app from granian instead (HTTP in Rust, the app in
threads), to compare a compiled HTTP front with the same Python behind it.

The result is the floor of this design's request tier: the CPU a worker spends per
request and per message for the framework, the JSON and (with --dsn) the driver,
with nothing of Queen's checks, SQL or bookkeeping. docs/PERFORMANCE.md sets it
against the CPU a message may cost under each throughput goal.
"""

from __future__ import annotations

import argparse
import contextlib
import multiprocessing
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any

import orjson

from bench import adapters, http1, procstat
from bench.systems import ROOT, free_port

OPERATIONS = ("push", "pop", "ack")


# The app, imported by the server's worker (under gunicorn after gevent's monkey-patching).


STAMP = "2026-12-03T22:00:00.000Z"
ROWS = "SELECT g::bigint, 'tx-' || g, 'queued' FROM generate_series(1, %s) g"
POP_ROWS = "SELECT g::bigint, 'tx-' || g, %s::jsonb::text, now() FROM generate_series(1, %s) g"


def _message(row: tuple[Any, ...], lease: str) -> dict[str, Any]:
    message_id, txid, payload, _created = row
    return {
        "id": message_id,
        "transactionId": txid,
        "queue": adapters.QUEUE,
        "partition": "p0",
        "data": orjson.Fragment(payload),
        "retryCount": 0,
        "priority": 0,
        "createdAt": STAMP,
        "lockedAt": STAMP,
        "leaseId": lease,
        "leaseExpiresAt": STAMP,
        "options": {"leaseTime": 300, "retryLimit": 3},
        "consumerGroup": None,
    }


class _Floor:
    """The three routes; each answers per item from rows, loaded from the database
    with a pool (one statement a request, `batch` rows) or made in memory without."""

    def __init__(self, dsn: str | None) -> None:
        self.pool: Any = None
        if dsn:
            from psycopg_pool import ConnectionPool

            self.pool = ConnectionPool(dsn, min_size=4, max_size=4, kwargs={"autocommit": True})

    def _rows(self, n: int, pop: bool = False) -> list[tuple[Any, ...]]:
        if self.pool is None:
            if pop:
                return [(i, f"tx-{i}", adapters.PAYLOAD_JSON.decode(), None) for i in range(n)]
            return [(i, f"tx-{i}", "queued") for i in range(n)]
        with self.pool.connection() as conn:
            if pop:
                return conn.execute(POP_ROWS, (adapters.PAYLOAD_JSON.decode(), n)).fetchall()
            return conn.execute(ROWS, (n,)).fetchall()

    def on_post_push(self, req: Any, resp: Any) -> None:
        items = orjson.loads(req.bounded_stream.read())["items"]
        rows = self._rows(len(items))
        resp.status = "201 Created"
        resp.content_type = "application/json"
        resp.data = orjson.dumps(
            {"messages": [{"id": r[0], "transactionId": r[1], "status": r[2]} for r in rows]}
        )

    def on_get_pop(self, req: Any, resp: Any, queue: str) -> None:
        rows = self._rows(int(req.params.get("batch", 1)), pop=True)
        lease = str(uuid.uuid4())
        resp.content_type = "application/json"
        resp.data = orjson.dumps({"messages": [_message(r, lease) for r in rows]})

    def on_post_ack(self, req: Any, resp: Any) -> None:
        acks = orjson.loads(req.bounded_stream.read())["acknowledgments"]
        rows = self._rows(len(acks))
        resp.content_type = "application/json"
        resp.data = orjson.dumps(
            {
                "results": [
                    {"transactionId": a["transactionId"], "status": r[2]}
                    for a, r in zip(acks, rows, strict=True)
                ]
            }
        )


def make_app() -> Any:
    import falcon

    app = falcon.App()
    floor = _Floor(os.environ.get("QUEEN_FLOOR_DSN"))
    app.add_route("/api/v1/push", floor, suffix="push")
    app.add_route("/api/v1/pop/queue/{queue}", floor, suffix="pop")
    app.add_route("/api/v1/ack/batch", floor, suffix="ack")
    return app


# The load, in its own process.


class _Phase:
    """count requests of one kind, shared by the client's connections (a thread each)."""

    def __init__(self, request: tuple[str, str, bytes | None], count: int) -> None:
        self.request, self.remaining = request, count
        self.lock = threading.Lock()
        self.statuses: dict[int, int] = {}

    def drive(self, conn: http1.Connection) -> None:
        while True:
            with self.lock:
                if self.remaining <= 0:
                    return
                self.remaining -= 1
            status, _ = conn.request(*self.request)
            with self.lock:
                self.statuses[status] = self.statuses.get(status, 0) + 1


def _load(port: int, connections: int, pipe: Connection) -> None:
    """Serve (operation, batch, count) commands from pipe; None ends. Replies with the
    statuses seen."""
    conns = [http1.Connection("127.0.0.1", port) for _ in range(connections)]
    item = orjson.dumps({"queue": adapters.QUEUE, "partition": "p0", "payload": adapters.PAYLOAD})
    while (job := pipe.recv()) is not None:
        operation, batch, count = job
        request: tuple[str, str, bytes | None]
        if operation == "push":
            request = ("POST", "/api/v1/push", b'{"items":[' + b",".join([item] * batch) + b"]}")
        elif operation == "pop":
            request = ("GET", f"/api/v1/pop/queue/{adapters.QUEUE}?batch={batch}", None)
        else:
            acks = [{"transactionId": str(uuid.uuid4()), "status": "completed"}] * batch
            request = ("POST", "/api/v1/ack/batch", orjson.dumps({"acknowledgments": acks}))
        phase = _Phase(request, count)
        threads = [threading.Thread(target=phase.drive, args=(c,)) for c in conns]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        pipe.send(phase.statuses)


SERVERS = {
    # Queen's own: gunicorn with one worker of Queen's worker class (gevent, pywsgi).
    "gunicorn": lambda port: [
        sys.executable,
        "-m",
        "gunicorn",
        "-k",
        "queen.server.worker.Worker",
        "-w",
        "1",
        "-b",
        f"127.0.0.1:{port}",
        "--log-level",
        "warning",
        "bench.floor:make_app()",
    ],
    # For comparison: granian (HTTP in Rust, the WSGI app in a pool of 4 threads), when
    # installed; Queen's long polls need gevent, so this is a measurement, not an option.
    "granian": lambda port: [
        str(Path(sys.executable).with_name("granian")),
        "--interface",
        "wsgi",
        "--workers",
        "1",
        "--blocking-threads",
        "4",
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        "--log-level",
        "warning",
        "--factory",
        "bench.floor:make_app",
    ],
}


SERVER_NAMES = {
    "gunicorn": "gunicorn, 1 worker of queen.server.worker.Worker",
    "granian": "granian, 1 worker, 4 threads",
}


def _tree_cpu(pid: int) -> float:
    """CPU seconds of a process and all its descendants (the server's master and workers)."""
    return procstat.cpu_seconds(pid) + sum(_tree_cpu(child) for child in procstat.children(pid))


def measure(args: argparse.Namespace) -> dict[tuple[str, int], float]:
    """Median server CPU µs per request of each (operation, batch) over the rounds."""
    port = free_port()
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    if args.dsn:
        env["QUEEN_FLOOR_DSN"] = args.dsn
    log = (Path(tempfile.gettempdir()) / "queen-floor.log").open("wb")
    server = subprocess.Popen(SERVERS[args.server](port), env=env, cwd=ROOT, stdout=log, stderr=log)
    context = multiprocessing.get_context("spawn")
    pipe, theirs = context.Pipe()
    client = context.Process(target=_load, args=(port, args.connections, theirs), daemon=True)
    try:
        deadline = time.monotonic() + 20
        while not _answers(port):
            if time.monotonic() > deadline or server.poll() is not None:
                raise RuntimeError(f"the server did not start (see {log.name})")
            time.sleep(0.2)
        client.start()
        costs: dict[tuple[str, int], list[float]] = {}
        for round_no in range(args.rounds + 1):  # round 0 warms up
            for batch in args.batches:
                for operation in OPERATIONS:
                    before = _tree_cpu(server.pid)
                    pipe.send((operation, batch, args.requests))
                    statuses = pipe.recv()
                    used = _tree_cpu(server.pid) - before
                    if set(statuses) - {200, 201}:
                        raise RuntimeError(f"{operation} answered {statuses}")
                    if round_no:
                        per_request = used * 1e6 / args.requests
                        costs.setdefault((operation, batch), []).append(per_request)
        return {key: statistics.median(values) for key, values in costs.items()}
    finally:
        with contextlib.suppress(Exception):
            pipe.send(None)
            client.join(5)
        server.send_signal(signal.SIGTERM)
        with contextlib.suppress(subprocess.TimeoutExpired):
            server.wait(15)
        if server.poll() is None:
            server.kill()
        log.close()


def _answers(port: int) -> bool:
    conn = http1.Connection("127.0.0.1", port, timeout=2)
    try:
        status, _ = conn.request("GET", f"/api/v1/pop/queue/{adapters.QUEUE}?batch=1")
        return status == 200
    except OSError:
        return False
    finally:
        conn.close()


def table(costs: dict[tuple[str, int], float], args: argparse.Namespace) -> str:
    rows = [
        f"Request tier floor: {SERVER_NAMES[args.server]}, falcon, orjson"
        f"{', one statement a request loading its batch of rows' if args.dsn else ', no database'};"
        f" {args.connections} connections; {procstat.machine()}",
        "",
        "| batch | push µs/request | pop µs/request | ack µs/request | push+pop+ack µs/message |",
        "|---:|---:|---:|---:|---:|",
    ]
    for batch in args.batches:
        push, pop, ack = (costs[(op, batch)] for op in OPERATIONS)
        rows.append(
            f"| {batch} | {push:.0f} | {pop:.0f} | {ack:.0f} | {(push + pop + ack) / batch:.1f} |"
        )
    return "\n".join(rows)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.floor", description=__doc__)
    parser.add_argument("--dsn", help="also run one statement a request, loading its batch's rows")
    parser.add_argument("--batches", default="1,10,100", help="comma list")
    parser.add_argument("--connections", type=int, default=4)
    parser.add_argument("--server", choices=sorted(SERVERS), default="gunicorn")
    parser.add_argument("--requests", type=int, default=4000, help="per phase")
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args(argv)
    args.batches = [int(b) for b in args.batches.split(",")]
    print(table(measure(args), args), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
