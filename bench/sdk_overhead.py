"""What the client SDK costs a consumer: queen.client against the same loop in raw httpx.

    python -m bench.sdk_overhead [--rounds 3] [--seconds 10] [--batch 10] [--workers 2] [--cluster]

One Queen (gunicorn, QUEEN_WORKERS workers, no maintenance) on a fresh database. Each
round runs two windows back to back, in alternating order: the SDK's consumer
(Queen.consumer(..., batch=N), a no-op handler, lease renewal on, its defaults) and a
hand-written loop over one httpx.Client (GET pop with wait, POST ack/batch), each
draining a backlog of its own queue, seeded before the window and larger than it can
drain. The goal is the median of the rounds' SDK/raw ratios: >= 0.9x.
Client CPU per message is this process's CPU time over the window (both run here).
Writes bench/results/sdk-overhead.md.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime as dt
import os
import platform
import statistics
import threading
import time
from dataclasses import dataclass

import httpx

from bench import cluster
from bench.report import save_lines
from bench.systems import BENCH_DIR, QueenServer, drop_database, fresh_database
from queen.client import Message, Queen

SERVER_DSN = os.environ.get("QUEEN_BENCH_DSN", "postgresql://postgres@127.0.0.1:5432/postgres")
SEED_BATCH = 1000
POLL_TIMEOUT_MS = 2000  # the SDK consumer's own long-poll timeout
GOAL = 0.9


@dataclass(frozen=True)
class Window:
    handled: int
    seconds: float
    cpu_seconds: float
    dry: bool  # the backlog ran out before the window ended

    @property
    def rate(self) -> float:
        return self.handled / self.seconds

    @property
    def cpu_us(self) -> float:
        return self.cpu_seconds / max(1, self.handled) * 1e6


def seed(url: str, queue: str, count: int) -> None:
    with httpx.Client(timeout=60) as client:
        for start in range(0, count, SEED_BATCH):
            n = min(SEED_BATCH, count - start)
            items = [{"queue": queue, "payload": {"i": start + i}} for i in range(n)]
            client.post(f"{url}/api/v1/push", json={"items": items}).raise_for_status()


def raw_window(url: str, queue: str, batch: int, seconds: float, seeded: int) -> Window:
    """The loop a user writes by hand: pop a batch, ack it, again."""
    handled = 0
    pop = f"{url}/api/v1/pop/queue/{queue}"
    params = {"batch": batch, "wait": "true", "timeout": POLL_TIMEOUT_MS}
    with httpx.Client(timeout=30) as client:
        cpu, started = time.process_time(), time.monotonic()
        deadline = started + seconds
        while time.monotonic() < deadline:
            response = client.get(pop, params=params)
            response.raise_for_status()
            if response.status_code == 204:
                continue
            messages = response.json()["messages"]
            acks = [{"transactionId": m["transactionId"], "status": "completed",
                     "leaseId": m["leaseId"]} for m in messages]
            client.post(f"{url}/api/v1/ack/batch", json={"acknowledgments": acks})
            handled += len(messages)
        elapsed, cpu = time.monotonic() - started, time.process_time() - cpu
    return Window(handled, elapsed, cpu, handled >= seeded)


def sdk_window(url: str, queue: str, batch: int, seconds: float, seeded: int) -> Window:
    """queen.client's consumer with a no-op handler, stopped after seconds."""

    def handler(message: Message) -> None:
        pass

    with Queen(url) as queen:
        consumer = queen.consumer(queue, handler, batch=batch, handle_signals=False)
        timer = threading.Timer(seconds, consumer.stop)
        cpu, started = time.process_time(), time.monotonic()
        timer.start()
        handled = consumer.run()
        elapsed, cpu = time.monotonic() - started, time.process_time() - cpu
    return Window(handled, elapsed, cpu, handled >= seeded)


RUNNERS = {"sdk": sdk_window, "raw": raw_window}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--seconds", type=float, default=10.0)
    parser.add_argument("--batch", type=int, default=10)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--out", default=str(BENCH_DIR / "results" / "sdk-overhead.md"))
    cluster.add_argument(parser)
    args = parser.parse_args()
    with contextlib.ExitStack() as stack:
        run(args, cluster.server_dsn(SERVER_DSN, args.cluster, stack))


def run(args: argparse.Namespace, server_dsn: str) -> None:
    args.postgres = cluster.describe(server_dsn, args.cluster)

    name = "queen_bench_sdk"
    dsn = fresh_database(server_dsn, name)
    server = QueenServer(dsn, workers=args.workers, maintenance=False).start()
    rounds: list[dict[str, Window]] = []
    try:
        seed(server.url, "calibrate", 5000)
        probe = raw_window(server.url, "calibrate", args.batch, 2.0, 5000)
        per_window = int(probe.rate * args.seconds * 1.5) + 2000
        print(f"Queen up on {server.url}; raw probe {probe.rate:.0f} msg/s;"
              f" {per_window} messages per window", flush=True)
        for r in range(args.rounds):
            order = ["sdk", "raw"] if r % 2 == 0 else ["raw", "sdk"]
            result: dict[str, Window] = {}
            for kind in order:
                queue = f"{kind}-{r}"
                seed(server.url, queue, per_window)
                result[kind] = RUNNERS[kind](server.url, queue, args.batch, args.seconds,
                                             per_window)
                print(f"  round {r + 1} {kind}: {result[kind].rate:.0f} msg/s,"
                      f" client {result[kind].cpu_us:.0f} us/msg", flush=True)
            rounds.append(result)
    finally:
        server.stop()
        drop_database(server_dsn, name)
    save_lines(args.out, report_lines(args, rounds))


def report_lines(args: argparse.Namespace, rounds: list[dict[str, Window]]) -> list[str]:
    ratios = [r["sdk"].rate / r["raw"].rate for r in rounds]
    median = statistics.median(ratios)
    lines = [
        "# Client SDK overhead",
        "",
        f"{dt.datetime.now(dt.UTC):%Y-%m-%d %H:%M} UTC, `python -m bench.sdk_overhead"
        f" --rounds {args.rounds} --seconds {args.seconds:g} --batch {args.batch}"
        f" --workers {args.workers}`; {platform.node()}, {os.cpu_count()} CPUs,"
        f" load average {os.getloadavg()[0]:.1f} at the end; {args.postgres};"
        " Queen on the cursor store.",
        "",
        f"One consumer at batch {args.batch}, end to end (pop, no-op handler, ack):"
        " queen.client's consumer against the same loop in raw httpx calls, side by side"
        f" in each round. Goal: SDK/raw >= {GOAL}x (median of the rounds).",
        "",
        "| round | SDK msg/s | raw msg/s | SDK/raw | SDK client us/msg | raw client us/msg |",
        "|---|---|---|---|---|---|",
    ]
    for i, (r, ratio) in enumerate(zip(rounds, ratios, strict=True), 1):
        dry = " (backlog ran out)" if r["sdk"].dry or r["raw"].dry else ""
        lines.append(
            f"| {i}{dry} | {r['sdk'].rate:.0f} | {r['raw'].rate:.0f} | {ratio:.2f}x"
            f" | {r['sdk'].cpu_us:.0f} | {r['raw'].cpu_us:.0f} |"
        )
    verdict = "met" if median >= GOAL else "not met"
    lines += ["", f"Median SDK/raw: **{median:.2f}x** (goal {GOAL}x: {verdict})."]
    return lines


if __name__ == "__main__":
    main()
