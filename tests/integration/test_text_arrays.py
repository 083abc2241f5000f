"""Parameters written as text[] literals (queen.store.db.text_array) reach PostgreSQL intact."""

from __future__ import annotations

import psycopg

from queen.store import Store
from queen.store.db import text_array
from tests.integration.helpers import pop, push, scalar

AWKWARD = ['a"b', "c\\d", '\\"', "{x}", "a,b", " blank ", "NULL", "null", "", "é ✓", "}", "'"]


def test_awkward_strings_and_nulls_come_back_as_they_were_written(server_dsn: str) -> None:
    values = [*AWKWARD, None, "last"]
    with psycopg.connect(server_dsn, autocommit=True) as conn:
        (back,) = conn.execute("SELECT %s::text[]", [text_array(values)]).fetchone()  # type: ignore[misc]
        (empty,) = conn.execute("SELECT cardinality(%s::text[])", [text_array([])]).fetchone()  # type: ignore[misc]
    assert back == values
    assert empty == 0


def test_an_ack_batch_settles_messages_whose_transaction_ids_need_quoting(
    store: Store, db_dsn: str
) -> None:
    txids = [t for t in AWKWARD if t]  # (an empty transactionId is invalid)
    items = [{"queue": "quoted", "payload": {"n": i}, "transactionId": t} for i, t in enumerate(txids)]
    assert {r.status for r in push(store, items)} == {"queued"}
    popped = pop(store, "quoted", batch=len(items))
    assert [m.transaction_id for m in popped] == txids
    error = 'a "quoted" error, a \\ and {braces}'
    acks = [{"transactionId": m.transaction_id, "status": "completed", "error": None,
             "leaseId": str(m.lease_id)} for m in popped]
    acks[-1] = {**acks[-1], "status": "failed", "error": error}
    results = store.messages.ack(acks)
    assert [(r.transaction_id, r.status) for r in results] == [
        *((t, "completed") for t in txids[:-1]), (txids[-1], "retry_scheduled")
    ]
    assert scalar(db_dsn, "SELECT error FROM queen.failures") == error
    (again,) = pop(store, "quoted", batch=10)
    assert again.transaction_id == txids[-1]
