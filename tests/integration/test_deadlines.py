"""How long a database call may take: the hot path's short statement timeout, the patient
calls' longer one, and a server that takes no writes (a standby, a demoted primary)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from falcon import testing
from psycopg.conninfo import make_conninfo

from queen.app import create_app
from queen.config import Settings
from queen.errors import Unavailable
from queen.store import Store, db
from queen.store.db import READ_ONLY, Database
from tests.integration.helpers import push, scalar


@pytest.fixture
def sleepy(monkeypatch: pytest.MonkeyPatch) -> str:
    """A named query that takes 0.4 s."""
    monkeypatch.setitem(db.QUERIES, "test_sleep", "SELECT pg_sleep(0.4)")
    return "test_sleep"


def database(dsn: str, **kwargs: int) -> Iterator[Database]:
    d = Database(dsn, pool_size=2, timeout_s=5, **kwargs)
    d.pool.open(wait=True)
    yield d
    d.close()


def test_hot_path_calls_run_under_the_short_timeout_and_patient_ones_under_the_long(
    db_dsn: str, sleepy: str
) -> None:
    for d in database(db_dsn, hot_path_timeout_ms=100, statement_timeout_ms=5000):
        with pytest.raises(Unavailable, match="timed out; nothing was applied"):
            d.fetch(sleepy)
        assert d.fetch(sleepy, patient=True) == [("",)]
        # The patient call's timeout was its transaction's only: the next call is short again.
        with pytest.raises(Unavailable, match="timed out"):
            d.fetch(sleepy)


def test_a_call_borrowing_with_its_own_timeout_gets_its_own_deadline(db_dsn: str) -> None:
    for d in database(db_dsn, hot_path_timeout_ms=100):
        with d.connection(timeout_ms=5000) as conn, conn.transaction():
            conn.execute("SELECT set_config('statement_timeout', '5000', true)")
            conn.execute("SELECT pg_sleep(0.3)")  # past the hot path's 100 ms: not cut


def test_admin_actions_are_patient(db_dsn: str) -> None:
    """A queue deletion runs under QUEEN_STATEMENT_TIMEOUT, not the hot path's."""
    setup = Store(Database(db_dsn, pool_size=1, timeout_s=5))
    setup.db.pool.open(wait=True)
    push(setup, [{"queue": "patient", "payload": {"n": n}} for n in range(3)])
    setup.close()
    for d in database(db_dsn, hot_path_timeout_ms=1, statement_timeout_ms=30000):
        store = Store(d)
        assert store.admin.delete_queue("patient") >= 1
    assert scalar(db_dsn, "SELECT count(*) FROM queen.queues WHERE name = 'patient'") == 0


@pytest.fixture
def read_only_store(db_dsn: str) -> Iterator[Store]:
    """A store whose every session is read-only, as on a standby."""
    dsn = make_conninfo(db_dsn, options="-c default_transaction_read_only=on")
    store = Store(Database(dsn, pool_size=2, timeout_s=5))
    store.db.pool.open(wait=True)
    yield store
    store.close()


def test_a_read_only_server_answers_503_and_its_connections_are_replaced(
    read_only_store: Store,
) -> None:
    before = read_only_store.db.pool.get_stats().get("connections_num", 0)
    with pytest.raises(Unavailable) as raised:
        push(read_only_store, [{"queue": "ro", "payload": {"n": 1}}])
    assert raised.value.message == READ_ONLY
    # Tried twice (nothing applied either time), each on a connection retired after it.
    made = read_only_store.db.pool.get_stats().get("connections_num", 0) - before
    assert made >= 2, read_only_store.db.pool.get_stats()
    with pytest.raises(Unavailable, match="read-only"):
        read_only_store.ping()


def test_over_http_a_read_only_server_is_a_503_and_not_ready(read_only_store: Store) -> None:
    settings = Settings.from_env({}, database_url=read_only_store.db.dsn)
    client = testing.TestClient(create_app(settings, store=read_only_store))
    resp = client.simulate_post("/api/v1/push", json={"items": [{"queue": "ro", "payload": 1}]})
    assert resp.status_code == 503, resp.text
    assert "read-only" in resp.json["error"]
    ready = client.simulate_get("/health/ready")
    assert ready.status_code == 503
    assert "read-only" in ready.json["checks"]["database"]["reason"]
