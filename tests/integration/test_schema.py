"""migrate builds the schema the code uses, refuses an earlier build's database, and is
idempotent and safe."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import threading
import uuid
from collections import Counter
from collections.abc import Iterator
from typing import Any

import psycopg
import pytest
from psycopg import sql

from queen.errors import QueenError
from queen.store.migrate import EarlierDatabase, install_functions, migrate, migration_files
from tests.conftest import ROOT, dsn_for, free_port

# Each entry: a name and a query returning sorted rows that describe one kind of object
# of schema queen. Migration bookkeeping (queen.schema_migrations) is left out.
CATALOG: dict[str, str] = {
    "relations": """
        SELECT c.relname, c.relkind, c.relpersistence, coalesce(c.reloptions, '{}')
        FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
        WHERE n.nspname = 'queen' AND c.relname NOT LIKE 'schema_migrations%'
        ORDER BY 1""",
    "columns": """
        SELECT c.relname,
               row_number() OVER (PARTITION BY c.oid ORDER BY a.attnum),
               a.attname, format_type(a.atttypid, a.atttypmod), a.attnotnull,
               pg_get_expr(d.adbin, d.adrelid), a.attidentity, a.attgenerated,
               coalesce(co.collname, '')
        FROM pg_attribute a
        JOIN pg_class c ON c.oid = a.attrelid
        JOIN pg_namespace n ON n.oid = c.relnamespace
        LEFT JOIN pg_attrdef d ON d.adrelid = a.attrelid AND d.adnum = a.attnum
        LEFT JOIN pg_collation co ON co.oid = a.attcollation AND a.attcollation <> 0
        WHERE n.nspname = 'queen' AND a.attnum > 0 AND NOT a.attisdropped
          AND c.relkind IN ('r', 'v', 'm', 'c', 'p', 'f')
          AND c.relname <> 'schema_migrations'
        ORDER BY 1, 2""",
    "indexes": """
        SELECT i.relname, pg_get_indexdef(i.oid)
        FROM pg_index x
        JOIN pg_class i ON i.oid = x.indexrelid
        JOIN pg_class t ON t.oid = x.indrelid
        JOIN pg_namespace n ON n.oid = t.relnamespace
        WHERE n.nspname = 'queen' AND t.relname <> 'schema_migrations'
        ORDER BY 1""",
    "constraints": """
        SELECT cl.relname, co.conname, co.contype, pg_get_constraintdef(co.oid)
        FROM pg_constraint co
        JOIN pg_namespace n ON n.oid = co.connamespace
        LEFT JOIN pg_class cl ON cl.oid = co.conrelid
        WHERE n.nspname = 'queen' AND coalesce(cl.relname, '') <> 'schema_migrations'
        ORDER BY 1, 2""",
    "functions": """
        SELECT p.proname, pg_get_function_identity_arguments(p.oid), p.prokind,
               CASE WHEN p.prokind = 'a' THEN NULL ELSE pg_get_functiondef(p.oid) END
        FROM pg_proc p JOIN pg_namespace n ON n.oid = p.pronamespace
        WHERE n.nspname = 'queen'
        ORDER BY 1, 2""",
    "aggregates": """
        SELECT p.proname, pg_get_function_identity_arguments(p.oid),
               a.aggtransfn::regproc::text, a.aggfinalfn::regproc::text,
               format_type(a.aggtranstype, NULL), a.agginitval
        FROM pg_aggregate a
        JOIN pg_proc p ON p.oid = a.aggfnoid
        JOIN pg_namespace n ON n.oid = p.pronamespace
        WHERE n.nspname = 'queen'
        ORDER BY 1, 2""",
    "triggers": """
        SELECT c.relname, t.tgname, pg_get_triggerdef(t.oid), t.tgenabled
        FROM pg_trigger t JOIN pg_class c ON c.oid = t.tgrelid
        JOIN pg_namespace n ON n.oid = c.relnamespace
        WHERE n.nspname = 'queen' AND NOT t.tgisinternal
        ORDER BY 1, 2""",
    "views": """
        SELECT c.relname, pg_get_viewdef(c.oid, true)
        FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
        WHERE n.nspname = 'queen' AND c.relkind IN ('v', 'm')
        ORDER BY 1""",
    "types": """
        SELECT t.typname, t.typtype, format_type(t.typbasetype, t.typtypmod),
               coalesce((SELECT array_agg(e.enumlabel ORDER BY e.enumsortorder)
                         FROM pg_enum e WHERE e.enumtypid = t.oid), '{}')
        FROM pg_type t JOIN pg_namespace n ON n.oid = t.typnamespace
        WHERE n.nspname = 'queen' AND t.typtype IN ('c', 'd', 'e')
          AND t.typname NOT LIKE 'schema_migrations%'
        ORDER BY 1""",
    "sequences": """
        SELECT sequencename, data_type::text, start_value, increment_by, cycle
        FROM pg_sequences WHERE schemaname = 'queen'
        ORDER BY 1""",
    "extensions": """
        SELECT extname FROM pg_extension ORDER BY 1""",
}


def _hashable(value: Any) -> Any:
    return tuple(_hashable(v) for v in value) if isinstance(value, list | tuple) else value


def describe(dsn: str) -> dict[str, list[tuple[Any, ...]]]:
    """Return the CATALOG rows of a database (lists turned into tuples)."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        return {
            name: [_hashable(row) for row in conn.execute(query).fetchall()]  # type: ignore[arg-type]
            for name, query in CATALOG.items()
        }


