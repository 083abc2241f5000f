"""Every role against every route, on the app itself over a real database (QUEEN_AUTH=on).

ROUTES holds one entry per (method, route) the app serves; the first test fails when the
app gains a route this table does not list, so no route can be added without deciding
who may call it.
"""

from __future__ import annotations

import dataclasses
import json
import time
from collections.abc import Iterator
from typing import Any

import falcon
import pytest
from falcon import inspect, testing

from queen import auth
from queen.api.auth import POLICY
from queen.app import create_app
from queen.config import Settings
from queen.store import Store, lifecycle
from tests import storage

ALL_ROLES = frozenset(auth.ROLES)
READERS = ALL_ROLES  # every role reads
PUBLIC = None  # no token needed at all


@dataclasses.dataclass(frozen=True)
class Case:
    path: str
    allowed: frozenset[str] | None  # roles that get past authorization; None: public
    body: Any = None


def roles(*names: str) -> frozenset[str]:
    return frozenset(names)


ADMIN = roles("admin")
A = "/api/v1"
NO_PARTITION = "00000000-0000-0000-0000-000000000000"
ROUTES: dict[tuple[str, str], Case] = {
    ("POST", f"{A}/push"): Case(
        f"{A}/push", roles("producer", "admin"), {"items": [{"queue": "qa", "payload": 1}]}
    ),
    ("GET", f"{A}/pop/queue/{{queue}}/partition/{{partition}}"): Case(
        f"{A}/pop/queue/qa/partition/Default", roles("consumer", "admin")
    ),
    ("GET", f"{A}/pop/queue/{{queue}}"): Case(f"{A}/pop/queue/qa", roles("consumer", "admin")),
    ("GET", f"{A}/pop"): Case(f"{A}/pop?namespace=n", roles("consumer", "admin")),
    ("POST", f"{A}/ack"): Case(
        f"{A}/ack", roles("consumer", "admin"), {"transactionId": "none", "status": "completed"}
    ),
    ("POST", f"{A}/ack/batch"): Case(
        f"{A}/ack/batch",
        roles("consumer", "admin"),
        {"acknowledgments": [{"transactionId": "none", "status": "completed"}]},
    ),
    ("POST", f"{A}/configure"): Case(f"{A}/configure", ADMIN, {"queue": "qa"}),
    ("POST", f"{A}/lease/{{lease}}/extend"): Case(
        f"{A}/lease/00000000-0000-0000-0000-000000000000/extend",
        roles("consumer", "admin"),
        {"seconds": 5},
    ),
    # A transaction that pushes and acks needs both rights: admin is the role with both.
    ("POST", f"{A}/transaction"): Case(
        f"{A}/transaction",
        ADMIN,
        {
            "operations": [
                {"type": "push", "items": [{"queue": "qa", "payload": 1}]},
                {"type": "ack", "transactionId": "none", "status": "completed"},
            ]
        },
    ),
    ("GET", f"{A}/consumer-groups"): Case(f"{A}/consumer-groups", READERS),
    ("GET", f"{A}/consumer-groups/{{group}}"): Case(f"{A}/consumer-groups/g", READERS),
    ("DELETE", f"{A}/consumer-groups/{{group}}"): Case(f"{A}/consumer-groups/g?queue=qa", ADMIN),
    ("PUT", f"{A}/consumer-groups/{{group}}"): Case(
        f"{A}/consumer-groups/g", roles("consumer", "admin"), {"queue": "qa"}
    ),
    ("POST", f"{A}/consumer-groups/{{group}}/seek"): Case(
        f"{A}/consumer-groups/g/seek", roles("consumer", "admin"), {"queue": "qa", "to": "end"}
    ),
    ("GET", "/health"): Case("/health", PUBLIC),
    ("GET", "/health/live"): Case("/health/live", PUBLIC),
    ("GET", "/health/ready"): Case("/health/ready", PUBLIC),
    ("GET", "/"): Case("/", PUBLIC),
    ("HEAD", "/"): Case("/", PUBLIC),
    ("GET", "/dashboard"): Case("/dashboard", PUBLIC),
    ("HEAD", "/dashboard"): Case("/dashboard", PUBLIC),
    ("GET", "/ws/dashboard"): Case("/ws/dashboard", READERS),
    ("GET", f"{A}/analytics"): Case(f"{A}/analytics", READERS),
    ("GET", f"{A}/analytics/queue/{{queue}}"): Case(f"{A}/analytics/queue/qa", READERS),
    ("GET", f"{A}/analytics/queues"): Case(f"{A}/analytics/queues", READERS),
    ("GET", f"{A}/analytics/queue-stats"): Case(f"{A}/analytics/queue-stats", READERS),
    ("GET", f"{A}/analytics/queue-depths"): Case(f"{A}/analytics/queue-depths", READERS),
    ("GET", f"{A}/analytics/throughput"): Case(f"{A}/analytics/throughput", READERS),
    ("GET", f"{A}/analytics/queue-lag"): Case(f"{A}/analytics/queue-lag", READERS),
    ("GET", f"{A}/analytics/rates"): Case(f"{A}/analytics/rates", READERS),
    ("GET", f"{A}/leases"): Case(f"{A}/leases", READERS),
    ("GET", f"{A}/system/nodes"): Case(f"{A}/system/nodes", READERS),
    ("GET", f"{A}/alerts"): Case(f"{A}/alerts", READERS),
    ("PUT", f"{A}/alerts/{{name}}"): Case(
        f"{A}/alerts/deep", ADMIN, {"queue": "qa", "kind": "depth", "threshold": 10}
    ),
    ("DELETE", f"{A}/alerts/{{name}}"): Case(f"{A}/alerts/none", ADMIN),
    ("GET", f"{A}/messages"): Case(f"{A}/messages", READERS),
    ("GET", f"{A}/messages/{{txid}}"): Case(f"{A}/messages/none", READERS),
    ("DELETE", f"{A}/messages/{{txid}}"): Case(f"{A}/messages/none", ADMIN),
    ("POST", f"{A}/messages/{{txid}}/retry"): Case(f"{A}/messages/none/retry", ADMIN),
    ("POST", f"{A}/messages/{{txid}}/dlq"): Case(f"{A}/messages/none/dlq", ADMIN),
    ("GET", f"{A}/messages/{{txid}}/related"): Case(f"{A}/messages/none/related", READERS),
    # (By partition id and transactionId, as the original Queen's clients name a message.)
    ("GET", f"{A}/messages/{{txid}}/{{scoped}}"): Case(f"{A}/messages/{NO_PARTITION}/none", READERS),
    ("DELETE", f"{A}/messages/{{txid}}/{{scoped}}"): Case(
        f"{A}/messages/{NO_PARTITION}/none", ADMIN
    ),
    ("POST", f"{A}/messages/{{txid}}/{{scoped}}/retry"): Case(
        f"{A}/messages/{NO_PARTITION}/none/retry", ADMIN
    ),
    ("POST", f"{A}/messages/{{txid}}/{{scoped}}/dlq"): Case(
        f"{A}/messages/{NO_PARTITION}/none/dlq", ADMIN
    ),
    ("GET", f"{A}/messages/{{txid}}/{{scoped}}/related"): Case(
        f"{A}/messages/{NO_PARTITION}/none/related", READERS
    ),
    ("GET", f"{A}/dlq"): Case(f"{A}/dlq?queue=qa", READERS),
    ("DELETE", f"{A}/queues/{{queue}}/clear"): Case(f"{A}/queues/qa/clear", ADMIN),
    ("GET", f"{A}/resources/queues"): Case(f"{A}/resources/queues", READERS),
    ("GET", f"{A}/resources/queues/{{queue}}"): Case(f"{A}/resources/queues/qa", READERS),
    ("DELETE", f"{A}/resources/queues/{{queue}}"): Case(f"{A}/resources/queues/qa", ADMIN),
    ("GET", f"{A}/resources/partitions"): Case(f"{A}/resources/partitions", READERS),
    ("GET", f"{A}/resources/namespaces"): Case(f"{A}/resources/namespaces", READERS),
    ("GET", f"{A}/resources/tasks"): Case(f"{A}/resources/tasks", READERS),
    ("GET", f"{A}/resources/overview"): Case(f"{A}/resources/overview", READERS),
    ("GET", "/metrics"): Case("/metrics", READERS),
    ("GET", "/metrics/prometheus"): Case("/metrics/prometheus", PUBLIC),
    ("GET", f"{A}/openapi.json"): Case(f"{A}/openapi.json", READERS),
    ("GET", f"{A}/auth/me"): Case(f"{A}/auth/me", READERS),
}
STATIC = "/dashboard/static/app.js"  # the dashboard's files are public


