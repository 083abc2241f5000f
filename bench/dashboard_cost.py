"""What an open dashboard costs the hot path: push and pop+ack rates with and without one.

    python -m bench.dashboard_cost [--clients 4] [--batch 10] [--seconds 5] [--rounds 5] [--cluster]

Side by side in one run against one Queen (2 gunicorn workers plus maintenance) on a
fresh database of $QUEEN_BENCH_DSN's server, or with --cluster of a throwaway cluster with
default settings. Each round runs every variant, the order rotating from round to round:
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
workers spent per message in each phase (from /proc).

With --direct it measures the same A/B without HTTP, gunicorn or client processes: the
app (falcon's test client) of one process with its real store, listener and hub, one
request at a time, a dashboard socket attached to the hub (batched) or none; the CPU time
of the whole process per message, which is what an open dashboard adds to the work of a
request, free of the machine's noise, and the part of it spent collecting garbage (what
records held past their request cost, in whichever thread the collection falls). Writes bench/results/dashboard-cost.md (or
dashboard-cost-direct.md). What forwarding a batch to a socket costs the worker holding
it, without the load, is bench.dashboard_forward's.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime as dt
import gc
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

from bench import cluster, procstat
from bench.report import save_lines
from bench.systems import BENCH_DIR, QueenServer, drop_database, fresh_database

SERVER_DSN = os.environ.get("QUEEN_BENCH_DSN", "postgresql://postgres@127.0.0.1:5432/postgres")
QUEUE = "dashcost"
PARTITIONS = 16
VARIANTS = ("closed", "open", "frames")
SETTLE_S = 16.0  # seconds for presence notes to expire after a socket closed (PRESENCE_TTL_S)


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
        f"({procstat.machine()} at the end, Python {platform.python_version()}), "
        f"{args.server}. Queen: 2 gunicorn workers + maintenance, cursor store, default settings "
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


class PageSocket:
    """What the hub needs of a socket: the page's subscription, then frames it counts."""

    def __init__(self) -> None:
        import queue

        self.incoming: queue.Queue[str | None] = queue.Queue()
        self.incoming.put(json.dumps({"type": "subscribe", "queues": [], "batch": True}))
        self.frames = 0

    def receive(self) -> str | None:
        return self.incoming.get()

    def send(self, message: str) -> None:
        self.frames += 1

    def close(self) -> None:
        self.incoming.put(None)


DASHBOARD_THREADS = ("dashboard-", "queen-listener")  # the hub's loops, writers, and receiver


