"""The hot paths stay on their keys without planner pins, even where statistics are stale.

A database is seeded with a consumed history (messages queue mode's cursor has passed)
in a few partitions and a little pending work behind it, once never ANALYZEd (the
planner knows nothing of the tables' sizes, as on a server without autovacuum before
maintenance's ANALYZE) and once ANALYZEd (as autovacuum leaves it). Then push, pop (by partition and by queue) and ack run through
the application's own named statements with auto_explain capturing the executed plan of
every statement nested in the functions, several times in one session, so that the
functions' cached generic plans are the ones checked (PL/pgSQL switches to them after
five runs). No plan may scan a history table or read more than a few hundred rows of
the store's tables: the consumed history must cost nothing.
"""

from __future__ import annotations

import re
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import orjson
import psycopg
import pytest

from queen.store import lifecycle
from queen.store.db import QUERIES
from queen.store.messages import ack_columns, ack_lease_params, push_new_params
from tests.integration import helpers
from workers.maintenance import COUNT_LAG, COUNT_SETTLE_S

PARTITIONS = 8
CONSUMED = 20_000  # per partition, queue mode's cursor past them
PENDING = 40  # per partition, behind the cursor
RUNS = 7  # of each statement in one session: past the five custom plans of PL/pgSQL
MAX_ROWS = 200  # rows any plan node on the message tables may produce or filter out
TABLES = ("messages", "consumers", "failures", "completions")
# A Seq Scan is refused only on the messages: the other tables may be scanned while they
# are small or empty (the planner rightly does), and the row counts below still bound
# what any node reads.

# (Every statement's plan as it ran, row counts included.)
AUTO_EXPLAIN = (*helpers.AUTO_EXPLAIN, "SET auto_explain.log_analyze = on",
                "SET auto_explain.log_timing = off")
HISTORY = """
INSERT INTO queen.messages (partition_id, transaction_id, payload)
SELECT p.id, 'done-' || p.name || '-' || g, '{"old": true}'
FROM queen.partitions p, generate_series(1, %(consumed)s) g
ORDER BY g, p.name
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


@pytest.fixture(scope="module", params=["stale", "analyzed"])
def seeded(request: pytest.FixtureRequest, server_dsn: str, template_db: str) -> Iterator[str]:
    """A seeded database, its history consumed: without statistics (as on a server without
    autovacuum), or ANALYZEd (as autovacuum or maintenance leaves it)."""
    from tests.conftest import cloned_database

    with cloned_database(server_dsn, template_db, "queen_plans") as dsn:
        with psycopg.connect(dsn, autocommit=True) as conn:
            for table in TABLES:  # no statistics may arrive while the test runs
                conn.execute(f"ALTER TABLE queen.{table} SET (autovacuum_enabled = false)")
            items = [{"queue": "big", "partition": f"p{p}", "payload": 0}
                     for p in range(PARTITIONS)]
            lifecycle.push(conn, items)  # the queue and its partitions
            conn.execute(HISTORY, {"consumed": CONSUMED})  # type: ignore[arg-type]
            lifecycle.seek(conn, "big", lifecycle.QUEUE_MODE, "end")  # all consumed
            lifecycle.push(conn, [{**item, "payload": n} for n in range(PENDING) for item in items])
            if request.param == "analyzed":
                conn.execute("ANALYZE")
        yield dsn


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


def check(name: str, plans: list[Plan]) -> None:
    """Assert no plan scans the messages whole, none is compiled by JIT (its estimates
    past jit_above_cost: compiling costs many times what these statements take), and no
    node on the store's tables touches more than MAX_ROWS rows."""
    assert plans, "auto_explain captured nothing"
    names = "|".join(TABLES)
    on_table = re.compile(rf"\b(?:on|using) (?:{names})(?:_\w+)?\b")
    for p in plans:
        where = f"{name}: {p.query[:80]!r}\n{p.plan}"
        assert not re.search(r"Seq Scan on messages\b", p.plan), where
        assert "JIT:" not in p.plan, where
        ours = False
        for line in p.plan.splitlines():
            if "(cost=" in line:
                ours = bool(on_table.search(line))
            if not ours:
                continue
            for produced, loops in re.findall(r"actual rows=(\d+) loops=(\d+)", line):
                assert int(produced) * int(loops) <= MAX_ROWS, where
            for removed in re.findall(r"Rows Removed by (?:Filter|Join Filter): (\d+)", line):
                assert int(removed) <= MAX_ROWS, where