def served(app: falcon.App) -> set[tuple[str, str]]:
    """(method, route) of every route, responders falcon adds itself left out."""
    return {
        (m.method, route.path)
        for route in inspect.inspect_routes(app)
        for m in route.methods
        if not m.internal and m.method != "OPTIONS"
    }


@dataclasses.dataclass
class Tokens:
    by_role: dict[str, str]
    store: Store

    def make(self, role: str, name: str, queues: str = "*", rate: float | None = None) -> str:
        token = auth.make_token()
        globs = ",".join(auth.parse_queues(queues))
        assert self.store.tokens.create(name, auth.token_hash(token), role, globs, rate)
        return token


@pytest.fixture
def tokens(store: Store) -> Tokens:
    made = Tokens({}, store)
    for role in auth.ROLES:
        made.by_role[role] = made.make(role, f"{role}-token")
    return made


def client_for(store: Store, **env: str) -> testing.TestClient:
    settings = Settings.from_env({"QUEEN_AUTH": "on", **env}, database_url=store.db.dsn)
    return testing.TestClient(create_app(settings, store=store))


@pytest.fixture
def client(store: Store) -> Iterator[testing.TestClient]:
    yield client_for(store)


def call(client: testing.TestClient, method: str, case: Case, token: str | None) -> Any:
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    return client.simulate_request(
        method,
        case.path.split("?")[0],
        query_string=case.path.partition("?")[2] or None,
        headers=headers,
        body=json.dumps(case.body) if case.body is not None else None,
        content_type=falcon.MEDIA_JSON if case.body is not None else None,
    )