@pytest.fixture
def empty_dsn(server_dsn: str) -> Iterator[str]:
    """A new database with nothing of Queen in it."""
    name = f"queen_e_{uuid.uuid4().hex[:12]}"
    with psycopg.connect(server_dsn, autocommit=True) as conn:
        conn.execute(sql.SQL("CREATE DATABASE {} TEMPLATE template0").format(sql.Identifier(name)))
    yield dsn_for(server_dsn, name)
    with psycopg.connect(server_dsn, autocommit=True) as conn:
        conn.execute(
            sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name))
        )


def test_catalog_query_sees_the_schema(db_dsn: str) -> None:
    described = describe(db_dsn)
    relations = {row[0] for row in described["relations"]}
    assert {"queues", "partitions", "messages", "consumers"} <= relations
    functions = {row[0] for row in described["functions"]}
    assert {"push_rows", "pop_queue", "ack_rows", "extend_lease"} <= functions
    assert described["triggers"]
    assert described["indexes"]


# queen.<name> in the code that talks SQL: Python modules (queen.store, queen.workers),
# the logger queen.maintenance and the settings queen.push_notify and queen.wakes are not SQL.
QUEEN_NAME = re.compile(r"\bqueen\.([a-z_][a-z0-9_]*)")
NOT_SQL = {"workers", "maintenance", "push_notify", "wakes"}


DEFINITION = re.compile(r"^CREATE OR REPLACE (?:FUNCTION|AGGREGATE) queen\.[a-z0-9_]+")
DROPPED = re.compile(r"^DROP FUNCTION IF EXISTS queen\.[a-z0-9_]+")  # an earlier build's


def names_in_code(uses_only: bool = False) -> set[str]:
    """Every queen.<name> that the SQL functions, the statements and the store's and
    workers' Python name (migrate.py names an earlier build's tables: left out).

    A function an earlier build defined, dropped by name, is not among them.
    uses_only: not in comments, nor the name a function's own definition gives it.
    """
    modules = {p.stem for p in (ROOT / "queen").iterdir() if not p.name.startswith("_")}
    store = ROOT / "queen" / "store"
    files = [*(ROOT / "sql" / "functions").glob("*.sql"), *store.glob("*.sql"),
             *(p for p in store.glob("*.py") if p.name != "migrate.py"),
             *(ROOT / "workers").glob("*.py")]
    found: set[str] = set()
    for path in files:
        for line in path.read_text(encoding="utf-8").splitlines():
            line = DROPPED.sub("", line)
            if uses_only:
                if line.lstrip().startswith(("--", "#")):
                    continue
                line = DEFINITION.sub("", line)
            found.update(QUEEN_NAME.findall(line))
    return found - modules - NOT_SQL


