"""What PostgreSQL notifies long polls about, and giving back undelivered claims."""

from __future__ import annotations

import threading
import time
import uuid
from collections.abc import Iterator
from typing import Any

import falcon.testing
import orjson
import psycopg
import pytest
from psycopg import sql

from queen import wakeup
from queen.app import create_app
from queen.config import Settings
from queen.events import Events
from queen.models import PopRoute
from queen.polling import ClaimedBody, LongPoller
from queen.store import Store
from tests import storage
from tests.integration.helpers import ack, partition_id, pop, push, rows, scalar


@pytest.fixture
def listener(db_dsn: str) -> Iterator[psycopg.Connection[Any]]:
    """A LISTEN connection, with a worker listed as having polls parked (so pushes notify)."""
    with psycopg.connect(db_dsn, autocommit=True) as conn:
        conn.execute(sql.SQL("LISTEN {}").format(sql.Identifier(wakeup.CHANNEL)))
        conn.execute("SELECT queen.list_waiting_worker('elsewhere', 600)")
        yield conn


def received(conn: psycopg.Connection[Any], wait_s: float = 0.3) -> list[str]:
    return [note.payload for note in conn.notifies(timeout=wait_s)]


def items(queue: str, partition: str, n: int) -> list[dict[str, Any]]:
    return [{"queue": queue, "partition": partition, "payload": {"i": i}} for i in range(n)]


AWKWARD_NAMES = [
    ("q", "p", None, None, None),
    ("orders eu", "Ünïcode ✓ part", "ns", "task", None),
    ("q", "Default", "", "", "ledger"),
    ("q", "p", None, "t", "__queue__"),
    ("a.b-c_d", "x:y", "ns", None, "group with spaces"),
]


@pytest.mark.parametrize("names", AWKWARD_NAMES)
def test_sql_and_python_make_and_read_the_same_payload(db_dsn, names):
    made = scalar(db_dsn, "SELECT queen.wake_payload(%s, %s, %s, %s, %s)", names)
    assert made == wakeup.payload(*names)
    queue, partition, namespace, task, group = names
    assert wakeup.parse(made) == wakeup.Wake(queue, partition, namespace or None, task or None, group)


def test_sql_notifies_on_the_channel_and_fills_in_the_partition_python_names(store, listener):
    assert scalar(store.db.dsn, "SELECT queen.wake_channel()") == wakeup.CHANNEL
    assert scalar(store.db.dsn, "SELECT queen.default_partition()") == wakeup.DEFAULT_PARTITION
    push(store, [{"queue": "unnamed", "payload": 1}])
    (note,) = received(listener)
    assert wakeup.parse(note).partition == wakeup.DEFAULT_PARTITION


def test_a_push_notifies_once_per_partition_not_per_message(store, listener):
    push(store, items("q", "a", 100) + items("q", "b", 50) + items("q", "c", 1))
    assert sorted(received(listener)) == ["q/a//", "q/b//", "q/c//"]


def test_the_payload_carries_namespace_and_task(store, listener):
    store.queues.configure("billing", "prod", "invoices", {})
    push(store, items("billing", "Default", 1))
    assert received(listener) == ["billing/Default/prod/invoices"]


def test_the_common_push_makes_its_wake_ups_in_its_own_statement(store, listener):
    store.queues.configure("billing", "prod", "invoices", {})
    push(store, items("billing", "Default", 1) + items("billing", "eu", 1))  # (made here)
    received(listener)
    ran: list[str] = []
    store.db.observe = lambda name, statement, committed: ran.append(name)
    try:
        push(store, items("billing", "eu", 2) + items("billing", "Default", 1))
    finally:
        store.db.observe = None
    assert ran == ["push_new", "notify_wakes"]  # (no lookup of the names again)
    assert sorted(received(listener)) == [
        "billing/Default/prod/invoices", "billing/eu/prod/invoices"]


def test_a_batch_of_failed_acks_notifies_once_per_partition(store, listener):
    push(store, items("q", "a", 10))
    received(listener)
    claimed = pop(store, "q", "a", batch=10)
    acks = [{"transactionId": m.transaction_id, "status": "failed", "error": "x"} for m in claimed]
    results = store.messages.ack(acks)
    assert {r.status for r in results} == {"retry_scheduled"}
    assert received(listener) == ["q/a///__queue__"]


