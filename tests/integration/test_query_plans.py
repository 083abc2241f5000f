"""The hot paths stay on indexes: pop never walks completed rows nor every partition.

A database is seeded with 50,000 completed messages and 2,000 partitions (most empty,
some leased), then the application's own statements run with auto_explain capturing
the executed plan of every statement nested in the PL/pgSQL functions. Set
QUEEN_WRITE_PLANS=path to also write the captured plans to that file (docs/QUERY_PLANS.md
was made that way).
"""

from __future__ import annotations

import os
import re
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import orjson
import psycopg
import pytest

from queen.store.db import QUERIES

PARTITIONS = 2000
LEASED = 50  # partitions 0..49: leased, with pending work behind the lease
FREE = 300  # partitions 50..349: free, with pending work
COMPLETED_PER_BUSY = 1000  # completed rows in each of partitions 0..49 (50,000 in all)
PENDING_PER_BUSY = 20
OTHER_QUEUES = 300  # queues without work, other namespaces
MAX_ROWS = 200  # rows any plan node may produce or filter out

AUTO_EXPLAIN = (
    "LOAD 'auto_explain'",
    "SET auto_explain.log_min_duration = 0",
    "SET auto_explain.log_nested_statements = on",
    "SET auto_explain.log_analyze = on",
    "SET auto_explain.log_timing = off",
    "SET auto_explain.log_level = 'notice'",
    "SET client_min_messages = 'notice'",
)
SEED = """
INSERT INTO queen.queues (name, namespace)
SELECT 'other-' || g, 'ns-' || (g %% 10) FROM generate_series(1, %(others)s) g;
INSERT INTO queen.queues (name, namespace) VALUES ('big', 'busy-ns');
INSERT INTO queen.partitions (queue_id, name)
SELECT q.id, 'p' || lpad(g::text, 4, '0') FROM queen.queues q, generate_series(0, %(parts)s - 1) g
WHERE q.name = 'big';
-- History: completed messages in the busy partitions (the first LEASED of them).
INSERT INTO queen.messages (transaction_id, id, partition_id, payload, status, completed_at)
SELECT 'done-' || p.name || '-' || g, gen_random_uuid(), p.id, '{"old": true}', 'completed', now()
FROM queen.partitions p, generate_series(1, %(completed)s) g
WHERE p.name < 'p' || lpad(%(leased)s::text, 4, '0');
-- Pending work in the leased and the free partitions, oldest in the leased ones.
INSERT INTO queen.messages (transaction_id, id, partition_id, payload)
SELECT 'todo-' || p.name || '-' || g, gen_random_uuid(), p.id, jsonb_build_object('n', g)
FROM queen.partitions p, generate_series(1, %(pending)s) g
WHERE p.name < 'p' || lpad((%(leased)s + %(free)s)::text, 4, '0')
ORDER BY g, p.name;
-- Lease the first LEASED partitions to a consumer that holds their first message.
WITH leased AS (
    UPDATE queen.partitions p
    SET lease_id = gen_random_uuid(), lease_expires_at = now() + interval '1 hour',
        leased_by = 'someone'
    WHERE p.name < 'p' || lpad(%(leased)s::text, 4, '0')
    RETURNING p.id, p.lease_id, p.lease_expires_at
)
UPDATE queen.messages m
SET status = 'processing', lease_id = l.lease_id, lease_expires_at = l.lease_expires_at,
    locked_at = now(), worker_id = 'someone'
FROM leased l
WHERE m.partition_id = l.id AND m.transaction_id LIKE 'todo-%%-1';
"""


@dataclass
class Plan:
    query: str
    plan: str


def _parse_notice(text: str) -> Plan | None:
    match = re.search(r"plan:\s*\nQuery Text: (.*?)\n(?=\S+.*\(cost=)", text, re.S)
    if not match:
        return None
    return Plan(query=match.group(1).strip(), plan=text[match.end() :].strip())


@pytest.fixture(scope="module")
def seeded(server_dsn: str, template_db: str) -> Iterator[str]:
    """One seeded database for the whole module (seeding takes a few seconds)."""
    from tests.conftest import cloned_database

    with cloned_database(server_dsn, template_db, "queen_plans") as dsn:
        yield _seed(dsn)