def test_a_fresh_migrate_defines_every_name_the_code_uses(db_dsn: str) -> None:
    with psycopg.connect(db_dsn, autocommit=True) as conn:
        defined = {r[0] for r in conn.execute(
            "SELECT relname FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace"
            " WHERE n.nspname = 'queen'"
            " UNION SELECT proname FROM pg_proc p JOIN pg_namespace n ON n.oid = p.pronamespace"
            " WHERE n.nspname = 'queen'"
            " UNION SELECT typname FROM pg_type t JOIN pg_namespace n ON n.oid = t.typnamespace"
            " WHERE n.nspname = 'queen'")}
    assert names_in_code() - defined == set()


# Functions only an earlier build's statements call, kept while hosts are replaced one at
# a time (each delegates to its successor).
KEPT_FOR_EARLIER_BUILDS = {"pop_set"}


def test_the_baseline_holds_nothing_the_code_does_not_use(db_dsn: str) -> None:
    """Every table, type and function of schema queen is used somewhere in the code."""
    described = describe(db_dsn)
    made = {row[0] for row in described["relations"] if row[1] in ("r", "u", "p")}
    made |= {row[0] for row in described["types"]}
    # (A trigger's function is used by its trigger, in the baseline.)
    made |= {row[0] for row in described["functions"] if "RETURNS trigger" not in (row[3] or "")}
    assert made - names_in_code(uses_only=True) - KEPT_FOR_EARLIER_BUILDS == set()


def test_migrate_reinstalls_changed_functions(empty_dsn: str) -> None:
    migrate(empty_dsn)
    with psycopg.connect(empty_dsn, autocommit=True) as conn:
        conn.execute("CREATE OR REPLACE FUNCTION queen.push_lock_key(p_partition uuid)"
                     " RETURNS bigint"
                     " LANGUAGE sql AS 'SELECT 0::bigint'")
    assert migrate(empty_dsn) == []
    with psycopg.connect(empty_dsn, autocommit=True) as conn:
        key = conn.execute("SELECT queen.push_lock_key(gen_random_uuid())").fetchone()
    assert key is not None and key[0] != 0


def test_installing_functions_from_an_empty_folder_fails_loudly(
    empty_dsn: str, tmp_path: Any
) -> None:
    with psycopg.connect(empty_dsn, autocommit=True) as conn, pytest.raises(RuntimeError):
        install_functions(conn, tmp_path)


def test_migrate_is_idempotent(empty_dsn: str) -> None:
    first = migrate(empty_dsn)
    assert first
    before = describe(empty_dsn)
    assert migrate(empty_dsn) == []
    assert describe(empty_dsn) == before
    with psycopg.connect(empty_dsn) as conn:
        names = [
            r[0] for r in conn.execute("SELECT name FROM queen.schema_migrations ORDER BY name")
        ]
    assert names == first


def test_concurrent_migrate_applies_each_migration_once(empty_dsn: str) -> None:
    threads = 6
    barrier = threading.Barrier(threads)
    results: list[list[str]] = []
    errors: list[BaseException] = []

    def run() -> None:
        barrier.wait()
        try:
            results.append(migrate(empty_dsn))
        except BaseException as exc:  # noqa: BLE001 - reported below
            errors.append(exc)

    workers = [threading.Thread(target=run) for _ in range(threads)]
    for w in workers:
        w.start()
    for w in workers:
        w.join(60)
    assert errors == []
    assert len(results) == threads
    applied = Counter(name for names in results for name in names)
    assert applied == Counter({p.name: 1 for p in migration_files()})
    assert migrate(empty_dsn) == []