def assert_refused(resp: Any, status: int) -> None:
    assert resp.status_code == status, (resp.status_code, resp.text)
    assert resp.headers["content-type"].startswith("application/json")
    assert set(resp.json) == {"error"} and resp.json["error"]
    if status == 401:
        assert resp.headers["www-authenticate"] == "Bearer"


def test_the_table_lists_every_route_and_nothing_else(client: testing.TestClient) -> None:
    routes = served(client.app)
    assert routes - set(ROUTES) == set(), "routes missing from ROUTES: who may call them?"
    assert set(ROUTES) - routes == set(), "ROUTES lists routes the app does not serve"


def test_the_policy_names_every_route(client: testing.TestClient) -> None:
    for method, path in served(client.app):
        assert method in POLICY.get(path, {}), f"{method} {path} has no rule in queen.api.auth"


@pytest.mark.parametrize(("method", "route"), sorted(ROUTES))
def test_every_role_against_every_route(
    client: testing.TestClient, tokens: Tokens, method: str, route: str
) -> None:
    case = ROUTES[(method, route)]
    without = call(client, method, case, None)
    if case.allowed is None:
        assert without.status_code not in (401, 403), without.text
        return
    assert_refused(without, 401)
    for role, token in tokens.by_role.items():
        resp = call(client, method, case, token)
        if role in case.allowed:
            assert resp.status_code not in (401, 403, 500), (role, resp.status_code, resp.text)
        else:
            assert_refused(resp, 403)