def test_ending_a_lease_with_work_left_notifies(store, listener):
    push(store, items("q", "a", 2))
    received(listener)
    (first,) = pop(store, "q", "a")
    assert ack(store, first.transaction_id).status == "completed"
    assert received(listener) == ["q/a///__queue__"]  # the partition is free again and holds one more


def test_a_groups_ack_wakes_that_group_and_a_push_every_group(store, listener):
    push(store, items("q", "a", 2))
    assert received(listener) == ["q/a//"]  # a push: work for every group
    route = PopRoute(queue="q", partition="a", consumer_group="g1")
    (first,) = store.messages.pop(route, 1, "test")
    done = {"transactionId": first.transaction_id, "status": "completed", "consumerGroup": "g1"}
    assert [r.status for r in store.messages.ack([done])] == ["completed"]
    assert received(listener) == ["q/a///g1"]  # freed for g1 alone


def test_an_expired_lease_released_notifies_even_when_nothing_is_retried(store, db_dsn, listener):
    store.queues.configure("q", None, None, {"retry_limit": 0})  # straight to dead_letter
    push(store, items("q", "a", 1))
    (leased,) = pop(store, "q", "a")
    push(store, items("q", "a", 1))  # pending work behind the lease
    received(listener)
    with psycopg.connect(db_dsn, autocommit=True) as conn:  # the lease expires, ended by
        conn.execute(  # maintenance's expiry
            "UPDATE queen.consumers SET lease_expires_at = now() - interval '1 second'"
            " WHERE lease_id = %s",
            (leased.lease_id,),
        )
    released = scalar(db_dsn, "SELECT queen.expire_leases(100)")
    assert released == 1
    assert sorted(rows(db_dsn, storage.STATUS_COUNTS)) == [("dead_letter", 1), ("pending", 1)]
    assert received(listener) == ["q/a///__queue__"]


def test_a_wake_up_names_one_known_partition_per_queue_at_commit(store, db_dsn, listener):
    push(store, items("q", "a", 1) + items("q", "b", 1) + items("r", "c", 1))
    received(listener)
    a, b = partition_id(db_dsn, "q", "a"), partition_id(db_dsn, "q", "b")
    c, unknown = partition_id(db_dsn, "r", "c"), uuid.UUID(int=0)
    with psycopg.connect(db_dsn, autocommit=True) as conn, conn.transaction():
        conn.execute("SELECT queen.wake(%s::uuid[])", ([b, a, c, unknown],))
        conn.execute("SELECT queen.wake(%s::uuid[])", ([a, b],))  # folded
        assert received(listener, 0.1) == []  # nothing before commit
    assert sorted(received(listener)) == ["q/a//", "r/c//"]


def test_unclaim_returns_messages_to_pending_without_a_retry(store, db_dsn, listener):
    push(store, items("q", "a", 5))
    claimed = pop(store, "q", "a", batch=3)
    received(listener)
    back = store.polling.unclaim(claimed[0].lease_id)
    assert back == 3
    assert received(listener) == ["q/a///__queue__"]
    lease = scalar(db_dsn, "SELECT lease_id FROM queen.consumers")  # (partition a's only)
    assert lease is None
    again = pop(store, "q", "a", batch=5)
    assert [m.transaction_id for m in again[:3]] == [m.transaction_id for m in claimed]
    assert [m.retry_count for m in again] == [0] * 5


def test_unclaim_leaves_a_lease_it_does_not_hold_alone(store):
    push(store, items("q", "a", 1))
    (claimed,) = pop(store, "q", "a")
    assert ack(store, claimed.transaction_id).status == "completed"
    assert store.polling.unclaim(claimed.lease_id) == 0