def test_a_failing_migration_is_rolled_back_and_retried(empty_dsn: str, tmp_path: Any) -> None:
    (tmp_path / "0001_ok.sql").write_text("CREATE TABLE queen.t1 (a int);")
    (tmp_path / "0002_bad.sql").write_text("CREATE TABLE queen.t2 (a int); SELECT 1/0;")
    with pytest.raises((psycopg.Error, QueenError)):
        migrate(empty_dsn, tmp_path)
    with psycopg.connect(empty_dsn) as conn:
        tables = {
            r[0] for r in conn.execute("SELECT tablename FROM pg_tables WHERE schemaname = 'queen'")
        }
        assert tables == {"schema_migrations", "t1"}
    (tmp_path / "0002_bad.sql").write_text("CREATE TABLE queen.t2 (a int);")
    assert migrate(empty_dsn, tmp_path) == ["0002_bad.sql"]


def documented_tables() -> dict[str, list[str]]:
    """docs/SCHEMA.md's tables ("## `queen.x`") and their columns ("Columns: `a`, ...")."""
    tables: dict[str, list[str]] = {}
    table = None
    lines = iter((ROOT / "docs" / "SCHEMA.md").read_text(encoding="utf-8").splitlines())
    for line in lines:
        if heading := re.fullmatch(r"## `queen\.([a-z_]+)`", line):
            table = heading.group(1)
        elif line.startswith("Columns:") and table is not None:
            text = line
            for more in lines:  # the list goes on until a blank line
                if not more.strip():
                    break
                text += " " + more
            tables[table] = re.findall(r"`([a-z_]+)`", text)
            table = None
    return tables


def test_a_fresh_migrate_builds_exactly_the_tables_schema_md_lists(empty_dsn: str) -> None:
    migrate(empty_dsn)
    with psycopg.connect(empty_dsn, autocommit=True) as conn:
        rows = conn.execute(
            "SELECT c.relname, a.attname FROM pg_class c"
            " JOIN pg_namespace n ON n.oid = c.relnamespace"
            " JOIN pg_attribute a ON a.attrelid = c.oid AND a.attnum > 0 AND NOT a.attisdropped"
            " WHERE n.nspname = 'queen' AND c.relkind IN ('r', 'p')"
            " ORDER BY c.relname, a.attnum"
        ).fetchall()
    built: dict[str, list[str]] = {}
    for table, column in rows:
        built.setdefault(table, []).append(column)
    documented = documented_tables()
    assert documented, "no table found in docs/SCHEMA.md"
    assert sorted(built) == sorted(documented)
    for table, columns in built.items():
        assert columns == documented[table], table


# -- databases made by an earlier build ------------------------------------------------

EARLIER = {
    # Migrations of an earlier build recorded (its message-row store applied).
    "migrations and rows": """
        CREATE SCHEMA queen;
        CREATE TABLE queen.schema_migrations (name text PRIMARY KEY,
                                              applied_at timestamptz NOT NULL DEFAULT now());
        INSERT INTO queen.schema_migrations (name)
        VALUES ('0001_initial.sql'), ('0002_counters.sql'), ('0010_claim_lease.sql');
        CREATE TABLE queen.queues (id uuid PRIMARY KEY, name text NOT NULL UNIQUE);
        CREATE TABLE queen.messages (transaction_id text PRIMARY KEY, status text);
        INSERT INTO queen.messages VALUES ('still-pending', 'pending');
        CREATE TABLE queen.partition_heads (partition_id uuid PRIMARY KEY);
    """,
    # A migration this build does not have, and nothing else of it.
    "unknown migration": """
        CREATE SCHEMA queen;
        CREATE TABLE queen.schema_migrations (name text PRIMARY KEY,
                                              applied_at timestamptz NOT NULL DEFAULT now());
        INSERT INTO queen.schema_migrations (name) VALUES ('0001_initial.sql');
    """,
    # The baseline of an earlier build of this store, whose tables had other names.
    "earlier baseline": """
        CREATE SCHEMA queen;
        CREATE TABLE queen.schema_migrations (name text PRIMARY KEY,
                                              applied_at timestamptz NOT NULL DEFAULT now());
        INSERT INTO queen.schema_migrations (name)
        VALUES ('0001_baseline.sql'), ('0002_partitions_by_queue.sql');
    """,
    # The message-row store's tables without the bookkeeping.
    "row tables": "CREATE SCHEMA queen; CREATE TABLE queen.partition_heads (partition_id uuid);",
}