def test_static_files_and_preflights_need_no_token(client: testing.TestClient) -> None:
    assert client.simulate_get(STATIC).status_code == 200
    preflight = client.simulate_options(f"{A}/push", headers={"Origin": "https://x.example"})
    assert preflight.status_code == 204


@pytest.mark.parametrize(
    "header",
    [
        "",
        "Bearer",
        "Bearer ",
        "Basic dXNlcjpwYXNz",
        "Bearer qn_short",
        "Bearer " + "qn_" + "a" * 5000,
        "Bearer qn_" + "A" * 43,  # well formed, unknown
        "Bearer qn_" + "\u00e9" * 43,
        "bearer  qn_" + "!" * 43,
    ],
    ids=["empty", "scheme", "blank", "basic", "short", "long", "unknown", "latin1", "symbols"],
)
def test_bad_tokens_are_401_json(client: testing.TestClient, tokens: Tokens, header: str) -> None:
    resp = client.simulate_get(f"{A}/resources/overview", headers={"Authorization": header})
    assert_refused(resp, 401)


def test_a_scoped_producer_pushes_only_to_its_queues(
    client: testing.TestClient, tokens: Tokens, store: Store
) -> None:
    token = tokens.make("producer", "orders-producer", "orders-*,audit")
    headers = {"Authorization": f"Bearer {token}"}

    def push(*queues: str) -> Any:
        items = [{"queue": q, "payload": q} for q in queues]
        return client.simulate_post(f"{A}/push", json={"items": items}, headers=headers)

    assert push("orders-1", "audit").status_code == 201
    assert_refused(push("orders-1", "billing"), 403)
    assert_refused(push("audits"), 403)
    with store.db.connection() as conn:  # nothing of the refused pushes was stored
        row = conn.execute(f"SELECT count(*) FROM {storage.MESSAGES}").fetchone()
    assert row == (2,)


def test_producer_is_recorded_on_each_message(client: testing.TestClient, tokens: Tokens) -> None:
    producer = {"Authorization": f"Bearer {tokens.by_role['producer']}"}
    reader = {"Authorization": f"Bearer {tokens.by_role['reader']}"}
    item = {"queue": "qp", "payload": 1, "transactionId": "tx-producer"}
    assert (
        client.simulate_post(f"{A}/push", json={"items": [item]}, headers=producer).status_code
        == 201
    )
    doc = client.simulate_get(f"{A}/messages/tx-producer", headers=reader).json
    assert doc["producer"] == "producer-token"


def test_a_scoped_consumer_pops_and_acks_only_its_queues(
    client: testing.TestClient, tokens: Tokens
) -> None:
    admin = {"Authorization": f"Bearer {tokens.by_role['admin']}"}
    scoped = {"Authorization": f"Bearer {tokens.make('consumer', 'c-orders', 'orders-*')}"}
    items = [
        {"queue": "orders-1", "payload": 1, "transactionId": "tx-mine"},
        {"queue": "billing", "payload": 2, "transactionId": "tx-other"},
    ]
    assert (
        client.simulate_post(f"{A}/push", json={"items": items}, headers=admin).status_code == 201
    )
    popped = client.simulate_get(f"{A}/pop/queue/orders-1", headers=scoped)
    assert popped.status_code == 200
    assert_refused(client.simulate_get(f"{A}/pop/queue/billing", headers=scoped), 403)
    assert_refused(client.simulate_get(f"{A}/pop", params={"namespace": "n"}, headers=scoped), 403)
    assert client.simulate_get(f"{A}/pop/queue/billing", headers=admin).status_code == 200
    other = {"transactionId": "tx-other", "status": "completed"}
    assert_refused(client.simulate_post(f"{A}/ack", json=other, headers=scoped), 403)
    batch = {"acknowledgments": [{"transactionId": "tx-mine", "status": "completed"}, other]}
    assert_refused(client.simulate_post(f"{A}/ack/batch", json=batch, headers=scoped), 403)
    mine = {"transactionId": "tx-mine", "status": "completed"}
    assert client.simulate_post(f"{A}/ack", json=mine, headers=scoped).status_code == 200


