"""Apply sql/migrations/ in order, once each, under an advisory lock (hosts may start together).

Then install the functions of sql/functions/ (CREATE OR REPLACE, on every start).
A database made by an earlier build (migrations this build does not have, or tables only
earlier builds made) is refused before anything is changed: this build has one
baseline and cannot upgrade such a database. A database a later build migrated (its
migrations sort after this build's last) is served as it is, and this build applies and
installs nothing there: that is what lets hosts be replaced one at a time.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import psycopg

from queen.errors import QueenError
from queen.store.db import translate_errors

log = logging.getLogger(__name__)

MIGRATIONS_LOCK = 0x5155_4545_4E00  # pg_advisory_lock key ("QUEEN")
# Tables only earlier builds made. Their migrations have names this build does not
# know either; these catch a database whose bookkeeping is gone.
EARLIER_TABLES = (
    "queen.partition_heads",
    "queen.status_deltas",
    "queen.lag_hour",
    "queen.lag_window",
)


class MigrationsNotFound(QueenError):
    """No migration files found."""


class EarlierDatabase(QueenError):
    """The database was made by an earlier build of Queen; nothing was changed."""


class SchemaNotCurrent(QueenError):
    """The database's schema is missing or older than this build's: run `queen migrate`."""


def sql_dir() -> Path:
    """Return the directory of Queen's SQL (migrations/ and functions/).

    An installed package carries it as queen/_sql/ (setup.cfg maps sql/ there); a
    checkout or an editable install has it as sql/ beside the package.
    """
    package = Path(__file__).resolve().parents[1]
    for candidate in (package / "_sql", package.parent / "sql"):
        if candidate.is_dir():
            return candidate
    raise MigrationsNotFound(
        f"Queen's SQL is missing: neither {package / '_sql'} nor {package.parent / 'sql'} exists"
    )


def migration_files(directory: Path | None = None) -> list[Path]:
    """Return the migration files of directory (default sql/migrations/) in order; raise
    MigrationsNotFound when there are none."""
    directory = directory or sql_dir() / "migrations"
    files = sorted(directory.glob("[0-9][0-9][0-9][0-9]_*.sql"))
    if not files:
        raise MigrationsNotFound(f"no migration files (NNNN_*.sql) in {directory}")
    return files


def function_files(directory: Path | None = None) -> list[Path]:
    """Return the files of sql/functions/ (or directory), in name order."""
    directory = directory or sql_dir() / "functions"
    return sorted(directory.glob("*.sql"))


def install_functions(conn: psycopg.Connection[Any], directory: Path | None = None) -> None:
    """Create or replace the functions of sql/functions/, in one transaction.

    Bodies are checked when called, not when created, so files may use each other's
    functions in any order. No file at all is an error (a package built without them).
    """
    files = function_files(directory)
    if not files:
        raise RuntimeError(f"no SQL function files in {directory or sql_dir() / 'functions'}")
    with conn.transaction():
        conn.execute("SET LOCAL check_function_bodies = off")
        for path in files:
            conn.execute(path.read_text(encoding="utf-8"))  # type: ignore[arg-type]


def refuse_earlier(conn: psycopg.Connection[Any], names: list[str]) -> None:
    """Raise EarlierDatabase when the database records migrations other than names (this
    build's) or holds tables only earlier builds made. Reads only."""
    recorded: list[str] = []
    if conn.execute("SELECT to_regclass('queen.schema_migrations')").fetchone() != (None,):
        recorded = [r[0] for r in conn.execute("SELECT name FROM queen.schema_migrations")]
    unknown = sorted(set(recorded) - set(names) - set(later_migrations(recorded, names)))
    tables = [
        r[0]
        for r in conn.execute(
            "SELECT t FROM unnest(%s::text[]) t WHERE to_regclass(t) IS NOT NULL",
            (list(EARLIER_TABLES),),
        )
    ]
    found = [f"migrations {', '.join(unknown)}"] if unknown else []
    found += [f"tables {', '.join(tables)}"] if tables else []
    if found:
        raise EarlierDatabase(
            f"this database was made by an earlier build of Queen ({'; '.join(found)}) and"
            " cannot be upgraded: drain it with that build, or point DATABASE_URL at a new"
            " database (nothing was changed)"
        )


def later_migrations(recorded: list[str] | set[str], names: list[str]) -> list[str]:
    """Return the recorded migrations a later build applied: unknown here, after names'."""
    last = max(names)
    return sorted(name for name in recorded if name not in names and name > last)


def schema_problem(conn: psycopg.Connection[Any]) -> str | None:
    """Return in one line why the database's schema is not this build's, None when it is.

    Reads only; a database made by an earlier build is named as refuse_earlier names it.
    """
    names = [path.name for path in migration_files()]
    try:
        refuse_earlier(conn, names)
    except EarlierDatabase as exc:
        return exc.message
    if conn.execute("SELECT to_regclass('queen.schema_migrations')").fetchone() == (None,):
        return "the database has no Queen schema: run `queen migrate` (queen serve does)"
    recorded = {r[0] for r in conn.execute("SELECT name FROM queen.schema_migrations")}
    pending = [name for name in names if name not in recorded]
    if pending:
        return (
            f"the database's schema is older than this build ({', '.join(pending)} not"
            " applied): run `queen migrate` (queen serve does)"
        )
    return None


def check_schema(dsn: str, connect_timeout_s: float = 5.0) -> None:
    """Raise SchemaNotCurrent unless the database's schema is this build's (reads only).

    An unreachable database raises Unavailable: whether its schema is current is not known.
    """
    with (
        translate_errors(),
        psycopg.connect(
            dsn, autocommit=True, connect_timeout=max(1, round(connect_timeout_s))
        ) as conn,
    ):
        problem = schema_problem(conn)
    if problem is not None:
        raise SchemaNotCurrent(problem)


def check_database(dsn: str) -> None:
    """Refuse (EarlierDatabase) a database made by an earlier build, changing nothing."""
    names = [path.name for path in migration_files()]
    with translate_errors(), psycopg.connect(dsn, autocommit=True) as conn:
        refuse_earlier(conn, names)


def migrate(dsn: str, directory: Path | None = None) -> list[str]:
    """Apply pending migrations, then install the functions; return the migrations applied.

    Raise EarlierDatabase, changing nothing, for a database made by an earlier build.
    directory: migrations of another folder, and no functions (tests of migrate itself).
    """
    files = migration_files(directory)  # before connecting: none is an error, not "none pending"
    applied: list[str] = []
    with translate_errors(), psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("SELECT pg_advisory_lock(%s)", (MIGRATIONS_LOCK,))
        try:
            refuse_earlier(conn, [path.name for path in files])
            conn.execute("CREATE SCHEMA IF NOT EXISTS queen")
            conn.execute(
                "CREATE TABLE IF NOT EXISTS queen.schema_migrations ("
                " name text PRIMARY KEY, applied_at timestamptz NOT NULL DEFAULT now())"
            )
            done = {r[0] for r in conn.execute("SELECT name FROM queen.schema_migrations")}
            later = later_migrations(done, [path.name for path in files])
            if later:
                log.warning(
                    "the database was migrated by a later build of Queen (%s): this build"
                    " changes nothing there and serves on that build's SQL until replaced",
                    ", ".join(later),
                )
                return []
            for path in files:
                if path.name in done:
                    continue
                log.info("applying migration %s", path.name)
                with conn.transaction():
                    conn.execute(path.read_text(encoding="utf-8"))  # type: ignore[arg-type]
                    conn.execute(
                        "INSERT INTO queen.schema_migrations (name) VALUES (%s)", (path.name,)
                    )
                applied.append(path.name)
            if directory is None:
                install_functions(conn)
        finally:
            conn.execute("SELECT pg_advisory_unlock(%s)", (MIGRATIONS_LOCK,))
    return applied


def main(argv: list[str] | None = None) -> int:
    """`python -m queen.store.migrate --check`: exit 1 with one line on stderr when the
    configured database's schema is missing or not this build's; 0 when it is current, or
    when the database does not answer (the server's readiness probe reports that)."""
    import argparse
    import sys

    from queen.config import Settings
    from queen.errors import Unavailable

    parser = argparse.ArgumentParser(prog="python -m queen.store.migrate")
    parser.add_argument(
        "--check", action="store_true", required=True, help="check the schema, change nothing"
    )
    parser.parse_args(argv)
    settings = Settings.from_env()
    try:
        check_schema(settings.dsn, settings.db_timeout_ms / 1000)
    except (SchemaNotCurrent, EarlierDatabase) as exc:
        print(f"queen: {exc.message}", file=sys.stderr)
        return 1
    except Unavailable:
        log.warning("the database does not answer: /health/ready says so until it does")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
