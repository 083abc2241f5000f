"""The API's families of the Store and its maintenance session."""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator
from typing import Any

import orjson
import psycopg
import pytest
from psycopg.sql import SQL, Identifier

from queen.config import Settings
from queen.errors import Unavailable
from queen.models import PopRoute
from queen.store import Store
from queen.store.db import Database
from queen.store.maintenance import MaintenanceSession
from queen.store.messages import message_id_of, message_uuid
from queen.wakeup import CHANNEL
from workers.maintenance import Maintenance


@pytest.fixture
def cstore(db_dsn: str) -> Iterator[Store]:
    s = Store(Database(db_dsn, pool_size=4, timeout_s=5))
    s.db.pool.open(wait=True)
    yield s
    s.close()


@pytest.fixture
def session(db_dsn: str) -> Iterator[MaintenanceSession]:
    s = MaintenanceSession(db_dsn, application_name="maint-test")
    s.connect()
    yield s
    s.close()


def sql(dsn: str, query: str, params: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    with psycopg.connect(dsn, autocommit=True) as conn:
        cur = conn.execute(query, params)  # type: ignore[arg-type]
        return cur.fetchall() if cur.description else []


def push(store: Store, queue: str, n: int, partition: str = "p") -> list[str]:
    items = [{"queue": queue, "partition": partition, "payload": {"n": i}} for i in range(n)]
    results = store.messages.push(orjson.dumps({"items": items}), items)
    return [r.transaction_id for r in results if r.transaction_id is not None]


def ack(store: Store, txid: str, status: str = "completed") -> str:
    (result,) = store.messages.ack([{"transactionId": txid, "status": status, "error": None}])
    return result.status


def terminate_after_commit(dsn: str) -> Any:
    """An after-statement hook: end the pop's backend once its statement committed, then
    use the connection, as the client would when the answer was still on its way."""

    def hook(conn: psycopg.Connection[Any]) -> None:
        pid = conn.info.backend_pid
        sql(dsn, "SELECT pg_terminate_backend(%s)", (pid,))
        deadline = time.monotonic() + 10
        while sql(dsn, "SELECT 1 FROM pg_stat_activity WHERE pid = %s", (pid,)):
            assert time.monotonic() < deadline
            time.sleep(0.02)
        conn.execute("SELECT 1")  # raises: the server ended the session

    return hook


def test_a_pop_whose_answer_was_lost_with_the_connection_counts_no_attempt(cstore, db_dsn):
    cstore.queues.configure("lost", None, None, {"lease_time": 300, "retry_limit": 3})
    pushed = push(cstore, "lost", 3)
    cstore.messages.after_pop_statement = terminate_after_commit(db_dsn)  # type: ignore[attr-defined]
    with pytest.raises(Unavailable):
        cstore.messages.pop(PopRoute(queue="lost"), 10, "w1")
    cstore.messages.after_pop_statement = None  # type: ignore[attr-defined]
    deadline = time.monotonic() + 20
    while cstore.messages.give_backs.pending():  # given back in the background
        assert time.monotonic() < deadline, "the pop was not given back"
        time.sleep(0.05)
    assert cstore.messages.give_backs.given_back == 3  # the pop did commit
    leased = "SELECT count(*) FROM queen.consumers WHERE lease_id IS NOT NULL"
    assert sql(db_dsn, leased) == [(0,)]

    again = cstore.messages.pop(PopRoute(queue="lost"), 10, "w2")
    assert [m.transaction_id for m in again] == pushed
    assert [m.retry_count for m in again] == [0, 0, 0]
    assert sql(db_dsn, "SELECT count(*) FROM queen.failures") == [(0,)]


def test_an_undelivered_pop_is_given_back_without_counting_an_attempt(cstore, db_dsn):
    pushed = push(cstore, "undelivered", 2)
    first = cstore.messages.pop(PopRoute(queue="undelivered"), 5, "w")
    assert cstore.polling.unclaim(first[0].lease_id) == 2
    assert cstore.polling.unclaim(first[0].lease_id) == 0  # (once)
    again = cstore.messages.pop(PopRoute(queue="undelivered"), 5, "w")
    assert [(m.transaction_id, m.retry_count) for m in again] == [(t, 0) for t in pushed]
    assert again[0].lease_id != first[0].lease_id
    assert ack(cstore, pushed[0]) == "completed"


def test_api_ids_are_uuids_made_of_created_at_and_the_bigint(cstore, db_dsn):
    push(cstore, "ids", 1)
    ((bigint, created, derived, back),) = sql(
        db_dsn,
        "SELECT id, created_at, queen.message_uuid(id, created_at),"
        " queen.message_id_of(queen.message_uuid(id, created_at))"
        " FROM queen.messages",
    )
    assert derived == message_uuid(bigint, created)
    assert back == bigint == message_id_of(derived)
    assert derived.version == 7 and derived.variant == uuid.RFC_4122
    (popped,) = cstore.messages.pop(PopRoute(queue="ids"), 1, "w")
    assert popped.id == str(derived)  # (as answers carry it)


def test_a_push_answered_compactly_names_each_message_as_stored(cstore, db_dsn):
    """A batch stored whole with ids made of its messages is answered in one row; the
    results made of it are the stored messages' API ids and transactionIds, in order.
    A batch naming a transactionId is answered one row an item, as before."""
    items = [{"queue": "compact", "partition": "p", "payload": {"n": n}} for n in range(3)]
    results = cstore.messages.push(orjson.dumps({"items": items}), items)
    stored = sql(db_dsn, "SELECT m.id, m.created_at,"
                         " queen.txid(m.transaction_id, m.partition_id, m.id)"
                         " FROM queen.messages m"
                         " JOIN queen.partitions p ON p.id = m.partition_id"
                         " JOIN queen.queues q ON q.id = p.queue_id"
                         " WHERE q.name = 'compact' ORDER BY m.id")
    assert [(r.position, r.id, r.transaction_id, r.status) for r in results] == [
        (k, str(message_uuid(i, t)), txid, "queued") for k, (i, t, txid) in enumerate(stored, 1)
    ]
    # Into several partitions, each its own prefix (one an item from push_new).
    spread = [{"queue": "compact", "partition": f"s{n % 2}", "payload": {"n": n}}
              for n in range(4)]
    # (The first makes the partitions: queen.push_batch's rows; then push_new's.)
    results = [r for _ in range(2)
               for r in cstore.messages.push(orjson.dumps({"items": spread}), spread)]
    assert len({r.transaction_id for r in results}) == 8
    named = {txid: i for txid, i in sql(
        db_dsn, "SELECT u.txid, a.id FROM unnest(%s::text[]) u(txid),"
                " LATERAL (SELECT queen.message_uuid(m.id, m.created_at)::text AS id"
                "          FROM queen.named(u.txid) x JOIN queen.messages m"
                "          ON m.partition_id = x.partition_id AND m.id = x.id) a",
        ([r.transaction_id for r in results],))}
    assert [named.get(r.transaction_id) for r in results] == [r.id for r in results]
    named = [*items[:1], {**items[0], "transactionId": "mine"}]
    again = cstore.messages.push(orjson.dumps({"items": named}), named)
    assert [(r.position, r.status) for r in again] == [(1, "queued"), (2, "queued")]
    assert again[1].transaction_id == "mine" and again[1].id != "mine"


def test_a_push_past_2_48_ids_names_each_message_as_stored(cstore, db_dsn):
    # (From 2^48 on an id reaches the API id's time bits: the statement makes those.)
    items = [{"queue": "wide", "partition": "p", "payload": {"n": n}} for n in range(3)]
    cstore.messages.push(orjson.dumps({"items": items[:1]}), items[:1])  # (makes p)
    sql(db_dsn, "ALTER TABLE queen.messages ALTER COLUMN id RESTART WITH 281474976710655")
    results = cstore.messages.push(orjson.dumps({"items": items}), items)
    stored = sql(db_dsn, "SELECT m.id, m.created_at, m.payload ->> 'n' FROM queen.messages m"
                         " WHERE m.id >= 281474976710655 ORDER BY m.id")
    assert [n for _, _, n in stored] == ["0", "1", "2"]  # ids in item order
    assert [r.id for r in results] == [str(message_uuid(i, t)) for i, t, _ in stored]


def test_maintenance_expires_leases_and_counts_an_attempt(cstore, session, db_dsn):
    cstore.queues.configure("exp", None, None, {"retry_limit": 3})
    push(cstore, "exp", 2)
    cstore.messages.pop(PopRoute(queue="exp"), 5, "w")
    sql(db_dsn, "UPDATE queen.consumers SET lease_expires_at = now() - interval '1 ms'"
                " WHERE lease_id IS NOT NULL")
    result = session.expire_leases(100)
    assert (result.leases, result.messages, result.next_expiry_in) == (1, 2, None)
    again = cstore.messages.pop(PopRoute(queue="exp"), 5, "w")
    assert [m.retry_count for m in again] == [1, 1]


def test_maintenance_wakes_polls_when_a_retry_delay_ends(cstore, session, db_dsn):
    cstore.queues.configure("held", None, None, {"retry_delay": 60_000, "retry_limit": 3})
    (txid,) = push(cstore, "held", 1)
    cstore.messages.pop(PopRoute(queue="held"), 1, "w")
    assert ack(cstore, txid, "failed") == "retry_scheduled"
    assert cstore.messages.pop(PopRoute(queue="held"), 1, "w") == []
    scan = session.wake_due(None)
    assert scan.woken == 0 and scan.next_due_in is not None and 50 < scan.next_due_in <= 60

    with psycopg.connect(db_dsn, autocommit=True) as listener:
        listener.execute(SQL("LISTEN {}").format(Identifier(CHANNEL)))
        sql(db_dsn, "SELECT queen.list_waiting_worker('w', 30)")
        sql(db_dsn, "UPDATE queen.consumers SET not_before = now() - interval '1 ms'")
        scan = session.wake_due(scan.scanned_at)
        assert scan.woken == 1
        assert [n.payload for n in listener.notifies(timeout=2, stop_after=1)] == ["held/p//"]
    (m,) = cstore.messages.pop(PopRoute(queue="held"), 1, "w")
    assert (m.transaction_id, m.retry_count) == (txid, 1)


def test_cleanup_removes_only_partitions_without_messages(cstore, session, db_dsn):
    push(cstore, "clean", 1, partition="full")
    push(cstore, "clean", 1, partition="drained")
    cstore.messages.pop(PopRoute(queue="clean", partition="drained"), 1, "w")
    sql(db_dsn, "DELETE FROM queen.messages m USING queen.partitions p"
                " WHERE p.id = m.partition_id AND p.name = 'drained'")
    sql(db_dsn, "UPDATE queen.partitions SET created_at = now() - interval '1 day'")
    assert session.cleanup_partitions(3600, 100) == 0  # drained: its lease is live
    sql(db_dsn, "UPDATE queen.consumers SET lease_id = NULL,"
                " updated_at = now() - interval '1 day'")
    assert session.cleanup_partitions(3600, 100) == 1
    assert sql(db_dsn, "SELECT name FROM queen.partitions") == [("full",)]


def test_cleanup_takes_a_removed_partitions_records_along(cstore, session, db_dsn):
    cstore.queues.configure("swept", None, None, {"retry_limit": 0})
    push(cstore, "swept", 2, partition="old")
    first, second = cstore.messages.pop(PopRoute(queue="swept", partition="old"), 2, "w")
    assert ack(cstore, first.transaction_id) == "completed"
    assert ack(cstore, second.transaction_id, "failed") == "dead_letter"
    sql(db_dsn, "ALTER TABLE queen.messages DISABLE TRIGGER messages_deleted")
    sql(db_dsn, "DELETE FROM queen.messages")  # (as if the records had been left)
    sql(db_dsn, "ALTER TABLE queen.messages ENABLE TRIGGER messages_deleted")
    sql(db_dsn, "UPDATE queen.partitions SET created_at = now() - interval '1 day'")
    sql(db_dsn, "UPDATE queen.consumers SET updated_at = now() - interval '1 day'")
    records = ("SELECT (SELECT count(*) FROM queen.completions),"
               " (SELECT count(*) FROM queen.failures)")
    assert sql(db_dsn, records) == [(1, 1)]
    assert session.cleanup_partitions(3600, 100) == 1
    assert sql(db_dsn, records) == [(0, 0)]


def test_retention_and_analyze_run_on_the_store_tables(cstore, session, db_dsn):
    cstore.queues.configure(
        "kept", None, None, {"retention_enabled": True, "retention_seconds": 60}
    )
    push(cstore, "kept", 3)
    sql(db_dsn, "UPDATE queen.messages SET created_at = now() - interval '2 minutes'")
    assert session.retention(2) == 2
    assert session.retention(10) == 1
    assert "messages" in session.analyze(min_changes=1)


def test_maintenance_runs_every_task_of_the_store(db_dsn):
    maintenance = Maintenance(Settings.from_env({"DATABASE_URL": db_dsn}))
    assert {t.name for t in maintenance.tasks} == {
        "timed", "leases", "due", "ttl", "counts", "analyze", "vacuum", "retention", "cleanup",
        "prune"}


def test_a_pop_refused_before_it_was_sent_keeps_no_lease(cstore, db_dsn):
    push(cstore, "refused", 1)
    cstore.db.outage.failed()  # a known outage: requests fail before borrowing a connection
    with pytest.raises(Unavailable):
        cstore.messages.pop(PopRoute(queue="refused"), 1, "w")
    assert cstore.messages.give_backs.pending() == 0
    cstore.db.outage.recovered()
    (m,) = cstore.messages.pop(PopRoute(queue="refused"), 1, "w")
    assert m.retry_count == 0