def test_a_scoped_consumers_ack_batch_may_pop_next_only_from_its_queues(
    client: testing.TestClient, tokens: Tokens
) -> None:
    admin = {"Authorization": f"Bearer {tokens.by_role['admin']}"}
    scoped = {"Authorization": f"Bearer {tokens.make('consumer', 'c-orders', 'orders-*')}"}
    items = [
        {"queue": "orders-1", "payload": 1, "transactionId": "tx-first"},
        {"queue": "orders-1", "payload": 2, "transactionId": "tx-second"},
        {"queue": "billing", "payload": 3, "transactionId": "tx-billing"},
    ]
    assert (
        client.simulate_post(f"{A}/push", json={"items": items}, headers=admin).status_code == 201
    )
    popped = client.simulate_get(f"{A}/pop/queue/orders-1", headers=scoped)
    assert [m["transactionId"] for m in popped.json["messages"]] == ["tx-first"]
    acks = [{"transactionId": "tx-first", "status": "completed"}]
    for refused in ({"queue": "billing"}, {"namespace": "n"}, {}):
        body = {"acknowledgments": acks, "next": refused}
        assert_refused(client.simulate_post(f"{A}/ack/batch", json=body, headers=scoped), 403)
    # Refused before any ack: the first message is still leased, not completed.
    state = client.simulate_get(f"{A}/messages/tx-first", headers=admin).json
    assert state["status"] == "processing", state
    body = {"acknowledgments": acks, "next": {"queue": "orders-1"}}
    answer = client.simulate_post(f"{A}/ack/batch", json=body, headers=scoped)
    assert answer.status_code == 200, answer.text
    assert [r["status"] for r in answer.json["results"]] == ["completed"]
    assert [m["transactionId"] for m in answer.json["messages"]] == ["tx-second"]


def test_a_scoped_consumer_extends_only_leases_on_its_queues(
    client: testing.TestClient, tokens: Tokens
) -> None:
    admin = {"Authorization": f"Bearer {tokens.by_role['admin']}"}
    scoped = {"Authorization": f"Bearer {tokens.make('consumer', 'c-ext', 'orders-*')}"}
    items = [{"queue": "orders-1", "payload": 1}, {"queue": "billing", "payload": 2}]
    assert (
        client.simulate_post(f"{A}/push", json={"items": items}, headers=admin).status_code == 201
    )
    mine = client.simulate_get(f"{A}/pop/queue/orders-1", headers=scoped).json["messages"][0]
    other = client.simulate_get(f"{A}/pop/queue/billing", headers=admin).json["messages"][0]
    body = {"seconds": 30}
    extended = client.simulate_post(
        f"{A}/lease/{mine['leaseId']}/extend", json=body, headers=scoped
    )
    assert extended.status_code == 200
    refused = client.simulate_post(
        f"{A}/lease/{other['leaseId']}/extend", json=body, headers=scoped
    )
    assert_refused(refused, 403)


def test_a_scoped_reader_must_name_its_queues(client: testing.TestClient, tokens: Tokens) -> None:
    admin = {"Authorization": f"Bearer {tokens.by_role['admin']}"}
    scoped = {"Authorization": f"Bearer {tokens.make('reader', 'r-orders', 'orders-*')}"}
    items = [
        {"queue": "orders-1", "payload": 1, "transactionId": "r-mine"},
        {"queue": "billing", "payload": 2, "transactionId": "r-other"},
    ]
    client.simulate_post(f"{A}/push", json={"items": items}, headers=admin)

    def get(path: str, **params: str) -> Any:
        return client.simulate_get(path, params=params or None, headers=scoped)

    assert get(f"{A}/messages", queue="orders-1").status_code == 200
    assert get(f"{A}/messages/r-mine").status_code == 200
    assert get(f"{A}/resources/queues/orders-1").status_code == 200
    assert get(f"{A}/analytics/throughput", queue="orders-1").status_code == 200
    assert get("/metrics").status_code == 200
    for refused in (
        get(f"{A}/messages"),
        get(f"{A}/messages", queue="billing"),
        get(f"{A}/messages/r-other"),
        get(f"{A}/messages/r-other/related"),
        get(f"{A}/resources/queues/billing"),
        get(f"{A}/resources/overview"),
        get(f"{A}/analytics/queues"),
        get("/ws/dashboard"),
    ):
        assert_refused(refused, 403)