def test_ready_partitions_lists_free_partitions_with_work_for_the_routes_asked(store):
    store.queues.configure("billing", "prod", "invoices", {})
    push(store, items("q", "a", 1) + items("q", "b", 1) + items("r", "c", 1))
    push(store, items("billing", "Default", 1))
    pop(store, "q", "b")  # leased: not ready
    ready = store.polling.ready_partitions

    assert ready(["q"], [], [], 100) == ["q/a//"]
    assert ready([], [("r", "c"), ("q", "b")], [], 100) == ["r/c//"]
    assert ready([], [], [("prod", None)], 100) == ["billing/Default/prod/invoices"]
    assert ready([], [], [(None, "invoices")], 100) == ["billing/Default/prod/invoices"]
    assert ready([], [], [("dev", None)], 100) == []
    assert len(ready([], [], [(None, None)], 100)) == 3
    assert len(ready([], [], [(None, None)], 2)) == 2
    assert ready([], [], [], 100) == []


def test_a_claimed_body_gives_back_only_what_was_not_handed_over():
    given_back: list[str] = []
    body = ClaimedBody(b"{}", lambda: given_back.append("released"))
    assert list(body) == [b"{}"]
    body.close()
    assert given_back == []

    body = ClaimedBody(b"{}", lambda: given_back.append("released"))
    assert next(body) == b"{}"  # handed to the server, whose write then failed
    body.close()
    body.close()
    assert given_back == ["released"]


def _wsgi(app: Any, path: str, query: str = "") -> tuple[str, Any]:
    status: list[str] = []
    env = falcon.testing.create_environ(path=path, query_string=query)
    result = app(env, lambda s, headers, exc_info=None: status.append(s))
    return status[0], result


def test_a_pop_response_the_server_could_not_send_gives_its_messages_back(store, db_dsn):
    settings = Settings.from_env({}, database_url=db_dsn)
    app = create_app(settings, store=store)
    push(store, items("q", "a", 2))

    status, result = _wsgi(app, "/api/v1/pop/queue/q", "batch=2")
    assert status.startswith("200")
    result.close()  # the server gave up before writing the body (client gone)
    counts = dict(rows(db_dsn, storage.STATUS_COUNTS))
    assert counts == {"pending": 2}

    status, result = _wsgi(app, "/api/v1/pop/queue/q", "batch=2")
    assert b"".join(result)
    result.close()
    counts = dict(rows(db_dsn, storage.STATUS_COUNTS))
    assert counts == {"processing": 2}
    assert scalar(db_dsn, f"SELECT max(retry_count) FROM ({storage.MESSAGE_VIEW}) v") == 0


def _parked_poll(
    poller: LongPoller, events: Events, timeout_s: float
) -> tuple[threading.Thread, list[Any]]:
    """A long poll by queue of q in a thread of its own, parked once its first check is done
    (give or take a moment): the thread, and the list its messages will be in."""
    got: list[Any] = []
    thread = threading.Thread(
        target=lambda: got.extend(
            poller.pop(PopRoute(queue="q"), 1, wait=True, timeout_s=timeout_s))
    )
    thread.start()
    deadline = time.monotonic() + 5
    while events.waiting == 0 and time.monotonic() < deadline:
        time.sleep(0.01)
    time.sleep(0.2)
    return thread, got


def test_a_long_poll_claims_when_woken_and_holds_no_connection_while_parked(store: Store):
    events = Events()
    thread, got = _parked_poll(LongPoller(store, events, "test"), events, timeout_s=5)
    stats = store.db.stats()
    assert stats["size"] == stats["idle"]  # parked without holding a connection
    push(store, items("q", "a", 1))
    events.notify("q/a//")
    thread.join(5)
    assert len(got) == 1


