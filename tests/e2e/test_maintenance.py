"""The maintenance process for real: gunicorn plus `python -m workers.maintenance`, real time.

The server's fallback re-check is set far beyond every test's horizon, so a long poll
answered on time was woken by a notification the maintenance process caused.
"""

from __future__ import annotations

import concurrent.futures
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest
import requests

from queen.store.maintenance import MaintenanceSession
from tests import storage
from tests.conftest import ROOT, Server

FAST = {  # maintenance settings that make the tests run in seconds
    "QUEEN_MAINTENANCE_INTERVAL": "0.2",
    "QUEEN_RETENTION_INTERVAL": "0.2",
    "METRICS_COLLECTION_INTERVAL": "0.5",
    "QUEEN_LEADER_POLL": "0.2",
}
NO_FALLBACK = {"QUEEN_POLL_FALLBACK": "600"}
# Seconds a long poll may be answered after its due time: only a wake-up from maintenance
# can answer it before the poll's own timeout (the fallback re-check is 600 s away); the
# margin holds on a loaded 2-core machine.
ON_TIME = 3.0


class Maintainer:
    """A `python -m workers.maintenance` subprocess with its log in a file."""

    def __init__(self, dsn: str, log_dir: Path, **env: str) -> None:
        self.dsn = dsn
        self.env = {**os.environ, "DATABASE_URL": dsn, "LOG_LEVEL": "info", **FAST, **env}
        self.log_path = log_dir / f"maintenance-{id(self)}.log"
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> Maintainer:
        with open(self.log_path, "wb") as log:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "workers.maintenance"],
                env=self.env,
                cwd=ROOT,
                stdout=log,
                stderr=subprocess.STDOUT,
            )
        return self

    @property
    def name(self) -> str:
        assert self.proc is not None
        return f"-{self.proc.pid}"  # the end of its application_name

    @property
    def log(self) -> str:
        return self.log_path.read_text()

    def kill(self) -> None:
        assert self.proc is not None
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait(10)

    def stop(self) -> int:
        if self.proc is None or self.proc.poll() is not None:
            return self.proc.returncode if self.proc else 0
        self.proc.terminate()
        try:
            return self.proc.wait(15)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            return self.proc.wait()


def leader(dsn: str) -> str | None:
    session = MaintenanceSession(dsn, application_name="test-observer")
    session.connect()
    try:
        return session.leader()
    finally:
        session.close()


def wait_for(predicate: Any, timeout: float, step: float = 0.05) -> float:
    """Poll predicate until true; return the seconds it took (fail after timeout)."""
    started = time.monotonic()
    while not predicate():
        assert time.monotonic() - started < timeout, "condition not reached in time"
        time.sleep(step)
    return time.monotonic() - started


def queue_totals(url: str, *queues: str) -> tuple[int, ...]:
    """(pending, processing, completed, failed, deadLetter) of the queues, as analytics counts
    them (the count rollup plus the walks past its watermarks)."""
    fields = ("pending", "processing", "completed", "failed", "deadLetter")
    sums = [0] * len(fields)
    for queue in queues:
        r = requests.get(f"{url}/api/v1/analytics/queue/{queue}", timeout=10)
        assert r.status_code == 200, r.text
        sums = [n + r.json()["totals"][f] for n, f in zip(sums, fields, strict=True)]
    return tuple(sums)


def settled_totals(
    url: str, queues: list[str], expected: tuple[int, ...], timeout: float = 10
) -> tuple[int, ...]:
    """The queues' totals once they equal expected (counts follow maintenance), or the
    last ones seen after timeout."""
    deadline = time.monotonic() + timeout
    while (got := queue_totals(url, *queues)) != expected and time.monotonic() < deadline:
        time.sleep(0.1)
    return got