def pop_params(**route: Any) -> dict[str, Any]:
    """The parameters of one pop, as pop_one takes them (rows: the pop's position, then
    queen.popped's fields)."""
    params = {"kind": "queue", "queue": "big", "partition": None, "namespace": None,
              "task": None, "group": lifecycle.QUEUE_MODE, "mode": None, "since": None,
              "batch": 10, "worker": "plans", "lease": str(uuid.uuid4()), "prefer": None}
    return {**params, **route}


def pops_param(*pops: dict[str, Any]) -> dict[str, Any]:
    """The parameter of pop_many for pops (pop_params each)."""
    return {"pops": orjson.dumps(pops).decode()}


def ack_params(rows: list[tuple[Any, ...]], statement: str = "ack") -> dict[str, Any]:
    """Acks of one pop's rows (its lease is named on its first row only), as the
    statement takes them (ack_lease's, or the columns of the others)."""
    lease = str(rows[0][11])
    acks = [{"transactionId": r[2], "status": "completed", "leaseId": lease} for r in rows]
    return (ack_lease_params(acks) or {}) if statement == "ack_lease" else ack_columns(acks)


def test_the_seed_is_what_the_plans_are_measured_against(seeded: str) -> None:
    with psycopg.connect(seeded, autocommit=True) as conn:
        (tuples,) = conn.execute(
            "SELECT reltuples FROM pg_class WHERE oid = 'queen.messages'::regclass"
        ).fetchone() or (None,)
        (total,) = conn.execute("SELECT count(*) FROM queen.messages").fetchone() or (0,)
    assert total == PARTITIONS * (CONSUMED + PENDING + 1)
    assert tuples == -1 or tuples > CONSUMED  # never analysed, or analysed when full


def test_analyze_keeps_statistics_only_of_the_columns_queries_select_by(seeded: str) -> None:
    """The plans above, with fresh statistics, are made from these alone."""
    with psycopg.connect(seeded, autocommit=True) as conn:
        targets = dict(conn.execute(
            "SELECT attname, attstattarget FROM pg_attribute"
            " WHERE attrelid = 'queen.messages'::regclass AND attnum > 0 AND NOT attisdropped"
        ).fetchall())
        kept = {name for (name,) in conn.execute(
            "SELECT attname FROM pg_stats WHERE schemaname = 'queen' AND tablename = 'messages'"
        ).fetchall()}
        analysed = conn.execute(  # (reltuples: -1 until the first ANALYZE)
            "SELECT reltuples >= 0 FROM pg_class WHERE oid = 'queen.messages'::regclass"
        ).fetchone()
    assert {name for name, target in targets.items() if target != 0} == {
        "id", "partition_id", "created_at"}
    assert kept == ({"id", "partition_id", "created_at"} if analysed == (True,) else set())


def test_pop_and_ack_by_partition_skip_the_consumed_history(explained: Explained) -> None:
    for _ in range(RUNS):
        rows, pop_plans = explained.run("pop_one", pop_params(kind="partition", partition="p0",
                                                              batch=2))
        assert len(rows) == 2
        acked, ack_plans = explained.run("ack", ack_params(rows))  # ends the lease
        assert {r[2] for r in acked} == {"completed"}
    check("pop by partition", pop_plans)
    check("ack", ack_plans)


def test_pop_by_queue_probes_each_partition_from_its_cursor(explained: Explained) -> None:
    for _ in range(RUNS):
        rows, pop_plans = explained.run("pop_one", pop_params(batch=2))
        assert len(rows) == 2
        _, ack_plans = explained.run("ack", ack_params(rows))
        rows, many_plans = explained.run("pop_many", pops_param(pop_params(batch=2)))
        assert len(rows) == 2  # (the same pop through pop_many)
        explained.run("ack", ack_params(rows))
    check("pop by queue", pop_plans)
    check("pop by queue, through pop_many", many_plans)
    check("ack", ack_plans)


