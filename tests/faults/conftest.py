"""Fixtures of the fault suite: a stack on the shared server, or on a cluster of its own."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest
from psycopg import sql

from bench.cluster import Cluster, pg_bin
from queen.store.migrate import migrate
from tests.faults.proxy import Proxy


@pytest.fixture(scope="session")
def cluster() -> Iterator[Cluster]:
    """A PostgreSQL cluster of the suite's own (initdb), which tests may stop and crash."""
    bindir = pg_bin("QUEEN_FAULTS_PGBIN")
    if bindir is None:
        pytest.skip("no PostgreSQL binaries for a throwaway cluster (QUEEN_FAULTS_PGBIN)")
    c = Cluster(bindir, prefix="queen-faults-pg-").init()
    c.start()
    yield c
    c.destroy()


@pytest.fixture
def cluster_db(cluster: Cluster, tmp_path: Path) -> str:
    """A migrated database of its own on the cluster; returns its DSN."""
    return fresh_database(cluster.dsn, cluster.dsn_for(database_name("faults", tmp_path)))


def database_name(prefix: str, tmp_path: Path) -> str:
    """A database name of a test's own, from its temporary directory."""
    return f"{prefix}_{tmp_path.name[-12:].replace('-', '_').lower()}"


def fresh_database(admin_dsn: str, dsn: str) -> str:
    """(Re)create the database dsn names, through admin_dsn, and migrate it; return dsn."""
    name = psycopg.conninfo.conninfo_to_dict(dsn)["dbname"]
    with psycopg.connect(admin_dsn, autocommit=True) as conn:
        conn.execute(sql.SQL("DROP DATABASE IF EXISTS {}").format(sql.Identifier(name)))
        conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
    migrate(dsn)
    return dsn


def through(proxy: Proxy, dsn: str) -> str:
    """Return dsn reaching its server through proxy."""
    return psycopg.conninfo.make_conninfo(dsn, host="127.0.0.1", port=str(proxy.port))


@pytest.fixture
def proxy_to_shared(db_dsn: str) -> Iterator[Proxy]:
    params = psycopg.conninfo.conninfo_to_dict(db_dsn)
    if str(params.get("host") or "").startswith("/"):
        pytest.skip("the test server is reached through a Unix socket: no TCP to proxy")
    port = int(params.get("port") or 5432)
    p = Proxy(port)
    yield p
    p.close()