def test_a_scoped_admin_manages_only_its_queues(client: testing.TestClient, tokens: Tokens) -> None:
    admin = {"Authorization": f"Bearer {tokens.by_role['admin']}"}
    scoped = {"Authorization": f"Bearer {tokens.make('admin', 'a-orders', 'orders-*')}"}
    client.simulate_post(
        f"{A}/push",
        json={"items": [{"queue": "billing", "payload": 1, "transactionId": "a-other"}]},
        headers=admin,
    )
    assert (
        client.simulate_post(
            f"{A}/configure", json={"queue": "orders-x"}, headers=scoped
        ).status_code
        == 200
    )
    for refused in (
        client.simulate_post(f"{A}/configure", json={"queue": "billing"}, headers=scoped),
        client.simulate_delete(f"{A}/queues/billing/clear", headers=scoped),
        client.simulate_delete(f"{A}/messages/a-other", headers=scoped),
        client.simulate_post(f"{A}/messages/a-other/dlq", headers=scoped),
    ):
        assert_refused(refused, 403)


def test_revoked_tokens_are_refused_once_the_cache_expires(
    client: testing.TestClient, tokens: Tokens, store: Store
) -> None:
    token = tokens.make("reader", "short-lived")
    headers = {"Authorization": f"Bearer {token}"}
    assert client.simulate_get("/metrics", headers=headers).status_code == 200
    assert store.tokens.revoke("short-lived")
    assert not store.tokens.revoke("short-lived")
    time.sleep(0.6)  # longer than queen.auth.cache.TOKEN_TTL_S
    assert_refused(client.simulate_get("/metrics", headers=headers), 401)


def test_rate_limited_tokens_get_429_with_retry_after(
    client: testing.TestClient, tokens: Tokens
) -> None:
    headers = {"Authorization": f"Bearer {tokens.make('reader', 'slow', rate=1)}"}
    statuses = [client.simulate_get("/metrics", headers=headers) for _ in range(5)]
    limited = [r for r in statuses if r.status_code == 429]
    assert statuses[0].status_code == 200
    assert limited, [r.status_code for r in statuses]
    assert int(limited[0].headers["retry-after"]) >= 1
    assert set(limited[0].json) == {"error"}
    other = {"Authorization": f"Bearer {tokens.by_role['reader']}"}
    assert client.simulate_get("/metrics", headers=other).status_code == 200  # per token


def test_metrics_auth_puts_prometheus_behind_a_token(store: Store, tokens: Tokens) -> None:
    client = client_for(store, QUEEN_METRICS_AUTH="on")
    assert_refused(client.simulate_get("/metrics/prometheus"), 401)
    headers = {"Authorization": f"Bearer {tokens.by_role['reader']}"}
    assert client.simulate_get("/metrics/prometheus", headers=headers).status_code == 200
    assert client.simulate_get("/health").status_code == 200