def _seed(dsn: str) -> str:
    params = {
        "others": OTHER_QUEUES,
        "parts": PARTITIONS,
        "completed": COMPLETED_PER_BUSY,
        "leased": LEASED,
        "free": FREE,
        "pending": PENDING_PER_BUSY,
    }
    with psycopg.connect(dsn, autocommit=True) as conn:
        with conn.transaction(), psycopg.ClientCursor(conn) as cur:
            cur.execute(SEED, params)  # type: ignore[arg-type]
        conn.execute("VACUUM ANALYZE")
    return dsn


class Explained:
    """A connection that records the executed plan of every (nested) statement."""

    def __init__(self, dsn: str) -> None:
        self.conn = psycopg.connect(dsn, autocommit=True)
        try:
            for statement in AUTO_EXPLAIN:
                self.conn.execute(statement)  # type: ignore[arg-type]
        except psycopg.errors.UndefinedFile:  # the embedded server ships without it
            self.conn.close()
            pytest.skip("this PostgreSQL has no auto_explain: plans cannot be captured")
        self.plans: list[Plan] = []
        self.conn.add_notice_handler(self._on_notice)

    def _on_notice(self, diag: psycopg.errors.Diagnostic) -> None:
        plan = _parse_notice(diag.message_primary or "")
        if plan is not None:
            self.plans.append(plan)

    def run(self, name: str, params: dict[str, Any]) -> tuple[list[tuple[Any, ...]], list[Plan]]:
        self.plans = []
        rows = self.conn.execute(QUERIES[name], params).fetchall()  # type: ignore[arg-type]
        return rows, self.plans

    def close(self) -> None:
        self.conn.close()


@pytest.fixture
def explained(seeded: str) -> Iterator[Explained]:
    e = Explained(seeded)
    yield e
    e.close()


RECORDED: dict[str, list[Plan]] = {}


def check(
    name: str,
    plans: list[Plan],
    tables: tuple[str, ...] = ("messages", "partitions"),
    *,
    record: bool = True,
) -> None:
    """Assert no plan node on these tables is a Seq Scan or touches more than MAX_ROWS rows.

    With the default tables every node of every plan must stay under MAX_ROWS. Recorded
    plans go to docs/QUERY_PLANS.md (test_write_plans).
    """
    if record:
        RECORDED[name] = plans
    assert plans, "auto_explain captured nothing"
    everything = tables == ("messages", "partitions")
    names = "|".join(tables)
    on_table = re.compile(rf"\b(?:on|using) (?:{names})(?:_\w+)?\b")
    for p in plans:
        where = f"{name}: {p.query[:80]!r}\n{p.plan}"
        assert not re.search(rf"Seq Scan on ({names})\b", p.plan), where
        node_is_ours = True
        for line in p.plan.splitlines():
            if "(cost=" in line:
                node_is_ours = everything or bool(on_table.search(line))
            if not node_is_ours:
                continue
            for produced, loops in re.findall(r"actual rows=(\d+) loops=(\d+)", line):
                assert int(produced) * int(loops) <= MAX_ROWS, where
            for removed in re.findall(r"Rows Removed by (?:Filter|Join Filter): (\d+)", line):
                assert int(removed) <= MAX_ROWS, where


def _pop_params(**kw: Any) -> dict[str, Any]:
    params = {
        "queue": None,
        "partition": None,
        "namespace": None,
        "task": None,
        "batch": 10,
        "worker": "plans",
        "lease": uuid.uuid4(),
    }
    params.update(kw)
    return params


def test_seed_is_what_the_plans_are_measured_against(seeded: str) -> None:
    with psycopg.connect(seeded) as conn:
        counts = dict(
            conn.execute("SELECT status, count(*) FROM queen.messages GROUP BY 1").fetchall()
        )
        partitions = conn.execute("SELECT count(*) FROM queen.partitions").fetchone()
        heads = conn.execute("SELECT count(*) FROM queen.partition_heads").fetchone()
    assert counts["completed"] == LEASED * COMPLETED_PER_BUSY
    assert counts["processing"] == LEASED
    assert partitions == (PARTITIONS,)
    assert heads == (LEASED + FREE,)


def test_pop_queue_skips_leased_partitions_on_the_index(explained: Explained) -> None:
    rows, plans = explained.run("pop_queue", _pop_params(queue="big"))
    assert len(rows) == 10
    assert {r[3] for r in rows} == {f"p{LEASED:04d}"}  # first free partition, oldest head
    check("pop_queue", plans)


def test_pop_partition_free_leased_and_empty(explained: Explained) -> None:
    rows, plans = explained.run("pop_partition", _pop_params(queue="big", partition="p0060"))
    assert len(rows) == 10
    check("pop_partition (free)", plans)
    rows, plans = explained.run("pop_partition", _pop_params(queue="big", partition="p0001"))
    assert rows == []
    check("pop_partition (leased)", plans)
    rows, plans = explained.run("pop_partition", _pop_params(queue="big", partition="p1500"))
    assert rows == []
    check("pop_partition (empty)", plans)