def test_fused_pops_by_queue_claim_as_a_set_from_each_cursor(explained: Explained) -> None:
    for _ in range(RUNS):
        one = pop_params(batch=2)
        pops = [{**one, "lease": str(uuid.uuid4()), "worker": f"plans{n}"} for n in range(3)]
        rows, pop_plans = explained.run("pop_many", pops_param(*pops))
        assert sorted({r[0] for r in rows}) == [1, 2, 3]  # each pop served
        assert len({r[4] for r in rows if r[4] is not None}) == 3  # on a partition each
        for position in (1, 2, 3):
            mine = [r for r in rows if r[0] == position]
            _, ack_plans = explained.run("ack", ack_params(mine))
    check("fused pops by queue", pop_plans)
    check("ack", ack_plans)


def test_push_into_existing_partitions(explained: Explained) -> None:
    items = [{"queue": "big", "partition": f"p{n % PARTITIONS}", "payload": n}
             for n in range(100)]
    body = orjson.dumps({"items": items}).decode()
    for _ in range(RUNS):
        rows, plans = explained.run("push", {"bodies": f"[{body}]", "producer": None})
        assert {r[3] for r in rows} == {"queued"}
    check("push", plans)
    # The server's push of such items, one statement (prepared at its sixth run, then
    # five custom plans): on its keys, and its generic plan kept.
    params, _ = push_new_params({"bodies": f"[{body}]", "producer": None}, items)
    for _ in range(RUNS + 6):
        ((fits, _, ids, _, _, wakes),), plans = explained.run("push_new", params)
        assert fits and len(ids) == 100 and len(wakes) == len(set(wakes))
    check("push_new", plans)
    (kept,) = explained.conn.execute(
        "SELECT generic_plans FROM pg_prepared_statements"
        " WHERE statement LIKE '%%queen.push_locks(%%'").fetchone()
    assert kept >= 1


BACKLOG = 1_250  # pending in one partition: a size at which, asked for a batch's items
# by EXISTS, the planner would rather hash-join them against every message of the
# partition than probe its key once per item


@pytest.fixture(scope="module")
def backlogged(server_dsn: str, template_db: str) -> Iterator[str]:
    """One partition with BACKLOG messages pending, ANALYZEd."""
    from tests.conftest import cloned_database

    with cloned_database(server_dsn, template_db, "queen_plans") as dsn:
        with psycopg.connect(dsn, autocommit=True) as conn:
            conn.execute("ALTER TABLE queen.messages SET (autovacuum_enabled = false)")
            lifecycle.push(conn, [{"queue": "big", "partition": "p0", "payload": n}
                                for n in range(BACKLOG)])
            conn.execute("ANALYZE")
        yield dsn


def test_an_ack_probes_its_messages_whatever_the_backlog(backlogged: str) -> None:
    explained = Explained(backlogged)
    try:
        for _ in range(RUNS):
            rows, _ = explained.run("pop_one", pop_params(kind="partition", partition="p0",
                                                          batch=1))
            acked, plans = explained.run("ack", ack_params(rows))
            assert [r[2] for r in acked] == ["completed"]
        check("ack with a backlog", plans)
    finally:
        explained.close()


WIDE = 2_000  # partitions of one queue, each with work: far more than a pop ranks
WALKED = 600  # partition rows a pop by queue may read: whether the queue is wider than
# the 256 it ranks whole (257 read), then at most 256 walked


@pytest.fixture(scope="module", params=["stale", "analyzed"])
def wide(request: pytest.FixtureRequest, server_dsn: str, template_db: str) -> Iterator[str]:
    """One queue of WIDE partitions with a message each."""
    from tests.conftest import cloned_database

    with cloned_database(server_dsn, template_db, "queen_plans") as dsn:
        with psycopg.connect(dsn, autocommit=True) as conn:
            for table in (*TABLES, "partitions"):
                conn.execute(f"ALTER TABLE queen.{table} SET (autovacuum_enabled = false)")
            lifecycle.push(conn, [{"queue": "big", "partition": f"p{p}", "payload": p}
                                for p in range(WIDE)])
            if request.param == "analyzed":
                conn.execute("ANALYZE")
        yield dsn