def test_one_notification_serves_a_long_poll_of_every_consumer_group_parked_here(store: Store):
    """Every group reads every message: one notification wakes a poll of each group (and
    of queue mode), one per group, not one in all (the others would wait for the fallback)."""
    events = Events()  # not started: no fallback, no listener; only this notification
    poller = LongPoller(store, events, "test")
    push(store, items("q", "a", 1))
    for group in ("g1", "g2"):  # each group known, its cursor past the first message
        (m,) = poller.pop(PopRoute(queue="q", consumer_group=group), 1, wait=False, timeout_s=0)
        ack_item = {
            "transactionId": m.transaction_id,
            "status": "completed",
            "consumerGroup": group,
        }
        assert [r.status for r in store.messages.ack([ack_item])] == ["completed"]
    (first,) = pop(store, "q", "a")
    assert ack(store, first.transaction_id).status == "completed"
    got: dict[str, list[Any]] = {}

    def poll(name: str, group: str | None, timeout_s: float) -> None:
        route = PopRoute(queue="q", consumer_group=group)
        got[name] = poller.pop(route, 10, wait=True, timeout_s=timeout_s)

    threads = [
        threading.Thread(target=poll, args=(name, group, timeout_s))
        for name, group, timeout_s in [
            ("g1", "g1", 10),
            ("g2", "g2", 10),
            ("queue mode", None, 10),
            ("g1 again", "g1", 1),
        ]
    ]
    for thread in threads:
        thread.start()
    deadline = time.monotonic() + 5
    while events.waiting < len(threads) and time.monotonic() < deadline:
        time.sleep(0.01)
    time.sleep(0.1)  # every poll past its first check, parked
    push(store, items("q", "a", 1))
    assert events.notify("q/a//")
    for thread in threads:
        thread.join(15)
    assert {name: len(messages) for name, messages in got.items()} == {
        "g1": 1,
        "g2": 1,
        "queue mode": 1,
        "g1 again": 0,
    }


def test_a_long_poll_does_not_claim_for_a_client_that_has_gone(store: Store, db_dsn):
    events = Events()
    poller = LongPoller(store, events, "test")
    push(store, items("q", "a", 1))
    assert (
        poller.pop(PopRoute(queue="q"), 1, wait=True, timeout_s=1, client_gone=lambda: True) == []
    )
    assert rows(db_dsn, f"SELECT status FROM ({storage.MESSAGE_VIEW}) v") == [("pending",)]


def test_ending_a_lease_on_an_emptied_partition_notifies_nobody(store, listener):
    push(store, items("q", "a", 1))
    (only,) = pop(store, "q", "a")
    received(listener)
    assert ack(store, only.transaction_id).status == "completed"
    assert received(listener) == []


def test_a_poll_by_queue_woken_for_a_partition_claims_that_partition_first(store: Store):
    events = Events()
    poller = LongPoller(store, events, "test")
    push(store, items("q", "older", 1))
    push(store, items("q", "newer", 1))
    messages = poller._recheck(PopRoute(queue="q"), 1, "q/newer//")
    assert [m.partition for m in messages] == ["newer"]
    messages = poller._recheck(PopRoute(queue="q"), 1, "q/newer//")
    assert [m.partition for m in messages] == ["older"]  # hint taken: the queue decides


def test_a_poll_woken_again_while_waiting_for_its_turn_first_tries_what_woke_it(store: Store):
    """Each wake-up is one re-check for its own partition: one that comes while the poll
    waits for a re-check slot is for the re-check after (or passed on), not instead."""
    events = Events()  # not started: only the notifications sent here
    poller = LongPoller(store, events, "test")
    held = 0
    while poller._rechecks.acquire(blocking=False):  # every re-check slot taken
        held += 1
    checked = threading.Event()
    claim = poller._claim

    def first_claim(route: PopRoute, batch: int) -> list[Any]:
        try:
            return claim(route, batch)
        finally:
            checked.set()

    poller._claim = first_claim  # type: ignore[method-assign]
    got: list[Any] = []
    thread = threading.Thread(
        target=lambda: got.extend(poller.pop(PopRoute(queue="q"), 1, wait=True, timeout_s=20))
    )
    thread.start()
    assert checked.wait(10)  # its first check found nothing: parked
    push(store, items("q", "first", 1))
    push(store, items("q", "second", 1))
    assert events.notify("q/first//")
    deadline = time.monotonic() + 10
    while not events.notify("q/second//"):  # once it is armed again, waiting for a slot
        assert time.monotonic() < deadline
        time.sleep(0.01)
    for _ in range(held):
        poller._rechecks.release()
    thread.join(15)
    assert [m.partition for m in got] == ["first"]


def test_an_ack_wakes_a_poll_parked_here_first_and_notifies_nobody(store: Store, listener):
    events = Events()  # not started: only what this process does wakes its polls
    poller = LongPoller(store, events, "test")
    push(store, items("q", "a", 3))
    received(listener)
    (first,) = pop(store, "q", "a")
    assert ack(store, first.transaction_id).status == "completed"
    assert received(listener) == ["q/a///__queue__"]  # no poll parked here: notified
    (second,) = pop(store, "q", "a")
    thread, got = _parked_poll(poller, events, timeout_s=10)  # (its first check: a leased)
    assert ack(store, second.transaction_id).status == "completed"
    thread.join(5)
    assert [data["i"] for data in (orjson.loads(m.payload) for m in got)] == [2]
    assert received(listener) == []  # the poll here took it: nobody else to wake


