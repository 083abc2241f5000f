"""Who may call the transaction and consumer-group routes (QUEEN_AUTH=on, cursor store).

A transaction's operations each need their own right: push operations push, ack
operations consume, each on its own queue for a queue-limited token.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from falcon import testing

from queen import auth
from queen.app import create_app
from queen.config import Settings
from queen.store import Store, cursors
from queen.store.db import Database
from tests.integration.test_auth_routes import Tokens, assert_refused

A = "/api/v1"


@pytest.fixture
def cursor_store(db_dsn: str) -> Iterator[Store]:
    store = Store(Database(db_dsn, pool_size=4, timeout_s=5))
    store.db.pool.open(wait=True)
    yield store
    store.close()


@pytest.fixture
def tokens(cursor_store: Store) -> Tokens:
    made = Tokens({}, cursor_store)
    for role in auth.ROLES:
        made.by_role[role] = made.make(role, f"{role}-token")
    return made


@pytest.fixture
def client(cursor_store: Store) -> testing.TestClient:
    settings = Settings.from_env(
        {"QUEEN_AUTH": "on"}, database_url=cursor_store.db.dsn
    )
    return testing.TestClient(create_app(settings, store=cursor_store))


def bearer(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


def commit(client: testing.TestClient, token: str, *operations: dict[str, Any]) -> Any:
    body = {"operations": list(operations)}
    return client.simulate_post(f"{A}/transaction", json=body, headers=bearer(token))


def push(queue: str, txid: str) -> dict[str, Any]:
    return {"type": "push", "items": [{"queue": queue, "payload": 1, "transactionId": txid}]}


def ack(txid: str) -> dict[str, Any]:
    return {"type": "ack", "transactionId": txid, "status": "completed"}


def stored(store: Store) -> list[str]:
    with store.db.connection() as conn:
        rows = conn.execute(
            "SELECT transaction_id FROM queen.cursor_messages ORDER BY id"
        ).fetchall()
    return [r[0] for r in rows]


def test_each_operation_needs_its_own_right(
    client: testing.TestClient, tokens: Tokens, cursor_store: Store
) -> None:
    by_role = tokens.by_role
    assert commit(client, by_role["producer"], push("qa", "p-1")).status_code == 200
    assert_refused(commit(client, by_role["consumer"], push("qa", "c-1")), 403)
    with cursor_store.db.connection() as conn:
        cursors.pop(conn, "qa")
    assert_refused(commit(client, by_role["producer"], ack("p-1")), 403)
    # A stage (ack and push) needs both rights: of the roles, admin has them.
    for role in ("producer", "consumer", "reader"):
        assert_refused(commit(client, by_role[role], ack("p-1"), push("qb", "s-1")), 403)
    assert stored(cursor_store) == ["p-1"]
    resp = commit(client, by_role["admin"], ack("p-1"), push("qb", "s-1"))
    assert resp.status_code == 200, resp.text
    assert stored(cursor_store) == ["p-1", "s-1"]
    # The consumer's own ack-only transaction.
    assert commit(client, by_role["admin"], push("qa", "p-2")).status_code == 200
    with cursor_store.db.connection() as conn:
        cursors.pop(conn, "qa")
    assert commit(client, by_role["consumer"], ack("p-2")).status_code == 200


def test_a_queue_limited_token_stays_on_its_queues(
    client: testing.TestClient, tokens: Tokens, cursor_store: Store
) -> None:
    admin = tokens.by_role["admin"]
    scoped = tokens.make("admin", "orders-admin", "orders-*")
    assert commit(client, admin, push("billing", "b-1"), push("orders-1", "o-1")).status_code == 200
    with cursor_store.db.connection() as conn:
        cursors.pop(conn, "billing")
        cursors.pop(conn, "orders-1")
    assert_refused(commit(client, scoped, push("orders-1", "o-2"), push("billing", "b-2")), 403)
    assert_refused(commit(client, scoped, ack("b-1")), 403)
    assert stored(cursor_store) == ["b-1", "o-1"]
    assert commit(client, scoped, ack("o-1"), push("orders-2", "o-2")).status_code == 200

    def call(method: str, path: str, token: str, **kwargs: Any) -> Any:
        return client.simulate_request(method, path, headers=bearer(token), **kwargs)

    reader = tokens.make("reader", "orders-reader", "orders-*")
    assert_refused(call("GET", f"{A}/consumer-groups", reader), 403)
    assert_refused(call("GET", f"{A}/consumer-groups", reader, params={"queue": "billing"}), 403)
    listed = call("GET", f"{A}/consumer-groups", reader, params={"queue": "orders-1"})
    assert listed.status_code == 200 and listed.json["consumerGroups"]
    assert_refused(call("GET", f"{A}/consumer-groups/__queue__", reader), 403)
    consumer = tokens.make("consumer", "orders-consumer", "orders-*")
    sought = call(
        "POST", f"{A}/consumer-groups/g/seek", consumer, json={"queue": "orders-1", "to": "end"}
    )
    assert sought.status_code == 200, sought.text
    refused = call(
        "POST", f"{A}/consumer-groups/g/seek", consumer, json={"queue": "billing", "to": "end"}
    )
    assert_refused(refused, 403)
    assert_refused(call("DELETE", f"{A}/consumer-groups/g", scoped), 403)
    assert_refused(
        call("DELETE", f"{A}/consumer-groups/g", consumer, params={"queue": "orders-1"}), 403
    )
    deleted = call("DELETE", f"{A}/consumer-groups/g", scoped, params={"queue": "orders-1"})
    assert deleted.status_code == 200, deleted.text