def thread_cpu() -> dict[str, float]:
    """CPU seconds of each thread of this process, by thread name (Linux /proc)."""
    names = {t.native_id: t.name for t in threading.enumerate()}
    tick = os.sysconf("SC_CLK_TCK")
    out: dict[str, float] = {}
    for task in os.listdir("/proc/self/task"):
        with open(f"/proc/self/task/{task}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        name = names.get(int(task), f"task-{task}")
        out[name] = out.get(name, 0.0) + (int(fields[11]) + int(fields[12])) / tick
    return out


def dashboard_share(before: dict[str, float], after: dict[str, float]) -> float:
    """Return the share of the process's CPU its dashboard threads took between two reads."""
    delta = {k: v - before.get(k, 0.0) for k, v in after.items()}
    total = sum(delta.values())
    ours = sum(v for k, v in delta.items() if k.startswith(DASHBOARD_THREADS))
    return ours / total if total else 0.0


class GcClock:
    """Seconds the garbage collector ran in this process, whichever thread it interrupted."""

    def __init__(self) -> None:
        self.seconds = 0.0
        self._started = 0.0

    def start(self) -> None:
        gc.callbacks.append(self._note)

    def stop(self) -> None:
        gc.callbacks.remove(self._note)

    def _note(self, phase: str, info: dict[str, int]) -> None:
        if phase == "start":
            self._started = time.perf_counter()
        else:
            self.seconds += time.perf_counter() - self._started


def direct_phase(client: Any, batch: int, requests_n: int, push: bool) -> tuple[float, int]:
    """Push (or pop and ack) requests_n times; return (process CPU seconds, messages)."""
    started, moved = time.process_time(), 0
    for i in range(requests_n):
        if push:
            items = [{"queue": QUEUE, "partition": f"p{(i + j) % PARTITIONS}", "payload": {"i": i}}
                     for j in range(batch)]
            resp = client.simulate_post("/api/v1/push", json={"items": items})
            assert resp.status_code == 201, resp.text
            moved += batch
            continue
        resp = client.simulate_get(f"/api/v1/pop/queue/{QUEUE}", params={"batch": batch})
        if resp.status_code == 204:
            continue
        acks = [{"transactionId": m["transactionId"], "status": "completed"}
                for m in resp.json["messages"]]
        done = client.simulate_post("/api/v1/ack/batch", json={"acknowledgments": acks})
        assert done.status_code == 200, done.text
        moved += len(acks)
    return time.process_time() - started, moved


def direct(args: argparse.Namespace) -> list[str]:
    from falcon import testing

    from queen.app import create_app
    from queen.config import Settings
    from queen.dashboard.hub import Hub
    from queen.events import Events
    from queen.store import Store
    from queen.store.migrate import migrate

    name = "queen_bench_dashcost_direct"
    dsn = fresh_database(args.server_dsn, name)
    migrate(dsn)
    settings = Settings.from_env({}, database_url=dsn)
    store = Store.from_settings(settings)
    store.open()
    events = Events(dsn, settings.poll_fallback_s, ready=store.polling.ready_partitions)
    hub = Hub.from_settings(settings, store.dashboard)
    hub.start_relay(store.dashboard.notify)
    events.on_dashboard = hub.receive
    events.start()
    store.polling.wakeups.start()
    client = testing.TestClient(create_app(settings, store=store, events=events, hub=hub))
    rows: list[dict[str, Any]] = []
    gc_clock = GcClock()
    gc_clock.start()
    try:
        direct_phase(client, args.batch, 200, push=True)  # warm up
        for rnd in range(args.rounds):
            for variant in (("closed", "open") if rnd % 2 == 0 else ("open", "closed")):
                sock = PageSocket() if variant == "open" else None
                if sock is not None:
                    threading.Thread(target=hub.serve, args=(sock,), daemon=True).start()
                    time.sleep(0.3)
                t0, gc0 = thread_cpu(), gc_clock.seconds
                push_cpu, pushed = direct_phase(client, args.batch, args.requests, push=True)
                t1, gc1 = thread_cpu(), gc_clock.seconds
                pop_cpu, acked = direct_phase(client, args.batch, args.requests, push=False)
                t2, gc2 = thread_cpu(), gc_clock.seconds
                row = {"variant": variant, "push_us": 1e6 * push_cpu / pushed,
                       "popack_us": 1e6 * pop_cpu / max(1, acked), "frames": "",
                       "push_gc_us": 1e6 * (gc1 - gc0) / pushed,
                       "popack_gc_us": 1e6 * (gc2 - gc1) / max(1, acked),
                       "push_share": dashboard_share(t0, t1),
                       "popack_share": dashboard_share(t1, t2)}
                if sock is not None:
                    time.sleep(0.6)  # the last batch arrives
                    row["frames"] = sock.frames
                    sock.close()
                    time.sleep(0.3)
                rows.append(row)
                print(f"round {rnd + 1} {variant:>6}: push {row['push_us']:.1f} µs/msg "
                      f"(GC {row['push_gc_us']:.2f}), pop+ack {row['popack_us']:.1f} µs/msg "
                      f"(GC {row['popack_gc_us']:.2f})", flush=True)
    finally:
        gc_clock.stop()
        events.shutdown()
        hub.shutdown()
        store.close()
        drop_database(args.server_dsn, name)
    return direct_report(rows, args)


def direct_report(rows: list[dict[str, Any]], args: argparse.Namespace) -> list[str]:
    lines = [
        "# What an open dashboard adds to a request's work (in process, no HTTP)",
        "",
        f"Run {dt.datetime.now(dt.UTC):%Y-%m-%d %H:%M} UTC on {platform.node()} "
        f"({os.cpu_count()} cores, Python {platform.python_version()}), {args.server}. "
        "One process: Queen's app (cursor store) through falcon's test "
        f"client with its real store, listener and hub (threads, no gevent); {args.requests} "
        f"requests per phase one at a time, batch {args.batch}, {PARTITIONS} partitions, "
        f"{args.rounds} rounds alternating. CPU time of the whole process (request handling, "
        "psycopg, the relay and listener threads) per message.",
        "",
        "The share columns: CPU of the dashboard's own threads (relay, ticker, socket writer,",
        "and the listener that receives the batches) over the process's CPU in that phase.",
        "",
        "The GC columns: of the CPU per message, the time the garbage collector ran.",
        "",
        "| round | variant | push CPU µs/msg | pop+ack CPU µs/msg | GC µs/msg push | pop+ack | "
        "dashboard share push | pop+ack | frames to the socket |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for i, row in enumerate(rows):
        lines.append(f"| {i // 2 + 1} | {row['variant']} | {row['push_us']:.1f} | "
                     f"{row['popack_us']:.1f} | {row['push_gc_us']:.2f} | "
                     f"{row['popack_gc_us']:.2f} | {100 * row['push_share']:.2f} % | "
                     f"{100 * row['popack_share']:.2f} % | {row['frames']} |")
    lines += ["", "Open / closed, per round: median and rounds", ""]
    for key, label in (("push_us", "push CPU/msg"), ("popack_us", "pop+ack CPU/msg")):
        ratios = []
        for r in range(args.rounds):
            pair = {row["variant"]: row for row in rows[2 * r : 2 * r + 2]}
            ratios.append(pair["open"][key] / pair["closed"][key])
        lines.append(f"- {label}: median {statistics.median(ratios):.3f} "
                     f"({', '.join(f'{x:.3f}' for x in ratios)})")
    for key, label in (("push_gc_us", "push"), ("popack_gc_us", "pop+ack")):
        by = {v: statistics.median(row[key] for row in rows if row["variant"] == v)
              for v in ("open", "closed")}
        lines.append(f"- {label}: garbage collection took a median {by['open']:.2f} µs/msg open, "
                     f"{by['closed']:.2f} closed")
    for key, label in (("push_share", "push"), ("popack_share", "pop+ack")):
        shares = [row[key] for row in rows if row["variant"] == "open"]
        base = [row[key] for row in rows if row["variant"] == "closed"]
        lines.append(f"- {label}: the dashboard threads took a median {100 * statistics.median(shares):.2f} % "
                     f"of the CPU open ({', '.join(f'{100 * x:.2f}' for x in shares)}), "
                     f"{100 * statistics.median(base):.2f} % closed (the listener's own work): "
                     f"the dashboard's cost is the difference, "
                     f"{100 * (statistics.median(shares) - statistics.median(base)):.2f} %")
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--direct", action="store_true", help="in process, no HTTP")
    parser.add_argument("--requests", type=int, default=1000, help="per phase with --direct")
    parser.add_argument("--clients", type=int, default=4)
    parser.add_argument("--batch", type=int, default=10)
    parser.add_argument("--seconds", type=float, default=5.0)
    parser.add_argument("--rounds", type=int, default=5)
    cluster.add_argument(parser)
    args = parser.parse_args()
    with contextlib.ExitStack() as stack:
        args.server_dsn = cluster.server_dsn(SERVER_DSN, args.cluster, stack)
        args.server = cluster.describe(args.server_dsn, args.cluster)
        run(args)


def run(args: argparse.Namespace) -> None:
    if args.direct:
        save_lines(BENCH_DIR / "results" / "dashboard-cost-direct.md", direct(args))
        return
    name = "queen_bench_dashcost"
    dsn = fresh_database(args.server_dsn, name)
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
        drop_database(args.server_dsn, name)
    n = len(VARIANTS)
    rows = [row for r in range(args.rounds) for v in VARIANTS
            for row in rows[n * r : n * r + n] if row["variant"] == v]
    save_lines(BENCH_DIR / "results" / "dashboard-cost.md", report(rows, args))


if __name__ == "__main__":
    main()
