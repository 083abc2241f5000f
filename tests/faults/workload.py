"""Drive a Queen stack with producers and consumers of unique ids, then check every id.

A Stack is gunicorn (two workers) plus two maintenance processes on one database,
optionally reached through a Proxy. A Run pushes from producer threads (one producer per
partition, ids `run.partition.seq`, a push retried with the same ids until answered)
and consumes in consumer processes (tests/faults/consumer.py, which a fault may kill),
then drains and hands everything to tests/faults/checker.py.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import signal
import subprocess
import sys
import threading
import time
import uuid
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
import requests

from tests import storage
from tests.conftest import ROOT, Server
from tests.e2e.test_maintenance import FAST, Maintainer, leader
from tests.faults.checker import Acked, Delivery, Pushed, Verdict, check

LEASE_S = 3  # the queue's leaseTime: a killed consumer's messages return this soon
STACK_ENV = {
    **FAST,
    "QUEEN_POLL_FALLBACK": "1",
    "LOG_LEVEL": os.environ.get("QUEEN_FAULTS_LOG_LEVEL", "warning"),
}


class Stack:
    """gunicorn (2 workers) and a maintenance leader with a standby, on one database."""

    def __init__(self, dsn: str, log_dir: Path, **env: str) -> None:
        self.dsn = dsn
        self.log_dir = log_dir
        self.env = {**STACK_ENV, **env}
        self.server = Server(dsn, workers=2, log_path=log_dir / "gunicorn.log", **self.env)
        self.maintainers = [Maintainer(dsn, log_dir, **self.env) for _ in range(2)]

    @property
    def url(self) -> str:
        return self.server.url

    def start(self) -> Stack:
        self.server.start(timeout=60)
        for m in self.maintainers:
            m.start()
        return self

    def workers(self) -> list[int]:
        assert self.server.proc is not None
        master = self.server.proc.pid
        return [int(p) for p in Path(f"/proc/{master}/task/{master}/children").read_text().split()]

    def kill_worker(self) -> int:
        pid = self.workers()[0]
        os.kill(pid, signal.SIGKILL)
        return pid

    def leader(self, admin_dsn: str) -> Maintainer | None:
        name = leader(admin_dsn)
        for m in self.maintainers:
            if name and name.endswith(m.name):
                return m
        return None

    def stop(self) -> None:
        for m in self.maintainers:
            m.stop()
        self.server.stop()


@dataclasses.dataclass
class Tally:
    """What the producers saw."""

    attempted: set[str] = dataclasses.field(default_factory=set)
    acknowledged: list[Pushed] = dataclasses.field(default_factory=list)
    statuses: Counter[str] = dataclasses.field(default_factory=Counter)
    successes: list[float] = dataclasses.field(default_factory=list)  # monotonic times
    lock: threading.Lock = dataclasses.field(default_factory=threading.Lock)


class Producer(threading.Thread):
    def __init__(self, url: str, queue: str, partitions: list[str], run: str, tally: Tally,
                 stop: threading.Event, batch: int = 5, pause_s: float = 0.02) -> None:
        super().__init__(daemon=True)
        self.api = f"{url}/api/v1"
        self.queue, self.partitions, self.run_id, self.tally = queue, partitions, run, tally
        self.stop, self.batch, self.pause_s = stop, batch, pause_s
        self.seq = dict.fromkeys(partitions, 0)

    def run(self) -> None:
        http = requests.Session()
        while not self.stop.is_set():
            for partition in self.partitions:
                if self.stop.is_set():
                    return
                self._push(http, partition)
                time.sleep(self.pause_s)

    def _push(self, http: requests.Session, partition: str) -> None:
        first = self.seq[partition]
        ids = [(f"{self.run_id}.{partition}.{first + i}", first + i) for i in range(self.batch)]
        body = {"items": [{"queue": self.queue, "partition": partition, "transactionId": mid,
                           "payload": {"n": seq}} for mid, seq in ids]}
        with self.tally.lock:
            self.tally.attempted.update(mid for mid, _ in ids)
        while not self.stop.is_set():  # the same ids until an answer says what happened
            try:
                r = http.post(f"{self.api}/push", json=body, timeout=15)
            except requests.RequestException:
                self._count("conn")
                time.sleep(0.2)
                continue
            self._count(str(r.status_code))
            if r.status_code == 201:
                status = {m["transactionId"]: m["status"] for m in r.json()["messages"]}
                with self.tally.lock:
                    for mid, seq in ids:
                        if status.get(mid) in ("queued", "duplicate"):
                            self.tally.acknowledged.append(Pushed(mid, partition, seq))
                    self.tally.successes.append(time.monotonic())
                self.seq[partition] = first + self.batch
                return
            time.sleep(0.2)

    def _count(self, status: str) -> None:
        with self.tally.lock:
            self.tally.statuses[status] += 1


class ConsumerProcess:
    def __init__(self, url: str, queue: str, log: Path) -> None:
        self.log = log
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "tests.faults.consumer", url, queue, str(log)], cwd=ROOT,
        )

    def kill(self) -> None:
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait(10)

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(20)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()

    def events(self) -> list[dict[str, Any]]:
        if not self.log.exists():
            return []
        lines = self.log.read_text(encoding="utf-8").splitlines()
        return [json.loads(line) for line in lines if line.endswith("}")]


@dataclasses.dataclass
class Report:
    fault: str
    verdict: Verdict
    statuses: dict[str, int]
    recovery_s: float | None
    longest_gap_s: float
    seconds: float
    notes: dict[str, Any] = dataclasses.field(default_factory=dict)

    @property
    def server_errors(self) -> int:
        """Answers 500-599 other than 503 (503 with Retry-After is the outage answer)."""
        return sum(n for s, n in self.statuses.items() if s.isdigit() and int(s) >= 500
                   and s != "503")

    def line(self) -> dict[str, Any]:
        return {"fault": self.fault, **self.verdict.summary(), "5xx": self.server_errors,
                "503": self.statuses.get("503", 0), "no_answer": self.statuses.get("conn", 0),
                "recovery_s": None if self.recovery_s is None else round(self.recovery_s, 2),
                "longest_gap_s": round(self.longest_gap_s, 2), "seconds": round(self.seconds, 1),
                **self.notes}


class Run:
    """One workload over a stack: start, let a fault happen, drain, check."""

    def __init__(self, stack: Stack, log_dir: Path, producers: int = 2,
                 partitions_each: int = 3, consumers: int = 3) -> None:
        self.stack = stack
        self.run_id = uuid.uuid4().hex[:8]
        self.queue = f"faults-{self.run_id}"
        self.log_dir = log_dir
        self.tally = Tally()
        self._stop = threading.Event()
        self.producers = [
            Producer(stack.url, self.queue, [f"p{i}-{j}" for j in range(partitions_each)],
                     self.run_id, self.tally, self._stop)
            for i in range(producers)
        ]
        self.n_consumers = consumers
        self.consumers: list[ConsumerProcess] = []
        self.started = time.monotonic()
        self.fault_ended: float | None = None
        self.notes: dict[str, Any] = {}  # figures of the fault itself, for the report

    def start(self) -> Run:
        r = requests.post(f"{self.stack.url}/api/v1/configure", timeout=15, json={
            "queue": self.queue, "options": {"leaseTime": LEASE_S, "retryLimit": 100}})
        assert r.status_code == 200, r.text
        for p in self.producers:
            p.start()
        for n in range(self.n_consumers):
            self.add_consumer(n)
        self.wait_for_traffic()
        return self

    def add_consumer(self, n: int) -> ConsumerProcess:
        consumer = ConsumerProcess(self.stack.url, self.queue, self.log_dir / f"consumer-{n}.jsonl")
        self.consumers.append(consumer)
        return consumer

    def wait_for_traffic(self, timeout: float = 30) -> None:
        """Wait until pushes succeed and some message was delivered and acked."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.tally.successes and any(
                "a" in e for c in self.consumers for e in c.events()
            ):
                return
            time.sleep(0.2)
        raise AssertionError("no traffic before the fault")

    def fault_over(self) -> None:
        self.fault_ended = time.monotonic()

    def finish(self, fault: str, after_s: float = 4.0, drain_s: float = 90.0) -> Report:
        """Produce after_s more, stop producing, drain, stop the consumers, check."""
        if self.fault_ended is None:
            self.fault_over()
        time.sleep(after_s)
        self._stop.set()
        for p in self.producers:
            p.join(30)
        deadline = time.monotonic() + drain_s
        wanted = {p.id for p in self.tally.acknowledged}
        asked = time.monotonic()
        while time.monotonic() < deadline:
            acked = {e["a"] for c in self.consumers for e in c.events() if "a" in e}
            if wanted <= acked:
                break
            # A consumer killed after its ack reached the server, before it logged it,
            # leaves messages no log will show acked: once the database holds all that
            # are missing as completed, there is nothing left to wait for.
            if time.monotonic() - asked > 2:
                asked = time.monotonic()
                with contextlib.suppress(psycopg.Error):
                    if self._completed(sorted(wanted - acked)) >= wanted - acked:
                        break
            time.sleep(0.5)
        time.sleep(1.0)  # a redelivery racing the last ack would show up now
        for c in self.consumers:
            c.stop()
        return self._report(fault)

    def _report(self, fault: str) -> Report:
        events = [e for c in self.consumers for e in c.events()]
        deliveries = [
            Delivery(e["d"], e["p"], e["t"], e["r"], e["x"]) for e in events if "d" in e
        ]
        acks = [Acked(e["a"], e["t"]) for e in events if "a" in e]
        verdict = check(self.tally.attempted, self.tally.acknowledged, deliveries, acks)
        if verdict.unfinished:  # acked, with the confirmation lost (a consumer killed)?
            done = self._completed(verdict.unfinished)
            self.notes["acked_unconfirmed"] = len(done)
            verdict.unfinished = [mid for mid in verdict.unfinished if mid not in done]
        statuses = Counter(self.tally.statuses)
        statuses.update(str(e["s"]) for e in events if "s" in e)
        return Report(fault, verdict, dict(statuses), self._recovery(), self._longest_gap(),
                      time.monotonic() - self.started, self.notes)

    def _completed(self, ids: list[str]) -> set[str]:
        """Return which of ids the database holds as completed."""
        with psycopg.connect(self.stack.dsn, autocommit=True) as conn:
            rows = conn.execute(
                f"SELECT transaction_id FROM ({storage.MESSAGE_VIEW}) v"
                " WHERE transaction_id = ANY (%s) AND status = 'completed'", (ids,)
            ).fetchall()
        return {row[0] for row in rows}

    def _recovery(self) -> float | None:
        """Seconds from the end of the fault to the first push answered 201 after it."""
        assert self.fault_ended is not None
        after = [t for t in self.tally.successes if t >= self.fault_ended]
        return after[0] - self.fault_ended if after else None

    def _longest_gap(self) -> float:
        times = sorted(self.tally.successes)
        return max((b - a for a, b in zip(times, times[1:], strict=False)), default=0.0)

    def stop(self) -> None:
        self._stop.set()
        for c in self.consumers:
            with contextlib.suppress(Exception):
                c.stop()


