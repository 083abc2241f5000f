"""The transaction and consumer-group routes in the app, over a real database or none at all."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from falcon import testing

from queen.app import create_app
from queen.config import Settings
from queen.store import Store
from queen.store.db import Database

A = "/api/v1"
PUSH = {"operations": [{"type": "push", "items": [{"queue": "secret", "payload": 1}]}]}


def client_of(store: Store) -> testing.TestClient:
    settings = Settings.from_env({}, database_url=store.db.dsn)
    return testing.TestClient(create_app(settings, store=store))


@pytest.fixture
def fresh_store(db_dsn: str) -> Iterator[Store]:
    store = Store(Database(db_dsn, pool_size=2, timeout_s=5))
    store.db.pool.open(wait=True)
    yield store
    store.close()


def test_an_encrypted_queue_without_a_key_names_the_operation(fresh_store: Store) -> None:
    client = client_of(fresh_store)
    configured = client.simulate_post(
        f"{A}/configure", json={"queue": "secret", "options": {"encryptionEnabled": True}}
    )
    assert configured.status_code == 200, configured.text
    resp = client.simulate_post(f"{A}/transaction", json=PUSH)
    assert resp.status_code == 400, resp.text
    assert resp.json["operation"] == 0
    assert "QUEEN_ENCRYPTION_KEY" in resp.json["error"]


def test_without_a_database_the_routes_answer_503() -> None:
    store = Store(
        Database("postgresql://postgres@127.0.0.1:1/none", pool_size=1, timeout_s=0.5)
    )
    store.open()
    try:
        client = client_of(store)
        for resp in (
            client.simulate_post(f"{A}/transaction", json=PUSH),
            client.simulate_get(f"{A}/consumer-groups"),
            client.simulate_get(f"{A}/consumer-groups/g"),
            client.simulate_post(f"{A}/consumer-groups/g/seek", json={"queue": "q", "to": "end"}),
            client.simulate_delete(f"{A}/consumer-groups/g"),
        ):
            assert resp.status_code == 503, resp.text
            assert set(resp.json) == {"error"}
    finally:
        store.close()