def test_bodies_must_be_json(store: Store, tokens: Tokens) -> None:
    for client, headers in (
        (testing.TestClient(create_app(Settings(database_url=store.db.dsn), store=store)), {}),
        (client_for(store), {"Authorization": f"Bearer {tokens.by_role['admin']}"}),
    ):
        body = json.dumps({"items": [{"queue": "qj", "payload": 1}]})
        for content_type in ("text/plain", "application/x-www-form-urlencoded", None):
            resp = client.simulate_post(
                f"{A}/push", body=body, content_type=content_type, headers=headers
            )
            assert_refused(resp, 415)
        for content_type in ("application/json", "application/json; charset=utf-8"):
            resp = client.simulate_post(
                f"{A}/push", body=body, content_type=content_type, headers=headers
            )
            assert resp.status_code == 201, resp.text
        resp = client.simulate_post(
            f"{A}/configure", body='{"queue": "qj"}', content_type="text/plain", headers=headers
        )
        assert_refused(resp, 415)


def test_auth_off_changes_nothing(store: Store) -> None:
    client = testing.TestClient(create_app(Settings(database_url=store.db.dsn), store=store))
    item = {"queue": "open", "payload": 1, "transactionId": "open-1"}
    assert client.simulate_post(f"{A}/push", json={"items": [item]}).status_code == 201
    assert client.simulate_get(f"{A}/messages/open-1").json["producer"] is None
    assert client.simulate_get(f"{A}/resources/overview").status_code == 200


def test_auth_me_tells_the_page_what_the_token_may_do(
    client: testing.TestClient, tokens: Tokens
) -> None:
    for role in ("reader", "admin"):
        headers = {"Authorization": f"Bearer {tokens.by_role[role]}"}
        doc = client.simulate_get(f"{A}/auth/me", headers=headers).json
        assert doc["auth"] is True and doc["role"] == role
        assert ("admin" in doc["permissions"]) is (role == "admin")
        assert "read" in doc["permissions"] and doc["queues"] == ["*"]
    assert_refused(client.simulate_get(f"{A}/auth/me"), 401)


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
            "SELECT transaction_id FROM queen.messages ORDER BY id"
        ).fetchall()
    return [r[0] for r in rows]


def test_each_operation_needs_its_own_right(
    client: testing.TestClient, tokens: Tokens, store: Store
) -> None:
    by_role = tokens.by_role
    assert commit(client, by_role["producer"], push("qa", "p-1")).status_code == 200
    assert_refused(commit(client, by_role["consumer"], push("qa", "c-1")), 403)
    with store.db.connection() as conn:
        lifecycle.pop(conn, "qa")
    assert_refused(commit(client, by_role["producer"], ack("p-1")), 403)
    # A stage (ack and push) needs both rights: of the roles, admin has them.
    for role in ("producer", "consumer", "reader"):
        assert_refused(commit(client, by_role[role], ack("p-1"), push("qb", "s-1")), 403)
    assert stored(store) == ["p-1"]
    resp = commit(client, by_role["admin"], ack("p-1"), push("qb", "s-1"))
    assert resp.status_code == 200, resp.text
    assert stored(store) == ["p-1", "s-1"]
    # The consumer's own ack-only transaction.
    assert commit(client, by_role["admin"], push("qa", "p-2")).status_code == 200
    with store.db.connection() as conn:
        lifecycle.pop(conn, "qa")
    assert commit(client, by_role["consumer"], ack("p-2")).status_code == 200


def test_a_queue_limited_token_stays_on_its_queues(
    client: testing.TestClient, tokens: Tokens, store: Store
) -> None:
    admin = tokens.by_role["admin"]
    scoped = tokens.make("admin", "orders-admin", "orders-*")
    assert commit(client, admin, push("billing", "b-1"), push("orders-1", "o-1")).status_code == 200
    with store.db.connection() as conn:
        lifecycle.pop(conn, "billing")
        lifecycle.pop(conn, "orders-1")
        lifecycle.pop(conn, "orders-1", group="g")  # the group the seeks below move
    assert_refused(commit(client, scoped, push("orders-1", "o-2"), push("billing", "b-2")), 403)
    assert_refused(commit(client, scoped, ack("b-1")), 403)
    assert stored(store) == ["b-1", "o-1"]
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
