"""PgQueuer load generator (asyncio): the same READY/GO protocol and output as bench.driver.

Producers enqueue batches with `Queries.enqueue`; each consumer is one `QueueManager`
(its own connection) with `batch_size` = the batch, counting jobs as its entrypoint runs
them. PgQueuer records completions itself (buffered, flushed every batch or timeout).
"""

from __future__ import annotations

import asyncio
import json
import sys
import time
from datetime import timedelta
from typing import Any

import psycopg
from pgqueuer.db import PsycopgDriver
from pgqueuer.qm import QueueManager
from pgqueuer.queries import Queries

from bench.adapters import PAYLOAD_JSON

ENTRYPOINT = "bench"


async def install(dsn: str) -> None:
    """Install PgQueuer's schema in a fresh database (idempotent: skips when present)."""
    async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as conn:
        cur = await conn.execute("SELECT to_regclass('pgqueuer')")
        row = await cur.fetchone()
        if row and row[0]:
            await conn.execute("TRUNCATE pgqueuer, pgqueuer_log, pgqueuer_statistics")
            return
        await Queries(PsycopgDriver(conn)).install()


class Window:
    def __init__(self, start: float, warmup: float, duration: float) -> None:
        self.open_at = start + warmup
        self.close_at = self.open_at + duration
        self.counts = {"pushed": 0, "popped": 0, "acked": 0, "empty_pops": 0, "errors": 0}
        self.samples: dict[str, list[float]] = {"push": [], "pop": [], "ack": []}
        self.errors: list[str] = []

    def inside(self) -> bool:
        return self.open_at <= time.time() <= self.close_at


async def producer(dsn: str, batch: int, window: Window, state: dict[str, int]) -> None:
    async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as conn:
        queries = Queries(PsycopgDriver(conn))
        while time.time() < window.close_at:
            if state["outstanding"] + batch > state["cap"]:
                await asyncio.sleep(0.001)
                continue
            started = time.time()
            try:
                await queries.enqueue([ENTRYPOINT] * batch, [PAYLOAD_JSON] * batch, [0] * batch)
            except Exception as exc:  # noqa: BLE001 - counted and reported
                window.counts["errors"] += 1
                window.errors.append(str(exc)[:300])
                await asyncio.sleep(0.05)
                continue
            state["outstanding"] += batch
            if window.inside():
                window.counts["pushed"] += batch
                if len(window.samples["push"]) < 20000:
                    window.samples["push"].append((time.time() - started) * 1000)


async def consumer(dsn: str, batch: int, window: Window, state: dict[str, int]) -> None:
    conn = await psycopg.AsyncConnection.connect(dsn, autocommit=True)
    qm = QueueManager(Queries(PsycopgDriver(conn)))

    @qm.entrypoint(ENTRYPOINT)
    async def handle(job: Any) -> None:
        state["outstanding"] -= 1
        if window.inside():
            window.counts["popped"] += 1
            window.counts["acked"] += 1

    async def stop_at_close() -> None:
        await asyncio.sleep(max(0.0, window.close_at - time.time()))
        qm.shutdown.set()

    stopper = asyncio.create_task(stop_at_close())
    await qm.run(batch_size=batch, dequeue_timeout=timedelta(seconds=1))
    await stopper
    await conn.close()


async def amain(spec: dict[str, Any]) -> dict[str, Any]:
    dsn, batch = spec["target"]["dsn"], int(spec["batch"])
    print("READY", flush=True)
    line = (await asyncio.to_thread(sys.stdin.readline)).split()
    start = float(line[1]) if len(line) == 2 else time.time()
    window = Window(start, float(spec["warmup"]), float(spec["duration"]))
    await asyncio.sleep(max(0.0, start - time.time()))
    state = {"outstanding": 0, "cap": int(spec.get("backlog_cap", 0)) or 10**12}
    tasks = [producer(dsn, batch, window, state) for _ in range(int(spec.get("producers", 0)))]
    if spec["workload"] == "e2e":
        tasks += [consumer(dsn, batch, window, state) for _ in range(int(spec.get("consumers", 0)))]
    await asyncio.gather(*tasks)
    return {"counts": window.counts, "samples": window.samples, "errors": window.errors[:5]}


def main() -> None:
    spec = json.loads(sys.argv[1])
    if spec.get("install"):
        asyncio.run(install(spec["target"]["dsn"]))
        return
    result = asyncio.run(amain(spec))
    sys.stdout.write(json.dumps(result) + "\n")
    sys.stdout.flush()


if __name__ == "__main__":
    main()
