"""The hot path's SQL functions are inlined, on a real PostgreSQL: a SQL-language function
the planner cannot inline runs through its own executor, parsed and planned again in
every transaction that calls it (from PL/pgSQL, its cached state lives no longer).

With track_functions = 'all', PostgreSQL counts a call of each function that runs as a
function; an inlined one is never counted. A function that is only folded into a plan
as a constant runs once, when the plan is made: so the server's push, pop and ack
statements and the maintenance after them run until their plans are kept (a statement
of the server's own, not a function's, is planned at each of its first ten runs: five
before the driver prepares it, five custom plans after), and then again, and that last
round must count no call of any SQL function."""

from __future__ import annotations

from typing import Any

import orjson
import psycopg
import pytest

from queen.store.db import QUERIES
from queen.store.messages import ack_columns, ack_lease_params, push_new_params
from tests.integration.test_query_plans import pop_params, pops_param

CALLS = (
    "SELECT p.oid::regprocedure::text, f.calls FROM pg_stat_xact_user_functions f"
    " JOIN pg_proc p ON p.oid = f.funcid JOIN pg_language l ON l.oid = p.prolang"
    " WHERE l.lanname = 'sql'"
)


def pop(**route: Any) -> dict[str, Any]:
    return pop_params(queue="inl", batch=5, **route)


def round_of_calls(conn: psycopg.Connection[Any]) -> None:
    """Push, pop by queue, by partition and as a fused set, ack, and the maintenance that
    follows, as the server and the maintenance process send them."""
    # (As the server: push_new, push when it did not fit.)
    for parts in ("a", "b", "c", "d", "ab"):
        items = [{"queue": "inl", "partition": part, "payload": {"n": i}}
                 for part in parts for i in range(5)]
        params = {"bodies": orjson.dumps([{"items": items}]).decode(), "producer": None}
        ((fits, *_),) = conn.execute(QUERIES["push_new"],
                                     push_new_params(params, items)[0]).fetchall()
        if not fits:
            conn.execute(QUERIES["push"], params).fetchall()
    rows = conn.execute(QUERIES["pop_one"], pop()).fetchall()
    rows += conn.execute(QUERIES["pop_one"], pop(kind="partition", partition="b")).fetchall()
    rows += conn.execute(QUERIES["pop_many"],
                         pops_param(pop(), pop(), pop(prefer="d"))).fetchall()
    assert len(rows) >= 10, "the pops found the messages pushed"
    # (Each pop's rows: its leaseId on the first. Whole leases acked as popped, as the
    # server sends them and through queen.ack_items, and the others' messages acked
    # failed, which takes the items path.)
    leases: list[tuple[str, list[str]]] = []
    for row in rows:
        if row[11] is not None:
            leases.append((str(row[11]), []))
        leases[-1][1].append(row[2])
    *rest, lone, whole, items = leases
    for name, (lease, txids) in (("ack_lease", lone), ("ack_whole", whole), ("ack", items)):
        acks = [{"transactionId": t, "status": "completed", "leaseId": lease} for t in txids]
        params = ack_lease_params(acks) if name == "ack_lease" else ack_columns(acks)
        ((fit, *_),) = conn.execute(QUERIES[name], params).fetchall()[:1]
        assert name == "ack" or fit == [1]
    for lease, txids in rest:
        acks = [{"transactionId": t, "status": "failed", "error": "x", "leaseId": lease}
                for t in txids]
        conn.execute(QUERIES["ack"], ack_columns(acks)).fetchall()
    # The maintenance that runs per message: counts, expired leases, due wake-ups.
    conn.execute(QUERIES["maintenance_refresh_counts"],
                 {"partitions": 64, "step": 1000, "settle": 0, "lag": 0})
    conn.execute(QUERIES["maintenance_expire_leases"], {"limit": 100})
    conn.execute(QUERIES["maintenance_wake_due"], {"since": None})


def test_no_sql_function_runs_uninlined_on_the_hot_path(db_dsn: str) -> None:
    with psycopg.connect(db_dsn) as conn:
        if not conn.execute("SELECT rolsuper FROM pg_roles"
                            " WHERE rolname = current_user").fetchone()[0]:
            pytest.skip("track_functions needs a superuser")
        conn.execute("INSERT INTO queen.waiting_workers VALUES ('parked', now() + '1 hour')")
        conn.execute("SET LOCAL track_functions = 'all'")
        for _ in range(3):  # (push_new runs five times a round)
            round_of_calls(conn)
        planned = dict(conn.execute(CALLS).fetchall())
        round_of_calls(conn)
        again = dict(conn.execute(CALLS).fetchall())
        ran = {name: calls - planned.get(name, 0) for name, calls in again.items()
               if calls > planned.get(name, 0)}
        assert ran == {}, "SQL functions called as functions, not inlined"
