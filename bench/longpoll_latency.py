"""Wake latency of a parked long poll: from the push's response to the poll's response.

    python -m bench.longpoll_latency [--rounds 300] [--workers 2] [--cluster]

Two cases, one Queen (gunicorn, QUEEN_WORKERS workers) on a fresh database:
  1 waiter      one poll parked (pop by queue); push one message; read the poll.
  1000 waiters  1000 polls parked on the same queue; push one message; the one woken
                answers and is replaced, so 1000 stay parked throughout.
Each message goes to its own partition and is acked after its round, as a consumer
would. The client reads the poll only after the push returned, so a poll answered before the
push's own response counts as ~0 ms. Goal: p50 <= 5 ms, p99 <= 50 ms.
Writes bench/results/longpoll-latency.md.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime as dt
import os
import platform
import time

import requests

from bench import cluster
from bench.rawpoll import Poll, Reader, percentile
from bench.report import save_lines
from bench.systems import BENCH_DIR, QueenServer, drop_database, fresh_database

SERVER_DSN = os.environ.get("QUEEN_BENCH_DSN", "postgresql://postgres@127.0.0.1:5432/postgres")
PATH = "/api/v1/pop/queue/lat?wait=true&timeout=60000"
SETTLE = 0.05  # seconds between rounds: the replacement poll parks


def run_case(server: QueenServer, parked: int, rounds: int, label: str) -> dict[str, float]:
    session = requests.Session()
    reader = Reader()
    for _ in range(parked):
        reader.add(Poll(server.port, PATH))
    time.sleep(1.0 + parked / 1000)
    latencies: list[float] = []
    since_sent: list[float] = []
    for i in range(rounds):
        sent = time.monotonic()
        body = {"items": [{"queue": "lat", "partition": f"{label}-{i}", "payload": {"i": i}}]}
        response = session.post(f"{server.url}/api/v1/push", json=body, timeout=10)
        pushed = time.monotonic()
        assert response.status_code == 201, response.text
        done = reader.until(1, 10)
        assert len(done) == 1 and done[0].status == 200, "a push did not wake a poll"
        latencies.append((done[0].done_at or pushed) - pushed)
        since_sent.append((done[0].done_at or pushed) - sent)
        for txid in done[0].transaction_ids:  # a consumer acks: leases do not pile up
            ack = {"transactionId": txid, "status": "completed"}
            session.post(f"{server.url}/api/v1/ack", json=ack, timeout=10)
        reader.add(Poll(server.port, PATH))
        time.sleep(SETTLE)
        if (i + 1) % 50 == 0:
            p50 = percentile(latencies, 50) * 1000
            print(f"  {label}: {i + 1}/{rounds} rounds, p50 so far {p50:.2f} ms", flush=True)
    return {
        "p50": percentile(latencies, 50) * 1000,
        "p90": percentile(latencies, 90) * 1000,
        "p99": percentile(latencies, 99) * 1000,
        "max": max(latencies) * 1000,
        "sent_p50": percentile(since_sent, 50) * 1000,
        "sent_p99": percentile(since_sent, 99) * 1000,
    }


def pop_round_trip(server: QueenServer, rounds: int) -> dict[str, float]:
    """The same claim without waiting: what a wake-up costs at least, on this machine now."""
    session = requests.Session()
    items = [{"queue": "rt", "partition": f"p{i}", "payload": {"i": i}} for i in range(rounds)]
    session.post(f"{server.url}/api/v1/push", json={"items": items}, timeout=30)
    took = []
    for _ in range(rounds):
        started = time.monotonic()
        response = session.get(f"{server.url}/api/v1/pop/queue/rt", timeout=10)
        took.append(time.monotonic() - started)
        assert response.status_code == 200, response.status_code
        ack = {
            "transactionId": response.json()["messages"][0]["transactionId"],
            "status": "completed",
        }
        session.post(f"{server.url}/api/v1/ack", json=ack, timeout=10)
    return {"p50": percentile(took, 50) * 1000, "p99": percentile(took, 99) * 1000}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=300)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--out", default=str(BENCH_DIR / "results" / "longpoll-latency.md"))
    cluster.add_argument(parser)
    args = parser.parse_args()
    with contextlib.ExitStack() as stack:
        run(args, cluster.server_dsn(SERVER_DSN, args.cluster, stack))


def run(args: argparse.Namespace, server_dsn: str) -> None:
    postgres = cluster.describe(server_dsn, args.cluster)

    results: dict[str, dict[str, float]] = {}
    baseline: dict[int, dict[str, float]] = {}
    for parked in (1, 1000):
        name = f"queen_bench_lat_{parked}"
        dsn = fresh_database(server_dsn, name)
        server = QueenServer(dsn, workers=args.workers, maintenance=False).start()
        print(f"{parked} parked: Queen up on {server.url}, {args.rounds} rounds", flush=True)
        try:
            results[f"{parked} waiter{'s' if parked > 1 else ''}"] = run_case(
                server, parked, args.rounds, f"w{parked}"
            )
            baseline[parked] = pop_round_trip(server, 100)
        finally:
            server.stop()
            drop_database(server_dsn, name)

    lines = [
        "# Long-poll wake latency",
        "",
        f"{dt.datetime.now(dt.UTC):%Y-%m-%d %H:%M} UTC, `python -m bench.longpoll_latency"
        f" --rounds {args.rounds} --workers {args.workers}`; {platform.node()},"
        f" {os.cpu_count()} CPUs, load average {os.getloadavg()[0]:.1f} at the end;"
        f" {postgres}; Queen on the cursor store.",
        "",
        "Push response → poll response (ms). Goal: p50 ≤ 5, p99 ≤ 50.",
        "",
        "| parked polls | p50 | p90 | p99 | max | push sent → poll p50 | p99 |",
        "|---|---|---|---|---|---|---|",
    ]
    for label, r in results.items():
        lines.append(
            f"| {label} | {r['p50']:.2f} | {r['p90']:.2f} | {r['p99']:.2f} | {r['max']:.2f}"
            f" | {r['sent_p50']:.2f} | {r['sent_p99']:.2f} |"
        )
    lines += [
        "",
        "For scale, a pop that does not wait (HTTP round trip of the same claim, measured"
        " right after each case on the same server): "
        + "; ".join(
            f"after the {k}-waiter case p50 {v['p50']:.2f} ms, p99 {v['p99']:.2f} ms"
            for k, v in baseline.items()
        )
        + ". A wake-up costs the notification plus such a claim.",
    ]
    save_lines(args.out, lines)


if __name__ == "__main__":
    main()
