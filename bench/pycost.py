"""`python -m bench.pycost`: Python CPU per message of push, pop and ack, in one process.

The full benchmark reads the gunicorn workers' CPU share on a shared machine, which
moves with everything else running there. This drives the same app in-process
(falcon's test client, no sockets on the HTTP side) against a fresh database and
reads this process's own CPU time (`time.process_time`: PostgreSQL runs elsewhere),
so the Python cost of one request path can be compared between two trees run one
after the other. Numbers include the test client's own small per-request overhead.
"""

from __future__ import annotations

import argparse
import contextlib
import statistics
import time
from collections.abc import Callable

import falcon.testing
import orjson

from bench import adapters, cluster
from bench.systems import drop_database, fresh_database

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
        self.handles: list[str] = []

    def push(self, n: int) -> int:
        resp = self.client.simulate_post(
            "/api/v1/push", body=push_body(n), content_type="application/json"
        )
        assert resp.status_code == 201, resp.text[:200]
        return n

    def pop(self, n: int) -> int:
        resp = self.client.simulate_get(f"/api/v1/pop/queue/{adapters.QUEUE}?batch={n}")
        assert resp.status_code == 200, resp.text[:200]
        self.handles = [m["transactionId"] for m in orjson.loads(resp.content)["messages"]]
        return len(self.handles)

    def ack(self) -> int:
        acks = [{"transactionId": t, "status": "completed"} for t in self.handles]
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
    parser.add_argument("--rounds", type=int, default=20)
    cluster.add_argument(parser)
    args = parser.parse_args(argv)
    with contextlib.ExitStack() as stack:
        args.dsn = cluster.server_dsn(args.dsn, args.cluster, stack)
        return run(args)


def run(args: argparse.Namespace) -> int:

    from queen.app import create_app
    from queen.config import Settings
    from queen.store import Store
    from queen.store.migrate import migrate

    dsn = fresh_database(args.dsn, DB_NAME)
    try:
        migrate(dsn)
        settings = Settings.from_env(
            {"DATABASE_URL": dsn, "LOG_LEVEL": "warning"}
        )
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


if __name__ == "__main__":
    raise SystemExit(main())
