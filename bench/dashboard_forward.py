"""What one worker batch costs the worker that forwards it to a dashboard socket.

    python -m bench.dashboard_forward [--batches 2000] [--events 55] [--rounds 5]

One gevent process (monkey-patched, as a gunicorn worker is) serves /ws/dashboard-like
sockets through gevent-websocket on a real TCP connection; a reader process reads every
frame. The process hands the hub --batches batch notifications (each listing --events
message events, about what one NOTIFY holds), 1 ms apart as from the listener, and waits
until the reader has every frame. Reported: the process's CPU time per batch (decoding
the notification, building the frames, the writer and its system calls), for the page's
batched socket and a plain one (one frame per event, API.md), rounds alternating. Free of
the HTTP load's noise, this is the part of bench.dashboard_cost's frames / open gap that
the socket itself accounts for: a worker forwards one batch per worker per flush
(QUEEN_DASHBOARD_FLUSH_INTERVAL, 1 s). Writes bench/results/dashboard-forward.md.
"""

from __future__ import annotations

from gevent import monkey

monkey.patch_all()

import argparse  # noqa: E402
import datetime as dt  # noqa: E402
import json  # noqa: E402
import multiprocessing  # noqa: E402
import os  # noqa: E402
import platform  # noqa: E402
import statistics  # noqa: E402
import time  # noqa: E402
from typing import Any  # noqa: E402

import gevent  # noqa: E402
from gevent.pywsgi import WSGIServer  # noqa: E402
from geventwebsocket.handler import WebSocketHandler  # type: ignore[import-untyped]  # noqa: E402

from bench.report import save_lines  # noqa: E402
from bench.systems import BENCH_DIR  # noqa: E402
from queen.dashboard import formats, relay  # noqa: E402
from queen.dashboard.hub import Hub  # noqa: E402

VARIANTS = ("open", "frames")  # the page's batched socket; a plain one (frame per event)
WAIT_S = 120.0


def reader(port: int, batched: bool, frames: Any) -> None:
    """Read every frame of one dashboard socket; keep the count in `frames`."""
    import websocket

    ws = websocket.create_connection(f"ws://127.0.0.1:{port}/", timeout=WAIT_S)
    if batched:
        ws.send(json.dumps({"type": "subscribe", "queues": [], "batch": True}))
    while True:
        try:
            ws.recv()
        except Exception:  # noqa: BLE001 - the server went away: done
            return
        frames.value += 1


def notification(events: int) -> str:
    """One worker's batch as the listener receives it: push events of one queue."""
    sample = [
        (formats.Event("message.pushed", {"queue": "dashcost", "partition": f"p{i % 16}",
                                          "transactionId": f"0192f0c1-{i:04}-7abc-8def-01234567"},
                       "dashcost"), "2026-12-01T21:11:00.123Z")
        for i in range(events)
    ]
    return relay.encode_batch("w1", sample, {"dashcost": {"message.pushed": 500}}, 500)


def run_variant(variant: str, args: argparse.Namespace) -> dict[str, Any]:
    batched = variant == "open"
    hub = Hub(None, "w1", client_buffer=10 * args.events * args.batches)

    def app(environ: dict[str, Any], start_response: Any) -> list[bytes]:
        hub.serve(environ["wsgi.websocket"])
        return []

    server = WSGIServer(("127.0.0.1", 0), app, handler_class=WebSocketHandler, log=None)
    server.start()
    context = multiprocessing.get_context("spawn")
    frames = context.Value("q", 0)
    proc = context.Process(target=reader, args=(server.server_port, batched, frames))
    proc.start()
    try:
        return measure(hub, notification(args.events), frames, batched, args) | {
            "variant": variant}
    finally:
        hub.shutdown()
        server.stop()
        proc.join(10)


def measure(hub: Hub, note: str, frames: Any, batched: bool,
            args: argparse.Namespace) -> dict[str, Any]:
    deadline = time.monotonic() + WAIT_S
    while hub.connections == 0 and time.monotonic() < deadline:
        gevent.sleep(0.05)
    gevent.sleep(0.5)  # connected, subscribed, snapshot-free (no store)
    listed = len(relay.decode(note).events)  # type: ignore[union-attr]
    start = frames.value
    want = start + args.batches * (1 if batched else listed + 1)  # + events.summary
    cpu = time.process_time()
    for _ in range(args.batches):
        hub.receive(note)
        gevent.sleep(0.001)
    while frames.value < want and time.monotonic() < deadline:
        gevent.sleep(0.005)
    cpu = time.process_time() - cpu
    assert frames.value == want, f"{frames.value - start} of {want - start} frames arrived"
    return {"events": listed, "frames": want - start, "us_per_batch": 1e6 * cpu / args.batches}


def report(rows: list[dict[str, Any]], args: argparse.Namespace) -> list[str]:
    lines = [
        "# What forwarding one worker batch costs the worker holding the socket",
        "",
        f"Run {dt.datetime.now(dt.UTC):%Y-%m-%d %H:%M} UTC on {platform.node()} "
        f"({os.cpu_count()} cores, Python {platform.python_version()}). One gevent process "
        "(the hub, gevent-websocket on a TCP connection), one reader process; "
        f"{args.batches} batches of {rows[0]['events']} message events each, 1 ms apart, "
        f"{args.rounds} rounds alternating. CPU time of the serving process per batch.",
        "",
        "| round | variant | frames read | CPU µs per batch | per event |",
        "|---|---|---|---|---|",
    ]
    for i, row in enumerate(rows):
        lines.append(f"| {i // len(VARIANTS) + 1} | {row['variant']} | {row['frames']:,} | "
                     f"{row['us_per_batch']:.0f} | {row['us_per_batch'] / row['events']:.2f} |")
    median = {v: statistics.median(r["us_per_batch"] for r in rows if r["variant"] == v)
              for v in VARIANTS}
    lines += [
        "",
        f"Median: open {median['open']:.0f} µs per batch, frames {median['frames']:.0f} µs; "
        f"the plain socket's extra {median['frames'] - median['open']:.0f} µs per batch. With "
        "2 workers flushing once a second, the worker holding the socket forwards 2 batches a "
        f"second: {2 * median['frames'] / 1000:.2f} ms of CPU a second for a plain socket.",
    ]
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batches", type=int, default=2000)
    parser.add_argument("--events", type=int, default=55, help="message events per batch")
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    rows = []
    for rnd in range(args.rounds):
        order = VARIANTS if rnd % 2 == 0 else VARIANTS[::-1]
        for variant in order:
            row = run_variant(variant, args)
            print(f"round {rnd + 1} {variant:>6}: {row['us_per_batch']:.0f} µs per batch "
                  f"({row['frames']} frames)", flush=True)
            rows.append(row)
    rows = [row for r in range(args.rounds) for v in VARIANTS
            for row in rows[2 * r : 2 * r + 2] if row["variant"] == v]
    save_lines(BENCH_DIR / "results" / "dashboard-forward.md", report(rows, args))


if __name__ == "__main__":
    main()
