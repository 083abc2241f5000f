"""Load generator process: gevent greenlets, one client (one connection) each.

Run by the harness as `python -m bench.driver '<spec json>'`. The process patches the
standard library before anything imports psycopg or pika, builds its clients, prints
READY, waits for `GO <epoch seconds>` on stdin, runs the workload until the window
closes and prints one JSON line with counts and latency samples. Counts and samples
only include operations that completed inside the measurement window, so several
driver processes started together add up.
"""

from gevent import monkey

monkey.patch_all()

import contextlib  # noqa: E402
import json  # noqa: E402
import random  # noqa: E402
import sys  # noqa: E402
import time  # noqa: E402
from typing import Any  # noqa: E402

import gevent  # noqa: E402

from bench.adapters import CLIENTS, EmptyPop, fanout_queues  # noqa: E402

MAX_SAMPLES = 20000  # latency samples kept per operation and process (reservoir)
EMPTY_SLEEP = 0.002  # seconds a polling consumer waits after an empty pop
ERROR_SLEEP = 0.05  # seconds to back off after an error


class Window:
    """The measurement window and what completed inside it."""

    def __init__(self, start: float, warmup: float, duration: float) -> None:
        self.open_at = start + warmup
        self.close_at = self.open_at + duration
        self.end_at = self.close_at
        self.counts = {
            "pushed": 0,
            "popped": 0,
            "acked": 0,
            "pop_calls": 0,
            "empty_pops": 0,
            "errors": 0,
        }
        self.samples: dict[str, list[float]] = {"push": [], "pop": [], "ack": []}
        self._seen = {"push": 0, "pop": 0, "ack": 0}
        self.error_text: list[str] = []

    def running(self) -> bool:
        return time.time() < self.end_at

    def record(self, op: str, started: float, count_key: str | None, n: int) -> None:
        done = time.time()
        if not (self.open_at <= done <= self.close_at):
            return
        if count_key:
            self.counts[count_key] += n
        self._seen[op] += 1
        seen, samples = self._seen[op], self.samples[op]
        latency_ms = (done - started) * 1000
        if len(samples) < MAX_SAMPLES:
            samples.append(latency_ms)
        else:
            slot = random.randrange(seen)
            if slot < MAX_SAMPLES:
                samples[slot] = latency_ms

    def error(self, exc: BaseException) -> None:
        self.counts["errors"] += 1
        if len(self.error_text) < 5:
            self.error_text.append(f"{type(exc).__name__}: {exc}"[:300])
        gevent.sleep(ERROR_SLEEP)


class Backlog:
    """Messages pushed and not yet acked by this process; producers wait above the cap."""

    def __init__(self, cap: int) -> None:
        self.cap = cap
        self.outstanding = 0


def producer(
    client: Any, batch: int, window: Window, backlog: Backlog | None, readers: int = 1
) -> None:
    """Push batch after batch; each message is readers deliveries to ack (fan-out)."""
    while window.running():
        if backlog is not None and backlog.outstanding + batch * readers > backlog.cap:
            gevent.sleep(0.001)
            continue
        started = time.time()
        try:
            client.push(batch)
        except Exception as exc:  # noqa: BLE001 - counted and reported
            window.error(exc)
            continue
        if backlog is not None:
            backlog.outstanding += batch * readers
        window.record("push", started, "pushed", batch)


def consumer(
    client: Any,
    batch: int,
    window: Window,
    backlog: Backlog | None,
    pause: float = 0.0,
    refill: Any = None,
) -> None:
    """Pop batch after batch and ack each; with refill (a producer), push one message
    before each pop (the latency probe: one client's push, pop and ack in turn)."""
    while window.running():
        if refill is not None:
            started = time.time()
            try:
                refill.push(1)
            except Exception as exc:  # noqa: BLE001
                window.error(exc)
                continue
            window.record("push", started, "pushed", 1)
        started = time.time()
        try:
            handles = client.pop(batch)
        except EmptyPop:
            window.counts["empty_pops"] += 1
            gevent.sleep(EMPTY_SLEEP)
            continue
        except Exception as exc:  # noqa: BLE001
            window.error(exc)
            continue
        window.record("pop", started, "popped", len(handles))
        if window.open_at <= time.time() <= window.close_at:
            window.counts["pop_calls"] += 1
        started = time.time()
        try:
            client.ack(handles)
        except Exception as exc:  # noqa: BLE001
            window.error(exc)
            continue
        if backlog is not None:
            backlog.outstanding -= len(handles)
        window.record("ack", started, "acked", len(handles))
        if pause:
            gevent.sleep(pause)


def build_clients(
    spec: dict[str, Any], count: int, offset: int, role: str = "producer"
) -> list[Any]:
    cls = CLIENTS[spec["system"]]
    return [
        cls(
            spec["target"],
            {**spec, **fanout_role(spec, role, i), "client_index": offset + i, "role": role},
        )
        for i in range(count)
    ]


def fanout_role(spec: dict[str, Any], role: str, i: int) -> dict[str, Any]:
    """What client i of a fan-out case reads or writes: consumers are dealt round the G
    groups (or copy queues) by their number over all processes, so each has as many."""
    if spec["workload"] != "fanout":
        return {}
    groups = int(spec["groups"])
    lane = (int(spec.get("first_consumer", 0)) + i) % groups
    if spec["variant"] == "groups":
        return {"consumer_group": f"g{lane}"} if role == "consumer" else {}
    queues = fanout_queues(groups)
    return {"queue": queues[lane]} if role == "consumer" else {"copy_queues": queues}


def main() -> None:
    spec = json.loads(sys.argv[1])
    workload, batch = spec["workload"], int(spec["batch"])
    producers = build_clients(spec, int(spec.get("producers", 0)), spec.get("index", 0) * 100)
    consumers = build_clients(
        spec, int(spec.get("consumers", 0)), spec.get("index", 0) * 100 + 50, "consumer"
    )
    if workload == "latency":
        # Pre-fill the queue so that every pop of the probe finds a message.
        for _ in range(int(spec.get("prefill_batches", 1))):
            producers[0].push(int(spec.get("prefill_batch", 100)))
    print("READY", flush=True)
    line = sys.stdin.readline().split()
    start = float(line[1]) if len(line) == 2 else time.time()
    window = Window(start, float(spec["warmup"]), float(spec["duration"]))
    gevent.sleep(max(0.0, start - time.time()))

    cap = int(spec.get("backlog_cap", 0))
    backlog = Backlog(cap) if cap else None
    jobs: list[Any] = []
    if workload == "push":
        jobs = [gevent.spawn(producer, c, batch, window, None) for c in producers]
    elif workload in ("e2e", "fanout"):
        readers = int(spec["groups"]) if workload == "fanout" else 1
        jobs = [gevent.spawn(producer, c, batch, window, backlog, readers) for c in producers]
        jobs += [gevent.spawn(consumer, c, batch, window, backlog) for c in consumers]
    elif workload == "latency":
        pause = float(spec.get("probe_pause", 0.005))
        jobs = [gevent.spawn(consumer, consumers[0], 1, window, None, pause, producers[0])]
    else:
        raise SystemExit(f"unknown workload {workload!r}")
    gevent.joinall(jobs, timeout=max(0.0, window.end_at - time.time()) + 10)
    gevent.killall(jobs, timeout=2)
    for c in producers + consumers:
        with contextlib.suppress(Exception):  # best effort at exit
            c.close()
    result = {"counts": window.counts, "samples": window.samples, "errors": window.error_text}
    sys.stdout.write(json.dumps(result) + "\n")
    sys.stdout.flush()


if __name__ == "__main__":
    main()
