"""Server spans for push, pop, ack and their fused database calls, from the app on a real
database, exported to OpenTelemetry's in-memory exporter."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from falcon import testing

from queen.app import create_app
from queen.config import Settings
from queen.store import Store
from queen.store.db import Database

sdk_trace = pytest.importorskip("opentelemetry.sdk.trace")
export = pytest.importorskip("opentelemetry.sdk.trace.export")
in_memory = pytest.importorskip("opentelemetry.sdk.trace.export.in_memory_span_exporter")
SpanKind = pytest.importorskip("opentelemetry.trace").SpanKind

A = "/api/v1"
CALLER = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"


@pytest.fixture
def traced(db_dsn: str) -> Iterator[tuple[testing.TestClient, object]]:
    exporter = in_memory.InMemorySpanExporter()
    provider = sdk_trace.TracerProvider()  # this app's own, not the process's
    provider.add_span_processor(export.SimpleSpanProcessor(exporter))
    store = Store(Database(db_dsn, pool_size=2, timeout_s=5))
    store.db.pool.open(wait=True)
    settings = Settings.from_env({}, database_url=db_dsn)
    app = create_app(settings, store=store, tracer=provider.get_tracer("queen"))
    yield testing.TestClient(app), exporter
    store.close()
    provider.shutdown()


def test_push_pop_and_ack_have_spans_with_their_database_calls(traced) -> None:
    client, exporter = traced
    pushed = client.simulate_post(f"{A}/push", json={"items": [{"queue": "t", "payload": 1}]},
                                  headers={"traceparent": CALLER})
    assert pushed.status_code == 201
    (message,) = client.simulate_get(f"{A}/pop/queue/t").json["messages"]
    acked = client.simulate_post(f"{A}/ack", json={"transactionId": message["transactionId"],
                                                  "status": "completed"})
    assert acked.status_code == 200
    assert client.simulate_get(f"{A}/resources/queues").status_code == 200  # not traced

    spans = exporter.get_finished_spans()
    requests = {s.name: s for s in spans if s.kind is SpanKind.SERVER}
    assert set(requests) == {"queen push", "queen pop", "queen ack"}
    calls = {s.name: s for s in spans if s.kind is SpanKind.CLIENT}
    assert {"queen.db push", "queen.db pop", "queen.db ack"} <= set(calls)
    for kind in ("push", "pop", "ack"):
        request, call = requests[f"queen {kind}"], calls[f"queen.db {kind}"]
        assert call.parent.span_id == request.context.span_id  # the call inside its request
        assert call.attributes["queen.fused.requests"] == 1
        assert request.attributes["http.response.status_code"] in (200, 201)
    # The push continued its caller's trace.
    assert f"{requests['queen push'].context.trace_id:032x}" == CALLER.split("-")[1]
    assert requests["queen pop"].attributes["messaging.destination.name"] == "t"


def test_an_app_without_a_tracer_installs_nothing(db_dsn: str) -> None:
    store = Store(Database(db_dsn, pool_size=1, timeout_s=5))
    try:
        app = create_app(Settings.from_env({}, database_url=db_dsn), store=store)
        names = {type(m).__name__ for m in app._unprepared_middleware}
        assert "TracingMiddleware" not in names
        assert store.messages.trace.__name__ == "untraced"
    finally:
        store.close()


def test_fused_pops_claimed_as_a_set_carry_the_trace(db_dsn: str) -> None:
    import uuid

    import orjson
    import psycopg

    from tests.integration.helpers import pop, push

    store = Store(Database(db_dsn, pool_size=2, timeout_s=5))
    store.db.pool.open(wait=True)
    try:
        parents = {p: f"00-{uuid.uuid4().hex}-{uuid.uuid4().hex[:16]}-01" for p in "ab"}
        for name, parent in parents.items():
            push(store, [{"queue": "q", "partition": name, "payload": name, "traceId": parent}])
            (m,) = pop(store, "q", name)  # a cursor in each partition, nothing consumed
            assert m.trace_id == parent
            store.polling.unclaim(m.lease_id)
        one = {"kind": "queue", "queue": "q", "partition": None, "namespace": None,
               "task": None, "group": "__queue__", "batch": 5, "worker": "test", "mode": None,
               "since": None, "prefer": None}
        body = [{**one, "lease": str(uuid.uuid4())} for _ in range(2)]
        with psycopg.connect(db_dsn, autocommit=True) as conn:
            got = conn.execute(
                "SELECT (message).payload, (message).trace_id FROM queen.pop_many(%s::jsonb)",
                (orjson.dumps(body).decode(),),
            ).fetchall()
        assert {payload: trace for payload, trace in got} == parents
    finally:
        store.close()
