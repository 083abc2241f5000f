"""What an open dashboard costs the hot path: push and pop+ack rates with and without one.

    python -m bench.dashboard_cost [--clients 4] [--batch 10] [--seconds 5] [--rounds 5]

Side by side in one run against one Queen (2 gunicorn workers plus maintenance) on a
fresh database. Each round runs every variant, the order rotating from round to round:
  closed   no dashboard socket anywhere;
  open     one dashboard socket on one worker, subscribed as the page is (one
           events.batch frame per worker batch), read as fast as frames come (the other
           worker learns of it from the presence notes and publishes its events too);
  frames   the same with a plain socket (one frame per event, as API.md describes).
Each variant first pushes for --seconds (the push rate; it also fills the backlog), then
pops and acks for --seconds (the pop+ack rate: pop by queue, ack the batch). The socket
opens before and closes after both phases, and the run waits until the workers have
stopped publishing before a closed variant. Goal: open / closed >= 0.97 for both rates.
Besides the rates (noisy on a shared machine) it reports the CPU time the gunicorn
workers spent per message in each phase (from /proc), which noise moves much less.
Writes bench/results/dashboard-cost.md.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import multiprocessing
import os
import platform
import statistics
import threading
import time
from typing import Any

import requests
import websocket

from bench import procstat
from bench.report import save_lines
from bench.systems import BENCH_DIR, QueenServer, drop_database, fresh_database

SERVER_DSN = os.environ.get("QUEEN_BENCH_DSN", "postgresql://postgres@127.0.0.1:5432/postgres")
QUEUE = "dashcost"
PARTITIONS = 16
VARIANTS = ("closed", "open", "frames")
SETTLE_S = 7.0  # seconds for presence notes to expire after a socket closed (PRESENCE_TTL_S)


def pusher(url: str, client: int, batch: int, seconds: float, out: Any) -> None:
    """POST /push for `seconds`; put (messages stored, seconds taken)."""
    stored = i = 0
    with requests.Session() as session:
        started = time.monotonic()
        while time.monotonic() - started < seconds:
            items = [
                {"queue": QUEUE, "partition": f"p{(client + i + j) % PARTITIONS}",
                 "payload": {"c": client, "i": i, "j": j}}
                for j in range(batch)
            ]
            resp = session.post(f"{url}/api/v1/push", json={"items": items}, timeout=30)
            assert resp.status_code == 201, resp.text
            stored += batch
            i += 1
        out.put((stored, time.monotonic() - started))


def consumer(url: str, client: int, batch: int, seconds: float, out: Any) -> None:
    """Pop by queue and ack each batch for `seconds`; put (messages acked, seconds taken)."""
    acked = 0
    with requests.Session() as session:
        started = time.monotonic()
        while time.monotonic() - started < seconds:
            resp = session.get(f"{url}/api/v1/pop/queue/{QUEUE}?batch={batch}", timeout=30)
            if resp.status_code == 204:
                continue
            messages = resp.json()["messages"]
            acks = [{"transactionId": m["transactionId"], "status": "completed"}
                    for m in messages]
            done = session.post(f"{url}/api/v1/ack/batch", json={"acknowledgments": acks},
                                timeout=30)
            assert done.status_code == 200, done.text
            acked += len(acks)
        out.put((acked, time.monotonic() - started))


def measure(role: Any, url: str, clients: int, batch: int, seconds: float) -> tuple[float, int]:
    """Run `clients` processes of role; return (messages per second, messages)."""
    context = multiprocessing.get_context("spawn")
    out = context.Queue()
    procs = [context.Process(target=role, args=(url, c, batch, seconds, out))
             for c in range(clients)]
    for p in procs:
        p.start()
    results = [out.get(timeout=seconds + 120) for _ in procs]
    for p in procs:
        p.join()
    return sum(n / took for n, took in results), sum(n for n, _ in results)


class Dashboard(threading.Thread):
    """One dashboard socket that reads every frame, as an open page does."""

    def __init__(self, port: int, batched: bool) -> None:
        super().__init__(daemon=True)
        self.ws = websocket.create_connection(f"ws://127.0.0.1:{port}/ws/dashboard", timeout=5)
        if batched:
            self.ws.send(json.dumps({"type": "subscribe", "queues": [], "batch": True}))
        self.frames = 0
        self.message_events = 0
        self.dropped = 0
        self.running = True

    def run(self) -> None:
        self.ws.settimeout(0.5)
        while self.running:
            try:
                frame = self.ws.recv()
            except websocket.WebSocketTimeoutException:
                continue
            except (websocket.WebSocketException, OSError):
                return
            self.frames += 1
            if frame.startswith('{"event":"message.'):
                self.message_events += 1
            elif frame.startswith('{"event":"events.summary"'):
                self.dropped += json.loads(frame)["data"]["dropped"]
            elif frame.startswith('{"event":"events.batch"'):
                data = json.loads(frame)["data"]
                self.message_events += len(data["events"])
                self.dropped += data["dropped"]

    def close(self) -> None:
        self.running = False
        self.join(5)
        self.ws.close()


def run_variant(queen: QueenServer, variant: str, args: argparse.Namespace) -> dict[str, Any]:
    dash = Dashboard(queen.port, batched=variant == "open") if variant != "closed" else None
    if dash is not None:
        dash.start()
        time.sleep(0.5)  # the presence note reaches the other worker
    workers = queen.worker_pids()
    cpu0 = sum(procstat.cpu_seconds(p) for p in workers)
    push, pushed = measure(pusher, queen.url, args.clients, args.batch, args.seconds)
    cpu1 = sum(procstat.cpu_seconds(p) for p in workers)
    pop, acked = measure(consumer, queen.url, args.clients, args.batch, args.seconds)
    cpu2 = sum(procstat.cpu_seconds(p) for p in workers)
    row: dict[str, Any] = {
        "variant": variant, "push": push, "popack": pop,
        "push_us": 1e6 * (cpu1 - cpu0) / max(1, pushed),
        "popack_us": 1e6 * (cpu2 - cpu1) / max(1, acked),
    }
    if dash is not None:
        dash.close()
        row.update(frames=dash.frames, events=dash.message_events, dropped=dash.dropped)
        time.sleep(SETTLE_S)
    return row


def drain(url: str) -> None:
    """Empty the backlog between rounds so each round pops from the same depth."""
    requests.delete(f"{url}/api/v1/queues/{QUEUE}/clear", timeout=60)


def report(rows: list[dict[str, Any]], args: argparse.Namespace) -> list[str]:
    lines = [
        "# What an open dashboard costs push and pop+ack",
        "",
        f"Run {dt.datetime.now(dt.UTC):%Y-%m-%d %H:%M} UTC on {platform.node()} "
        f"({os.cpu_count()} cores, Python {platform.python_version()}), PostgreSQL at "
        f"{SERVER_DSN.rsplit('@', 1)[-1]} (shared with other work; autovacuum as configured "
        "there). Queen: 2 gunicorn workers + maintenance, default settings "
        f"(QUEEN_DASHBOARD_MAX_EVENTS 1000/s per worker). {args.clients} client processes, "
        f"batch {args.batch}, {PARTITIONS} partitions, {args.seconds:g} s per phase, "
        f"{args.rounds} rounds, variants alternating.",
        "",
        "| round | variant | push msg/s | pop+ack msg/s | worker CPU µs/msg push | "
        "pop+ack | frames | message events | dropped |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    n = len(VARIANTS)
    for i, row in enumerate(rows):
        lines.append(
            f"| {i // n + 1} | {row['variant']} | {row['push']:,.0f} | {row['popack']:,.0f} | "
            f"{row['push_us']:.0f} | {row['popack_us']:.0f} | {row.get('frames', '')} | "
            f"{row.get('events', '')} | {row.get('dropped', '')} |"
        )
    lines += ["", "Variant / closed, per round (same round, back to back), median and rounds:", ""]
    for variant in VARIANTS[1:]:
        for key, label in (("push", "push rate"), ("popack", "pop+ack rate"),
                           ("push_us", "push CPU/msg"), ("popack_us", "pop+ack CPU/msg")):
            ratios = []
            for r in range(args.rounds):
                group = {row["variant"]: row for row in rows[n * r : n * r + n]}
                ratios.append(group[variant][key] / group["closed"][key])
            lines.append(f"- {variant} {label}: median {statistics.median(ratios):.3f} "
                         f"({', '.join(f'{x:.3f}' for x in ratios)})")
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--clients", type=int, default=4)
    parser.add_argument("--batch", type=int, default=10)
    parser.add_argument("--seconds", type=float, default=5.0)
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    name = "queen_bench_dashcost"
    dsn = fresh_database(SERVER_DSN, name)
    queen = QueenServer(dsn, workers=2).start()
    rows: list[dict[str, Any]] = []
    try:
        measure(pusher, queen.url, args.clients, args.batch, 2.0)  # warm up
        drain(queen.url)
        for rnd in range(args.rounds):
            shift = rnd % len(VARIANTS)
            order = VARIANTS[shift:] + VARIANTS[:shift]
            for variant in order:
                row = run_variant(queen, variant, args)
                print(f"round {rnd + 1} {variant:>6}: push {row['push']:,.0f} msg/s, "
                      f"pop+ack {row['popack']:,.0f} msg/s", flush=True)
                rows.append(row)
                drain(queen.url)
    finally:
        queen.stop()
        drop_database(SERVER_DSN, name)
    n = len(VARIANTS)
    rows = [row for r in range(args.rounds) for v in VARIANTS
            for row in rows[n * r : n * r + n] if row["variant"] == v]
    save_lines(BENCH_DIR / "results" / "dashboard-cost.md", report(rows, args))


if __name__ == "__main__":
    main()
