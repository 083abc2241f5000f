"""sql/schema.sql and sql/migrations/ build the same database; migrate is idempotent and safe."""

from __future__ import annotations

import threading
import uuid
from collections import Counter
from collections.abc import Iterator
from typing import Any

import psycopg
import pytest
from psycopg import sql

from queen.errors import QueenError
from queen.store.migrate import install_functions, migrate, migration_files
from tests.conftest import dsn_for

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
    assert {"queues", "partitions", "messages", "partition_heads"} <= relations
    functions = {row[0] for row in described["functions"]}
    assert {"push", "ack", "claim", "pop_queue", "pop_partition", "pop_filtered"} <= functions
    # The cursor store: tables from migration 0006, functions from sql/functions/.
    assert {"cursor_messages", "cursor_consumers", "cursor_groups"} <= relations
    assert {"cursor_push", "cursor_pop_queue", "cursor_ack", "cursor_extend"} <= functions
    assert described["triggers"]
    assert described["indexes"]


def test_migrations_build_what_schema_sql_builds(db_dsn: str, empty_dsn: str) -> None:
    applied = migrate(empty_dsn)
    assert applied == [p.name for p in migration_files()]
    from_schema, from_migrations = describe(db_dsn), describe(empty_dsn)
    for kind in CATALOG:
        only_schema = sorted(set(from_schema[kind]) - set(from_migrations[kind]), key=repr)
        only_migrations = sorted(set(from_migrations[kind]) - set(from_schema[kind]), key=repr)
        assert (only_schema, only_migrations) == ([], []), (
            f"{kind} differ: only in schema.sql {only_schema!r}; "
            f"only in migrations {only_migrations!r}"
        )
        assert from_schema[kind] == from_migrations[kind], f"{kind} differ in order"


def test_migrate_reinstalls_changed_functions(empty_dsn: str) -> None:
    migrate(empty_dsn)
    with psycopg.connect(empty_dsn, autocommit=True) as conn:
        conn.execute("CREATE OR REPLACE FUNCTION queen.cursor_push_lock_key(p_partition uuid)"
                     " RETURNS bigint"
                     " LANGUAGE sql AS 'SELECT 0::bigint'")
    assert migrate(empty_dsn) == []
    with psycopg.connect(empty_dsn, autocommit=True) as conn:
        key = conn.execute("SELECT queen.cursor_push_lock_key(gen_random_uuid())").fetchone()
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