def test_a_poll_woken_here_that_leaves_the_wake_up_unused_has_it_notified(
    store: Store, listener
):
    events = Events()
    LongPoller(store, events, "test")  # (joins the registry to the store's wake-ups)
    assert not events.wake_here("q/a//")  # a push's wake-up is every process's
    with events.subscribe(PopRoute(queue="q")) as waiter:
        assert events.wake_here("q/a///__queue__")
        assert waiter.event.is_set()
    assert received(listener) == ["q/a///__queue__"]  # (left unused, none here to take it)
    with events.subscribe(PopRoute(queue="q")) as waiter:
        assert events.notify("q/b///__queue__")  # a notification: the others had it too
    assert received(listener) == []


def test_a_plain_session_notifies_inside_the_push_and_a_deferring_one_after(db_dsn, listener):
    body = '[{"queue": "q", "partition": "a", "payload": 1}]'
    with psycopg.connect(db_dsn, autocommit=True) as conn:
        conn.execute(storage.PUSH_ITEMS, (body,))
        assert received(listener) == ["q/a//"]

        conn.execute("SELECT set_config('queen.push_notify', 'after_commit', false)")
        conn.execute(storage.PUSH_ITEMS, (body,))
        assert received(listener) == []
        conn.execute("SELECT queen.notify_pushed(%s, %s)", (["q", "q", "x"], ["a", "a", "y"]))
        assert received(listener) == ["q/a//"]


def test_started_wakeups_send_for_many_pushes_at_once(store: Store, listener):
    wakeups = store.polling.wakeups
    wakeups.start()
    try:
        for name in ("a", "b", "c"):
            push(store, items("q", name, 2))
        assert sorted(received(listener, 1.0)) == ["q/a//", "q/b//", "q/c//"]
    finally:
        wakeups.stop()


def test_pushes_send_no_wake_up_while_no_worker_has_polls_parked(store: Store, db_dsn):
    with psycopg.connect(db_dsn, autocommit=True) as conn:
        conn.execute(sql.SQL("LISTEN {}").format(sql.Identifier(wakeup.CHANNEL)))
        push(store, items("q", "a", 1))
        assert received(conn) == []
        store.polling.list_waiting_worker("w1", 30)
        push(store, items("q", "a", 1))
        assert received(conn) == ["q/a//"]
        conn.execute("UPDATE queen.waiting_workers SET until = now() - interval '1 second'")
        push(store, items("q", "a", 1))
        assert received(conn) == []


def test_a_long_poll_lists_its_worker_before_its_first_check(store: Store, db_dsn):
    poller = LongPoller(store, Events(), "worker-7")
    assert poller.pop(PopRoute(queue="q"), 1, wait=True, timeout_s=0.05) == []
    listed = rows(db_dsn, "SELECT worker, until > now() FROM queen.waiting_workers")
    assert listed == [("worker-7", True)]


def test_an_ack_collects_its_wake_ups_and_sends_none_inside_its_transaction(store, db_dsn, listener):
    push(store, items("q", "a", 2) + items("q", "b", 2))
    received(listener)
    first = pop(store, "q", "a")[0].transaction_id
    second = pop(store, "q", "b")[0].transaction_id
    acks = orjson.dumps([
        {"transactionId": first, "status": "completed"},
        {"transactionId": second, "status": "failed", "error": "x"},
    ]).decode()
    with psycopg.connect(db_dsn, autocommit=True) as conn:
        rows = conn.execute(
            "SELECT idx, status, wakes FROM queen.ack(%s::jsonb)", (acks,)
        ).fetchall()
        assert received(listener) == []  # committed, and nothing sent
        assert [(r[0], r[1]) for r in rows] == [(1, "completed"), (2, "retry_scheduled")]
        assert sorted(rows[0][2]) == ["q/a///__queue__", "q/b///__queue__"]  # both free, with work
        assert rows[1][2] is None  # the wake-ups come on the first row only
        (setting,) = conn.execute("SELECT current_setting('queen.wakes', true)").fetchone()
        assert setting in (None, "")  # (a later statement notifies at commit again)
        conn.execute("SELECT queen.notify_wakes(%s)", (rows[0][2] + rows[0][2],))
        assert sorted(received(listener)) == ["q/a///__queue__", "q/b///__queue__"]  # once each