def test_pop_by_queue_reads_a_bounded_number_of_partitions(wide: str) -> None:
    explained = Explained(wide)
    try:
        for _ in range(RUNS):
            rows, plans = explained.run("pop_one", pop_params(batch=1))
            assert len(rows) == 1
        check("pop by queue over many partitions", plans)
        # Never analysed, the partitions may be read whole (the planner takes the queue for
        # a few of them) until maintenance's ANALYZE, which takes them in as they change.
        stale = "partitions" in lifecycle.analyze(explained.conn, min_changes=1000)
        if stale:
            explained.close()
            explained = Explained(wide)  # (plans made afresh, with the statistics)
            for _ in range(RUNS):
                rows, plans = explained.run("pop_one", pop_params(batch=1))
                assert len(rows) == 1
            check("pop by queue over many partitions, analysed", plans)
        scanned = re.compile(r"\b(?:on|using) partitions\w*\b.*actual rows=(\d+) loops=(\d+)")
        for p in plans:
            for produced, loops in scanned.findall(p.plan):
                assert int(produced) * int(loops) <= WALKED, f"{p.query[:80]!r}\n{p.plan}"
    finally:
        explained.close()



@pytest.mark.parametrize(("statement", "marker"), [
    ("ack_whole", "x.lease_digest = t.digest"),
    ("ack_lease", "x.lease_digest = hashtextextended("),
])
def test_the_whole_lease_ack_reads_its_own_rows_and_keeps_a_generic_plan(
    wide: str, statement: str, marker: str,
) -> None:
    """ack_whole, a statement of its own rather than a function, probes each request's
    first message and consumer row by key and updates the row by its ctid; ack_lease
    probes the first message and updates the group's row in its partition: with
    a cursor row for every one of the queue's partitions, no node reads the others. Once
    the driver has prepared one, PostgreSQL keeps one generic plan for it (no planning
    each call)."""
    with psycopg.connect(wide, autocommit=True) as conn:
        lifecycle.seek(conn, "big", lifecycle.QUEUE_MODE, "beginning")  # WIDE cursor rows
    explained = Explained(wide)
    try:
        for n in range(RUNS + 6):  # (prepared at its sixth run, then five custom plans)
            rows, _ = explained.run("pop_one", pop_params(kind="partition", partition=f"p{n}",
                                                          batch=1))
            ((fit, _, at),), plans = explained.run(statement, ack_params(rows, statement))
            assert fit == [1] and at is not None
        check(f"{statement} over many cursor rows", plans)
        (kept,) = explained.conn.execute(
            "SELECT generic_plans FROM pg_prepared_statements WHERE statement LIKE %s",
            (f"%{marker}%",)).fetchone()
        assert kept >= 1
    finally:
        explained.close()


# A statement nested in a PL/pgSQL function is planned with its variables as parameters
# ($n): a generic plan, kept for the session. A custom plan has their values folded in
# instead, and is made afresh at every call: PostgreSQL uses custom plans for the first
# five calls of a session, then keeps them wherever the values make a custom plan look
# cheaper, as an array or a batch size does. Values the calls below pass in (names, a
# lease id, a JSON body), as a custom plan would print them (EXPLAIN VERBOSE), and which
# the functions' own text never holds.
LITERALS = re.compile(
    r"'(?:big|plans|p1)'::text|'[0-9a-f]{8}-[0-9a-f-]{27}'::uuid|'[\[{].*?[\]}]'::jsonb"
    r"|'\{.*?\}'::(?:text|uuid)\[\]"
)


def _custom(plans: list[Plan]) -> list[str]:
    """The nested plans with values folded in (the last plan is the statement itself,
    which the driver sends with its parameters bound, unprepared at first)."""
    return [f"{p.query[:80]!r}\n{p.plan}" for p in plans[:-1] if LITERALS.search(p.plan)]