# Acks commit without waiting for the WAL flush (docs/DECISIONS.md): a crash may forget
# those of the last wal_writer_delay (200 ms) times three, so their messages come again.
ACKS_A_CRASH_MAY_FORGET_S = 1.0


@contextlib.contextmanager
def running(dsn: str, tmp_path: Path, **env: str) -> Iterator[Run]:
    """A Stack on dsn (env added to its settings) with a Run started on it; both stopped after."""
    stack = Stack(dsn, tmp_path, **env).start()
    run = Run(stack, tmp_path)
    try:
        yield run.start()
    finally:
        run.stop()
        stack.stop()


def assert_survived(report: Report, crashed_at: float | None = None) -> None:
    """The guarantees every fault must keep; prints the figures for docs/RELIABILITY.md.

    crashed_at (wall clock): PostgreSQL crashed then, so messages acked within
    ACKS_A_CRASH_MAY_FORGET_S before may be delivered again; any other duplicate fails.
    """
    if crashed_at is not None:
        before = report.verdict.duplicated_acked_before(crashed_at - ACKS_A_CRASH_MAY_FORGET_S)
        assert not before, ("acks confirmed well before the crash were forgotten", before[:5])
        report.notes["acks_forgotten_by_the_crash"] = len(report.verdict.duplicated)
        report.verdict.duplicated = []
    line = report.line()
    print(f"\nFAULT {json.dumps(line)}")
    out = os.environ.get("QUEEN_FAULTS_REPORT")
    if out:
        with open(out, "a", encoding="utf-8") as f:
            f.write(json.dumps(line) + "\n")
    v = report.verdict
    assert v.ok, line | {"lost_ids": v.lost[:5], "duplicated_ids": v.duplicated[:5],
                         "unexpected_ids": v.unexpected[:5], "order": v.order_violations[:5]}
    assert report.server_errors == 0, report.statuses
    assert not v.unfinished, v.unfinished[:5]
    assert v.acknowledged > 0