def everything(dsn: str) -> dict[str, list[tuple[Any, ...]]]:
    """The schema and the rows of every table of schema queen."""
    described = describe(dsn)
    with psycopg.connect(dsn, autocommit=True) as conn:
        tables = [r[0] for r in conn.execute(
            "SELECT tablename FROM pg_tables WHERE schemaname = 'queen' ORDER BY 1")]
        for table in tables:
            query = sql.SQL("SELECT * FROM queen.{} ORDER BY 1").format(sql.Identifier(table))
            described[f"rows of {table}"] = [_hashable(r) for r in conn.execute(query)]
    return described


@pytest.mark.parametrize("made", list(EARLIER))
def test_an_earlier_builds_database_is_refused_and_left_unchanged(empty_dsn: str, made: str):
    with psycopg.connect(empty_dsn, autocommit=True) as conn:
        conn.execute(EARLIER[made])  # type: ignore[arg-type]
    before = everything(empty_dsn)
    with pytest.raises(EarlierDatabase) as refused:
        migrate(empty_dsn)
    assert "earlier build" in refused.value.message
    assert "new database" in refused.value.message
    assert everything(empty_dsn) == before


def run_queen(args: list[str], dsn: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "DATABASE_URL": dsn, "LOG_LEVEL": "warning"}
    return subprocess.run([sys.executable, *args], env=env, cwd=ROOT, capture_output=True,
                          text=True, timeout=60)


def test_queen_migrate_serve_and_maintenance_refuse_it_with_one_line(empty_dsn: str) -> None:
    with psycopg.connect(empty_dsn, autocommit=True) as conn:
        conn.execute(EARLIER["migrations and rows"])  # type: ignore[arg-type]
    before = everything(empty_dsn)
    serve = ["-m", "queen.cli", "serve", "--port", str(free_port()), "--no-maintenance"]
    for args in (["-m", "queen.cli", "migrate"], serve, ["-m", "workers.maintenance"]):
        done = run_queen(args, empty_dsn)
        assert done.returncode == 1, (args, done.stdout, done.stderr)
        lines = [line for line in done.stderr.splitlines() if line.strip()]
        assert len(lines) == 1, (args, done.stderr)
        assert "earlier build" in lines[0] and "0001_initial.sql" in lines[0]
        assert "queen.partition_heads" in lines[0]
    assert everything(empty_dsn) == before


def test_a_database_of_this_build_is_accepted_by_maintenance(db_dsn: str) -> None:
    from queen.store.maintenance import MaintenanceSession

    session = MaintenanceSession(db_dsn, application_name="schema-check")
    session.connect()
    try:
        session.check_schema()  # no error: what migrate made
    finally:
        session.close()


def test_a_database_a_later_build_migrated_is_served_and_left_as_it_is(db_dsn: str) -> None:
    """A rolling upgrade: hosts of the earlier build keep serving after the later build's
    migration, and their `queen migrate` does not install their functions over its."""
    from queen.store.migrate import schema_problem

    with psycopg.connect(db_dsn, autocommit=True) as conn:
        conn.execute("INSERT INTO queen.schema_migrations (name) VALUES ('9999_later.sql')")
        conn.execute("CREATE OR REPLACE FUNCTION queen.push_lock_key(p_partition uuid)"
                     " RETURNS bigint LANGUAGE sql AS 'SELECT 7::bigint'")  # the later SQL
        assert schema_problem(conn) is None
    assert migrate(db_dsn) == []
    with psycopg.connect(db_dsn, autocommit=True) as conn:
        key = conn.execute("SELECT queen.push_lock_key(gen_random_uuid())").fetchone()
    assert key == (7,)  # not reinstalled
    done = run_queen(["-m", "queen.store.migrate", "--check"], db_dsn)
    assert done.returncode == 0, done.stderr
