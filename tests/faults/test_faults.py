"""Faults under load, each checked message by message (tests/faults/checker.py).

Every test drives producers and consumers through a fault, drains, and asserts: nothing
lost, no redelivery of an acked message, nothing unexpected, FIFO per partition, no 5xx
but 503. The unmarked tests are the bounded subset of the default run; `-m faults` runs
the rest (docs/RELIABILITY.md has their figures and the command).
"""

from __future__ import annotations

import contextlib
import socket
import threading
import time
from pathlib import Path

import pytest
import requests

from bench.cluster import Cluster
from tests.faults.conftest import through
from tests.faults.proxy import Proxy
from tests.faults.workload import LEASE_S, Run, assert_survived, running


def test_kill_9_of_a_worker(db_dsn: str, tmp_path: Path) -> None:
    with running(db_dsn, tmp_path) as run:
        before = run.stack.workers()
        killed_at, killed = time.monotonic(), run.stack.kill_worker()
        deadline = time.monotonic() + 30
        while killed in (now := run.stack.workers()) or len(now) < len(before):
            assert time.monotonic() < deadline, "the worker was not replaced"
            time.sleep(0.05)
        run.notes["replaced_s"] = round(time.monotonic() - killed_at, 2)
        run.fault_over()
        assert_survived(run.finish("kill -9 of a worker"))


def test_database_connections_reset(db_dsn: str, proxy_to_shared: Proxy, tmp_path: Path) -> None:
    with running(through(proxy_to_shared, db_dsn), tmp_path) as run:
        for _ in range(3):
            assert proxy_to_shared.reset() > 0
            time.sleep(1.0)
        run.fault_over()
        assert_survived(run.finish("database connections reset (3 times, 1 s apart)"))


@pytest.mark.faults
def test_kill_9_of_a_consumer_holding_leases(db_dsn: str, tmp_path: Path) -> None:
    with running(db_dsn, tmp_path) as run:
        victim = run.consumers[0]
        deadline = time.monotonic() + 20
        while True:  # kill it between a delivery and its ack, if the timing allows
            events = victim.events()
            if events and "d" in events[-1]:
                break
            assert time.monotonic() < deadline
            time.sleep(0.005)
        victim.kill()
        run.fault_over()
        report = run.finish("kill -9 of a consumer holding leases", after_s=LEASE_S + 3)
        assert_survived(report)


@pytest.mark.faults
def test_kill_9_of_the_maintenance_leader(db_dsn: str, tmp_path: Path) -> None:
    with running(db_dsn, tmp_path) as run:
        deadline = time.monotonic() + 20
        while (old := run.stack.leader(db_dsn)) is None:
            assert time.monotonic() < deadline, "no maintenance leader"
            time.sleep(0.1)
        run.consumers[0].kill()  # its leases need the leader (or a claim) to expire
        killed_at = time.monotonic()
        old.kill()
        while (new := run.stack.leader(db_dsn)) is None or new is old:
            assert time.monotonic() < deadline + 20, "the standby did not take over"
            time.sleep(0.1)
        run.notes["takeover_s"] = round(time.monotonic() - killed_at, 2)
        run.fault_over()
        assert_survived(run.finish("kill -9 of the maintenance leader", after_s=LEASE_S + 3))


@pytest.mark.faults
def test_postgresql_restart(cluster: Cluster, cluster_db: str, tmp_path: Path) -> None:
    with running(cluster_db, tmp_path) as run:
        cluster.restart()
        run.fault_over()
        assert_survived(run.finish("PostgreSQL restart (fast)"))


@pytest.mark.faults
def test_postgresql_stopped_for_10_s(cluster: Cluster, cluster_db: str, tmp_path: Path) -> None:
    with running(cluster_db, tmp_path) as run:
        cluster.stop("fast")
        time.sleep(10)
        cluster.start()
        run.fault_over()
        assert_survived(run.finish("PostgreSQL stopped for 10 s"))


def _wake_s(url: str, queue: str) -> float:
    """Park a long poll on queue, push one message, return how long until the poll has it."""
    answered: list[float] = []

    def poll() -> None:
        deadline = time.monotonic() + 40
        while time.monotonic() < deadline:
            r = requests.get(f"{url}/api/v1/pop/queue/{queue}",
                             params={"wait": "true", "timeout": 30000}, timeout=40)
            if r.status_code == 200:
                answered.append(time.monotonic())
                return
            time.sleep(0.05)  # 503 while recovering: ask again

    waiter = threading.Thread(target=poll)
    waiter.start()
    time.sleep(1.0)  # parked
    push = {"items": [{"queue": queue, "payload": "wake"}]}
    while requests.post(f"{url}/api/v1/push", json=push, timeout=15).status_code != 201:
        time.sleep(0.05)
    pushed = time.monotonic()
    waiter.join(45)
    return answered[0] - pushed


