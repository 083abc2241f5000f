"""The server's pooled sessions keep one plan per prepared hot call, never compiled by
JIT; reads, the dashboard and admin actions choose plans for their values."""

from __future__ import annotations

from typing import Any

import orjson
import psycopg

from queen.store import Store
from queen.store.db import QUERIES
from tests.integration.helpers import push

PREPARED = (  # (the driver sends the statement with its own placeholders)
    "SELECT custom_plans, generic_plans FROM pg_prepared_statements"
    " WHERE statement LIKE '%%queen.push_locks%%'"
)


def _push_new(conn: psycopg.Connection[Any], items: int) -> None:
    body = {"items": [{"queue": "q", "partition": "p", "payload": n} for n in range(items)]}
    params = {"bodies": orjson.dumps([body]).decode(), "producer": None, "queues": ["q"],
              "partitions": ["p"], "slots": [1] * items}
    (row,) = conn.execute(QUERIES["push_new"], params, prepare=True).fetchall()
    assert row[0]  # (stored)


def test_a_hot_call_prepared_on_a_pooled_session_never_plans_for_its_values(
    store: Store,
) -> None:
    push(store, [{"queue": "q", "partition": "p", "payload": "first"}])
    with store.db.connection() as conn:
        for items in (1, 100, 1, 7, 1, 100, 3):
            _push_new(conn, items)
        assert conn.execute(PREPARED).fetchall() == [(0, 7)]


def test_reads_the_dashboard_and_admin_actions_plan_for_their_values(store: Store) -> None:
    mode = "SELECT current_setting('plan_cache_mode')"
    with store.db.connection() as conn:
        assert conn.execute(mode).fetchone() == ("force_generic_plan",)
    with store.reads.session() as session:
        assert session._conn.execute(mode).fetchone() == ("auto",)
    seen: list[str] = []
    store.db.fetch("ping", patient=True,
                   after_execute=lambda conn: seen.append(conn.execute(mode).fetchone()[0]))
    assert seen == ["auto"]  # (the dashboard's transactions set the same)
    with store.db.connection() as conn:  # (for their transaction only)
        assert conn.execute(mode).fetchone() == ("force_generic_plan",)


def test_no_pooled_session_compiles_a_plan_by_jit(store: Store) -> None:
    # (Whatever the server's jit_above_cost: a session that would compile, as every
    # statement over that cost does, plans the same statement without it here.)
    with store.db.connection() as conn:
        conn.execute("SET jit_above_cost = 0")
        plan = "\n".join(r[0] for r in conn.execute(
            "EXPLAIN (ANALYZE, COSTS OFF) SELECT count(*) FROM generate_series(1, 10)"))
        assert conn.execute("SELECT current_setting('jit')").fetchone() == ("off",)
    assert "JIT:" not in plan