def test_the_hot_calls_run_generic_plans_from_a_sessions_first_call(seeded: str) -> None:
    """Push, pop, lease extension, ack and the wake-ups after them (queen.notify_sent,
    notify_wakes) plan the statements they run once per session, not at every call
    (plan_cache_mode)."""
    explained = Explained(seeded)
    try:
        explained.conn.execute("SET auto_explain.log_verbose = on")
        explained.run("list_waiting_worker", {"worker": "plans", "seconds": 60})  # wake-ups sent
        body = orjson.dumps({"items": [{"queue": "big", "partition": "p1", "payload": 1}]})
        _, plans = explained.run("push", {"bodies": f"[{body.decode()}]", "producer": "plans"})
        assert plans and not _custom(plans), _custom(plans)
        _, plans = explained.run("notify_sent", {"queues": ["big"], "partitions": ["p1"],
                                                 "wakes": ["big/p2//"]})
        assert plans and not _custom(plans), _custom(plans)
        rows, plans = explained.run("pop_one", pop_params(kind="partition", partition="p1",
                                                          batch=2))
        assert len(rows) == 2 and not _custom(plans), _custom(plans)
        extended, plans = explained.run("extend_leases", {"leases": [rows[0][11]], "seconds": [60]})
        assert extended[0][1] is not None and not _custom(plans), _custom(plans)
        acked, plans = explained.run("ack", ack_params(rows))
        assert {r[2] for r in acked} == {"completed"} and not _custom(plans), _custom(plans)
        _, plans = explained.run("notify_wakes", {"payloads": ["big/p1//"]})
        assert plans and not _custom(plans), _custom(plans)
        # The check sees a custom plan where there is one: a function without the
        # setting, at its first call.
        explained.plans = []
        explained.conn.execute("SELECT queen.push_targets(%s::jsonb)", (
            orjson.dumps([{"queue": "big", "partition": "p2"}]).decode(),)).fetchall()
        assert _custom(explained.plans)
    finally:
        explained.close()


def test_the_count_rollup_plans_its_walk_once_per_session(seeded: str) -> None:
    """Maintenance's count refresh (queen.count_refresh) runs generic plans from a
    session's first call, over the seeded history as over new messages."""
    explained = Explained(seeded)
    try:
        explained.conn.execute("SET auto_explain.log_verbose = on")
        for _ in range(2):  # a step into the history, then one more
            behind, plans = explained.run(
                "maintenance_refresh_counts",
                {"partitions": PARTITIONS, "step": 100, "settle": COUNT_SETTLE_S,
                 "lag": COUNT_LAG},
            )
            assert behind == [(PARTITIONS,)]  # 100 of 20,000 a step: every partition behind
            walks = [p for p in plans if "activity_walk" in p.query]
            assert len(walks) == PARTITIONS and not _custom(plans), _custom(plans)
    finally:
        explained.close()


SMALL = 300  # messages when a session makes its plans: a table this small, with statistics
# from when it was full of one partition, is one a sequential scan reads quickest
GROWN = 10_000  # messages after it, over PARTITIONS partitions
BODY = {"body": "x" * 100, "kind": "plans"}


@pytest.fixture
def emptied(server_dsn: str, template_db: str) -> Iterator[str]:
    """Statistics taken while one partition held every message, then the tables emptied
    (TRUNCATE: the planner then goes by the table's size as it finds it)."""
    from tests.conftest import cloned_database

    with cloned_database(server_dsn, template_db, "queen_plans") as dsn:
        with psycopg.connect(dsn, autocommit=True) as conn:
            for table in TABLES:
                conn.execute(f"ALTER TABLE queen.{table} SET (autovacuum_enabled = false)")
            for _ in range(20):
                lifecycle.push(conn, [{"queue": "big", "partition": "one", "payload": BODY}] * 1000)
            conn.execute("ANALYZE")
            conn.execute(f"TRUNCATE {', '.join(f'queen.{t}' for t in TABLES)}")
        yield dsn


def test_plans_a_session_made_while_the_table_was_small_stay_on_keys(emptied: str) -> None:
    explained = Explained(emptied)
    try:
        def push(count: int) -> None:
            items = [{"queue": "big", "partition": f"p{n % PARTITIONS}", "payload": BODY}
                     for n in range(count)]
            lifecycle.push(explained.conn, items)

        body = orjson.dumps({"items": [{"queue": "big", "partition": "p1", "payload": BODY}]})
        one = {"bodies": f"[{body.decode()}]", "producer": None}
        push(SMALL)
        for _ in range(RUNS):  # the session's plans, made now
            explained.run("push", one)
            rows, _ = explained.run("pop_one", pop_params(batch=10))
            explained.run("ack", ack_params(rows))
        push(GROWN)
        _, plans = explained.run("push", one)
        check("push, planned when the table was small", plans)
        rows, plans = explained.run("pop_one", pop_params(batch=10))
        assert len(rows) == 10
        check("pop by queue, planned when the table was small", plans)
        acked, plans = explained.run("ack", ack_params(rows))
        assert {r[2] for r in acked} == {"completed"}
        check("ack, planned when the table was small", plans)
    finally:
        explained.close()