def test_acks_through_the_store_wake_polls_after_they_committed(store, listener):
    push(store, items("q", "a", 2))
    received(listener)
    (first,) = pop(store, "q", "a")
    sent: list[list[str]] = []
    send = store.messages.after_ack
    store.messages.after_ack = lambda payloads: (sent.append(list(payloads)), send(payloads))
    assert ack(store, first.transaction_id).status == "completed"
    assert sent == [["q/a///__queue__"]]
    assert received(listener) == ["q/a///__queue__"]
    (last,) = pop(store, "q", "a")
    assert ack(store, last.transaction_id).status == "completed"
    assert sent == [["q/a///__queue__"]]  # the partition is empty: nobody to wake
    assert received(listener) == []


def test_started_wakeups_send_what_acks_freed(store: Store, listener):
    wakeups = store.polling.wakeups
    wakeups.start()
    try:
        push(store, items("q", "a", 2) + items("q", "b", 2))
        assert sorted(received(listener, 1.0)) == ["q/a//", "q/b//"]
        for name in ("a", "b"):
            (leased,) = pop(store, "q", name)
            ack(store, leased.transaction_id)
        assert sorted(received(listener, 1.0)) == ["q/a///__queue__", "q/b///__queue__"]
    finally:
        wakeups.stop()


def test_a_worker_lists_itself_again_when_its_listener_reconnects_with_no_poll_parked(
    store: Store, db_dsn: str
) -> None:
    """A server that crashed comes back with queen.waiting_workers empty. A worker whose
    listener reconnects with no poll parked must list itself again: its next poll trusts
    the listing it remembers, and without one no push would wake it before the fallback."""
    events = Events(db_dsn, fallback_s=120.0)  # the fallback cannot rescue the poll below
    poller = LongPoller(store, events, "worker-r")
    events.start()
    try:
        assert events.connected.wait(10)
        assert poller.pop(PopRoute(queue="q"), 1, wait=True, timeout_s=0.05) == []  # listed
        with psycopg.connect(db_dsn, autocommit=True) as conn:  # what a crash leaves
            conn.execute("DELETE FROM queen.waiting_workers")
            conn.execute(
                "SELECT pg_terminate_backend(pid) FROM pg_stat_activity"
                " WHERE datname = current_database() AND application_name = 'queen-listener'"
            )
        deadline = time.monotonic() + 20
        while scalar(db_dsn, "SELECT count(*) FROM queen.waiting_workers WHERE until > now()") == 0:
            assert time.monotonic() < deadline, "the reconnected worker did not list itself"
            time.sleep(0.05)
        assert events.reconnects >= 1
        got: list[Any] = []
        thread = threading.Thread(
            target=lambda: got.extend(poller.pop(PopRoute(queue="q"), 1, wait=True, timeout_s=60))
        )
        thread.start()
        deadline = time.monotonic() + 10
        while events.waiting == 0:
            assert time.monotonic() < deadline
            time.sleep(0.01)
        started = time.monotonic()
        push(store, items("q", "a", 1))
        thread.join(20)
        assert len(got) == 1
        assert time.monotonic() - started < 15  # a wake-up, not the fallback's 120 s
    finally:
        events.shutdown()


def test_pushes_and_acks_wake_ups_noted_together_go_in_one_transaction(store, listener):
    push(store, items("q", "a", 1) + items("q", "b", 1))
    store.polling.list_waiting_worker("w1", 30)
    received(listener)
    ran: list[tuple[str, bool]] = []
    store.db.observe = lambda name, statement, committed: ran.append((name, committed))
    try:
        store.polling.wakeups._send([("q", "a")], ["q/b///__queue__"])  # (one round's)
    finally:
        store.db.observe = None
    assert ran == [("notify_sent", True)]
    assert sorted(received(listener)) == ["q/a//", "q/b///__queue__"]
