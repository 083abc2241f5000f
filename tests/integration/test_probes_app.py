"""/health/live and /health/ready as the app answers them, check by check."""

from __future__ import annotations

from collections.abc import Iterator

import psycopg
import pytest
from falcon import testing

from queen.app import create_app
from queen.config import Settings
from queen.events import Events
from queen.store import Store
from queen.store.db import Database


def client_of(store: Store, events: Events | None = None) -> testing.TestClient:
    settings = Settings.from_env({}, database_url=store.db.dsn)
    return testing.TestClient(create_app(settings, store=store, events=events))


@pytest.fixture
def fresh_store(db_dsn: str) -> Iterator[Store]:
    store = Store(Database(db_dsn, pool_size=2, timeout_s=5))
    store.db.pool.open(wait=True)
    yield store
    store.close()


def test_ready_names_each_check(fresh_store: Store) -> None:
    resp = client_of(fresh_store).simulate_get("/health/ready")
    assert resp.status_code == 200, resp.text
    assert resp.json == {"status": "ready", "checks": {"database": {"ok": True},
                                                      "schema": {"ok": True}}}


def test_an_older_schema_is_not_ready_and_says_to_migrate(fresh_store: Store) -> None:
    with psycopg.connect(fresh_store.db.dsn, autocommit=True) as conn:
        (name,) = conn.execute("SELECT max(name) FROM queen.schema_migrations").fetchone()
        conn.execute("DELETE FROM queen.schema_migrations WHERE name = %s", (name,))
    client = client_of(fresh_store)
    resp = client.simulate_get("/health/ready")
    assert resp.status_code == 503
    schema = resp.json["checks"]["schema"]
    assert schema["ok"] is False and "queen migrate" in schema["reason"] and name in schema["reason"]
    assert resp.json["checks"]["database"] == {"ok": True}
    assert client.simulate_get("/health/live").json == {"status": "live"}


def test_a_listener_not_connected_is_not_ready(fresh_store: Store) -> None:
    events = Events(fresh_store.db.dsn)  # never started: never connected
    resp = client_of(fresh_store, events).simulate_get("/health/ready")
    assert resp.status_code == 503
    assert resp.json["checks"]["listener"]["ok"] is False
    assert resp.json["checks"]["database"] == {"ok": True}


def test_without_a_database_live_answers_and_ready_says_why_not() -> None:
    store = Store(Database("postgresql://postgres@127.0.0.1:1/none", pool_size=1, timeout_s=0.5))
    store.open()
    try:
        client = client_of(store)
        assert client.simulate_get("/health/live").status_code == 200
        resp = client.simulate_get("/health/ready")
        assert resp.status_code == 503
        assert resp.json["status"] == "not ready"
        for check in ("database", "schema"):
            assert resp.json["checks"][check]["ok"] is False
            assert resp.json["checks"][check]["reason"]
    finally:
        store.close()
