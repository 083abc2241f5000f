"""Under gevent, queries and the listener yield to the hub instead of blocking the worker.

Each scenario runs in a fresh interpreter, because what matters is the import order:
gevent must patch the standard library before psycopg is first imported.
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from typing import Any

from tests.conftest import ROOT

GREENLETS = 50
SLEEP_S = 0.5  # long enough that a loaded machine's scheduling gaps stay well below it

PATCHED_FIRST = textwrap.dedent(
    """
    from gevent import monkey
    monkey.patch_all()
    """
)
PSYCOPG_FIRST = textwrap.dedent(
    """
    import psycopg
    from gevent import monkey
    monkey.patch_all()
    """
)
WORKLOAD = textwrap.dedent(
    """
    import json, sys, time
    import gevent
    from queen import wsgi
    from queen.events import Events
    from queen.store.db import Database

    dsn, n, sleep_s = sys.argv[1], int(sys.argv[2]), float(sys.argv[3])
    with_listener = sys.argv[4] == "listener"
    try:
        wsgi.assert_cooperative_driver()
        driver_ok, driver_error = True, ""
    except RuntimeError as exc:
        driver_ok, driver_error = False, str(exc)

    db = Database(dsn, pool_size=n + 5, timeout_s=30)
    db.pool.open(wait=True)
    db.pool.resize(min_size=n)
    db.pool.wait(timeout=30)

    events = Events(dsn, fallback_s=60)
    if with_listener:
        events.start()
        events.connected.wait(10)

    ticks = []
    def ticker():
        while True:
            ticks.append(time.monotonic())
            gevent.sleep(0.01)

    def query():
        with db.connection() as conn:
            conn.execute("SELECT pg_sleep(%s)", (sleep_s,))

    tick = gevent.spawn(ticker)
    gevent.sleep(0.3)  # the listener sits in notifies() meanwhile
    idle_ticks = len(ticks)
    t0 = time.monotonic()
    gevent.joinall([gevent.spawn(query) for _ in range(n)], raise_error=True)
    wall = time.monotonic() - t0
    gevent.sleep(0.05)  # let the ticker record when it got to run again
    tick.kill()
    gaps = [b - a for a, b in zip(ticks, ticks[1:])]
    events.shutdown()
    db.close()
    print(json.dumps({"driver_ok": driver_ok, "driver_error": driver_error, "wall": wall,
                      "idle_ticks": idle_ticks, "max_gap": max(gaps)}))
    """
)


def run(prelude: str, dsn: str, n: int, listener: bool) -> dict[str, Any]:
    mode = "listener" if listener else "queries"
    done = subprocess.run(
        [sys.executable, "-c", prelude + WORKLOAD, dsn, str(n), str(SLEEP_S), mode],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_queries_and_listener_do_not_block_the_hub(db_dsn: str) -> None:
    result = run(PATCHED_FIRST, db_dsn, GREENLETS, listener=True)
    assert result["driver_ok"], result["driver_error"]
    # 50 x 0.2 s one after the other would take 10 s.
    assert result["wall"] < GREENLETS * SLEEP_S / 5, result
    # The hub kept running: the 10 ms ticker never stalled for a query's length,
    # and it ticked while the listener waited for notifications.
    assert result["max_gap"] < SLEEP_S, result
    assert result["idle_ticks"] >= 10, result


def test_psycopg_imported_before_patching_is_refused_and_would_block(db_dsn: str) -> None:
    n = 5
    # Without the listener: with the blocking driver it would stall this process for
    # its whole keepalive wait on every turn.
    result = run(PSYCOPG_FIRST, db_dsn, n, listener=False)
    assert not result["driver_ok"]
    assert "psycopg" in result["driver_error"]
    # What the check prevents: every query stops the whole process.
    assert result["wall"] >= n * SLEEP_S * 0.9, result
    assert result["max_gap"] >= SLEEP_S * 0.9, result


HUB_WAIT = textwrap.dedent(
    """
    import json, sys
    import gevent
    from queen.errors import Unavailable
    from queen.store.bounds import sever
    from queen.store.db import Database

    db = Database(sys.argv[1], pool_size=2, timeout_s=30)
    db.pool.open(wait=True)
    with db.connection() as conn:
        kind = type(conn).__name__
        # Several reads for one answer, and a statement that fails on the server.
        rows = conn.execute("SELECT repeat('x', 1000) FROM generate_series(1, 2000)").fetchall()
        try:
            conn.execute("SELECT 1 / 0")
        except Exception as exc:
            server_error = type(exc).__name__

    def sever_soon(conn):
        gevent.sleep(0.3)
        sever(conn)

    severed = None
    try:
        with db.connection() as conn:
            gevent.spawn(sever_soon, conn)
            conn.execute("SELECT pg_sleep(10)")
    except Unavailable as exc:
        severed = exc.message
    after = db.fetch("list_waiting_worker", {"worker": "hub-wait-test", "seconds": 1})
    db.close()
    print(json.dumps({"kind": kind, "rows": len(rows), "server_error": server_error,
                      "severed": severed, "after": after}))
    """
)


def test_the_pool_waits_on_the_hub_and_a_severed_call_fails_at_once(db_dsn: str) -> None:
    done = subprocess.run(
        [sys.executable, "-c", PATCHED_FIRST + HUB_WAIT, db_dsn],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    result = json.loads(done.stdout.strip().splitlines()[-1])
    assert result["kind"] == "HubConnection"
    assert result["rows"] == 2000
    assert result["server_error"] == "DivisionByZero"
    # The cut socket woke the waiting call, which failed as a lost database does; the
    # pool then served the next call on a new connection.
    assert result["severed"] == "database unavailable", result
    assert result["after"] == [[None]]


def test_without_gevent_the_pool_keeps_psycopgs_waiting() -> None:
    import psycopg

    from queen.store.db import QueenConnection, connection_class

    assert connection_class() is QueenConnection
    assert QueenConnection.wait is psycopg.Connection.wait