def _healthy(url: str, timeout: float = 30) -> None:
    """Wait until /health answers 200 several times in a row (both workers, likely)."""
    deadline, streak = time.monotonic() + timeout, 0
    while streak < 6:
        assert time.monotonic() < deadline, "not healthy after the fault"
        streak = streak + 1 if requests.get(f"{url}/health", timeout=15).status_code == 200 else 0
        time.sleep(0.05)


@pytest.mark.faults
def test_postgresql_crash(cluster: Cluster, cluster_db: str, tmp_path: Path) -> None:
    # No fallback re-check for 20 s: a wake-up within a second came through the listener.
    with running(cluster_db, tmp_path, QUEEN_POLL_FALLBACK="20") as run:
        crashed_at = time.time()
        cluster.crash()
        cluster.start()  # crash recovery: queen.waiting_workers (unlogged) is emptied
        run.fault_over()
        _healthy(run.stack.url)
        wakes = [_wake_s(run.stack.url, f"wake-{n}") for n in range(3)]
        run.notes["wake_after_crash_s"] = [round(w, 3) for w in wakes]
        report = run.finish("PostgreSQL crash (immediate stop, recovery)")
        assert_survived(report, crashed_at=crashed_at)
        assert wakes[-1] < 1.0, wakes


@pytest.mark.faults
def test_database_connections_frozen_for_15_s(
    cluster: Cluster, cluster_db: str, tmp_path: Path
) -> None:
    proxy = Proxy(cluster.port)
    try:
        with running(through(proxy, cluster_db), tmp_path) as run:
            proxy.frozen.set()
            time.sleep(15)
            proxy.frozen.clear()
            run.fault_over()
            assert_survived(run.finish("database connections frozen for 15 s"))
    finally:
        proxy.close()


def _flood(port: int, idle: int, slow: int, seconds: float) -> int:
    """Open idle sockets and slowloris ones (a header byte a second); return how many opened."""
    sockets = []
    for n in range(idle + slow):
        with contextlib.suppress(OSError):
            s = socket.create_connection(("127.0.0.1", port), timeout=5)
            if n >= idle:
                s.sendall(b"GET /health HTTP/1.1\r\n")
            sockets.append(s)
    opened = len(sockets)
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        for s in sockets[idle:]:
            with contextlib.suppress(OSError):
                s.sendall(b"X")
        time.sleep(1)
    for s in sockets:
        s.close()
    return opened


@pytest.mark.faults
def test_slowloris_and_idle_floods(db_dsn: str, tmp_path: Path) -> None:
    with running(db_dsn, tmp_path) as run:
        opened: list[int] = []
        flood = threading.Thread(
            target=lambda: opened.append(_flood(run.stack.server.port, 2000, 200, 15))
        )
        flood.start()
        flood.join(60)
        assert opened and opened[0] > 1000
        run.fault_over()
        assert_survived(run.finish("2,000 idle and 200 slowloris connections for 15 s"))



def _acks_per_s(run: Run, start: float, end: float) -> float:
    """Acks the consumers confirmed per second between two times (wall clock, as they
    record them)."""
    times = [e["t"] for c in run.consumers for e in c.events() if "a" in e]
    return sum(start <= t < end for t in times) / (end - start)


@pytest.mark.faults
def test_a_snapshot_held_for_15_s(db_dsn: str, tmp_path: Path) -> None:
    """An idle-in-transaction session holding a snapshot (a report left open, a stuck
    client): vacuum cannot remove what it might still see, so dead rows pile up under
    the consumer rows every pop and ack update. Queen keeps serving, and its ack rate
    while the snapshot is held is recorded beside the rate before it."""
    import psycopg

    with running(db_dsn, tmp_path) as run:
        time.sleep(3)
        before = _acks_per_s(run, time.time() - 3, time.time())
        with psycopg.connect(db_dsn) as holder:
            holder.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ")
            holder.execute("SELECT count(*) FROM queen.consumers").fetchone()
            held_at = time.time()
            time.sleep(15)
            during = _acks_per_s(run, held_at, time.time())
            holder.rollback()
        run.notes["acks_per_s_before"] = round(before, 1)
        run.notes["acks_per_s_while_held"] = round(during, 1)
        run.fault_over()
        assert_survived(run.finish("a snapshot held for 15 s (idle in transaction)"))
        assert during > 0, "no ack confirmed while the snapshot was held"