def test_pop_filtered_by_namespace(explained: Explained) -> None:
    rows, plans = explained.run("pop_filtered", _pop_params(namespace="busy-ns"))
    assert len(rows) == 10
    check("pop_filtered", plans)


def test_ack_of_a_popped_batch(explained: Explained) -> None:
    popped, _ = explained.run("pop_partition", _pop_params(queue="big", partition="p0070"))
    acks = [{"transactionId": r[1], "status": "completed", "error": None} for r in popped]
    rows, plans = explained.run("ack", {"acks": orjson.dumps(acks).decode()})
    assert [r[2] for r in rows] == ["completed"] * 10
    check("ack", plans)


def test_failed_acks_look_their_queue_up_on_the_index(explained: Explained) -> None:
    popped, _ = explained.run("pop_partition", _pop_params(queue="big", partition="p0071"))
    acks = [{"transactionId": r[1], "status": "failed", "error": "boom"} for r in popped]
    rows, plans = explained.run("ack", {"acks": orjson.dumps(acks).decode()})
    assert [r[2] for r in rows] == ["retry_scheduled"] * 10
    check("ack (failed)", plans, record=False)


def test_push_into_existing_partitions(explained: Explained) -> None:
    items = [
        {"queue": "big", "partition": f"p{n % 5 + 90:04d}", "payload": {"n": n}} for n in range(10)
    ]
    rows, plans = explained.run(
        "push", {"body": orjson.dumps({"items": items}).decode(), "producer": None}
    )
    assert [r[3] for r in rows] == ["queued"] * 10
    # The backlog and the heads are checked here: push still resolves queue and
    # partition names with hash joins over those tables when they are small (see
    # docs/QUERY_PLANS.md).
    check("push", plans, tables=("messages", "partition_heads"))


GROWN = """
INSERT INTO queen.messages (transaction_id, id, partition_id, payload, status, completed_at)
SELECT 'grown-' || g, gen_random_uuid(), p.id, '{}', 'completed', now()
FROM queen.partitions p, generate_series(1, 1000) g WHERE p.name = 'p'
"""


def test_plans_made_on_an_empty_table_stay_on_indexes(server_dsn: str, template_db: str) -> None:
    """A session plans its statements once (generic plans), maybe on a just created or
    truncated table; after the table grew, a one-message push, pop and ack must still
    read a handful of rows, not the partition's history nor the whole table."""
    from tests.conftest import cloned_database

    with cloned_database(server_dsn, template_db, "queen_plans_empty") as dsn:
        with psycopg.connect(dsn, autocommit=True) as admin:
            # No statistics may arrive in between: they would replan everything.
            admin.execute("ALTER TABLE queen.messages SET (autovacuum_enabled = false)")
        e = Explained(dsn)
        try:
            item = {"queue": "q", "partition": "p", "payload": {"n": 1}}
            body = orjson.dumps({"items": [item]}).decode()

            def cycle() -> list[Plan]:
                _, plans = e.run("push", {"body": body, "producer": None})
                popped, more = e.run("pop_queue", _pop_params(queue="q", batch=1))
                assert len(popped) == 1
                acks = [{"transactionId": popped[0][1], "status": "completed"}]
                rows, last = e.run("ack", {"acks": orjson.dumps(acks).decode()})
                assert [r[2] for r in rows] == ["completed"]
                return plans + more + last

            for _ in range(3):  # the plans are made on an empty table, then kept
                cycle()
            with psycopg.connect(dsn, autocommit=True) as admin:
                admin.execute(GROWN)
            check("one message after the table grew", cycle(), ("messages",), record=False)
        finally:
            e.close()


def test_write_plans(explained: Explained) -> None:
    """Write the recorded plans when QUEEN_WRITE_PLANS names a file (runs last)."""
    target = os.environ.get("QUEEN_WRITE_PLANS")
    if not target:
        pytest.skip("QUEEN_WRITE_PLANS not set")
    out = []
    for name, plans in RECORDED.items():
        out.append(f"### {name}\n")
        for p in plans:
            query = re.sub(r"\s+", " ", p.query)
            out.append(f"```\n-- {query[:160]}\n{p.plan}\n```\n")
    Path(target).write_text("\n".join(out), encoding="utf-8")