def query(dsn: str, sql: str, params: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    with psycopg.connect(dsn, autocommit=True) as conn:
        return conn.execute(sql, params).fetchall()  # type: ignore[arg-type]


def statuses(dsn: str) -> dict[str, tuple[str, int, str | None]]:
    found = query(
        dsn, f"SELECT transaction_id, status, retry_count, error FROM ({storage.MESSAGE_VIEW}) v"
    )
    return {r[0]: (r[1], r[2], r[3]) for r in found}


@pytest.fixture
def maintainers(db_dsn: str, tmp_path: Path) -> Iterator[list[Maintainer]]:
    """Start maintenance processes with maintainers.append(...); all stop at the end."""
    started: list[Maintainer] = []
    yield started
    for m in started:
        m.stop()


@pytest.fixture
def stack(db_dsn: str, tmp_path: Path, maintainers: list[Maintainer]) -> Iterator[Server]:
    """gunicorn (no fallback re-checks) plus one maintenance process."""
    maintainers.append(Maintainer(db_dsn, tmp_path).start())
    srv = Server(db_dsn, workers=1, **NO_FALLBACK).start()
    wait_for(lambda: leader(db_dsn) is not None, 10)
    yield srv
    quick_stop(srv)


def quick_stop(srv: Server) -> None:
    """Stop gunicorn without the graceful wait (SIGINT: quick shutdown)."""
    if srv.proc is not None and srv.proc.poll() is None:
        srv.proc.send_signal(signal.SIGINT)
    srv.stop()


def configure(url: str, queue: str, **options: Any) -> None:
    r = requests.post(f"{url}/api/v1/configure", json={"queue": queue, "options": options})
    assert r.status_code == 200, r.text


def push(url: str, queue: str, *payloads: Any, partition: str | None = None) -> list[str]:
    items = [
        {"queue": queue, "payload": p} | ({"partition": partition} if partition else {})
        for p in payloads
    ]
    r = requests.post(f"{url}/api/v1/push", json={"items": items})
    assert r.status_code == 201, r.text
    return [m["transactionId"] for m in r.json()["messages"]]


def pop(url: str, queue: str, *, batch: int = 1, wait_ms: int = 0) -> list[dict[str, Any]]:
    params: dict[str, Any] = {"batch": batch}
    if wait_ms:
        params |= {"wait": "true", "timeout": wait_ms}
    r = requests.get(f"{url}/api/v1/pop/queue/{queue}", params=params, timeout=30)
    assert r.status_code in (200, 204), r.text
    return r.json()["messages"] if r.status_code == 200 else []


def ack(url: str, txid: str, status: str = "completed") -> dict[str, Any]:
    r = requests.post(f"{url}/api/v1/ack", json={"transactionId": txid, "status": status})
    assert r.status_code == 200, r.text
    return r.json()


class Timed:
    """A long poll started in the background; .answer() waits for it and says when it came."""

    def __init__(self, url: str, queue: str, batch: int = 1, wait_ms: int = 15000) -> None:
        self.at = 0.0
        self.messages: list[dict[str, Any]] = []
        self._thread = threading.Thread(target=self._run, args=(url, queue, batch, wait_ms))
        self._thread.start()
        time.sleep(0.2)  # let it park

    def _run(self, url: str, queue: str, batch: int, wait_ms: int) -> None:
        self.messages = pop(url, queue, batch=batch, wait_ms=wait_ms)
        self.at = time.monotonic()

    def answer(self) -> tuple[float, list[dict[str, Any]]]:
        self._thread.join(30)
        return self.at, self.messages


# -- leases ---------------------------------------------------------------------------


@pytest.mark.parametrize(("dlq", "final"), [(True, "dead_letter"), (False, "failed")])
def test_expired_leases_redeliver_then_give_up(
    stack: Server, db_dsn: str, dlq: bool, final: str
) -> None:
    url = stack.url
    configure(url, "q", leaseTime=1, retryLimit=1, dlqAfterMaxRetries=dlq)
    (txid,) = push(url, "q", "work")
    (first,) = pop(url, "q")
    popped_at = time.monotonic()
    assert first["retryCount"] == 0
    poll = Timed(url, "q")  # parks: the partition is leased
    at, messages = poll.answer()
    assert [m["transactionId"] for m in messages] == [txid]
    assert messages[0]["retryCount"] == 1
    assert 0.9 < at - popped_at < 1 + ON_TIME  # woken by the expiry, not a re-check
    wait_for(lambda: statuses(db_dsn)[txid][0] == final, 5)
    assert statuses(db_dsn)[txid] == (final, 1, "lease expired")
    assert query(db_dsn, storage.LEASED_PARTITIONS) == [(0,)]


# -- delayed and windowed -------------------------------------------------------------


def test_delayed_messages_wake_a_long_poll_on_time(stack: Server) -> None:
    url = stack.url
    configure(url, "d", delayedProcessing=2)
    before = time.monotonic()
    (txid,) = push(url, "d", "later")
    after = time.monotonic()
    assert pop(url, "d") == []
    at, messages = Timed(url, "d").answer()
    assert [m["transactionId"] for m in messages] == [txid]
    assert before + 2 <= at <= after + 2 + ON_TIME, at - (after + 2)


def test_windowed_messages_wake_a_long_poll_when_the_window_closes(stack: Server) -> None:
    url = stack.url
    configure(url, "w", windowBuffer=2)
    push(url, "w", 1)
    poll = Timed(url, "w", batch=10)
    time.sleep(0.8)
    before = time.monotonic()
    push(url, "w", 2)  # moves the window
    after = time.monotonic()
    at, messages = poll.answer()
    assert [m["data"] for m in messages] == [1, 2]
    assert before + 2 <= at <= after + 2 + ON_TIME, at - (after + 2)


# -- ttl and retention ----------------------------------------------------------------


def test_ttl_expires_pending_messages_without_a_pop(stack: Server, db_dsn: str) -> None:
    url = stack.url
    configure(url, "t", ttl=1)
    expiring = push(url, "t", 1, 2, partition="a") + push(url, "t", 3, partition="b")
    elapsed = wait_for(lambda: all(s[0] == "dead_letter" for s in statuses(db_dsn).values()), 10)
    assert 0.5 < elapsed < 1 + ON_TIME
    assert {t: s for t, s in statuses(db_dsn).items()} == {
        t: ("dead_letter", 0, "ttl expired") for t in expiring
    }
    assert pop(url, "t") == []


def test_retention_deletes_old_pending_and_completed(stack: Server, db_dsn: str) -> None:
    url = stack.url
    configure(url, "r", retentionEnabled=True, retentionSeconds=2, completedRetentionSeconds=1)
    configure(url, "kept", retentionSeconds=1)  # retention not enabled
    done = push(url, "r", 1, 2)
    waiting = push(url, "r", 3)
    kept = push(url, "kept", 4)
    for txid in done:
        (m,) = pop(url, "r")
        assert m["transactionId"] == txid
        ack(url, txid)
    wait_for(lambda: set(statuses(db_dsn)) == set(waiting + kept), 4)
    wait_for(lambda: set(statuses(db_dsn)) == set(kept), 4)


def test_idle_empty_partitions_are_removed(
    db_dsn: str, tmp_path: Path, maintainers: list[Maintainer]
) -> None:
    maintainers.append(Maintainer(db_dsn, tmp_path, QUEEN_PARTITION_CLEANUP="1").start())
    srv = Server(db_dsn).start()
    try:
        configure(srv.url, "c", retentionEnabled=True, completedRetentionSeconds=1)
        (txid,) = push(srv.url, "c", 1, partition="gone")
        (m,) = pop(srv.url, "c")
        ack(srv.url, m["transactionId"])
        wait_for(lambda: query(db_dsn, "SELECT count(*) FROM queen.partitions") == [(0,)], 8)
        push(srv.url, "c", 2, partition="gone")  # comes back on the next push
        assert [m["data"] for m in pop(srv.url, "c")] == [2]
    finally:
        quick_stop(srv)


# -- maxSize --------------------------------------------------------------------------


PENDING = f"SELECT count(*) FROM ({storage.MESSAGE_VIEW}) v WHERE status = 'pending'"


def test_max_size_holds_under_20_concurrent_pushers(stack: Server, db_dsn: str) -> None:
    url = stack.url
    limit = 50
    configure(url, "full", maxSize=limit)
    stop = threading.Event()
    peak = 0

    def sample() -> None:
        nonlocal peak
        with psycopg.connect(db_dsn, autocommit=True) as conn:
            while not stop.is_set():
                (n,) = conn.execute(PENDING).fetchone()  # type: ignore[misc]
                peak = max(peak, n)

    def pusher(worker: int) -> list[str]:
        seen = []
        with requests.Session() as http:
            for batch in range(10):
                items = [
                    {"queue": "full", "partition": f"p{worker % 4}", "payload": [worker, batch, i]}
                    for i in range(5)
                ]
                r = http.post(f"{url}/api/v1/push", json={"items": items})
                assert r.status_code in (201, 429), r.text
                seen += [m["status"] for m in r.json().get("messages", [])] or ["rejected"] * 5
        return seen

    sampler = threading.Thread(target=sample)
    sampler.start()
    with concurrent.futures.ThreadPoolExecutor(20) as pool:
        results = [s for r in pool.map(pusher, range(20)) for s in r]
    stop.set()
    sampler.join()
    assert results.count("queued") == limit
    assert results.count("rejected") == 20 * 10 * 5 - limit
    assert peak <= limit
    assert query(db_dsn, f"SELECT count(*) FROM {storage.MESSAGES}") == [(limit,)]
    # Room comes back as messages leave pending.
    (m,) = pop(url, "full")
    assert push(url, "full", "one more")
    assert query(db_dsn, PENDING) == [(limit,)]


# -- leadership -----------------------------------------------------------------------


def test_a_standby_takes_over_after_kill_9_without_doing_work_twice(
    db_dsn: str, tmp_path: Path, maintainers: list[Maintainer]
) -> None:
    maintainers += [Maintainer(db_dsn, tmp_path).start(), Maintainer(db_dsn, tmp_path).start()]
    wait_for(lambda: any("standing by" in m.log for m in maintainers), 10)
    a, b = sorted(maintainers, key=lambda m: "standing by" in m.log)  # a leads, b stands by
    assert (leader(db_dsn) or "").endswith(a.name)

    srv = Server(db_dsn, **NO_FALLBACK).start()
    try:
        url = srv.url
        configure(url, "f", leaseTime=1, retryLimit=5)
        txids = [t for p in range(20) for t in push(url, "f", p, partition=f"p{p}")]
        delivered = [m for _ in range(20) for m in pop(url, "f")]
        assert len(delivered) == 20
        time.sleep(0.8)
        a.kill()  # around the moment the leases expire
        took = wait_for(lambda: (leader(db_dsn) or "").endswith(b.name), 10)
        assert took < 8
        # Pending with one retry each, once the new leader ended the leases (on the cursor
        # store an expired lease not yet ended already reads as pending, retryCount 0).
        expired_once = dict.fromkeys(txids, ("pending", 1))
        deadline = time.monotonic() + 5
        while (seen := {t: s[:2] for t, s in statuses(db_dsn).items()}) != expired_once:
            assert time.monotonic() < deadline, seen
            time.sleep(0.05)
        assert settled_totals(url, ["f"], (20, 0, 0, 0, 0)) == (20, 0, 0, 0, 0)
    finally:
        quick_stop(srv)


def test_a_leader_that_loses_its_connection_steps_down(
    db_dsn: str, tmp_path: Path, maintainers: list[Maintainer]
) -> None:
    a = Maintainer(db_dsn, tmp_path).start()
    maintainers.append(a)
    wait_for(lambda: leader(db_dsn) is not None, 10)
    query(
        db_dsn,
        "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE application_name LIKE %s",
        (f"%{a.name}",),
    )
    wait_for(lambda: "stepping down" in a.log, 5)
    wait_for(lambda: (leader(db_dsn) or "").endswith(a.name), 5)  # and leads again
    assert a.proc is not None and a.proc.poll() is None
    assert a.stop() == 0
    assert "stopped" in a.log


# -- accounting -----------------------------------------------------------------------


def test_accounting_after_a_mixed_run(stack: Server, db_dsn: str) -> None:
    """Completes, failed acks, expiries, retries, DLQ and ttl; then every count agrees."""
    url = stack.url
    configure(url, "mix", leaseTime=1, retryLimit=1)
    configure(url, "soft", leaseTime=1, retryLimit=0, dlqAfterMaxRetries=False)
    configure(url, "stale", ttl=1)
    pushed = [t for p in range(4) for t in push(url, "mix", *range(10), partition=f"p{p}")]
    pushed += push(url, "soft", *range(5))
    pushed += push(url, "stale", *range(5))
    acked_completed = 0
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        batch = pop(url, "mix", batch=3, wait_ms=1500) + pop(url, "soft", batch=2)
        if not batch:
            terminal = {s[0] for t, s in statuses(db_dsn).items()}
            if terminal <= {"completed", "dead_letter", "failed"}:
                break
            continue
        for m in batch:
            choice = hash(m["transactionId"]) % 3
            if choice == 0:
                acked_completed += ack(url, m["transactionId"])["status"] == "completed"
            elif choice == 1:
                ack(url, m["transactionId"], "failed")
            # else: never acked; the lease expires
    final = statuses(db_dsn)
    assert sorted(final) == sorted(pushed)  # each message once, none lost
    assert {s[0] for s in final.values()} <= {"completed", "dead_letter", "failed"}

    by_status = {
        status: sum(1 for s in final.values() if s[0] == status)
        for status in ("pending", "processing", "completed", "failed", "dead_letter")
    }
    expected = tuple(by_status.values())
    assert settled_totals(url, ["mix", "soft", "stale"], expected) == expected
    assert by_status["completed"] == acked_completed
